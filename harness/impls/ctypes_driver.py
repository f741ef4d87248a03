"""The real llama.cpp client library as a ``ClientDriver``: a ctypes agent in a subprocess.

The agent (``harness.impls.ctypes_agent``) runs each step with the build's own libggml-rpc.
The library aborts its process on protocol errors, so the agent lives in a child process of
its own (own process group); its death becomes ``ClientAborted`` with an ``ExitInfo`` that
says how it ended and what the library printed last. Every read has a deadline: a step that
gets no answer kills the agent and raises ``ClientHung``.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

from .driver import ClientAborted, ClientDriver, ExitInfo, StepFailed, StepResult
from .built_peer import client_library_env
from .supervisor import REAL_PROCESS_ENV

DEFAULT_STEP_TIMEOUT = 60.0
STARTUP_TIMEOUT = 30.0
EXIT_GRACE = 5.0  # after EOF or close, how long the process may take to be reaped
LOG_LINES = 400

# What the library prints before it aborts, most telling first. The message is the first
# line matching the earliest pattern, so "version mismatch" wins over the generic
# "RPC handshake failed" that follows it.
_CAUSES = [re.compile(p) for p in (
    r"RPC server version mismatch: \S+",
    r"Remote RPC server crashed or returned malformed response",
    r"Failed to connect to \S+",
    r"RPC handshake failed for \S+",
    r"Failed to parse endpoint: \S+",
    r"GGML_ASSERT\(.*\) failed",
    r"(send|recv) failed.*",
)]
_ABORT_LINE = re.compile(r"^\S+\.(?:c|cpp|h):\d+: (.+)$")  # ggml_abort's "file:line: message"
_ABORT_TEXT = ("GGML_ABORT", "GGML_ASSERT", "Remote RPC server crashed", "handshake failed",
               "version mismatch")


class ClientHung(ClientAborted):
    """No answer within the deadline: the agent was killed. ``exit_info.returncode`` is None."""


def _package_root() -> str:
    return str(Path(__file__).resolve().parents[2])


def classify_exit(returncode: int | None, log: list[str]) -> ExitInfo:
    """Turn a finished process's return code and stderr into an ExitInfo."""
    sig = -returncode if returncode is not None and returncode < 0 else None
    if returncode == 128 + signal.SIGABRT:
        sig = int(signal.SIGABRT)  # reported through a shell as 134
    text = "\n".join(log)
    # A custom abort handler may exit instead of raising SIGABRT; the text still says abort.
    aborted = sig == signal.SIGABRT or (
        returncode not in (0, None) and any(t in text for t in _ABORT_TEXT))
    # A clean exit has no error line unless the library named a cause anyway.
    message = last_error(log, causes_only=returncode == 0)
    return ExitInfo(returncode=returncode, signal=sig, aborted=aborted, message=message,
                    log_tail=list(log[-40:]))


def last_error(log: list[str], causes_only: bool = False) -> str:
    """The library's most telling error line, e.g. "RPC server version mismatch: 9.0.0"."""
    for pat in _CAUSES:
        for line in log:
            m = pat.search(line)
            if m:
                return m.group(0)
    if causes_only:
        return ""
    for line in reversed(log):
        m = _ABORT_LINE.match(line.strip())
        if m:
            return m.group(1)
    for line in reversed(log):
        if line.strip():
            return line.strip()
    return ""


