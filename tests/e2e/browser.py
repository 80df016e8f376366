"""Headless Chromium driven through chromedriver's W3C WebDriver HTTP API (Debian's `chromium` and
`chromium-driver`, `make browser`), with `requests`: no Selenium in the lock for a handful of calls.

The flags are the ones measured to work here as root and offline (../shared/ENVIRONMENT.md): no
sandbox, no GPU, and nothing that reaches outside hosts (background networking, component updates).
"""

from __future__ import annotations

import base64
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import requests

CHROMIUM, CHROMEDRIVER = "chromium", "chromedriver"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,900",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Browser:
    """One chromedriver process and one browser session; `close` ends both."""

    def __init__(self, timeout: float = 60) -> None:
        self.port, self.timeout = _free_port(), timeout
        self.profile = tempfile.mkdtemp(prefix="chromium-")
        self.driver = subprocess.Popen(
            [CHROMEDRIVER, f"--port={self.port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self.base = f"http://127.0.0.1:{self.port}"
        self._wait(lambda: requests.get(f"{self.base}/status", timeout=2).json()["value"]["ready"], 30)
        options = {"binary": shutil.which(CHROMIUM), "args": [*ARGS, f"--user-data-dir={self.profile}"]}
        caps = {"capabilities": {"alwaysMatch": {"goog:chromeOptions": options}}}
        self.session = self._call("post", "/session", caps)["sessionId"]

    def _call(self, method: str, path: str, body: dict | None = None):
        body = body if body is not None else {}
        reply = requests.request(method, f"{self.base}{path}", json=body, timeout=self.timeout)
        value = reply.json()["value"]
        if reply.status_code != 200:
            raise RuntimeError(f"webdriver {method} {path}: {value.get('message', value)}")
        return value

    def _s(self, method: str, path: str, body: dict | None = None):
        return self._call(method, f"/session/{self.session}{path}", body)

    @staticmethod
    def _wait(probe: Callable[[], object], timeout: float) -> object:
        deadline, last = time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            try:
                if found := probe():
                    return found
            except (requests.RequestException, RuntimeError, KeyError, ValueError) as err:
                last = err
            time.sleep(0.5)
        raise TimeoutError(f"not within {timeout:g}s (last error: {last})")

    def open(self, url: str) -> None:
        self._s("post", "/url", {"url": url})

    def script(self, source: str, *args: object) -> object:
        """Run `source` (a function body) in the page; its return value."""
        return self._s("post", "/execute/sync", {"script": source, "args": list(args)})

    def wait_for(self, source: str, timeout: float, *args: object) -> object:
        """Poll a script until it returns something truthy (the page is a single-page app)."""
        return self._wait(lambda: self.script(source, *args), timeout)

    def frame(self, index: int | None) -> None:
        """Switch into the page's iframe number `index` (TensorBoard's plugins live in one); None: back out."""
        self._s("post", "/frame", {"id": index})

    def png(self) -> bytes:
        """The viewport as drawn, PNG."""
        return base64.b64decode(self._s("get", "/screenshot"))

    def screenshot(self, path: Path) -> None:
        path.write_bytes(self.png())

    def close(self) -> None:
        try:
            self._call("delete", f"/session/{self.session}")
        finally:
            self.driver.terminate()
            self.driver.wait(timeout=10)
            shutil.rmtree(self.profile, ignore_errors=True)
