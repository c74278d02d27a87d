"""A headless Chromium driven over the DevTools protocol (aiohttp's websocket client):
the installed binary, never a downloaded browser. Used by the dashboard tests.

``Browser.find()`` is the binary or None; ``async with Browser(binary, tmp) as b``
starts it on a free port (read from ``DevToolsActivePort``), opens one page and stops
it on exit. Console errors, uncaught exceptions and CSP violations are collected in
``b.errors``.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "chrome")


class Browser:
    def __init__(self, binary: str, workdir: Path, *, width: int = 1400,
                 height: int = 900) -> None:
        self.binary, self.workdir = binary, Path(workdir)
        self.width, self.height = width, height
        self.errors: list[str] = []
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._process: subprocess.Popen | None = None
        self._session: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._reader: asyncio.Task | None = None

    @staticmethod
    def find() -> str | None:
        return next((p for p in map(shutil.which, CANDIDATES) if p), None)

    async def __aenter__(self) -> "Browser":
        profile = self.workdir / "chromium-profile"
        profile.mkdir(parents=True, exist_ok=True)
        self._process = subprocess.Popen(
            [self.binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--hide-scrollbars",
             f"--window-size={self.width},{self.height}", f"--user-data-dir={profile}",
             "--remote-debugging-port=0", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=(self.workdir / "chromium.log").open("wb"))
        try:
            port = await self._port(profile / "DevToolsActivePort")
            self._session = aiohttp.ClientSession()
            async with self._session.put(f"http://127.0.0.1:{port}/json/new?about:blank") as r:
                target = await r.json(content_type=None)
            self._ws = await self._session.ws_connect(target["webSocketDebuggerUrl"],
                                                      max_msg_size=64 * 2**20)
            self._reader = asyncio.get_running_loop().create_task(self._read())
            for domain in ("Page", "Runtime", "Log"):
                await self.send(f"{domain}.enable")
            await self.send("Emulation.setDeviceMetricsOverride", width=self.width,
                            height=self.height, deviceScaleFactor=1, mobile=False)
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._reader is not None:
            self._reader.cancel()
        if self._ws is not None:
            await self._ws.close()
        if self._session is not None:
            await self._session.close()
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()

    async def _port(self, path: Path, timeout: float = 30.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                log = (self.workdir / "chromium.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"chromium exited with {self._process.returncode}: {log}")
            if path.exists() and path.read_text().strip():
                return int(path.read_text().split()[0])
            await asyncio.sleep(0.05)
        raise TimeoutError(f"chromium wrote no {path.name} within {timeout}s")

    async def _read(self) -> None:
        async for message in self._ws:
            data = json.loads(message.data)
            if "id" in data:
                future = self._pending.pop(data["id"], None)
                if future is not None and not future.done():
                    future.set_result(data)
            elif data.get("method") == "Runtime.exceptionThrown":
                details = data["params"]["exceptionDetails"]
                self.errors.append(details.get("exception", {}).get("description")
                                   or details.get("text", "exception"))
            elif data.get("method") == "Log.entryAdded":
                entry = data["params"]["entry"]
                if entry["level"] == "error":
                    self.errors.append(f"{entry['source']}: {entry['text']}")
            elif data.get("method") == "Runtime.consoleAPICalled":
                if data["params"]["type"] == "error":
                    self.errors.append("console: " + " ".join(
                        str(a.get("value", a.get("description"))) for a in data["params"]["args"]))

    async def send(self, method: str, **params: Any) -> dict:
        """One DevTools command; its ``result`` (a protocol error raises)."""
        ident = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._pending[ident] = future
        await self._ws.send_json({"id": ident, "method": method, "params": params})
        data = await asyncio.wait_for(future, 30)
        if "error" in data:
            raise RuntimeError(f"{method}: {data['error']}")
        return data["result"]

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited)."""
        result = await self.send("Runtime.evaluate", expression=expression,
                                 returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def open(self, url: str) -> None:
        """Navigate and wait for the document to finish loading."""
        await self.send("Page.navigate", url=url)
        await self.wait_for("document.readyState === 'complete' && location.href !== "
                            "'about:blank'")

    async def wait_for(self, expression: str, timeout: float = 15.0) -> Any:
        """Poll ``expression`` until it is truthy; its value. TimeoutError names it."""
        deadline = time.monotonic() + timeout
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"still false after {timeout}s: {expression}\n"
                                   f"errors: {self.errors}")
            await asyncio.sleep(0.1)

    async def screenshot(self, path: Path, full_page: bool = True) -> bytes:
        """A PNG of the page (the whole document with ``full_page``) written to ``path``."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = await self.evaluate(  # the content, not the empty viewport below it
                "[document.documentElement.scrollWidth, "
                "Math.ceil(document.body.getBoundingClientRect().height)]")
            params.update(captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": size[0], "height": size[1],
                                "scale": 1})
        png = base64.b64decode((await self.send("Page.captureScreenshot", **params))["data"])
        Path(path).write_bytes(png)
        return png
