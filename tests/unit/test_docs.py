"""The README and docs/ hold what a newcomer reads: short, linked, and free of internal references.

Checked here: the README stays within 250 lines; every relative link in the README and docs/
resolves to a file in the repository (anchors are not checked); and no page, nor a notebook's
markdown or code, names a tracker issue, a section of a file outside the repository, a path outside
it or its design notes. The reference study is cited through docs/reference.md.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 250

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FORBIDDEN = re.compile(r"(?i:issue \d+)|method\.md §|\.\./shared|DESIGN\.md")  # docs/design.md is ours


def pages() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def notebooks() -> list[Path]:
    return sorted((ROOT / "notebooks").glob("*.ipynb"))


def relative_links(text: str) -> list[str]:
    """The relative targets of the markdown links in ``text`` (no URLs, no in-page anchors)."""
    targets = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.IGNORECASE) or target.startswith("#"):
            continue
        targets.append(target.split("#", 1)[0])
    return targets


def forbidden(text: str) -> list[str]:
    return [m.group(0) for m in FORBIDDEN.finditer(text)]


def test_relative_links_are_found_and_urls_and_anchors_skipped() -> None:
    text = ("[a](docs/x.md) [b](https://example.org/y.md) [c](#here) [d](../data/reference/README.md#t) "
            "![img](pic.png) [e](mailto:a@b)")
    assert relative_links(text) == ["docs/x.md", "../data/reference/README.md"]


def test_forbidden_mentions_are_caught() -> None:
    assert forbidden("as in issue 14, see method.md §9.5 and ../shared/DESIGN.md") == [
        "issue 14", "method.md §", "../shared", "DESIGN.md"]
    assert forbidden("Issue 3") == ["Issue 3"]
    assert forbidden("the reference study (docs/reference.md), 2026-12-01, docs/method.md, docs/design.md") == []


def test_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines, at most {MAX_README_LINES}"


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = [t for t in relative_links(page.read_text(encoding="utf-8")) if not (page.parent / t).exists()]
    assert not broken, f"{page.relative_to(ROOT)}: links to missing files {broken}"


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_internal_reference_in_docs(page: Path) -> None:
    found = forbidden(page.read_text(encoding="utf-8"))
    assert not found, f"{page.relative_to(ROOT)} mentions {found}"


@pytest.mark.parametrize("notebook", notebooks(), ids=lambda p: p.name)
def test_no_internal_reference_in_notebooks(notebook: Path) -> None:
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    found = [(i, hit) for i, cell in enumerate(cells) for hit in forbidden("".join(cell["source"]))]
    assert not found, f"{notebook.name}: (cell, mention) {found}"


def test_docs_have_the_topic_pages() -> None:
    for name in ("results.md", "method.md", "reference.md", "faults.md", "topologies.md", "backends.md"):
        assert (DOCS / name).is_file(), f"docs/{name} is missing"
    assert list((DOCS / "history").glob("20*.md")), "docs/history/ has no dated file"
