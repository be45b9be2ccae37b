"""The site's first page (lab.study.site.index_html): relative links, a link preview, alternative
text, the index of sittings linked to their records; nothing needs a server."""

from __future__ import annotations

import re

import pandas as pd

from lab.study import site
from tests.unit.study.test_first_screen import FINDINGS
from tests.unit.study.test_page import meta


def test_the_index_page_links_relatively_and_previews_with_the_answers_figure() -> None:
    sittings = pd.DataFrame([{"sitting": "20261206T212826Z-quick-6ba0", "day": "2026-12-06", "machine": "m2",
                              "profile": "quick"},
                             {"sitting": "20261207T090000Z-quick-<x>", "day": "2026-12-07", "machine": "m2",
                              "profile": "quick"}])
    html = site.index_html(FINDINGS, '<img src="answer.png" alt="wal costs less than kafka up to N = 8">', sittings,
                           links=[("report.html", "The newest report"), ("results.html", "Every sitting")],
                           records=["20261206T212826Z-quick-6ba0"])
    hrefs = re.findall(r'href="([^"]+)"', html)
    assert hrefs == ["report.html", "results.html", "sittings/20261206T212826Z-quick-6ba0.json"]
    assert not any(h.startswith(("/", "http")) for h in hrefs)
    assert meta(html, "property", "og:image") == "answer.png"
    assert meta(html, "name", "description") == FINDINGS[0].sentence.replace("`", "")
    assert all(re.search(r'\balt="[^"]+"', tag) for tag in re.findall(r"<img[^>]*>", html))
    assert "20261207T090000Z-quick-&lt;x&gt;" in html  # no record file: named, not linked, escaped
    assert html.index('id="answer"') < html.index("<h2>The sittings</h2>")
    served = site.index_html([], "", sittings.iloc[0:0], links=[], base_url="https://lab.example/fanout/")
    assert meta(served, "property", "og:image") == "https://lab.example/fanout/answer.png"
    assert "No sitting is recorded yet" in served
