"""A page as a reader's browser shows it: headless Chromium (the distribution's package, never a
downloaded browser) driven over the Chrome DevTools protocol.

:func:`view` opens a local page at a viewport (1400 × 900: a laptop's first screen), waits until it
has loaded, and returns a :class:`PageView`: the errors the console saw (failed loads included),
images that did not load or have no alternative text, outputs a process printed, lines of the page
that read like a library's warning or a traceback, whether given elements lie wholly inside the
first screen, and a PNG of that screen. Chromium runs as a child of this process on a fresh
profile, with every background connection off (the machine may have no route outside), and listens
for the protocol on a loopback port it picks itself; it is stopped by its pid when done.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.stack.base import StackError

log = logging.getLogger(__name__)
VIEWPORT = (1400, 900)
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--disable-extensions", "--mute-audio", "--hide-scrollbars",
         "--disable-dev-shm-usage", "--remote-debugging-port=0")
# what the first screen of a report must show: its first answer sentence and the answer's figure
FIRST_SCREEN = ("#answer .lab-sentence", "#answer figure img")
SUSPICIOUS = re.compile(r"Traceback \(most recent call last\)|\b\w*Warning\b|\bWARNING\b")
PRINTED = ('[data-mime-type="application/vnd.jupyter.stdout"]', '[data-mime-type="application/vnd.jupyter.stderr"]')

INSPECT = """(selectors, printed) => {
  const vw = window.innerWidth, vh = window.innerHeight;
  const inView = (sel) => {
    const e = document.querySelector(sel);
    if (!e) return false;
    const r = e.getBoundingClientRect();
    return r.width > 0 && r.height > 0 && r.top >= 0 && r.left >= 0 && r.bottom <= vh && r.right <= vw;
  };
  const name = (i) => (i.getAttribute('alt') || i.getAttribute('src') || '').slice(0, 100);
  const imgs = Array.from(document.images);
  return {
    broken: imgs.filter(i => !i.complete || i.naturalWidth === 0).map(name),
    noAlt: imgs.filter(i => !(i.getAttribute('alt') || '').trim()).map(name),
    printed: document.querySelectorAll(printed.join(',')).length,
    text: document.body ? document.body.innerText : '',
    visible: Object.fromEntries(selectors.map(s => [s, inView(s)])),
  };
}"""


@dataclass(frozen=True)
class PageView:
    """What a browser made of a page (:func:`view`)."""

    url: str
    console_errors: tuple[str, ...] = ()
    broken_images: tuple[str, ...] = ()
    images_without_alt: tuple[str, ...] = ()
    printed_outputs: int = 0
    suspicious: tuple[str, ...] = ()
    first_screen: dict[str, bool] = field(default_factory=dict)
    screenshot: Path | None = None

    def problems(self) -> list[str]:
        """What a reader would trip over, one line each (empty: none)."""
        out = [f"console error: {e}" for e in self.console_errors]
        out += [f"image did not load: {i}" for i in self.broken_images]
        out += [f"image without alternative text: {i}" for i in self.images_without_alt]
        if self.printed_outputs:
            out.append(f"{self.printed_outputs} printed output(s) of a process on the page")
        out += [f"reads like a warning or a traceback: {line}" for line in self.suspicious]
        out += [f"not on the first screen: {sel}" for sel, shown in self.first_screen.items() if not shown]
        return out


def suspicious_lines(text: str) -> list[str]:
    """Lines of a page's text that read like a library's warning or a traceback."""
    return [line.strip()[:200] for line in text.splitlines() if SUSPICIOUS.search(line)]


def chromium() -> str:
    """The Chromium executable, or a one-line StackError saying how to install it."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None and Path("/usr/bin/chromium").exists():
        found = "/usr/bin/chromium"
    if found is None:
        raise StackError("Chromium is not installed: `apt-get install chromium` (make setup installs it, "
                         "scripts/system-deps.sh)")
    return found