class CtypesClientDriver(ClientDriver):
    """One session of the real client library from ``lib_dir`` (a build's bin dir).

    ``proto`` ("X.Y.Z") tells the agent which library it has (pre-5 has no memset).
    ``env`` adds variables for the agent (e.g. GGML_RPC_DEBUG=1). ``step_timeout`` bounds
    each step, ``session_timeout`` the whole session (None: no bound beyond the steps).
    """

    name = "ctypes"
    agent_module = "harness.impls.ctypes_agent"  # subclasses run an extended agent

    def __init__(self, lib_dir: str | os.PathLike, *, proto: str | None = None,
                 env: dict[str, str] | None = None, step_timeout: float = DEFAULT_STEP_TIMEOUT,
                 session_timeout: float | None = None, python: str | None = None,
                 name: str | None = None):
        self.lib_dir = Path(lib_dir)
        self.proto = proto
        self.extra_env = dict(env or {})
        self.step_timeout = step_timeout
        self.session_timeout = session_timeout
        self.python = python or sys.executable
        if name:
            self.name = name
        self.proc: subprocess.Popen | None = None
        self.ready: dict = {}
        self.exit_info: ExitInfo | None = None
        self._events: queue.Queue = queue.Queue()
        self._log: deque[str] = deque(maxlen=LOG_LINES)
        self._threads: list[threading.Thread] = []
        self._n = 0
        self._t_start = 0.0

    # -- process -----------------------------------------------------------------------------

    def start(self) -> dict:
        """Spawn the agent and wait for it to load the libraries; returns its ready event."""
        if self.proc is not None:
            return self.ready
        env = {k: v for k, v in os.environ.items()
               if k not in ("LD_PRELOAD", "GGML_RPC_SERVERS")}  # never inherit the model shim
        env.update(REAL_PROCESS_ENV)  # ggml would attach gdb before aborting
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_package_root(), env.get("PYTHONPATH"))
                                            if p)
        env.update(client_library_env(self.lib_dir))
        env.update(self.extra_env)
        cmd = [self.python, "-u", "-m", self.agent_module, "--lib-dir", str(self.lib_dir)]
        if self.proto:
            cmd += ["--proto", self.proto]
        self._t_start = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=env, start_new_session=True,
                                     bufsize=0)
        for target, stream in ((self._read_events, self.proc.stdout),
                               (self._read_log, self.proc.stderr)):
            t = threading.Thread(target=target, args=(stream,), daemon=True,
                                 name=f"{self.name}-agent-{target.__name__}")
            t.start()
            self._threads.append(t)
        ev = self._wait_event(-1, "startup", STARTUP_TIMEOUT, None)
        if not ev.get("ok"):
            # The agent reports a load failure and exits; collect how it ended.
            info = self._finish(EXIT_GRACE)
            info.message = ev.get("error") or info.message
            raise ClientAborted(info, None)
        self.ready = ev.get("result", {})
        return self.ready

    def _read_events(self, stream) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").strip()
            if not line:
                continue
            try:
                self._events.put(json.loads(line))
            except json.JSONDecodeError:
                self._log.append(f"[agent stdout] {line}")
        self._events.put(None)  # EOF: the agent is gone

    def _read_log(self, stream) -> None:
        for raw in iter(stream.readline, b""):
            self._log.append(raw.decode("utf-8", "replace").rstrip("\n"))

    def _deadline(self, step_timeout: float) -> tuple[float, str]:
        """Seconds left for this step, and how to describe running out of them."""
        if self.session_timeout is None:
            return step_timeout, f"within {step_timeout:g} s"
        left = self.session_timeout - (time.monotonic() - self._t_start)
        if left < step_timeout:
            return max(left, 0.0), f"within the session deadline of {self.session_timeout:g} s"
        return step_timeout, f"within {step_timeout:g} s"

    def _wait_event(self, i: int, op: str, timeout: float, step: dict | None) -> dict:
        if step is None:  # start-up is outside the session deadline
            why = f"within {timeout:g} s"
        else:
            timeout, why = self._deadline(timeout)
        end = time.monotonic() + timeout
        while True:
            try:
                ev = self._events.get(timeout=max(end - time.monotonic(), 0.001))
            except queue.Empty:
                self._kill()
                info = self._finish(EXIT_GRACE)
                info.returncode, info.signal, info.aborted = None, None, False
                info.message = f"hang: no answer to {op} {why}"
                self.exit_info = info
                raise ClientHung(info, step) from None
            if ev is None:
                info = self._finish(EXIT_GRACE)
                raise ClientAborted(info, step)
            if ev.get("i") == i:
                return ev
            self._log.append(f"[agent] unexpected event {ev}")

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # the agent leads its own group
            except ProcessLookupError:
                pass

    def _finish(self, grace: float) -> ExitInfo:
        """Reap the agent (killing it after ``grace`` s), drain its pipes, classify the end."""
        proc = self.proc
        try:
            rc = proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self._kill()
            rc = proc.wait(timeout=grace)
        for t in self._threads:
            t.join(timeout=grace)  # stderr is complete once its reader saw EOF
        for s in (proc.stdin, proc.stdout, proc.stderr):
            try:
                s.close()
            except (OSError, ValueError):
                pass
        self.exit_info = classify_exit(rc, list(self._log))
        return self.exit_info

    # -- ClientDriver ------------------------------------------------------------------------

    def run(self, step: dict) -> StepResult:
        if self.exit_info is not None:
            raise ClientAborted(self.exit_info, step)
        self.start()
        i = self._n
        self._n += 1
        op = str(step.get("op"))
        try:
            self.proc.stdin.write((json.dumps({**step, "i": i}) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise ClientAborted(self._finish(EXIT_GRACE), step) from None
        ev = self._wait_event(i, op, float(step.get("timeout", self.step_timeout)), step)
        res = StepResult(i=i, op=ev.get("op", op), ok=bool(ev.get("ok")),
                         result=ev.get("result") or {}, error=ev.get("error", ""),
                         t0=ev.get("t0", 0.0), t1=ev.get("t1", 0.0))
        if op == "close" and res.ok:
            self._finish(EXIT_GRACE)
        if not res.ok:
            raise StepFailed(res)
        return res

    def close(self) -> ExitInfo | None:
        """End the session: a close step if the agent still runs, then reap it."""
        if self.proc is None:
            return None
        if self.exit_info is None:
            try:
                self.run({"op": "close", "timeout": min(self.step_timeout, 10.0)})
            except (ClientAborted, StepFailed):
                pass
            if self.exit_info is None:
                self._kill()
                self._finish(EXIT_GRACE)
        return self.exit_info

    def log_tail(self, n: int = 20) -> list[str]:
        return list(self._log)[-n:]

    def __del__(self):
        # Last resort only; sessions end through close(). Never leave an agent behind.
        if getattr(self, "proc", None) is not None and self.exit_info is None:
            self._kill()
            try:
                self.proc.wait(timeout=1)
            except Exception:  # noqa: BLE001
                pass
