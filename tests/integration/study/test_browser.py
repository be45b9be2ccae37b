"""The real headless Chromium (Debian's package) on hand-made pages, no stack: what it reports must
be what a reader would see, or the report's browser test proves nothing."""

from __future__ import annotations

from pathlib import Path

from lab.study import browser

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="  # 1x1


def _page(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "page.html"
    path.write_text('<!DOCTYPE html><html><head><meta charset="utf-8"><title>t</title></head>'
                    f'<body>{body}</body></html>')
    return path


def test_a_clean_page_shows_its_answer_and_figure_on_the_first_screen(tmp_path: Path) -> None:
    page = _page(tmp_path, f'<section id="answer"><p class="lab-sentence">wal costs least up to N = 8.</p>'
                           f'<figure><img src="data:image/png;base64,{PNG}" alt="the figure" width="600" '
                           f'height="400"></figure></section>')
    view = browser.view(page, screenshot=tmp_path / "first-screen.png")
    assert view.problems() == []
    assert view.first_screen == {sel: True for sel in browser.FIRST_SCREEN}
    shot = (tmp_path / "first-screen.png").read_bytes()
    assert shot[:8] == b"\x89PNG\r\n\x1a\n"
    assert (int.from_bytes(shot[16:20], "big"), int.from_bytes(shot[20:24], "big")) == browser.VIEWPORT


def test_a_bad_page_is_caught_on_every_count(tmp_path: Path) -> None:
    page = _page(tmp_path, '<div style="height:2000px"></div>'  # the answer below the first screen
                           '<section id="answer"><p class="lab-sentence">late</p>'
                           '<figure><img src="missing.png"></figure></section>'
                           '<div data-mime-type="application/vnd.jupyter.stdout"><pre>series quick: 42 runs</pre></div>'
                           '<pre>RuntimeWarning: invalid value encountered in scalar subtract</pre>'
                           '<script>console.error("boom"); undefinedFunction();</script>')
    view = browser.view(page)
    assert view.screenshot is None
    assert "boom" in view.console_errors and any("undefinedFunction" in e for e in view.console_errors)
    assert any("missing.png" in e for e in view.console_errors)  # the failed load, as the console says it
    assert view.broken_images == ("missing.png",) and view.images_without_alt == ("missing.png",)
    assert view.printed_outputs == 1
    assert view.suspicious == ("RuntimeWarning: invalid value encountered in scalar subtract",)
    assert view.first_screen == {sel: False for sel in browser.FIRST_SCREEN}
