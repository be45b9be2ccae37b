"""Only root reaches the stack's own Docker engine (``lab stack engine up``): its API is root on the
machine. The engine alone is started (no images copied: seconds, not minutes); a real unprivileged
uid (``setpriv`` to nobody) then tries the docker CLI against it in plain tcp, in TLS without a
client certificate, and with the stack's own certificate files, which it cannot read; root with
them is answered. Skipped, with the reason, without root, dockerd, containerd or the docker CLI.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from collections.abc import Iterator

import pytest

from lab.settings import Settings
from tests.conftest import test_settings as native_test_settings

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(os.geteuid() != 0, reason="the lab's own engine runs in a network namespace: root"),
              pytest.mark.skipif(not (shutil.which("dockerd") and shutil.which("containerd")),
                                 reason="dockerd and containerd are not installed (Debian: docker.io)"),
              pytest.mark.skipif(shutil.which("docker") is None, reason="no docker CLI"),
              pytest.mark.skipif(shutil.which("setpriv") is None, reason="no setpriv (util-linux)")]
OFFSET = 850
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]


@pytest.fixture(scope="module")
def engine() -> Iterator[Settings]:
    from lab.stack import images, remote_engine

    base = native_test_settings(OFFSET, "engine-access")
    settings = base.replace(backend="compose", compose_images="local", docker_host=base.engine_url)
    remote_engine.down(settings, purge=True)  # leftovers of an interrupted session
    copy = images.copy_images
    images.copy_images = lambda *args, **kwargs: []  # the engine alone: its images are not the point here
    try:
        remote_engine.up(settings)
        yield settings
    finally:
        images.copy_images = copy
        remote_engine.down(settings, purge=True)
        shutil.rmtree(settings.stack_dir, ignore_errors=True)


def _docker(settings: Settings, *flags: str, as_nobody: bool) -> subprocess.CompletedProcess[str]:
    argv = [shutil.which("docker") or "docker", "-H", settings.engine_url, *flags, "version", "--format",
            "{{.Server.Version}}"]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/tmp", "DOCKER_CONFIG": "/tmp/.docker-nobody"}
    return subprocess.run([*NOBODY, *argv] if as_nobody else argv, env=env, capture_output=True, text=True,
                          timeout=60, check=False)


def test_a_non_root_uid_cannot_reach_the_engine(engine: Settings) -> None:
    plain = _docker(engine, as_nobody=True)  # what any local user would try first
    assert plain.returncode != 0 and not plain.stdout.strip(), ("plain tcp", plain.stdout, plain.stderr)
    tls = engine.engine_tls_dir
    with_certificate = ["--tlsverify", "--tlscacert", str(tls / "ca.pem"), "--tlscert", str(tls / "cert.pem"),
                        "--tlskey", str(tls / "key.pem")]
    tries = {
        "TLS, no client certificate": ["--tls"],
        "TLS, the stack's certificate files": with_certificate,
    }
    for what, flags in tries.items():
        done = _docker(engine, *flags, as_nobody=True)
        assert done.returncode != 0 and not done.stdout.strip(), (what, done.stdout, done.stderr)
    # the files are root's alone: the directory 0700, the keys 0600
    assert stat.S_IMODE(tls.stat().st_mode) == 0o700 and tls.stat().st_uid == 0
    for key in ("key.pem", "server-key.pem"):
        assert stat.S_IMODE((tls / key).stat().st_mode) == 0o600
    # the control: root with the stack's certificate is answered, so the refusals above are the engine's
    done = _docker(engine, *with_certificate, as_nobody=False)
    assert done.returncode == 0 and done.stdout.strip(), done.stderr
