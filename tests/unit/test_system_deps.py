"""scripts/system-deps.sh's decisions: which Debian packages it installs for each
``LAB_RABBITMQ_VERSION``, that it installs under a ``policy-rc.d`` that starts no daemon, and that
it stops, disables and masks the distribution's broker whenever the package is there.

The script runs for real (bash, its own logic) with ``SYSDEPS_ROOT`` pointing at a directory of
the test's and a PATH of recording commands: ``apt-get``, ``systemctl``, ``update-rc.d`` and the
init script write what they were asked to a log (``apt-get install`` also lays down the broker's
binary, as the package would), ``id`` answers the uid the case wants, and each tool the script
looks for is on PATH or not as the case says.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "system-deps.sh"
BASH = shutil.which("bash") or "/bin/bash"
BROKER = "usr/lib/rabbitmq/bin/rabbitmq-server"
POLICY = "usr/sbin/policy-rc.d"
EVERY_OTHER = ["maven", "python3-venv", "docker-compose", "docker.io", "debootstrap", "chromium"]

APT_GET = f"""#!{BASH}
echo "apt-get $*" >> "$LOG"
if [ "$1" = install ]; then
  if [ -x "$SYSDEPS_ROOT/{POLICY}" ] && "$SYSDEPS_ROOT/{POLICY}"; then echo "policy: starts" >> "$LOG";
  else echo "policy: $("$SYSDEPS_ROOT/{POLICY}" >/dev/null 2>&1; echo $?)" >> "$LOG"; fi
  for pkg in "$@"; do
    if [ "$pkg" = rabbitmq-server ]; then
      mkdir -p "$SYSDEPS_ROOT/{Path(BROKER).parent}" && printf '#!/bin/sh\\n' > "$SYSDEPS_ROOT/{BROKER}"
      chmod 755 "$SYSDEPS_ROOT/{BROKER}"
    fi
  done
