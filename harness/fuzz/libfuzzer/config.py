"""The in-process campaign's configuration and the target's environment: the sanitizer
runtimes' options, the allocation cap while fuzzing, the RSS baseline the bound sits on,
libFuzzer's arguments."""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ...impls.sanitize import UBSAN_SUPPRESSIONS
from ...impls.supervisor import REAL_PROCESS_ENV
from ..target import DEFAULT_AS_LIMIT, DEFAULT_RSS_LIMIT
from ..signature import vm_hwm
from .build import tool


ENGINE = "libfuzzer"


SANITIZE = ("address", "undefined")  # what the in-process target is built with


MAX_RERUNS = 40  # artifacts re-run for their report (smallest first)


# The server's allocations above this fail while the campaign fuzzes (the target's
# HARNESS_FUZZ_ALLOC_LIMIT): under ASan a buffer of S bytes costs S/8 bytes of shadow written
# and page-faulted twice, and a 10-minute p7 campaign spent most of its time in the mutants of a
# few inputs that allocate hundreds of MiB (docs/libfuzzer.md, "Rate"). Every finding is then
# confirmed without the cap (triage), so the cap moves time, not findings: memory volume is the
# live engine's to judge, where a large buffer costs nothing until it is touched.
IN_PROCESS_ALLOC_LIMIT = 16 << 20


CAP_ENV = ("HARNESS_FUZZ_ALLOC_LIMIT", "HARNESS_FUZZ_RSS_BOUND", "HARNESS_FUZZ_AS_LIMIT")


# The provisional name of a "capped" event: what its re-run without the cap may confirm.
CAPPED_LINE = "allocation above the resident memory bound (refused by the in-process cap)"


FINALISE_GRACE = 60.0


@dataclass
class LibFuzzerConfig:
    target: str
    duration: float = 600.0
    seed: int | None = None
    workers: int = 1  # libFuzzer -fork=N jobs
    out: Path | None = None
    deadline: float = 5.0  # libFuzzer -timeout
    rss_limit: int = DEFAULT_RSS_LIMIT
    as_limit: int = DEFAULT_AS_LIMIT
    corpus: Path | None = None
    seeds_valid: int = 150
    seeds_mutated: int = 150
    seeds_sweep: bool = True  # the sweep's cases (those within max_len) are seeds too
    max_len: int = 1 << 16
    alloc_limit: int = IN_PROCESS_ALLOC_LIMIT  # while fuzzing (0: only --as-limit)
    minimise_seconds: float = 12.0  # libFuzzer -minimize_crash per finding
    replay: bool = True  # confirm every finding against the live server
    # The live server sanitizer findings replay against (None: the pin's +asan+ubsan build):
    # a release build survives most of what ASan/UBSan report.
    sanitizer_target: str | None = None
    coverage: bool = True
    keep_work: bool = False
    # fields the shared campaign report reads: one libFuzzer run is one whole campaign, the
    # oracles beyond death need a live server process, and the exchanged minimum is the
    # live engine's (executions are counted instead)
    shard: tuple[int, int] = (1, 1)
    oracles: dict = field(default_factory=dict)
    min_messages: int = 0

    def to_json(self) -> dict:
        d = asdict(self)
        for k in ("out", "corpus"):
            d[k] = str(d[k]) if d[k] is not None else None
        return d


# libFuzzer's own RSS bound (-rss_limit_mb) is off: its handler prints ASan's memory profile,
# which stops the world from the RSS thread and deadlocks when the stopped fuzzing thread holds
# a runtime lock (the symbolizer's, the allocator's). A job stuck that way stalled the whole
# fork-mode campaign: no job result, no status line, zero executions in the report. The
# sanitizer runtime's hard_rss_limit_mb bounds RSS instead and dies like any report.
NO_RSS_THREAD = "-rss_limit_mb=0"


