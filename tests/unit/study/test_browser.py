"""What the headless browser's findings mean (lab.study.browser), as pure functions of its events
and of a page's text; tests/integration/test_browser.py runs the real Chromium."""

from __future__ import annotations

from pathlib import Path

from lab.study import browser


def test_lines_that_read_like_a_warning_or_a_traceback() -> None:
    text = "\n".join([
        "The broker pays off from N = 12.",
        "/x/lab/study/crossover.py:88: RuntimeWarning: invalid value encountered in scalar subtract",
        "[IPKernelApp] WARNING | Kernel is running over TCP without encryption.",
        "Traceback (most recent call last):",
        "a warning to operators: slots retain WAL",  # prose, lower case: fine
        "UserWarning",
    ])
    assert browser.suspicious_lines(text) == [
        "/x/lab/study/crossover.py:88: RuntimeWarning: invalid value encountered in scalar subtract",
        "[IPKernelApp] WARNING | Kernel is running over TCP without encryption.",
        "Traceback (most recent call last):", "UserWarning"]


def test_console_errors_are_exceptions_console_error_calls_and_failed_loads() -> None:
    events = [
        {"method": "Runtime.exceptionThrown", "params": {"exceptionDetails": {
            "text": "Uncaught", "exception": {"description": "ReferenceError: require is not defined"}}}},
        {"method": "Runtime.consoleAPICalled", "params": {"type": "error", "args": [{"value": "boom"}]}},
        {"method": "Runtime.consoleAPICalled", "params": {"type": "log", "args": [{"value": "fine"}]}},
        {"method": "Log.entryAdded", "params": {"entry": {"level": "error", "text": "Failed to load resource",
                                                          "url": "https://cdn.example/require.js"}}},
        {"method": "Log.entryAdded", "params": {"entry": {"level": "warning", "text": "a deprecation"}}},
        {"method": "Page.loadEventFired", "params": {}},
    ]
    assert browser.console_errors(events) == [
        "ReferenceError: require is not defined", "boom", "Failed to load resource https://cdn.example/require.js"]


def test_a_page_view_names_every_problem() -> None:
    clean = browser.PageView("file:///r.html", first_screen={"#answer .lab-sentence": True}, screenshot=Path("s.png"))
    assert clean.problems() == []
    bad = browser.PageView("file:///r.html", console_errors=("boom",), broken_images=("a figure",),
                           images_without_alt=("data:image/png;base64,iVBOR",), printed_outputs=2,
                           suspicious=("RuntimeWarning: x",), first_screen={"#answer figure img": False})
    assert bad.problems() == [
        "console error: boom", "image did not load: a figure",
        "image without alternative text: data:image/png;base64,iVBOR", "2 printed output(s) of a process on the page",
        "reads like a warning or a traceback: RuntimeWarning: x", "not on the first screen: #answer figure img"]
