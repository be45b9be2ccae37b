"""No module decides anything by a pipeline's name but the pipeline's own (``lab/pipelines/<name>.py``):
the rest reads what a pipeline is from its capabilities.

The scan reads every module of ``lab/`` as a syntax tree and looks for a registered name written as
a string and compared with, looked up by or matched against an expression that stands for a
pipeline (its source names one: ``s.pipeline``, ``pipeline.name``, ``pipes``, ``row["pipeline"]``).
The same words as services or Debezium sinks (``kafka``, ``rabbitmq``) or a run.json block
(``wal``) compared with anything else are not a pipeline's name and are not flagged.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from lab.pipelines import REGISTRY

LAB = Path(__file__).resolve().parents[3] / "lab"
NAMES = frozenset(REGISTRY)
# the modules a pipeline is: the only places that may decide by its name
OWN = frozenset(Path(inspect.getsourcefile(cls) or "").resolve()
                for r in REGISTRY.values() for cls in (r.pipeline, r.source))


def _names_in(node: ast.AST) -> set[str]:
    """Registered names written as a string literal, or as literals of a tuple, list, set or dict's keys."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} & NAMES
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return set().union(*(_names_in(e) for e in node.elts)) if node.elts else set()
    if isinstance(node, ast.Dict):
        return set().union(*(_names_in(k) for k in node.keys if k is not None)) if node.keys else set()
    return set()


def _pipeline(node: ast.AST) -> bool:
    """Whether an expression stands for a pipeline (its source names one)."""
    return "pipe" in ast.unparse(node).lower()


def decisions(source: str) -> list[tuple[int, str]]:
    """(line, code) of every decision by a pipeline's name in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        hit = False
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            hit = any(_names_in(a) for a in sides) and any(_pipeline(a) and not _names_in(a) for a in sides)
        elif isinstance(node, ast.Subscript):  # {"kafka": ...}[s.pipeline]
            hit = bool(_names_in(node.value)) and _pipeline(node.slice)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            args = [*node.args, *(k.value for k in node.keywords)]
            if node.func.attr in ("get", "pop", "isin"):  # {"kafka": ...}.get(s.pipeline), df.pipeline.isin([...])
                hit = (bool(_names_in(node.func.value)) and any(_pipeline(a) for a in args)) or (
                    node.func.attr == "isin" and _pipeline(node.func.value) and any(_names_in(a) for a in args))
            elif node.func.attr in ("startswith", "endswith") and _pipeline(node.func.value):
                hit = any(isinstance(a, ast.Constant) and isinstance(a.value, str)
                          and any(n.startswith(a.value) or n.endswith(a.value) for n in NAMES) for a in args)
        elif isinstance(node, ast.Match):
            hit = _pipeline(node.subject) and any(
                isinstance(c.pattern, ast.MatchValue) and _names_in(c.pattern.value) for c in node.cases)
        if hit:
            found.append((node.lineno, ast.unparse(node)[:100]))
    return sorted(found)


def test_no_module_but_a_pipelines_own_decides_by_its_name() -> None:
    found = [f"{path.relative_to(LAB.parent)}:{line}: {code}"
             for path in sorted(LAB.rglob("*.py")) if path.resolve() not in OWN
             for line, code in decisions(path.read_text())]
    assert not found, "decide by the pipeline's capabilities, not its name:\n" + "\n".join(found)


def test_every_registered_pipeline_is_its_own_module() -> None:
    assert {p.parent.name for p in OWN} == {"pipelines"} and len({p.stem for p in OWN}) == len(REGISTRY)


def test_the_scan_sees_a_decision_by_name() -> None:
    """The walker finds each shape (a check that sees nothing proves nothing), and leaves alone the
    same words used for services, sinks and run.json's blocks."""
    flagged = """
if pipeline.name == "kafka": pass
if s.pipeline in ("wal", "wal-sharded"): pass
first = "kafka" if "kafka" in pipes else pipes[0]
target = {"kafka": "kafka", "rabbitmq": "rabbitmq"}.get(s.pipeline, "pg")
rows = df[df["pipeline"].isin(["poll", "wal-relay"])]
if scenario.pipeline.startswith("wal"): pass
match s.pipeline:
    case "kafka-share": pass
"""
    assert [line for line, _ in decisions(flagged)] == [2, 3, 4, 5, 6, 7, 8]
    left_alone = """
if self.sink == "kafka": pass
if key == "wal": pass
service = {"kafka": "C3"}[name]
if pipeline in REGISTRY: pass
"""
    assert decisions(left_alone) == []
