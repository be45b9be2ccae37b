"""The package layout of the reference study: no module imports a layer above its own, and no
modules import each other in a circle.

Layers, top to bottom: ``cli`` → ``study`` → ``runner``/``consumer`` → ``pipelines``, ``faults``, ``measure`` →
``stack``, ``workload``, ``pg`` → ``scenario``, ``settings``, ``results``. Imports inside a function
count too (a lazy import is still a dependency), and so do those made for types only.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

LAB = Path(__file__).resolve().parents[2] / "lab"

LAYER = {
    "cli": 0, "__main__": 0,
    "study": 1,
    "runner": 2, "consumer": 2, "relay": 2,
    "pipelines": 3, "faults": 3, "measure": 3,
    "stack": 4, "workload": 4, "pg": 4,
    "scenario": 5, "settings": 5, "results": 5, "__init__": 6,
}


def _unit(module: str) -> str:
    """``lab.study.series`` → ``study``; ``lab.runner`` → ``runner``; ``lab`` → ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "lab"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "lab":
            if node.module == "lab":  # from lab import x: x is the unit
                out += [(node.lineno, f"lab.{a.name}") for a in node.names]
            else:
                out.append((node.lineno, node.module))
    return out


MODULES = sorted(LAB.rglob("*.py"))


def test_every_unit_has_a_layer() -> None:
    units = {p.relative_to(LAB).parts[0].removesuffix(".py") for p in MODULES}
    assert units <= set(LAYER), f"modules without a layer: {sorted(units - set(LAYER))}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(LAB)))
def test_no_import_runs_up(path: Path) -> None:
    own = LAYER[path.relative_to(LAB).parts[0].removesuffix(".py")]
    upward = [
        f"line {line}: {module}" for line, module in _imports(path)
        if _unit(module) != "__version__" and LAYER.get(_unit(module), 99) < own
    ]
    assert not upward, f"{path.relative_to(LAB)} imports a higher layer: {upward}"


def _module(path: Path) -> str:
    parts = list(path.relative_to(LAB.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _targets(path: Path, known: set[str]) -> set[str]:
    """The modules of ``lab`` that ``path`` imports (``from lab.stack import children`` is the module
    ``lab.stack.children``; ``from lab.stack import get_stack`` is the package)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module
                     for a in node.names]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                out.add(name)
    return out


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every set of modules that import each other, directly or through others (Tarjan's components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_modules_import_each_other() -> None:
    known = {_module(p) for p in MODULES}
    graph = {_module(p): _targets(p, known) - {_module(p)} for p in MODULES}
    assert circles(graph) == []


def test_the_checker_sees_a_circle() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    """The walker finds lazy imports inside functions (a check that sees nothing proves nothing)."""
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from lab.study import series\n    import lab.runner\n")
    assert [m for _, m in _imports(f)] == ["lab.study", "lab.runner"]
