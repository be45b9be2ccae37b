"""The README and docs/ hold what a newcomer reads: short, linked, and free of internal references.

Checked here: the README stays within 250 lines; every relative link in the README and docs/
resolves to a file in the repository (anchors are not checked); every `lab` command in their shell
blocks parses with the real command line, and every `make` target they name exists; and no page, nor a notebook's
markdown or code, names a tracker issue, a section of a file outside the repository, a path outside
it or its design notes. The reference study is cited through docs/reference.md.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
from pathlib import Path

import pytest

from lab.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 250

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
# docs/architecture.md is ours: a design file of any spelling is outside the repository
FORBIDDEN = re.compile(r"(?i:issue \d+|design\.md)|method\.md §|\.\./shared")


def pages() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md")), ROOT / "data" / "reference" / "README.md"]


def current_pages() -> list[Path]:
    """The pages that describe the lab as it is; docs/history/ keeps each command as it was run."""
    return [p for p in pages() if not p.is_relative_to(DOCS / "history")]


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


SHELL_BLOCK = re.compile(r"```(?:sh|bash)\n(.*?)```", re.DOTALL)
LAB_COMMAND = re.compile(
    r"(?:^|[\s;(&|\"$])(?:\.venv/bin/)?lab ((?:stack|run|series|report|faults|bench|site)\b[^#;|&)\"\n]*)")


def lab_commands(text: str) -> list[str]:
    """The arguments of every ``lab`` command in the shell blocks of ``text`` (continuations joined)."""
    commands = []
    for block in SHELL_BLOCK.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            commands += [m.group(1).strip() for m in LAB_COMMAND.finditer(line)]
    return commands


def parse_error(command: str) -> str | None:
    """None when ``lab <command>`` parses with the real command line, else argparse's message."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            build_parser().parse_args(shlex.split(command))
    except SystemExit as exc:
        return err.getvalue().strip().splitlines()[-1] if exc.code else None
    return None


def make_targets() -> set[str]:
    return set(re.findall(r"(?m)^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(encoding="utf-8")))


def test_relative_links_are_found_and_urls_and_anchors_skipped() -> None:
    text = ("[a](docs/x.md) [b](https://example.org/y.md) [c](#here) [d](../data/reference/README.md#t) "
            "![img](pic.png) [e](mailto:a@b)")
    assert relative_links(text) == ["docs/x.md", "../data/reference/README.md"]


def test_forbidden_mentions_are_caught() -> None:
    # spelled in pieces, so that a grep for them over the tree finds none here either
    issue, method, shared, design = "iss" "ue 14", "meth" "od.md §", "../sha" "red", "DES" "IGN.md"
    assert forbidden(f"as in {issue}, see {method}9.5 and {shared}/{design}") == [issue, method, shared, design]
    capital, lower = "Iss" "ue 3", "docs/des" "ign.md"
    assert forbidden(capital) == [capital] and forbidden(lower) == ["des" "ign.md"]
    assert forbidden("the reference study (docs/reference.md), 2026-12-01, docs/method.md, "
                     "docs/architecture.md") == []


def test_lab_commands_are_read_from_shell_blocks_and_checked() -> None:
    text = "```sh\n.venv/bin/lab run --pipeline wal \\\n  --json   # one run\nmake test\n```\n`lab run --nope`"
    assert [" ".join(c.split()) for c in lab_commands(text)] == ["run --pipeline wal --json"]
    assert parse_error("run --pipeline wal --json") is None
    assert parse_error("run --no-such-option") is not None


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


@pytest.mark.parametrize("page", current_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_documented_command_exists(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    bad = [(c, e) for c in lab_commands(text) if (e := parse_error(c))]
    assert not bad, f"{page.relative_to(ROOT)}: commands the command line refuses: {bad}"
    missing = set(re.findall(r"`make ([a-z][a-z-]*)", text)) - make_targets()
    assert not missing, f"{page.relative_to(ROOT)}: make targets not in the Makefile: {sorted(missing)}"


@pytest.mark.parametrize("notebook", notebooks(), ids=lambda p: p.name)
def test_no_internal_reference_in_notebooks(notebook: Path) -> None:
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    found = [(i, hit) for i, cell in enumerate(cells) for hit in forbidden("".join(cell["source"]))]
    assert not found, f"{notebook.name}: (cell, mention) {found}"


def test_docs_have_the_topic_pages() -> None:
    for name in ("results.md", "method.md", "reference.md", "faults.md", "topologies.md", "backends.md"):
        assert (DOCS / name).is_file(), f"docs/{name} is missing"
    assert list((DOCS / "history").glob("20*.md")), "docs/history/ has no dated file"
