"""The report page (lab.study.page): figures with alternative text, the appendix last, no printed
output, no script from a CDN, the tags of a link preview."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import nbformat
from matplotlib.figure import Figure
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from lab.study import page, plots


def _figure() -> Figure:
    fig = Figure(figsize=(4, 3), layout="constrained")
    ax = fig.subplots()
    ax.plot([1, 2], [3, 4])
    return plots.finding(fig, "wal costs least at N = 1", "5,000 messages per start, closed loop.")


def test_a_figure_on_the_page_says_its_finding_and_conditions_to_who_cannot_see_it() -> None:
    fig = _figure()
    assert page.alt_text(fig) == "wal costs least at N = 1 5,000 messages per start, closed loop."
    tag = page.img_tag(fig)
    w, h = (int(v) for v in re.search(r'width="(\d+)" height="(\d+)"', tag).groups())  # type: ignore[union-attr]
    data = base64.b64decode(re.search(r'base64,([^"]+)"', tag).group(1))  # type: ignore[union-attr]
    px = page._size(data)  # drawn at 150 pixels per inch, shown at 100: sharp on a dense screen
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and abs(px[0] - 1.5 * w) <= 1 and abs(px[1] - 1.5 * h) <= 1
    assert 'alt="wal costs least at N = 1 5,000 messages per start, closed loop."' in tag
    assert page.img_tag(fig, "answer.png").startswith('<img src="answer.png" alt=')
    bundle, extra = page.Picture(fig)._repr_mimebundle_()
    assert bundle["text/html"].startswith('<img src="data:image/png;base64,')
    assert bundle["text/plain"] == extra["image/png"]["alt"] == page.alt_text(fig)
    bare = Figure()
    bare.subplots().set_title("a title only")
    assert page.alt_text(bare) == "a title only"


def _notebook(tmp_path: Path) -> Path:
    cells = [
        new_markdown_cell("# The study"),
        new_markdown_cell("Needs the stack for the cells marked so.", metadata={"tags": ["notebook-only"]}),
        new_code_cell("secret_code_line = 1", outputs=[
            new_output("stream", name="stdout", text="series quick: 42 runs\n"),
            new_output("stream", name="stderr", text="RuntimeWarning: invalid value encountered in scalar subtract\n"),
            new_output("display_data", data={"text/html": "<table><tr><td>headline-cell</td></tr></table>"})]),
        new_markdown_cell("## How it was measured", metadata={"tags": ["appendix"]}),
        new_markdown_cell("## The broker pays off from N = 12"),
    ]
    nbformat.write(new_notebook(cells=cells, metadata={"title": "an old title"}), tmp_path / "a.ipynb")
    return tmp_path / "a.ipynb"


def test_the_appendix_goes_last_under_one_heading(tmp_path: Path) -> None:
    first = _notebook(tmp_path)
    nbformat.write(new_notebook(cells=[new_markdown_cell("## Latency at a fixed rate")]), tmp_path / "b.ipynb")
    combined = nbformat.read(page.combine([first, tmp_path / "b.ipynb"], tmp_path / "c.ipynb"), as_version=4)
    heads = [c.source.splitlines()[0] for c in combined.cells]
    assert heads == ["# The study", "Needs the stack for the cells marked so.", "secret_code_line = 1",
                     "## The broker pays off from N = 12", "## Latency at a fixed rate", "# Appendix",
                     "## How it was measured"]


def test_the_page_has_no_code_no_printed_output_no_cdn_script_and_a_preview(tmp_path: Path) -> None:
    html = page.export_html(_notebook(tmp_path), tmp_path / "a.html", title="fanout-lab report r1",
                            description="wal costs least", image="first-screen.png").read_text()
    assert "headline-cell" in html and "The study" in html and "secret_code_line" not in html
    assert "series quick: 42 runs" not in html and "RuntimeWarning" not in html
    assert "Needs the stack" not in html  # a notebook-only cell
    assert not re.findall(r'<script[^>]+src="https?://', html), "a script from a CDN"
    assert "<title>fanout-lab report r1</title>" in html
    assert meta(html, "property", "og:image") == "first-screen.png"
    assert meta(html, "property", "og:title") == "fanout-lab report r1"
    assert meta(html, "name", "description") == "wal costs least"


def meta(html: str, attribute: str, name: str) -> str | None:
    """The content of a page's ``<meta>`` tag, whatever the order of its attributes."""
    for tag in re.findall(r"<meta\b[^>]*>", html):
        if f'{attribute}="{name}"' in tag:
            found = re.search(r'content="([^"]*)"', tag)
            return found.group(1) if found else None
    return None
