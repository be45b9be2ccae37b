"""The notebooks as committed: thin, parameterised, without outputs (no kernel, no services)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import nbformat
import papermill as pm
import pytest

from lab.scenario import Scenario
from lab.study.report import KERNEL, NOTEBOOKS, REPORT_PAGE

DIR = Path(__file__).resolve().parents[2] / "notebooks"


def _nb(name: str) -> nbformat.NotebookNode:
    return nbformat.read(DIR / f"{name}.ipynb", as_version=4)


def _parameters(nb: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]


def test_the_notebooks_are_those_of_the_study() -> None:
    assert sorted(p.stem for p in DIR.glob("*.ipynb")) == sorted(NOTEBOOKS)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_valid_thin_and_committed_without_outputs(name: str) -> None:
    nb = _nb(name)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == KERNEL
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.outputs == [] and c.execution_count is None for c in code), "clear the outputs"
    assert nb.cells[0].cell_type == "markdown"  # the narrative comes first
    assert len(code) <= 20 and all(len(c.source.splitlines()) <= 30 for c in code), "keep logic in lab/"
    for cell in code:  # every cell parses (top-level await and line magics allowed, as in the kernel)
        source = "\n".join(line for line in cell.source.splitlines() if not line.startswith("%"))
        compile(source, f"{name}.ipynb", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_one_parameters_cell_each_annotated_and_documented(name: str) -> None:
    nb = _nb(name)
    (cell,) = _parameters(nb)
    lines = [line for line in cell.source.splitlines() if line.strip()]
    tree = ast.parse(cell.source)
    assert len(tree.body) == len(lines) and all(isinstance(s, ast.AnnAssign) for s in tree.body)
    assert all("  # " in line for line in lines), "every parameter says what it is"
    inferred = pm.inspect_notebook(str(DIR / f"{name}.ipynb"))
    assert list(inferred) == [s.target.id for s in tree.body]  # type: ignore[union-attr]


def test_scenario_parameters_are_exactly_the_scenario_fields() -> None:
    (cell,) = _parameters(_nb("scenario"))
    body = ast.parse(cell.source).body
    fields = dataclasses.fields(Scenario)
    assert [s.target.id for s in body] == [f.name for f in fields]  # type: ignore[union-attr]
    for stmt, f in zip(body, fields, strict=True):
        assert isinstance(stmt, ast.AnnAssign) and stmt.value is not None
        assert ast.unparse(stmt.annotation) == f.type, f.name
        assert ast.literal_eval(stmt.value) == f.default, f.name
        assert type(ast.literal_eval(stmt.value)) is type(f.default), f.name
    # and the next code cell builds the Scenario from exactly those names
    code = [c for c in _nb("scenario").cells if c.cell_type == "code"]
    after = code[next(i for i, c in enumerate(code) if "parameters" in c.metadata.get("tags", [])) + 1]
    assert "Scenario(**{f: globals()[f] for f in Scenario.field_names()})" in after.source


def test_broker_native_runs_its_series_beside_the_published_numbers() -> None:
    source = "".join(c.source for c in _nb("broker_native").cells)
    assert "series.run_series(plan" in source and "broker_native.plan(" in source
    assert 'load_reference("broker_native")' in source and "not implemented" not in source.lower()


NEEDS_STACK = {"scenario", "series", "latency", "broker_native", "control", "faults"}


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_a_notebook_says_which_cells_need_the_stack(name: str) -> None:
    """A cell that runs anything on the stack (it awaits a run) is tagged ``needs-stack`` and says so in
    its first line; a notebook-only note below the title tells the reader which cells those are, or
    that the notebook runs on stored data alone (analysis, topology, results)."""
    nb = _nb(name)
    note = nb.cells[1]
    assert note.cell_type == "markdown" and "notebook-only" in note.metadata.get("tags", [])
    running = [c for c in nb.cells if c.cell_type == "code" and "await " in c.source]
    for cell in running:
        assert "needs-stack" in cell.metadata.get("tags", []) and cell.source.startswith("# needs the stack: ")
    assert all("needs-stack" not in c.metadata.get("tags", []) for c in nb.cells if c not in running)
    assert bool(running) == (name in NEEDS_STACK)
    assert ("Needs the stack" in note.source) == (name in NEEDS_STACK)
    if name not in NEEDS_STACK:
        assert "stored data only" in note.source and "without the stack" in note.source


def test_the_analysis_opens_with_the_answer_and_ends_with_its_appendix() -> None:
    nb = _nb("analysis")
    code = [c for c in nb.cells if c.cell_type == "code" and "parameters" not in c.metadata.get("tags", [])]
    assert "first_screen.answer_html(findings" in code[0].source and "ledger.findings(sittings" in code[0].source
    assert "ranking.at_measured(" in code[1].source
    tagged = [i for i, c in enumerate(nb.cells) if "appendix" in c.metadata.get("tags", [])]
    assert tagged and tagged == list(range(len(nb.cells) - len(tagged), len(nb.cells)))  # the last cells
    assert any("Definitions" in nb.cells[i].source for i in tagged)  # the intervals' definitions


def test_no_cell_of_a_page_prints() -> None:
    """What a page shows is displayed (Markdown, tables, figures); a print would be a process's stdout,
    which the page leaves out, so a finding printed would be lost from it."""
    for name in REPORT_PAGE:
        code = [c for c in _nb(name).cells if c.cell_type == "code"]
        assert not [c.source for c in code if "print(" in c.source], name