def sanitizer_env(cfg: LibFuzzerConfig, events: Path | None, rss_baseline_mb: int = 0, *,
                  fuzzing: bool = False) -> dict[str, str]:
    """The target's environment. Its RSS bound is ``--rss-limit`` above the target's own
    resident memory (``rss_baseline_mb``: libFuzzer, the coverage maps, the backend), so what
    passes it grew as far as a live server's RSS must grow to pass the same bound.

    ``fuzzing``: the campaign's own run (and the profile of its corpus), with the allocation
    cap and without UBSan's stack trace (the target records the report's line; triage re-runs
    one input per line with the trace). Everything that names or confirms a finding runs
    without them."""
    as_mb = max(cfg.as_limit >> 20, 64) if cfg.as_limit else 1 << 20
    rss = f"hard_rss_limit_mb={max(cfg.rss_limit >> 20, 64) + rss_baseline_mb}:" \
        if cfg.rss_limit else ""
    env = dict(os.environ,
               ASAN_OPTIONS=f"allocator_may_return_null=1:max_allocation_size_mb={as_mb}:{rss}"
                            "detect_leaks=0:handle_abort=0:symbolize=1:"
                            "print_summary=1:detect_stack_use_after_return=0",
               # Every check is fatal (the build's -fno-sanitize-recover=all, halt_on_error
               # for the few it keeps recoverable) unless the reviewed list suppresses it.
               UBSAN_OPTIONS=f"print_stacktrace={0 if fuzzing else 1}:halt_on_error=1:"
                             f"symbolize=1:suppressions={UBSAN_SUPPRESSIONS}",
               **REAL_PROCESS_ENV)
    for key in CAP_ENV:
        env.pop(key, None)
    if fuzzing and 0 < cfg.alloc_limit and (not cfg.as_limit or cfg.alloc_limit < cfg.as_limit):
        env["HARNESS_FUZZ_ALLOC_LIMIT"] = str(cfg.alloc_limit)
        # a refused receive buffer the uncapped server would have zero-filled past the RSS
        # bound is recorded, and triage re-runs it without the cap (rpc_server_fuzzer.cpp)
        if cfg.rss_limit:
            env["HARNESS_FUZZ_RSS_BOUND"] = str((max(cfg.rss_limit >> 20, 64) +
                                                 rss_baseline_mb) << 20)
            env["HARNESS_FUZZ_AS_LIMIT"] = str(as_mb << 20)
    symbolizer = tool("llvm-symbolizer")
    if symbolizer:
        env["ASAN_SYMBOLIZER_PATH"] = env["UBSAN_SYMBOLIZER_PATH"] = symbolizer
    if events is not None:
        env["HARNESS_FUZZ_EVENTS"] = str(events)
    return env


# Runs of the HELLO-only input: enough to sample the target after its start (a few hundred
# ms), few enough that ASan's quarantine of what each run frees stays small.
BASELINE_RUNS = 2000


def rss_baseline_mb(binary: Path, dialect: str, work: Path, env: dict[str, str]) -> int:
    """The target's own peak RSS (MiB) while it repeats an input that only says HELLO: what
    every input's memory comes on top of in process (0 when it cannot be read). Read from
    the kernel's VmHWM of the running target: libFuzzer's own peak_rss_mb comes from
    getrusage, which keeps the peak of the process that started it (the harness) across
    exec."""
    from ...strategies import hello_request_frame
    hello = work / "hello.input"
    hello.write_bytes(hello_request_frame(dialect))
    try:
        proc = subprocess.Popen([str(binary), f"-runs={BASELINE_RUNS}", NO_RSS_THREAD, str(hello)],
                                env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    except OSError:
        return 0
    peak = 0
    try:
        end = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < end:
            now = vm_hwm(proc.pid)
            if now is None:
                break
            peak = max(peak, now)
            time.sleep(0.005)
    finally:
        proc.kill()
        proc.wait()
    return peak >> 20


def libfuzzer_args(cfg: LibFuzzerConfig, seed: int, dictionary: Path, artifacts: Path,
                   duration: float) -> list[str]:
    as_mb = max(cfg.as_limit >> 20, 64) if cfg.as_limit else 1 << 20
    return [f"-fork={max(cfg.workers, 1)}", "-ignore_crashes=1", "-ignore_ooms=1",
            "-ignore_timeouts=1", f"-max_total_time={max(int(duration), 1)}",
            f"-seed={seed}", f"-artifact_prefix={artifacts}/", f"-dict={dictionary}",
            f"-max_len={cfg.max_len}", f"-timeout={max(int(cfg.deadline), 1)}",
            NO_RSS_THREAD, f"-malloc_limit_mb={as_mb}", "-print_final_stats=1",
            # leaks are off in ASan (a server killed by the harness is no leak); libFuzzer's own
            # leak check still ran every input that ended with more mallocs than frees twice
            "-detect_leaks=0"]
