"""Debian roots the lab builds itself with ``debootstrap`` and runs programs in by ``chroot``.

Why: Debian 13 ("trixie") ships RabbitMQ 4.0 on Erlang 27, which needs a newer C library than a
Debian 12 host has. Rather than a container registry (none is reachable), the lab bootstraps a
minimal Debian root into its cache and runs the broker from it, sharing the host's network
(loopback ports as usual) and pids (tracked and stopped like any native service).

* :func:`debian_root` builds ``<cache_dir>/rootfs/<suite>-<digest of the package list>`` once,
  idempotently: into a temporary directory, marked complete by a stamp file, then renamed; a
  half-built root from an interrupted run is removed and rebuilt. One build at a time per root
  (a lock file beside it, waited for), so two stack dirs sharing the cache never remove each
  other's half-built root. Another caller (the compose backend's local images) reuses the same root.
* :func:`chroot_argv` wraps a command so that it runs inside the root in a private mount
  namespace (``unshare --mount``): ``/proc`` and ``/dev`` are mounted there, and each host
  directory in ``binds`` appears at the same absolute path inside. The mounts vanish with the
  last process of the namespace, so nothing is left mounted on the host. ``unshare`` and
  ``chroot`` exec in place: the recorded pid is the command itself.
* debootstrap itself mounts ``proc`` and ``sys`` inside the root it builds; a build that is
  killed (its timeout, SIGTERM) leaves them mounted. :func:`remove_tree` unmounts whatever is
  mounted under a directory before it removes it, and refuses to remove one it cannot unmount
  (``rmtree`` would otherwise walk into the host's ``/proc`` and ``/sys``).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from lab.settings import Settings, child_env, is_root
from lab.stack import proc
from lab.stack.base import StackError
from lab.stack.netns import run_tool

log = logging.getLogger(__name__)

MIRROR = "http://deb.debian.org/debian"
STAMP = ".lab-rootfs-complete"
BUILD_TIMEOUT = 1800.0
LOCK_WAIT_S = BUILD_TIMEOUT + 120.0  # another caller's build of the same root: its timeout, and its cleanup


def mounts_under(path: Path, mountinfo: str | None = None) -> list[Path]:
    """Mount points at or below ``path`` (from ``/proc/self/mountinfo``), deepest first: the order
    they can be unmounted in."""
    if mountinfo is None:
        try:
            mountinfo = Path("/proc/self/mountinfo").read_text()
        except OSError:
            return []
    base = Path(path).resolve()
    found = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) < 5:
            continue
        # octal escapes of the kernel's format: a space is \040
        point = Path(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4]))
        if point == base or base in point.parents:
            found.append(point)
    return sorted(set(found), key=lambda p: len(p.parts), reverse=True)


def unmount_under(path: Path) -> None:
    """Unmount everything mounted at or below ``path`` (a debootstrap killed by its timeout leaves
    its proc and sys mounted in the build dir); raise StackError naming a mount that stays."""
    for _ in range(3):  # a mount stacked on another shows up again once the top one is gone
        points = mounts_under(path)
        if not points:
            return
        for point in points:
            res = run_tool(["umount", str(point)])
            if res.returncode != 0:  # busy: detach it now, the kernel drops it when released
                run_tool(["umount", "--lazy", str(point)])
    left = mounts_under(path)
    if left:
        raise StackError(f"{left[0]} is still mounted; unmount it (umount -l {left[0]}) before the lab removes {path}")


def remove_tree(path: Path) -> None:
    """``rm -rf path`` that never walks into a mount: everything mounted under it is unmounted
    first, and a mount that stays refuses the removal (StackError) instead of emptying, say, the
    host's /proc or a bind-mounted directory through it."""
    unmount_under(path)
    shutil.rmtree(path, ignore_errors=True)


def root_path(settings: Settings, suite: str, packages: Sequence[str]) -> Path:
    """Where the root for ``suite`` with ``packages`` lives (built or not)."""
    digest = hashlib.sha256(" ".join(sorted(packages)).encode()).hexdigest()[:10]
    return settings.cache_dir / "rootfs" / f"{suite}-{digest}"


