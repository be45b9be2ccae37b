"""The results as a static site any web server (or a file browser) can serve: ``lab site``.

``build_site(out, settings)`` writes, with relative links only:

* ``index.html``: the answer (the findings beside the newest sitting's figure), links to the two
  pages below, and the index of the committed sittings, each linked to its record;
* ``results.html``: every table and figure of the committed sittings (``notebooks/results.ipynb``
  executed on them: no stack, no run);
* ``report.html`` and ``first-screen.png``: the newest report of this machine and the screenshot of
  its first screen, when there is one;
* ``answer.png`` (the index's figure, which is also its link preview's image: ``og:image``),
  ``sittings/<id>.json`` (the records themselves).

Open Graph wants an absolute image URL: ``base_url`` (where the site will be served) makes the
preview tags absolute; without it they are relative, which most previews then ignore.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from datetime import UTC, datetime
from html import escape
from pathlib import Path
from typing import IO

import pandas as pd

from lab.settings import Settings
from lab.study import first_screen, page

TITLE = "fanout-lab: direct WAL readers or Debezium and a broker, what each costs per message"
STYLE = """<style>
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;max-width:1400px;
padding:0 24px;color:#1d1d1d;line-height:1.4}
h1{font-size:1.55em;margin:0 0 4px} .question{font-style:italic;color:#333;margin:0 0 14px;max-width:1000px}
nav ul{padding-left:20px} table{border-collapse:collapse;font-size:90%} th,td{border-bottom:1px solid #ddd;
padding:4px 10px;text-align:left} th{background:#f4f4f4}
</style>"""


def _absolute(base_url: str, name: str) -> str:
    return f"{base_url.rstrip('/')}/{name}" if base_url else name


def _description(findings: Sequence[first_screen.FindingLike]) -> str:
    """A link preview's description: the first finding in plain words, else the question."""
    return findings[0].sentence.replace("`", "") if findings else first_screen.QUESTION


def index_html(findings: Sequence[first_screen.FindingLike], figure: str, sittings: pd.DataFrame, *,
               links: Sequence[tuple[str, str]], records: Sequence[str] = (), base_url: str = "",
               updated: str = "") -> str:
    """The site's first page: the question, the answer beside its figure (``figure``: an ``<img>``
    tag), the links (href, text), and the index of sittings (:func:`lab.study.explore.index_table`)
    with each sitting linked to ``sittings/<id>.json`` when its id is in ``records``."""
    description = _description(findings)
    meta = "".join(f'<meta {a}="{escape(n)}" content="{escape(c)}">'
                   for a, n, c in page.preview_tags(TITLE, description, _absolute(base_url, "answer.png")))
    block = first_screen.answer_html(findings, figure, empty="No sitting is recorded yet: `make report` measures one.")
    items = "".join(f'<li><a href="{escape(href)}">{escape(text)}</a></li>' for href, text in links)
    rows = []
    for r in sittings.itertuples(index=False):
        name = escape(str(r.sitting))
        cell = f'<a href="sittings/{name}.json">{name}</a>' if str(r.sitting) in records else name
        rows.append("<tr>" + f"<td>{cell}</td>" + "".join(
            f"<td>{escape(str(getattr(r, c)))}</td>" for c in sittings.columns if c != "sitting") + "</tr>")
    head = "".join(f"<th>{escape(str(c))}</th>" for c in sittings.columns)
    table = (f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>" if rows
             else "<p>No sitting is recorded yet.</p>")
    stamp = f"<p><small>Built {escape(updated)}.</small></p>" if updated else ""
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{escape(TITLE)}</title>{meta}{STYLE}</head><body><main>"
            f"<h1>{escape(TITLE)}</h1><p class=\"question\">{escape(first_screen.QUESTION)}</p>{block}"
            f"<nav><ul>{items}</ul></nav><h2>The sittings</h2>"
            f"<p>A sitting is one <code>lab report</code> on a quiet machine; its record is committed with the "
            f"code. Every figure above is the median and range over them.</p>{table}{stamp}</main></body></html>")


def build_site(out: Path, settings: Settings, *, report: Path | None = None, base_url: str = "",
               echo: IO[str] | None = None) -> Path:
    """Write the site into ``out`` (module docstring) and return its ``index.html``. ``report``: the
    report folder to publish (default: the newest one that has a page, if any)."""
    from lab.results import latest_report, load_sittings, sittings_dir
    from lab.study import explore, ledger
    from lab.study.report import SCREENSHOT, execute_notebook

    out.mkdir(parents=True, exist_ok=True)
    records = load_sittings(settings=settings)
    current = first_screen.headline_sitting(records)
    findings = ledger.findings(records, current=current) if current is not None else []
    figure = ""
    if current is not None:
        fig = first_screen.sitting_figure(current)
        data = page.png(fig)
        (out / "answer.png").write_bytes(data)
        figure = page.img_tag(fig, "answer.png", data=data)
    with tempfile.TemporaryDirectory(prefix="lab-site-") as tmp:
        executed = execute_notebook("results", Path(tmp) / "results.ipynb", {"report_dir": ""}, settings=settings,
                                    echo=echo)
        page.export_html(executed, out / "results.html", title="fanout-lab: the results of every sitting",
                         description=_description(findings),
                         image=_absolute(base_url, "answer.png") if records else "")
    links = [("results.html", "Every table and figure of the committed sittings")]
    report = report or latest_report(settings)
    if report is not None and (report / "report.html").is_file():
        shutil.copyfile(report / "report.html", out / "report.html")
        shot = report / SCREENSHOT
        if shot.is_file():
            shutil.copyfile(shot, out / SCREENSHOT)
        links.insert(0, ("report.html", f"The newest report on this machine ({report.name})"))
    else:  # a site rebuilt where no report is: none of an older build's stays behind unlinked
        for name in ("report.html", SCREENSHOT):
            (out / name).unlink(missing_ok=True)
    published = out / "sittings"
    published.mkdir(exist_ok=True)
    names = []
    for path in sorted(sittings_dir(settings).glob("*.json")):
        shutil.copyfile(path, published / path.name)
        names.append(path.stem)
    sittings = explore.index_table(ledger.cells(records)) if records else explore.index_table(pd.DataFrame())
    index = out / "index.html"
    index.write_text(index_html(findings, figure, sittings, links=links, records=names, base_url=base_url,
                                updated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")), encoding="utf-8")
    return index


def describe(index: Path) -> list[str]:
    """What a site folder holds, a line per page (for the command's last lines)."""
    out = [f"site: {index}"]
    for name, what in (("results.html", "every sitting's tables and figures"), ("report.html", "the newest report")):
        if (index.parent / name).is_file():
            out.append(f"  {what}: {index.parent / name}")
    return out
