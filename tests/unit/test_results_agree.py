"""docs/results.md and the README's opening agree with the committed sittings: both are written by
``lab results`` from data/sittings, and a figure typed by hand or a record added without rewriting
them fails here."""

from __future__ import annotations

from pathlib import Path

from lab.results import load_sittings
from lab.settings import Settings
from lab.study import published

ROOT = Path(__file__).resolve().parents[2]


def _records() -> list[dict[str, object]]:
    return load_sittings(settings=Settings(root=ROOT, data_dir=ROOT / "data"))


def test_the_ledger_holds_sittings() -> None:
    assert _records(), "data/sittings holds no record: the published answer has nothing behind it"


def test_results_md_is_what_the_ledger_writes() -> None:
    written = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    assert written == published.results_markdown(_records()), "docs/results.md disagrees: run `lab results`"


def test_the_readme_opening_is_what_the_ledger_writes() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert published.with_readme_block(readme, published.readme_block(_records())) == readme, (
        "the README's opening disagrees with data/sittings: run `lab results`")
