"""Every module the code imports is declared, and the lock pins every declared distribution.

``pyproject.toml`` keeps ranges (what the code supports); ``requirements.lock`` pins the exact
versions ``make setup`` installs (what the published figures were measured with).
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared(*extras: str) -> set[str]:
    project = PYPROJECT["project"]
    reqs = list(project["dependencies"])
    for extra in extras:
        reqs += project["optional-dependencies"][extra]
    return {_norm(re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0]) for r in reqs}


def _imported(folder: Path) -> dict[str, str]:
    """Top-level module -> first file importing it, for every import under ``folder``."""
    out: dict[str, str] = {}
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                out.setdefault(name.split(".")[0], str(path.relative_to(ROOT)))
    return out


def _undeclared(folder: Path, declared: set[str]) -> list[str]:
    dists = md.packages_distributions()
    missing = []
    for module, where in _imported(folder).items():
        if module in sys.stdlib_module_names or module in ("lab", "tests", "__future__"):
            continue
        owners = {_norm(d) for d in dists.get(module, [])}
        if not owners & declared:
            missing.append(f"{module} (imported in {where}; installed by {sorted(owners) or 'nothing'})")
    return missing


def test_every_module_lab_imports_is_a_declared_dependency() -> None:
    assert not _undeclared(ROOT / "lab", _declared())


def test_every_module_the_tests_import_is_declared_for_them() -> None:
    assert not _undeclared(ROOT / "tests", _declared("test"))


def test_the_checker_sees_an_undeclared_import(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("import numpy\nfrom psutil import Process\nimport json\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert [m.split()[0] for m in _undeclared(tmp_path, {"numpy"})] == ["psutil"]
    finally:
        ROOT = saved


def test_the_lock_pins_every_declared_distribution_exactly() -> None:
    lock = (ROOT / "requirements.lock").read_text().splitlines()
    pins = {}
    for line in lock:
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep, f"requirements.lock: {line!r} is not pinned with =="
            pins[_norm(name.split("[")[0])] = version
    missing = sorted(_declared("test", "notebooks") - pins.keys())
    assert not missing, f"declared but not pinned in requirements.lock: {missing}"
