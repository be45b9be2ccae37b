"""The report as a web page: executed notebooks made into one HTML page a reader reads, without code.

* Figures are shown as ``<img>`` with alternative text (their finding and conditions,
  :func:`alt_text`) through :class:`Picture`, which a notebook cell returns.
* :func:`combine` joins the executed notebooks into one, the cells tagged ``appendix`` (method,
  definitions of the intervals, provenance, per-run tables) moved to the end under one heading.
* :func:`export_html` writes the page with code cells hidden, without the cells tagged
  ``notebook-only`` (what a notebook tells its reader in JupyterLab), without what a process printed
  (stdout and stderr stay in the executed notebooks beside the page, not on it), without any script
  from a CDN (require.js, MathJax and Mermaid: the page has no widget, formula or diagram), and
  with the tags of a link preview (``og:image``: the screenshot of its first screen).
"""

from __future__ import annotations

import base64
import io
import logging
from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

log = logging.getLogger(__name__)
TEMPLATES = Path(__file__).with_name("templates")
TEMPLATE = "page"  # templates/page: nbconvert's lab template without CDN scripts, with preview tags
APPENDIX_TAG = "appendix"
NOTEBOOK_ONLY = "notebook-only"  # a cell for the notebook's reader (which cells need the stack), not for the page
APPENDIX_HEADING = "# Appendix\n\nHow it was measured, what the intervals mean, where it ran, and every run."
DPI = 150  # pixels per inch of a page's PNG; shown at 100 per inch, so it stays sharp on a dense screen
SHOWN_DPI = 100


def alt_text(fig: Figure) -> str:
    """What a figure says, for a reader who does not see it: its title (the finding) and its
    caption (the conditions), else its axes' titles."""
    parts = [fig.get_suptitle(), fig.get_supxlabel()]
    if not any(p.strip() for p in parts):
        parts = [ax.get_title() for ax in fig.axes]
    text = " ".join(" ".join(p.split()) for p in parts if p and p.strip())
    return text or "figure"


def png(fig: Figure, dpi: int = DPI) -> bytes:
    """The figure as PNG bytes, cropped to what it draws."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return buf.getvalue()


def _size(data: bytes) -> tuple[int, int]:
    """Width and height of a PNG from its header."""
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def img_tag(fig: Figure, src: str | None = None, *, data: bytes | None = None) -> str:
    """``<img>`` of the figure at its natural size, with its :func:`alt_text`: embedded as a data
    URI, or pointing at ``src`` (a file written beside the page)."""
    data = data if data is not None else png(fig)
    w, h = (round(v * SHOWN_DPI / DPI) for v in _size(data))
    url = src if src is not None else "data:image/png;base64," + base64.b64encode(data).decode()
    return f'<img src="{escape(url)}" alt="{escape(alt_text(fig))}" width="{w}" height="{h}">'


class Picture:
    """A figure as a notebook shows it and a page embeds it: an ``<img>`` with its alternative text
    (and the plain PNG for front ends that do not render HTML)."""

    def __init__(self, fig: Figure) -> None:
        self.fig = fig
        self.data = png(fig)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> tuple[dict[str, str], dict[str, Any]]:
        alt = alt_text(self.fig)
        w, h = (round(v * SHOWN_DPI / DPI) for v in _size(self.data))
        return ({"text/html": img_tag(self.fig, data=self.data), "image/png": base64.b64encode(self.data).decode(),
                 "text/plain": alt}, {"image/png": {"alt": alt, "width": w, "height": h}})


def strip_streams(nb: Any) -> Any:
    """``nb`` without stream outputs (what its cells printed to stdout and stderr)."""
    for cell in nb.cells:
        if cell.get("cell_type") == "code":
            cell.outputs = [o for o in cell.get("outputs", []) if o.get("output_type") != "stream"]
    return nb


def appendix_last(cells: Sequence[Any]) -> list[Any]:
    """``cells`` with those tagged ``appendix`` moved to the end, in their order, after one heading."""
    import nbformat

    tagged = [c for c in cells if APPENDIX_TAG in c.get("metadata", {}).get("tags", [])]
    if not tagged:
        return list(cells)
    rest = [c for c in cells if not any(c is t for t in tagged)]
    return [*rest, nbformat.v4.new_markdown_cell(APPENDIX_HEADING), *tagged]


def combine(notebooks: Sequence[Path], out: Path) -> Path:
    """One notebook holding the cells (and outputs) of ``notebooks`` in order, the appendix last."""
    import nbformat

    first, *rest = (nbformat.read(p, as_version=4) for p in notebooks)
    for nb in rest:
        first.cells.extend(nb.cells)
    first.cells = appendix_last(first.cells)
    nbformat.write(first, out)
    return out


def preview_tags(title: str, description: str = "", image: str = "") -> list[tuple[str, str, str]]:
    """The ``<meta>`` tags of a link preview: (attribute, name, content); ``image`` relative to the
    page or absolute (Open Graph wants an absolute URL: ``lab site --base-url`` gives one)."""
    tags = [("property", "og:title", title), ("property", "og:type", "article")]
    if description:
        tags += [("name", "description", description), ("property", "og:description", description)]
    if image:
        tags += [("property", "og:image", image), ("name", "twitter:card", "summary_large_image")]
    return tags


def export_html(notebook: Path, html: Path, *, title: str, description: str = "", image: str = "") -> Path:
    """The executed notebook as one self-contained HTML page: no code cells, no printed output, no
    CDN script, a link preview (``image``: e.g. the screenshot's file name beside the page)."""
    import nbformat
    from nbconvert import HTMLExporter
    from nbconvert.preprocessors import TagRemovePreprocessor

    nb = strip_streams(nbformat.read(notebook, as_version=4))
    nb.metadata["title"] = title
    quiet = logging.getLogger(f"{__name__}.nbconvert")
    quiet.setLevel(logging.ERROR)
    exporter = HTMLExporter(template_name=TEMPLATE, extra_template_basedirs=[str(TEMPLATES)],
                            exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True, log=quiet)
    # what a notebook says to its reader in JupyterLab (which cells need the stack) is not the page's
    exporter.register_preprocessor(TagRemovePreprocessor(remove_cell_tags={NOTEBOOK_ONLY}), enabled=True)
    resources = {"metadata": {"name": title}, "preview": preview_tags(title, description, image)}
    body, _ = exporter.from_notebook_node(nb, resources=resources)
    html.write_text(body, encoding="utf-8")
    return html
