"""The accessibility check of the report pages: axe-core run in a real headless Chromium.

axe-core (Deque's rule engine, the one browsers' own audits use) comes from the npm registry
into the harness cache the first time it is needed (``npm install axe-core@AXE_VERSION``; node
and npm from Debian). Chromium is driven over its DevTools pipe (``--remote-debugging-pipe``:
null-terminated JSON on file descriptors 3 and 4), so no websocket library or driver binary is
needed. :func:`audit` loads one page at a laptop's viewport (1366 x 768), runs axe's WCAG 2.x A
and AA rules on it and returns each violation; it can save a screenshot of that first screen.
"""

from __future__ import annotations

import base64
import json
import os
import select
import signal
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import HarnessError
from .browser import find_chromium

AXE_VERSION = "4.10.3"
VIEWPORT = (1366, 768)
RULE_TAGS = ("wcag2a", "wcag2aa", "wcag21a", "wcag21aa")
_TIMEOUT = 60.0
_MAX_MESSAGE = 64 << 20  # a DevTools message larger than this is an error, not a read


class AccessibilityUnavailable(HarnessError):
    """No Chromium, or axe-core cannot be fetched (no npm, no registry)."""


class DevToolsError(HarnessError):
    """Chromium's DevTools answered with an error, closed its pipe or went silent."""


@dataclass(frozen=True)
class A11yViolation:
    rule: str
    impact: str
    help: str
    nodes: int
    first: str  # the CSS selector of the first element it names

    @property
    def line(self) -> str:
        return f"{self.rule} ({self.impact}): {self.help}: {self.nodes} element(s), e.g. {self.first}"


def _cache_root() -> Path:
    from ..impls.cache import cache_root
    return cache_root()


def ensure_axe(timeout: float = 300.0) -> Path:
    """axe.min.js of AXE_VERSION, installed into the harness cache on first use."""
    prefix = _cache_root() / "axe" / AXE_VERSION
    script = prefix / "node_modules" / "axe-core" / "axe.min.js"
    if script.is_file():
        return script
    npm = shutil.which("npm")
    if npm is None:
        raise AccessibilityUnavailable("no npm on PATH (Debian: apt-get install npm): "
                                       "axe-core comes from the npm registry")
    prefix.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([npm, "install", "--silent", "--no-audit", "--no-fund", "--prefix",
                           str(prefix), f"axe-core@{AXE_VERSION}"], capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if proc.returncode != 0 or not script.is_file():
        raise AccessibilityUnavailable(f"npm install axe-core@{AXE_VERSION} failed "
                                       f"(rc={proc.returncode}): {proc.stderr.strip()[-500:]}")
    return script


class DevTools:
    """One headless Chromium driven over its DevTools pipe; a context manager that reaps it."""

    def __init__(self, timeout: float = _TIMEOUT):
        exe = find_chromium()
        if exe is None:
            raise AccessibilityUnavailable("no chromium on PATH (Debian: apt-get install "
                                           "chromium)")
        self.timeout = timeout
        self._profile = tempfile.TemporaryDirectory(prefix="ggml-rpc-devtools-")
        to_chrome_r, self._out = os.pipe()
        self._in, from_chrome_w = os.pipe()

        def onto_3_and_4() -> None:  # in the child: the pipe's ends where Chromium reads them
            a, b = os.dup(to_chrome_r), os.dup(from_chrome_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--hide-scrollbars",
             "--force-device-scale-factor=1", "--remote-debugging-pipe",
             f"--user-data-dir={self._profile.name}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            close_fds=False, preexec_fn=onto_3_and_4,
            start_new_session=True)  # its helpers share its group: close() stops them all
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buf = b""
        self._id = 0
        self._events: list[dict] = []

    def __enter__(self) -> DevTools:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for fd in (self._out, self._in):
            try:
                os.close(fd)
            except OSError:
                pass
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        # Chromium's helper processes outlive it for a moment and still write the profile
        # (stop 38's CI: "Directory not empty: 'Default'" from the cleanup): stop the group,
        # then remove the profile once nothing writes it any more
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass  # the group is gone already
        deadline = time.monotonic() + 10
        while True:
            try:
                self._profile.cleanup()  # again after a failure: what is left, if anything
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._in], [], [], left)[0]:
                raise DevToolsError(f"chromium sent nothing for {self.timeout:.0f} s")
            chunk = os.read(self._in, 1 << 20)
            if not chunk:
                raise DevToolsError(f"chromium closed its DevTools pipe "
                                    f"(exit {self.proc.poll()})")
            self._buf += chunk
            if len(self._buf) > _MAX_MESSAGE:
                raise DevToolsError("a DevTools message over 64 MiB")
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method: str, session: str | None = None, **params) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params}
        if session is not None:
            msg["sessionId"] = session
        os.write(self._out, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise DevToolsError(f"{method}: {reply['error'].get('message')}")
                return reply.get("result", {})
            self._events.append(reply)

    def wait_event(self, method: str, session: str) -> dict:
        deadline = time.monotonic() + self.timeout
        while True:
            for i, e in enumerate(self._events):
                if e.get("method") == method and e.get("sessionId") == session:
                    return self._events.pop(i)
            self._events.append(self._read_message(deadline))

    def open(self, url: str, viewport: tuple[int, int] = VIEWPORT) -> str:
        """A new tab at ``url`` of ``viewport`` size, loaded; returns its session id."""
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Page.enable", session)
        self.call("Emulation.setDeviceMetricsOverride", session, width=viewport[0],
                  height=viewport[1], deviceScaleFactor=1, mobile=False)
        self.call("Page.navigate", session, url=url)
        self.wait_event("Page.loadEventFired", session)
        return session

    def evaluate(self, session: str, expression: str):
        result = self.call("Runtime.evaluate", session, expression=expression,
                           awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in result:
            raise DevToolsError(f"the page's script failed: "
                                f"{result['exceptionDetails'].get('text')}: "
                                f"{result['exceptionDetails'].get('exception', {})}")
        return result["result"].get("value")

    def screenshot(self, session: str, out: Path) -> Path:
        data = self.call("Page.captureScreenshot", session, format="png")["data"]
        out.write_bytes(base64.b64decode(data))
        return out


def audit(pages: list[Path], *, screenshots: Path | None = None,
          viewport: tuple[int, int] = VIEWPORT) -> dict[Path, list[A11yViolation]]:
    """axe-core's WCAG 2.x A/AA violations of each page (empty list: none); with
    ``screenshots``, the first screen of each page is saved there as <page name>.png."""
    axe = ensure_axe().read_text()
    run = ("axe.run(document, {runOnly: {type: 'tag', values: %s}, resultTypes: ['violations']})"
           ".then(r => r.violations.map(v => ({id: v.id, impact: v.impact || '', help: v.help,"
           " nodes: v.nodes.length, first: (v.nodes[0] && v.nodes[0].target.join(' ')) || ''})))"
           % json.dumps(list(RULE_TAGS)))
    found: dict[Path, list[A11yViolation]] = {}
    with DevTools() as dt:
        for page in pages:
            session = dt.open(Path(page).resolve().as_uri(), viewport)
            dt.evaluate(session, axe)
            found[page] = [A11yViolation(v["id"], v["impact"], v["help"], v["nodes"], v["first"])
                           for v in dt.evaluate(session, run)]
            if screenshots is not None:
                screenshots.mkdir(parents=True, exist_ok=True)
                dt.screenshot(session, screenshots / f"{Path(page).stem}.png")
    return found
