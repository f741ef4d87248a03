"""Running the in-process target: libFuzzer in fork mode with its status lines read as a
timeline, an input minimised with -minimize_crash, an artifact re-run for its report."""

from __future__ import annotations

import os
import re
import resource
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .config import NO_RSS_THREAD


_STATUS = re.compile(r"^#(?P<execs>\d+)[:\s]+(?:\w+\s+)?cov: (?P<cov>\d+) ft: (?P<ft>\d+) "
                     r"corp: (?P<corp>\d+)(?:/\S+)?(?: .*?exec/s:? (?P<eps>\d+))?"
                     r"(?: .*?oom/timeout/crash: (?P<oom>\d+)/(?P<timeout>\d+)/(?P<crash>\d+))?")


@dataclass
class Timeline:
    """libFuzzer's status lines: (seconds, executions, edges, features, corpus, crashes)."""

    points: list = field(default_factory=list)
    t0: float = field(default_factory=time.monotonic)

    def feed(self, line: str) -> dict | None:
        m = _STATUS.match(line)
        if not m:
            return None
        p = {"t": round(time.monotonic() - self.t0, 1), "execs": int(m.group("execs")),
             "edges": int(m.group("cov")), "features": int(m.group("ft")),
             "corpus": int(m.group("corp")), "crashes": int(m.group("crash") or 0),
             "ooms": int(m.group("oom") or 0), "timeouts": int(m.group("timeout") or 0)}
        self.points.append(p)
        return p

    @property
    def last(self) -> dict:
        return self.points[-1] if self.points else {"execs": 0, "edges": 0, "features": 0,
                                                     "corpus": 0, "crashes": 0}

    def sampled(self, n: int = 20) -> list:
        """At most ``n`` points, evenly spread, the last one included."""
        if len(self.points) <= n:
            return list(self.points)
        step = len(self.points) / n
        return [self.points[int(i * step)] for i in range(n - 1)] + [self.points[-1]]


def children_cpu() -> float:
    """CPU seconds (user + system) of every child process waited for so far, theirs included."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_fuzzer(binary: Path, args: list[str], env: dict, log: Path, timeline: Timeline,
                hard_stop: float, on_line: Callable[[dict], None] | None) -> int:
    nice = shutil.which("nice")
    proc = subprocess.Popen(([nice] if nice else []) + [str(binary), *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            errors="replace", start_new_session=True)

    def kill_group() -> None:
        # The whole group: fork-mode jobs (and the shells that run them, which hold the
        # stderr pipe) outlive a killed parent, and a stuck one would keep this read open.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    killer = threading.Timer(max(hard_stop - time.monotonic(), 1.0), kill_group)
    killer.start()
    try:
        with open(log, "w") as f:
            assert proc.stderr is not None
            for line in proc.stderr:
                f.write(line)
                p = timeline.feed(line)
                if p is not None and on_line is not None:
                    on_line(p)
    finally:
        killer.cancel()
        # Jobs still running after the parent ended (none when it wrapped up); before the
        # parent is reaped, so the group id cannot have been reused.
        kill_group()
        rc = proc.wait()
    return rc


def rerun(binary: Path, data_path: Path, env: dict, timeout: float) -> str | None:
    """One input through the target, aborting like the server and tracing commands: its log,
    or None when it ran to the end (a recoverable report alone is no failure)."""
    env = dict(env, HARNESS_FUZZ_TRACE="1", HARNESS_FUZZ_ABORT="1")
    env.pop("HARNESS_FUZZ_EVENTS", None)
    try:
        r = subprocess.run([str(binary), NO_RSS_THREAD, f"-timeout={max(int(timeout), 1)}",
                            str(data_path)],
                           env=env, capture_output=True, text=True, errors="replace",
                           timeout=timeout * 3 + 30)
    except subprocess.TimeoutExpired as e:
        out = e.stderr or b""
        return out.decode(errors="replace") if isinstance(out, bytes) else out
    return r.stderr if r.returncode != 0 else None