def is_built(root: Path) -> bool:
    return (root / STAMP).exists()


def debian_root(settings: Settings, suite: str, packages: Sequence[str]) -> Path:
    """A minimal Debian ``suite`` root with ``packages`` installed; built on first call (root only).
    One build at a time per root, across every stack dir sharing the cache (``<root>.lock``): a
    second caller waits for the first and uses its root, never removes it half-built."""
    root = root_path(settings, suite, packages)
    if is_built(root):
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    with proc.waited(root.with_name(root.name + ".lock"), f"the build of {root}", LOCK_WAIT_S):
        if is_built(root):  # built by the caller we waited for
            return root
        return _build(root, suite, packages)


def _build(root: Path, suite: str, packages: Sequence[str]) -> Path:
    if not is_root():
        raise StackError(f"building the Debian {suite} root {root} needs root (debootstrap, chroot)")
    exe = shutil.which("debootstrap") or ("/usr/sbin/debootstrap" if Path("/usr/sbin/debootstrap").exists() else None)
    if exe is None:
        raise StackError(
            f"debootstrap is missing, needed to build the Debian {suite} root for RabbitMQ 4; "
            "install it: apt-get install debootstrap (or set LAB_RABBITMQ_VERSION=3.10)"
        )
    tmp = root.with_name(root.name + ".building")
    remove_tree(tmp)  # a half-built root from an interrupted build, its mounts first
    tmp.parent.mkdir(parents=True, exist_ok=True)
    argv = [exe, "--variant=minbase", f"--include={','.join(packages)}", suite, str(tmp), MIRROR]
    log.info("building Debian %s root with %s (a few minutes, once)", suite, ", ".join(packages))
    try:
        res = subprocess.run(argv, env=child_env(DEBIAN_FRONTEND="noninteractive"),
                             capture_output=True, text=True, timeout=BUILD_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        unmount_under(tmp)
        raise StackError(f"debootstrap of Debian {suite} took over {BUILD_TIMEOUT:.0f} s") from None
    except BaseException:  # SIGTERM/SIGINT mid-build: leave no mount behind, the interrupt goes on
        with contextlib.suppress(StackError):
            unmount_under(tmp)
        raise
    unmount_under(tmp)  # a failed build can leave its proc and sys mounted too
    if res.returncode != 0:
        lines = (res.stderr or res.stdout).strip().splitlines() or [str(res.returncode)]
        log_file = tmp / "debootstrap" / "debootstrap.log"
        raise StackError(f"debootstrap {suite} failed: {lines[-1]} (log: {log_file})")
    # No daemon of the root ever starts from a maintainer script; the lab starts what it needs.
    policy = tmp / "usr" / "sbin" / "policy-rc.d"
    policy.write_text("#!/bin/sh\nexit 101\n")
    policy.chmod(0o755)
    (tmp / STAMP).write_text(" ".join(packages) + "\n")
    remove_tree(root)
    tmp.rename(root)
    log.info("Debian %s root ready at %s", suite, root)
    return root


def package_version(root: Path, package: str) -> str:
    """The installed version of ``package`` in ``root`` (from its dpkg status), or ``""``."""
    try:
        text = (root / "var" / "lib" / "dpkg" / "status").read_text()
    except OSError:
        return ""
    for block in text.split("\n\n"):
        if f"Package: {package}\n" in block + "\n":
            for line in block.splitlines():
                if line.startswith("Version: "):
                    return line.removeprefix("Version: ")
    return ""


def chroot_argv(root: Path, argv: Sequence[str | Path], binds: Sequence[Path] = ()) -> list[str]:
    """``argv`` run inside ``root`` in a private mount namespace, ``binds`` at the same paths."""
    steps = ["set -e", f"r={shlex.quote(str(root))}",
             'mount -t proc proc "$r/proc"', 'mount --rbind /dev "$r/dev"']
    for b in binds:
        inner = shlex.quote(str(b))
        steps += [f'mkdir -p "$r"{inner}', f'mount --bind {inner} "$r"{inner}']
    steps.append('exec chroot "$r" ' + " ".join(shlex.quote(str(a)) for a in argv))
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", "; ".join(steps)]