class _Protocol:
    """One DevTools connection: commands by id, events kept in order (flattened sessions)."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.next_id = 0
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.events: list[dict[str, Any]] = []
        self.arrived = asyncio.Event()

    async def read(self) -> None:
        async for msg in self.ws:
            data = json.loads(msg.data)
            if "id" in data:
                fut = self.pending.pop(data["id"], None)
                if fut is not None and not fut.done():
                    fut.set_result(data)
            else:
                self.events.append(data)
                self.arrived.set()
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(StackError("Chromium closed the DevTools connection"))

    async def send(self, method: str, params: dict[str, Any] | None = None, *, session: str | None = None,
                   limit_s: float = 60.0) -> dict[str, Any]:
        self.next_id += 1
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.pending[self.next_id] = fut
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        await self.ws.send_str(json.dumps(msg))
        reply = await asyncio.wait_for(fut, limit_s)
        if "error" in reply:
            raise StackError(f"Chromium: {method} failed: {reply['error'].get('message')}")
        result: dict[str, Any] = reply.get("result", {})
        return result

    async def wait_for(self, method: str, session: str, limit_s: float) -> None:
        deadline = time.monotonic() + limit_s
        while not any(e.get("method") == method and e.get("sessionId") == session for e in self.events):
            self.arrived.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                raise StackError(f"Chromium: no {method} within {limit_s:g} s")
            try:
                await asyncio.wait_for(self.arrived.wait(), left)
            except TimeoutError:
                continue


def console_errors(events: Sequence[dict[str, Any]]) -> list[str]:
    """The errors among DevTools events: uncaught exceptions, ``console.error`` calls and the
    browser's own error entries (a resource that failed to load)."""
    out = []
    for e in events:
        p = e.get("params", {})
        if e.get("method") == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            out.append(str(d.get("exception", {}).get("description") or d.get("text")))
        elif e.get("method") == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.append(" ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
        elif e.get("method") == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            entry = p["entry"]
            out.append(f"{entry.get('text')} {entry.get('url', '')}".strip())
    return out


async def _devtools_port(profile: Path, proc: asyncio.subprocess.Process, logfile: Path,
                         limit_s: float) -> tuple[int, str]:
    """The port and browser path Chromium wrote to ``DevToolsActivePort`` in its profile."""
    marker = profile / "DevToolsActivePort"
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc.returncode is not None:
            last = (logfile.read_text(errors="replace").strip().splitlines() or ["(no output)"])[-1]
            raise StackError(f"Chromium exited with status {proc.returncode} before it listened: {last[:300]}")
        lines = marker.read_text().split() if marker.exists() else []
        if len(lines) >= 2:
            return int(lines[0]), lines[1]
        await asyncio.sleep(0.1)
    raise StackError(f"Chromium did not open its DevTools port within {limit_s:g} s")


async def _view(path: Path, screenshot: Path | None, viewport: tuple[int, int], selectors: Sequence[str],
                limit_s: float) -> PageView:
    import aiohttp

    url = path.resolve().as_uri()
    with tempfile.TemporaryDirectory(prefix="lab-chromium-") as tmp:
        profile = Path(tmp) / "profile"
        logpath = Path(tmp) / "chromium.log"
        logfile = open(logpath, "wb")  # noqa: SIM115  (closed below, after the process)
        proc = await asyncio.create_subprocess_exec(  # a session of its own: its helpers are stopped with it
            chromium(), *FLAGS, f"--user-data-dir={profile}", f"--window-size={viewport[0]},{viewport[1]}",
            "about:blank", stdin=asyncio.subprocess.DEVNULL, stdout=logfile, stderr=logfile, start_new_session=True)
        try:
            port, browser_path = await _devtools_port(profile, proc, logpath, limit_s)
            async with aiohttp.ClientSession() as http, http.ws_connect(
                    f"ws://127.0.0.1:{port}{browser_path}", max_msg_size=0) as ws:
                cdp = _Protocol(ws)
                reader = asyncio.create_task(cdp.read())
                try:
                    target = (await cdp.send("Target.createTarget", {"url": "about:blank"}))["targetId"]
                    session = (await cdp.send("Target.attachToTarget", {"targetId": target, "flatten": True}))[
                        "sessionId"]
                    for method in ("Page.enable", "Runtime.enable", "Log.enable"):
                        await cdp.send(method, session=session)
                    await cdp.send("Emulation.setDeviceMetricsOverride", {
                        "width": viewport[0], "height": viewport[1], "deviceScaleFactor": 1, "mobile": False},
                        session=session)
                    await cdp.send("Page.navigate", {"url": url}, session=session)
                    await cdp.wait_for("Page.loadEventFired", session, limit_s)
                    call = f"({INSPECT})({json.dumps(list(selectors))}, {json.dumps(list(PRINTED))})"
                    found = (await cdp.send("Runtime.evaluate", {"expression": call, "returnByValue": True},
                                            session=session))["result"]["value"]
                    if screenshot is not None:
                        shot = await cdp.send("Page.captureScreenshot", {
                            "format": "png", "captureBeyondViewport": False,
                            "clip": {"x": 0, "y": 0, "width": viewport[0], "height": viewport[1], "scale": 1}},
                            session=session)
                        screenshot.parent.mkdir(parents=True, exist_ok=True)
                        screenshot.write_bytes(base64.b64decode(shot["data"]))
                    errors = console_errors([e for e in cdp.events if e.get("sessionId") == session])
                finally:
                    reader.cancel()
        finally:
            await _stop(proc)
            logfile.close()
    return PageView(url, tuple(errors), tuple(found["broken"]), tuple(found["noAlt"]), int(found["printed"]),
                    tuple(suspicious_lines(found["text"])), dict(found["visible"]), screenshot)


async def _stop(proc: asyncio.subprocess.Process, limit_s: float = 10.0) -> None:
    """Stop Chromium and every helper it started (its renderer, zygote, crash handler: one process group,
    the group of the pid it was started with), so that nothing writes to its profile any more."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if proc.returncode is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(proc.wait(), 0.1)
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return  # the whole group is gone
            await asyncio.sleep(0.05)


def view(path: Path, *, screenshot: Path | None = None, viewport: tuple[int, int] = VIEWPORT,
         selectors: Sequence[str] = FIRST_SCREEN, timeout: float = 60.0) -> PageView:
    """Open the local page ``path`` in headless Chromium at ``viewport`` and say what it shows
    (:class:`PageView`); ``screenshot``: also write the first screen there as PNG."""
    log.info("opening %s in headless Chromium at %dx%d", path, *viewport)
    return asyncio.run(_view(path, screenshot, viewport, selectors, timeout))
