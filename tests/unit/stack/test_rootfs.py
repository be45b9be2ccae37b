"""The Debian roots of lab/stack/rootfs.py and the RabbitMQ release setting that uses them."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from lab.settings import Settings
from lab.stack import rootfs
from lab.stack.base import StackError
from lab.stack.rabbitmq_broker import RabbitMQService


def test_root_path_depends_on_suite_and_package_set_not_order(tmp_path: Path) -> None:
    s = Settings(cache_dir=tmp_path)
    a = rootfs.root_path(s, "trixie", ["rabbitmq-server", "curl"])
    assert a == rootfs.root_path(s, "trixie", ["curl", "rabbitmq-server"])
    assert a.parent == tmp_path / "rootfs" and a.name.startswith("trixie-")
    assert a != rootfs.root_path(s, "bookworm", ["rabbitmq-server", "curl"])
    assert a != rootfs.root_path(s, "trixie", ["rabbitmq-server"])


def test_a_built_root_is_returned_without_building_again(tmp_path: Path) -> None:
    s = Settings(cache_dir=tmp_path)
    root = rootfs.root_path(s, "trixie", ["rabbitmq-server"])
    root.mkdir(parents=True)
    assert not rootfs.is_built(root)
    (root / rootfs.STAMP).write_text("rabbitmq-server\n")
    assert rootfs.debian_root(s, "trixie", ["rabbitmq-server"]) == root  # no debootstrap call


def test_package_version_reads_the_roots_dpkg_status(tmp_path: Path) -> None:
    status = tmp_path / "var" / "lib" / "dpkg" / "status"
    status.parent.mkdir(parents=True)
    status.write_text(
        "Package: erlang-base\nStatus: install ok installed\nVersion: 1:27.3.4-1\n\n"
        "Package: rabbitmq-server\nStatus: install ok installed\nVersion: 4.0.5-6\n"
    )
    assert rootfs.package_version(tmp_path, "rabbitmq-server") == "4.0.5-6"
    assert rootfs.package_version(tmp_path, "erlang-base") == "1:27.3.4-1"
    assert rootfs.package_version(tmp_path, "missing") == ""
    assert rootfs.package_version(tmp_path / "nowhere", "rabbitmq-server") == ""


@pytest.mark.skipif(os.geteuid() != 0, reason="mount namespaces and chroot need root")
def test_chroot_argv_runs_inside_with_binds_and_leaves_no_mount(tmp_path: Path) -> None:
    # "/" as the root: the wrapper's own behaviour (private namespace, proc, binds) is what runs
    (tmp_path / "marker").write_text("seen")
    argv = rootfs.chroot_argv(Path("/"), ["sh", "-c", f"cat {tmp_path}/marker; cat /proc/self/mounts"],
                              binds=[tmp_path])
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30).stdout
    assert out.startswith("seen")
    assert f" {tmp_path} " in out  # the bind exists inside the namespace ...
    assert f" {tmp_path} " not in Path("/proc/self/mounts").read_text()  # ... and only there


def test_rabbitmq_release_setting(tmp_path: Path) -> None:
    s = Settings(cache_dir=tmp_path, stack_dir=tmp_path / "stack")
    assert s.rabbitmq_version == "4.0"
    new = RabbitMQService(s)
    assert new.root == rootfs.root_path(s, "trixie", ["rabbitmq-server"])
    old = RabbitMQService(s.replace(rabbitmq_version="3.10"))
    assert old.root is None
    assert new.mnesia != old.mnesia and new.mnesia.parent == old.mnesia.parent  # no shared database
    with pytest.raises(StackError, match=re.escape("unknown LAB_RABBITMQ_VERSION '3.13': choose one of 4.0, 3.10")):
        RabbitMQService(s.replace(rabbitmq_version="3.13"))
    assert Settings.from_env({"LAB_RABBITMQ_VERSION": "3.10"}).rabbitmq_version == "3.10"


def test_mounts_under_finds_the_tree_deepest_first() -> None:
    info = "\n".join([
        "22 1 0:20 / /proc rw - proc proc rw",
        "101 27 254:0 /x /b/root.building/proc rw - ext4 /dev/vda rw",
        "102 101 0:42 / /b/root.building/proc rw - proc proc rw",
        "103 27 0:43 / /b/root.building/sys rw - sysfs sysfs rw",
        "104 27 0:44 / /b/root.building2/sys rw - sysfs sysfs rw",
        r"105 27 0:45 / /b/root.building/a/with\040space rw - tmpfs tmpfs rw",
    ])
    found = rootfs.mounts_under(Path("/b/root.building"), info)
    assert found[0] == Path("/b/root.building/a/with space")
    assert set(found) == {Path("/b/root.building/a/with space"), Path("/b/root.building/sys"),
                          Path("/b/root.building/proc")}
    assert rootfs.mounts_under(Path("/elsewhere"), info) == []


def _mounted(path: Path) -> bool:
    return any(line.split()[4].startswith(str(path)) for line in Path("/proc/self/mountinfo").read_text().splitlines())


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root")
def test_an_interrupted_build_dir_is_unmounted_before_it_is_removed(tmp_path: Path) -> None:
    """The state a killed debootstrap leaves: proc and sys mounted in the build dir (here also a
    bind mount of a directory outside, and a mount stacked on another). Removing the dir unmounts
    them all first and never deletes what a mount showed."""
    building = tmp_path / "trixie-abc.building"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("a file outside the build dir")
    for sub in ("proc", "sys", "bind"):
        (building / sub).mkdir(parents=True)
    subprocess.run(["mount", "--bind", str(outside), str(building / "bind")], check=True)
    subprocess.run(["mount", "-t", "proc", "proc", str(building / "proc")], check=True)
    subprocess.run(["mount", "--bind", str(outside), str(building / "sys")], check=True)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(building / "sys")], check=True)  # stacked
    try:
        assert _mounted(building)
        rootfs.remove_tree(building)
        assert not _mounted(building) and not building.exists()
        assert (outside / "keep").read_text() == "a file outside the build dir"
    finally:
        for _ in range(4):
            for sub in ("bind", "proc", "sys"):
                subprocess.run(["umount", "--lazy", str(building / sub)], capture_output=True, check=False)


def _fake_debootstrap(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[str], dict[str, object]]]:
    """No network, no real root: every `debootstrap` fails at once, and what it was called with is kept."""
    import shutil

    calls: list[tuple[list[str], dict[str, object]]] = []
    real_run = subprocess.run

    def run(argv: list[str], *args: object, **kwargs: object) -> subprocess.CompletedProcess[str]:
        if Path(str(argv[0])).name == "debootstrap":
            calls.append(([str(a) for a in argv], kwargs))
            return subprocess.CompletedProcess(argv, 1, "", "E: fake debootstrap\n")
        return real_run(argv, *args, **kwargs)  # type: ignore[call-overload, no-any-return]

    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.setattr(shutil, "which", lambda name, *a, **kw: f"/fake/{name}" if name == "debootstrap" else None)
    monkeypatch.setattr(rootfs, "is_root", lambda: True)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    return calls


def test_a_build_under_way_in_another_stack_is_waited_for_not_removed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two stack dirs share the cache: while one builds the root (holding its lock), another's `up`
    waits for it instead of removing its half-built root; here the wait is cut short."""
    import sys

    calls = _fake_debootstrap(monkeypatch)
    s = Settings(cache_dir=tmp_path)
    root = rootfs.root_path(s, "trixie", ["rabbitmq-server"])
    building = root.with_name(root.name + ".building")
    (building / "usr").mkdir(parents=True)
    (building / "usr" / "half").write_text("another build's work")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time\n"
         "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\nfcntl.flock(fd, fcntl.LOCK_EX)\n"
         "os.write(fd, f'{os.getpid()} lab stack up'.encode())\nprint('held', flush=True)\ntime.sleep(60)",
         str(root.with_name(root.name + ".lock"))], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        monkeypatch.setattr(rootfs, "LOCK_WAIT_S", 1.0, raising=False)
        with pytest.raises(StackError, match=rf"is in use by `lab stack up` \(pid {holder.pid}\)"):
            rootfs.debian_root(s, "trixie", ["rabbitmq-server"])
    finally:
        holder.kill()
        holder.wait()
    assert (building / "usr" / "half").read_text() == "another build's work" and calls == []


def test_the_images_root_is_built_with_a_timeout_by_the_shared_root_build(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`lab stack images build` bootstraps its root through debian_root: one locked build, with a
    timeout, whose half-built leftovers are unmounted before they are removed."""
    from lab.stack import images

    calls = _fake_debootstrap(monkeypatch)
    s = Settings(cache_dir=tmp_path)
    with pytest.raises(StackError, match="fake debootstrap"):
        images.rootfs_tarball(s, say=lambda _: None)
    assert len(calls) == 1
    argv, kwargs = calls[0]
    assert kwargs.get("timeout") == rootfs.BUILD_TIMEOUT
    assert argv[-2].endswith(".building") and Path(argv[-2]).parent == tmp_path / "rootfs"
