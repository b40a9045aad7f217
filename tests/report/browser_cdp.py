"""A headless Chromium driven over the DevTools protocol (CDP) with aiohttp's websocket client: just
enough to open a page, collect its JavaScript errors, evaluate expressions and take screenshots.

    with Browser(tmp_path) as browser:
        page = browser.open(url, wait_for=PLOTS_DONE)
        page.errors            # uncaught exceptions, console errors and dialogs (alert, confirm...), as text
        page.evaluate("1 + 1")
        page.screenshot(path)  # the full page as PNG
"""

from __future__ import annotations

import asyncio
import base64
import json
import itertools
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

START_TIMEOUT_S = 30.0
# True once a latscope page (report, compare, capacity) has drawn all its plots: it sets this attribute.
PLOTS_DONE = "document.body.getAttribute('data-plots') === 'done'"


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if path := shutil.which(name):
            return path
    return None


@dataclass
class Page:
    browser: "Browser"
    ws: aiohttp.ClientWebSocketResponse
    errors: list[str] = field(default_factory=list)
    console: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)  # alert/confirm/prompt messages, each dismissed at once
    _ids: itertools.count = field(default_factory=lambda: itertools.count(1))
    _events: list[dict] = field(default_factory=list)

    async def _send(self, method: str, params: dict | None = None, timeout: float = 30.0) -> dict:
        message_id = next(self._ids)
        await self.ws.send_json({"id": message_id, "method": method, "params": params or {}})
        deadline = time.monotonic() + timeout
        while True:
            message = await self.ws.receive_json(timeout=max(0.1, deadline - time.monotonic()))
            if message.get("id") == message_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self._event(message)

    def _event(self, message: dict) -> None:
        method, params = message.get("method"), message.get("params", {})
        self._events.append(message)
        if method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            self.errors.append(details.get("exception", {}).get("description") or details.get("text", "exception"))
        elif method == "Runtime.consoleAPICalled":
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
            self.console.append(f"{params.get('type')}: {text}")
            if params.get("type") in ("error", "assert"):
                self.errors.append(f"console.{params.get('type')}: {text}")
        elif method == "Page.javascriptDialogOpening":
            # A dialog blocks the page (and every evaluate) until answered: dismiss it and say so, so an
            # injected alert(1) fails a test with its message instead of a load timeout.
            self.dialogs.append(f"{params.get('type')}: {params.get('message')}")
            self.errors.append(f"dialog {self.dialogs[-1]}")
            asyncio.ensure_future(self.ws.send_json({"id": next(self._ids), "method": "Page.handleJavaScriptDialog",
                                                     "params": {"accept": False}}))
        elif method == "Log.entryAdded":
            entry = params.get("entry", {})
            if entry.get("level") == "error":
                self.errors.append(f"log: {entry.get('text')} ({entry.get('url', '')})")

    async def _drain(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                self._event(await self.ws.receive_json(timeout=left))
            except asyncio.TimeoutError:
                return

    def run(self, coro):
        return self.browser.loop.run_until_complete(coro)

    def evaluate(self, expression: str) -> Any:
        result = self.run(self._send("Runtime.evaluate", {"expression": expression, "returnByValue": True}))
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, path: Path, width: int = 1280, max_height: int | None = None, scale: float = 1.0) -> Path:
        """The page (its full height, or the top max_height CSS pixels) as a PNG at `scale`."""

        async def shoot() -> bytes:
            metrics = await self._send("Page.getLayoutMetrics")
            height = int(metrics["cssContentSize"]["height"])
            if max_height:
                height = min(height, max_height)
            await self._send("Emulation.setDeviceMetricsOverride",
                             {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
            await self._drain(0.5)  # let plotly's responsive resize settle
            shot = await self._send("Page.captureScreenshot", {
                "format": "png", "captureBeyondViewport": True,
                "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": scale}}, timeout=60)
            return base64.b64decode(shot["data"])

        path.write_bytes(self.run(shoot()))
        return path


    def screenshot_of(self, selector: str, path: Path, width: int = 1280, scale: float = 1.0) -> Path:
        """The element matching CSS `selector` as a PNG (the page laid out `width` pixels wide)."""

        async def shoot() -> bytes:
            metrics = await self._send("Page.getLayoutMetrics")
            await self._send("Emulation.setDeviceMetricsOverride", {
                "width": width, "height": int(metrics["cssContentSize"]["height"]), "deviceScaleFactor": 1, "mobile": False})
            await self._drain(0.5)  # let plotly's responsive resize settle
            found = await self._send("Runtime.evaluate", {"returnByValue": True, "expression":
                f"(() => {{ const r = document.querySelector({json.dumps(selector)}).getBoundingClientRect();"
                " return [r.left + scrollX, r.top + scrollY, r.width, r.height]; })()"})
            x, y, w, h = found["result"]["value"]
            shot = await self._send("Page.captureScreenshot", {
                "format": "png", "captureBeyondViewport": True,
                "clip": {"x": x, "y": y, "width": w, "height": h, "scale": scale}}, timeout=60)
            return base64.b64decode(shot["data"])

        path.write_bytes(self.run(shoot()))
        return path


class Browser:
    def __init__(self, tmp_path: Path, width: int = 1280, height: int = 900):
        self.tmp_path, self.width, self.height = tmp_path, width, height
        self.loop = asyncio.new_event_loop()
        self.session: aiohttp.ClientSession | None = None
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> "Browser":
        binary = chromium_path()
        profile = Path(tempfile.mkdtemp(prefix="chromium-profile-", dir=self.tmp_path))  # fresh: no stale port file
        self.process = subprocess.Popen(
            [binary, "--headless", "--remote-debugging-port=0", f"--user-data-dir={profile}", "--no-sandbox",
             "--disable-gpu", "--no-first-run", "--no-default-browser-check", "--disable-extensions",
             "--allow-file-access-from-files", f"--window-size={self.width},{self.height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=(self.tmp_path / "chromium.log").open("wb"), start_new_session=True)
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.process.poll() is not None or time.monotonic() > deadline:
                log = (self.tmp_path / "chromium.log").read_text(errors="replace")[-2000:]
                self.__exit__(None, None, None)
                raise RuntimeError(f"chromium did not start (exit code {self.process.returncode}):\n{log}")
            time.sleep(0.05)
        self.port = int(port_file.read_text().split()[0])
        self.session = self.loop.run_until_complete(self._session())
        return self

    async def _session(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession()

    def open(self, url: str, wait_for: str | None = None, timeout_s: float = 60.0) -> Page:
        """A new tab at `url` with errors collected from the start; waits for the load event and,
        when given, until the JavaScript expression `wait_for` is true."""

        async def open_page() -> Page:
            base = f"http://127.0.0.1:{self.port}"
            async with self.session.put(f"{base}/json/new?about:blank") as response:
                target = await response.json()
            ws = await self.session.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0)
            page = Page(self, ws)
            for domain in ("Runtime", "Log", "Page"):
                await page._send(f"{domain}.enable")
            await page._send("Emulation.setDeviceMetricsOverride",
                             {"width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False})
            await page._send("Page.navigate", {"url": url})
            deadline = time.monotonic() + timeout_s
            while not any(e.get("method") == "Page.loadEventFired" for e in page._events):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{url} did not load within {timeout_s} s")
                await page._drain(0.2)
            return page

        page = self.loop.run_until_complete(open_page())
        if wait_for:
            deadline = time.monotonic() + timeout_s
            while not page.evaluate(f"!!({wait_for})"):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{wait_for!r} still false after {timeout_s} s; errors: {page.errors}")
                page.run(page._drain(0.2))
        page.run(page._drain(0.3))  # late errors
        return page

    def __exit__(self, *exc: object) -> None:
        if self.session is not None:
            self.loop.run_until_complete(self.session.close())
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.loop.close()