fi
"""
RECORD = f"""#!{BASH}
echo "$(basename "$0") $*" >> "$LOG"
"""


@dataclass
class Result:
    status: int
    stderr: str
    log: list[str]
    root: Path

    @property
    def installed(self) -> list[str]:
        lines = [line.split()[2:] for line in self.log if line.startswith("apt-get install")]
        assert len(lines) <= 1
        return [a for a in lines[0] if not a.startswith("-")] if lines else []


def _tool(bin_dir: Path, name: str, text: str) -> None:
    path = bin_dir / name
    path.write_text(text)
    path.chmod(0o755)


def run_script(tmp_path: Path, *, version: str | None, uid: int = 0, present: bool = False,
               broker: bool = False, init: str = "systemd", policy: str | None = None,
               running: bool = False, apt_fails: bool = False) -> Result:
    """Run the script: ``present``: every tool it looks for is there; ``broker``: the packaged
    broker is installed already; ``init``: ``systemd``, ``sysv`` or none; ``policy``: an existing
    policy-rc.d of the machine's; ``running``: the distribution's service has its pid file."""
    root, bin_dir, log = tmp_path / "root", tmp_path / "bin", tmp_path / "log"
    for d in (root / "usr" / "sbin", bin_dir):
        d.mkdir(parents=True)
    log.write_text("")
    for name in ("chmod", "rm", "mkdir", "basename", "mktemp", "cat"):  # what the script and the recorders use
        real = shutil.which(name)
        assert real is not None
        (bin_dir / name).symlink_to(real)
    _tool(bin_dir, "id", f"#!{BASH}\necho {uid}\n")
    fails = 'if [ "$1" = install ]; then echo "E: Unable to locate package" >&2; exit 100; fi\n'  # update works
    _tool(bin_dir, "apt-get", APT_GET + (fails if apt_fails else ""))
    _tool(bin_dir, "systemctl", RECORD)
    _tool(bin_dir, "update-rc.d", RECORD)
    _tool(bin_dir, "python3", f"#!{BASH}\nexit {0 if present else 1}\n")
    if present:
        for name in ("mvn", "docker", "dockerd", "debootstrap", "chromium"):
            _tool(bin_dir, name, f"#!{BASH}\nexit 0\n")
    if broker:
        (root / BROKER).parent.mkdir(parents=True)
        _tool((root / BROKER).parent, "rabbitmq-server", "#!/bin/sh\n")
    if init == "systemd":
        (root / "run" / "systemd" / "system").mkdir(parents=True)
    elif init == "sysv":
        (root / "etc" / "init.d").mkdir(parents=True)
        _tool(root / "etc" / "init.d", "rabbitmq-server", RECORD)
    if running:
        (root / "run" / "rabbitmq").mkdir(parents=True)
        (root / "run" / "rabbitmq" / "pid").write_text("4242\n")
    if policy is not None:
        _tool(root / "usr" / "sbin", "policy-rc.d", policy)
    env = {"PATH": str(bin_dir), "SYSDEPS_ROOT": str(root), "LOG": str(log), "HOME": str(tmp_path)}
    if version is not None:
        env["LAB_RABBITMQ_VERSION"] = version
    res = subprocess.run([BASH, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60, check=False)
    return Result(res.returncode, res.stderr, log.read_text().splitlines(), root)


MASKED = ["systemctl stop rabbitmq-server.service epmd.socket epmd.service",
          "systemctl disable rabbitmq-server.service", "systemctl mask rabbitmq-server.service"]


@pytest.mark.parametrize("version", [None, "4.0"])
def test_rabbitmq_4_installs_no_host_broker(tmp_path: Path, version: str | None) -> None:
    r = run_script(tmp_path, version=version)
    assert r.status == 0, r.stderr
    assert r.installed == EVERY_OTHER
    assert "apt-get update -qq" in r.log
    assert not any(line.startswith("systemctl") for line in r.log)  # no broker package: nothing to mask
    assert not (r.root / BROKER).exists()


def test_rabbitmq_3_10_installs_the_host_broker_without_starting_it_and_masks_it(tmp_path: Path) -> None:
    r = run_script(tmp_path, version="3.10")
    assert r.status == 0, r.stderr
    assert r.installed == ["maven", "rabbitmq-server", *EVERY_OTHER[1:]]
    assert "policy: 101" in r.log  # maintainer scripts were told to start no daemon
    assert not (r.root / POLICY).exists()  # the script's own policy-rc.d is gone afterwards
    assert r.log[-3:] == MASKED


def test_a_machines_own_policy_rc_d_is_kept(tmp_path: Path) -> None:
    own = "#!/bin/sh\n# the machine's\nexit 0\n"
    r = run_script(tmp_path, version="3.10", policy=own)
    assert r.status == 0, r.stderr
    assert "policy: starts" in r.log  # the machine's policy applies, the script does not replace it
    assert (r.root / POLICY).read_text() == own


@pytest.mark.parametrize("version", [None, "3.10"])
def test_with_everything_present_nothing_is_installed_but_a_present_broker_is_masked(
        tmp_path: Path, version: str | None) -> None:
    r = run_script(tmp_path, version=version, present=True, broker=True)
    assert r.status == 0, r.stderr
    assert not any(line.startswith("apt-get") for line in r.log)
    assert r.log == MASKED


def test_under_sysv_init_a_running_broker_is_stopped_and_disabled(tmp_path: Path) -> None:
    r = run_script(tmp_path, version="3.10", present=True, broker=True, init="sysv", running=True)
    assert r.status == 0, r.stderr
    assert r.log == ["rabbitmq-server stop", "update-rc.d rabbitmq-server disable"]


def test_under_sysv_init_a_broker_not_running_is_only_disabled(tmp_path: Path) -> None:
    # its init script's stop would start an epmd on every interface just to ask
    r = run_script(tmp_path, version="3.10", present=True, broker=True, init="sysv")
    assert r.status == 0, r.stderr
    assert r.log == ["update-rc.d rabbitmq-server disable"]


def test_without_root_it_names_the_missing_packages_and_installs_nothing(tmp_path: Path) -> None:
    r = run_script(tmp_path, version="3.10", uid=1000)
    assert r.status == 1
    assert r.stderr.strip().splitlines() == [
        "missing Debian packages: maven rabbitmq-server python3-venv docker-compose docker.io debootstrap chromium; "
        "install them: sudo apt-get install maven rabbitmq-server python3-venv docker-compose docker.io debootstrap "
        "chromium"]
    assert r.log == []


def test_bash_parses_it() -> None:
    subprocess.run([BASH, "-n", str(SCRIPT)], check=True, timeout=30)


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed (Debian: shellcheck)")
def test_shellcheck_finds_nothing() -> None:
    res = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True, timeout=60, check=False,
                         env={**os.environ})
    assert res.returncode == 0, res.stdout


def test_apt_says_nothing_unless_the_install_fails(tmp_path: Path) -> None:
    """debconf's and needrestart's chatter stays off the terminal of a `make setup` that works; a failed
    install shows what apt said, and the script fails."""
    ok = run_script(tmp_path / "ok", version=None)
    assert ok.status == 0 and ok.stderr.strip().splitlines() == [f"installing Debian packages: {' '.join(EVERY_OTHER)}"]
    bad = run_script(tmp_path / "bad", version=None, apt_fails=True)
    assert bad.status == 1 and "E: Unable to locate package" in bad.stderr
