"""``harness fuzz --engine libfuzzer --target PIN``: a coverage-guided campaign in process.

1. the pin's in-process target is built (cached, :mod:`.build`);
2. the seed corpus comes from the structured generator (valid sessions and mutated ones) and
   the deterministic sweep (every case within ``max_len``), plus
   ``--corpus`` (a live campaign's ``corpus/`` or a previous in-process corpus);
3. libFuzzer runs in fork mode (``-fork=<workers> -ignore_crashes=1``: a sanitizer error ends a
   job, not the campaign), its status lines give executions and edges over time; the server's
   allocations above ``alloc_limit`` fail in it and UBSan prints no stack trace there
   (docs/libfuzzer.md, "Rate");
4. triage: every distinct failure becomes a finding with a signature from its report
   (:mod:`harness.fuzz.sanitizer`): the aborts and sanitizer reports the target records itself
   (``.event`` files; a UBSan line, or what followed a refused allocation, re-run once per
   provisional signature without the cap and with the stack trace) and libFuzzer's
   crash/timeout/oom artifacts, re-run once each to read their report;
5. each finding is saved like a live campaign's (``crashes/<id>/repro.rpct``, pcap,
   ``finding.json``, ``test_repro.py``, plus ``input.bin`` for the fuzz target) and replayed
   with :func:`harness.fuzz.replay.replay` against the live server;
6. the corpus is exported as ``.rpct`` cases (``corpus/``, for a live campaign's ``--corpus``)
   and replayed by the pin's coverage build (:mod:`harness.fuzz.coverage`);
7. ``report.md`` / ``report.json`` in the live campaign's format, plus the in-process figures.
"""

from __future__ import annotations

import json
import os
import random
import re
import resource
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from ...impls.sanitize import UBSAN_SUPPRESSIONS
from ...impls.supervisor import REAL_PROCESS_ENV
from ...proto import DEFAULT, get_dialect
from .. import sanitizer
from ..campaign import Progress, campaign_id
from ..report import build_report, campaign_problems, render_markdown, replay_cell
from ..shrink import save_reproducer
from ..target import DEFAULT_AS_LIMIT, DEFAULT_RSS_LIMIT
from ..signature import Signature, death_line, reproduces, vm_hwm
from ..target_spec import TargetSpec
from ..errors import TargetError
from . import corpus as lfc
from .build import TARGET_NAME, BuildError, build_target, tool
from .profile import ProfileError, profile_corpus, render_markdown as render_profile_markdown

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

_STATUS = re.compile(r"^#(?P<execs>\d+)[:\s]+(?:\w+\s+)?cov: (?P<cov>\d+) ft: (?P<ft>\d+) "
                     r"corp: (?P<corp>\d+)(?:/\S+)?(?: .*?exec/s:? (?P<eps>\d+))?"
                     r"(?: .*?oom/timeout/crash: (?P<oom>\d+)/(?P<timeout>\d+)/(?P<crash>\d+))?")
_TRACE = re.compile(r"^harness-fuzz: command (?P<cmd>\d+) at byte (?P<at>\d+)")
_EVENT_HEAD = re.compile(r"^(?P<key>kind|command|offset|length|capped): (?P<value>.*)$")


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


# ---------------------------------------------------------------- running

def _children_cpu() -> float:
    """CPU seconds (user + system) of every child process waited for so far, theirs included."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _run_fuzzer(binary: Path, args: list[str], env: dict, log: Path, timeline: Timeline,
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


def minimise(binary: Path, failure: "Failure", dialect: str, env: dict, work: Path,
             seconds: float, deadline: float) -> tuple[bytes, bool]:
    """libFuzzer's crash minimiser on the failure's input (aborting like the server), kept
    only if the smaller input still fails with the same signature. (input, minimised)."""
    work.mkdir(parents=True, exist_ok=True)
    src, dst = work / "input", work / "minimal"
    src.write_bytes(failure.data)
    dst.unlink(missing_ok=True)
    # Only the finding's own abort ends the process; for a sanitizer finding, none does.
    own = failure.signature.line.removesuffix(": ...") \
        if failure.signature.signal == "SIGABRT" else "\x01no abort"
    run_env = dict(env, HARNESS_FUZZ_ABORT="1", HARNESS_FUZZ_ABORT_ONLY=own)
    run_env.pop("HARNESS_FUZZ_EVENTS", None)
    # The minimiser runs rounds of -max_total_time each (child processes of its own): a
    # quarter of the budget per round, the whole group ended when the budget is spent; the
    # smallest input so far is in ``dst`` either way.
    proc = subprocess.Popen([str(binary), "-minimize_crash=1", NO_RSS_THREAD,
                             f"-max_total_time={max(int(seconds / 4), 1)}",
                             f"-timeout={max(int(deadline), 1)}", f"-exact_artifact_path={dst}",
                             str(src)], env=run_env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    if not dst.is_file() or len(dst.read_bytes()) >= len(failure.data):
        return failure.data, False
    data = dst.read_bytes()
    log = rerun(binary, dst, env, deadline)
    got = signature_of(log, dialect, data) if log is not None else None
    if got is None or not reproduces(failure.signature, got[0], command=False):
        return failure.data, False
    failure.signature = got[0]  # the command of the minimal input (like a lockstep run)
    return data, True


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


# ---------------------------------------------------------------- triage

@dataclass
class Failure:
    signature: Signature
    data: bytes
    detail: str
    source: str  # "abort event" | "sanitizer event" | artifact name
    report: str = ""


def _command_name(dialect: str, data: bytes, cmd_id: int | None, offset: int | None) -> str:
    """The request that was running: by the byte offset of its command in the input."""
    d = get_dialect(dialect)
    if offset is not None:
        pos = 0
        for frame in lfc.split_frames(data):
            if pos == offset:
                cmd = d.ids.get(frame[0])
                return cmd.value if cmd is not None else f"UNKNOWN_{frame[0]}"
            pos += len(frame)
    if cmd_id is not None and cmd_id >= 0:
        cmd = d.ids.get(cmd_id)
        return cmd.value if cmd is not None else f"UNKNOWN_{cmd_id}"
    return "NONE"


def signature_of(text: str, dialect: str, data: bytes, cmd_id: int | None = None,
                 offset: int | None = None) -> tuple[Signature, str] | None:
    """The finding signature of a target's log (None: nothing broke in it)."""
    lines = text.splitlines()
    if cmd_id is None:
        traced = [m for m in map(_TRACE.match, lines) if m]
        if traced:
            cmd_id, offset = int(traced[-1].group("cmd")), int(traced[-1].group("at"))
    command = _command_name(dialect, data, cmd_id, offset)
    report = sanitizer.parse(lines)
    if report is not None and not report.is_abort:
        signal = "" if report.kind in ("memory", "hang") else "exit 1"
        return Signature(report.kind, signal, report.signature_line(), command), report.text
    line = death_line(lines)  # the same line a live campaign reads from the server's log
    if line:
        return Signature("crash", "SIGABRT", line, command), death_line(lines, raw=True)
    return None


def _read_event(path: Path) -> tuple[dict, str]:
    head: dict = {}
    text = path.read_text(errors="replace")
    body_at = text.find("\n\n")
    for line in text[:body_at].splitlines():
        m = _EVENT_HEAD.match(line)
        if m:
            head[m.group("key")] = m.group("value")
    return head, text[body_at + 2:]


@dataclass
class Triage:
    found: dict  # Signature -> Failure (the smallest input of each)
    seen: Counter  # how often each signature was met
    not_rerun: int  # artifacts and event groups left without a re-run (beyond MAX_RERUNS)
    unconfirmed: int = 0  # event groups whose input did not fail again when re-run alone


def _needs_rerun(head: dict) -> bool:
    """An event the campaign's run cannot name alone: a UBSan report line (recorded without its
    stack trace) or anything that happened after the cap refused an allocation (what the input
    does without the cap is what a live server does)."""
    return head.get("kind") == "ubsan" or int(head.get("capped", 0) or 0) > 0


def triage(binary: Path, events: Path, artifacts: Path, dialect: str, env: dict,
           deadline: float) -> Triage:
    """Distinct failures (smallest input per signature), how often each was seen, and what was
    left without a re-run. ``env`` is the one without the campaign's allocation cap and with
    UBSan's stack trace: every re-run names its finding as a live sanitizer server would."""
    found: dict[Signature, Failure] = {}
    seen: Counter = Counter()
    explained: set[str] = set()

    def add(sig: Signature, data: bytes, detail: str, source: str, report: str,
            times: int = 1) -> None:
        seen[sig] += times
        old = found.get(sig)
        if old is None or len(data) < len(old.data):
            found[sig] = Failure(sig, data, detail, source, report)

    groups: dict[Signature, list[tuple[bytes, str]]] = {}  # provisional signature -> inputs
    for ev in sorted(events.glob("*.event")):
        inp = ev.with_suffix(".input")
        if not inp.exists():
            continue
        head, body = _read_event(ev)
        data = inp.read_bytes()
        explained.add(lfc.input_name(data))
        got = signature_of(body, dialect, data, int(head.get("command", -1)),
                           _frame_start(data, int(head.get("offset", 0))))
        if got is None and head.get("kind") == "capped":
            command = _command_name(dialect, data, int(head.get("command", -1)), None)
            got = Signature("memory", "", CAPPED_LINE, command), body
        if got is None:
            continue
        if _needs_rerun(head):
            groups.setdefault(got[0], []).append((data, head.get("kind", "?")))
        else:
            add(got[0], data, got[1], f"{head.get('kind', '?')} event", body)
    # One re-run per provisional signature (its smallest input): many jobs die of the same
    # few UBSan reports, and one line names them all.
    ordered = sorted(groups.items(), key=lambda kv: min(len(d) for d, _ in kv[1]))
    unconfirmed = 0
    with tempfile.TemporaryDirectory(prefix="harness-triage-") as tmp:
        for _, members in ordered[:MAX_RERUNS]:
            data, kind = min(members, key=lambda m: len(m[0]))
            path = Path(tmp) / "input"
            path.write_bytes(data)
            log = rerun(binary, path, env, deadline)
            got = signature_of(log, dialect, data) if log is not None else None
            if got is None:
                unconfirmed += 1  # it needed the cap (or the job's state) to fail
                continue
            add(got[0], data, got[1], f"{kind} event, re-run", log, times=len(members))
    pending = sorted((p for p in artifacts.iterdir() if p.is_file()
                      and p.name.split("-", 1)[-1] not in explained),
                     key=lambda p: p.stat().st_size)
    for art in pending[:MAX_RERUNS]:
        data = art.read_bytes()
        log = rerun(binary, art, env, deadline)
        got = signature_of(log, dialect, data) if log is not None else None
        if got is None:
            continue  # did not fail alone (state of the job that found it, or timing)
        add(got[0], data, got[1], art.name, log)
    return Triage(found, seen, max(0, len(pending) - MAX_RERUNS) +
                  max(0, len(ordered) - MAX_RERUNS), unconfirmed)


def _frame_start(data: bytes, offset: int) -> int | None:
    """The start of the frame the server read last, given its read position ``offset`` (the
    byte after the last one read)."""
    last = max(offset - 1, 0)
    pos = 0
    for frame in lfc.split_frames(data):
        if pos <= last < pos + len(frame):
            return pos
        pos += len(frame)
    return None


# ---------------------------------------------------------------- campaign

def run_libfuzzer_campaign(cfg: LibFuzzerConfig, *, on_progress: Callable | None = None,
                           progress_build=None) -> tuple[Path, dict]:
    spec = TargetSpec.parse(cfg.target)
    if spec.kind != "peer":
        raise TargetError(f"--engine libfuzzer needs a pin built from sources (p5, p6, p7 ...), "
                          f"not {cfg.target!r}")
    dialect = spec.dialect or DEFAULT.name
    try:
        build = build_target(spec.name, "libfuzzer", progress=progress_build)
    except BuildError as e:
        raise TargetError(f"cannot build the in-process target of {spec.name}: {e}") from None
    out = Path(cfg.out) if cfg.out else Path("reports") / f"fuzz-{campaign_id(spec.name)}-lf"
    dirs = {k: out / k for k in ("crashes", "corpus", "inputs", "work")}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    work = dirs["work"]
    seeds, artifacts, events = work / "seeds", work / "artifacts", work / "events"
    for d in (seeds, artifacts, events):
        d.mkdir(parents=True, exist_ok=True)
    seed = cfg.seed if cfg.seed is not None else random.SystemRandom().randrange(1 << 31)
    cfg = LibFuzzerConfig(**{**asdict(cfg), "seed": seed, "out": out})
    progress = Progress()
    started = time.monotonic()
    n_seeds = lfc.write_seed_corpus(seeds, dialect, valid=cfg.seeds_valid,
                                    mutated=cfg.seeds_mutated, seed=seed,
                                    sweep_max_len=cfg.max_len if cfg.seeds_sweep else None)
    imported = 0
    if cfg.corpus is not None and Path(cfg.corpus).is_dir():
        imported = lfc.import_live_corpus(Path(cfg.corpus), seeds)
        for f in Path(cfg.corpus).iterdir():  # a previous in-process corpus: raw inputs
            if f.is_file() and re.fullmatch(r"[0-9a-f]{40}", f.name):
                lfc.write_input(seeds, f.read_bytes())
                imported += 1
    dictionary = work / f"{TARGET_NAME}.dict"
    lfc.write_dictionary(dictionary, dialect)
    baseline = rss_baseline_mb(build.binary, dialect, work, sanitizer_env(cfg, None))
    env = sanitizer_env(cfg, events, baseline)  # what names and confirms findings
    fuzz_env = sanitizer_env(cfg, events, baseline, fuzzing=True)
    timeline = Timeline()
    remaining = max(cfg.duration - (time.monotonic() - started), 5.0)

    def on_line(p: dict) -> None:
        progress.workers[0] = {"stats": {"cases": p["execs"], "frames": 0},
                               "dialect": dialect, "statuses": {}, "coverage": {}}
        if on_progress is not None:
            on_progress(progress)

    fuzz_started = time.monotonic()
    cpu_before = _children_cpu()
    rc = _run_fuzzer(build.binary, libfuzzer_args(cfg, seed, dictionary, artifacts, remaining)
                     + [str(dirs["inputs"]), str(seeds)], fuzz_env, work / "libfuzzer.log",
                     timeline,
                     time.monotonic() + remaining + FINALISE_GRACE, on_line)
    fuzz_seconds = time.monotonic() - fuzz_started
    fuzz_cpu = _children_cpu() - cpu_before
    triaged = triage(build.binary, events, artifacts, dialect, env, cfg.deadline)
    found, seen = triaged.found, triaged.seen
    # Minimisation: a few seconds each, at most a fifth of the campaign's duration in all.
    budget_end = time.monotonic() + max(cfg.duration / 5, 30.0)
    findings = []
    for f in sorted(found.values(), key=lambda f: (f.signature.kind, f.signature.line)):
        original = len(lfc.split_frames(f.data))
        left = budget_end - time.monotonic()
        minimised = False
        if left > 2 and len(f.data) > 64:
            f.data, minimised = minimise(build.binary, f, dialect, env, work / "minimise",
                                         min(cfg.minimise_seconds, left), cfg.deadline)
        if any(x["id"] == f.signature.id for x in findings):
            continue  # minimised into a signature already saved
        findings.append(_save(cfg, f, out, dialect, seen, minimised=minimised,
                              original_steps=original))
    exported = lfc.export_corpus(dirs["inputs"], dirs["corpus"], dialect)
    server_coverage = None
    if cfg.coverage:
        from ..coverage import corpus_coverage
        try:
            server_coverage = corpus_coverage(spec.name, [dirs["inputs"], seeds],
                                              out / "coverage")
        except (BuildError, OSError, subprocess.SubprocessError) as e:
            server_coverage = {"error": str(e)}
    try:  # after the campaign, on the corpus it kept: what one execution costs, by phase
        execution_profile = profile_corpus(build.binary, [dirs["inputs"]],
                                           sanitizer_env(cfg, None, baseline, fuzzing=True),
                                           dialect)
    except ProfileError as e:
        execution_profile = {"error": str(e)}
    last = timeline.last
    progress.workers[0] = {"stats": {"cases": last["execs"], "frames": 0, "restarts": 0,
                                     "verdicts": sum(seen.values())},
                           "dialect": dialect, "statuses": {}, "coverage": {},
                           "rss_peak": 0}
    progress.findings = findings
    if last["execs"] == 0:  # also when no status line came (Timeline.last's default)
        # Nothing was executed: the log is the only account of why, so it is kept.
        log = out / "libfuzzer.log"
        shutil.copyfile(work / "libfuzzer.log", log)
        progress.errors.append({"worker": 0, "error": f"libFuzzer (exit {rc}) reported no "
                                f"executions in {fuzz_seconds:.0f} s; see {log}"})
    progress.started = time.time() - (time.monotonic() - started)
    report = build_report(cfg, spec, progress)
    report.update({
        "engine": ENGINE, "executions": last["execs"],
        "executions_per_s": round(last["execs"] / max(fuzz_seconds, 1e-9), 1),
        "fuzz_seconds": round(fuzz_seconds, 1), "fuzz_cpu_seconds": round(fuzz_cpu, 1),
        # per CPU second of libFuzzer and its jobs: what one core would run, however busy the
        # machine was (the wall-clock rate above is that machine at that load)
        "executions_per_cpu_s": round(last["execs"] / fuzz_cpu, 1) if fuzz_cpu > 0 else None,
        "edges": last["edges"],
        "features": last["features"], "corpus_size": last["corpus"],
        "edges_over_time": timeline.sampled(30), "seeds": n_seeds, "imported": imported,
        "exported_cases": exported, "libfuzzer_exit": rc,
        "artifacts_not_rerun": triaged.not_rerun,
        "alloc_limit": int(fuzz_env.get("HARNESS_FUZZ_ALLOC_LIMIT", 0)),
        "events_not_confirmed": triaged.unconfirmed,
        "findings_by_class": dict(Counter(_class_of(f["signature"]) for f in findings)),
        "rss_baseline_mb": baseline,
        "server_coverage": server_coverage, "binary": str(build.binary),
        "execution_profile": execution_profile,
    })
    report["messages_counted"] = False  # in process one execution is one connection
    report["workers_never_listened"] = []  # no server listens: executions say it ran
    report["problems"] = campaign_problems(report, cfg.min_messages)
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (out / "report.md").write_text(render_libfuzzer_markdown(report, out))
    if not cfg.keep_work:
        shutil.rmtree(work, ignore_errors=True)
    return out, report


def _class_of(sig: dict) -> str:
    """A finding's class for the summary: the sanitizer's bug type, GGML_ASSERT, ..."""
    line = sig.get("line", "")
    if sig.get("kind") != "crash":
        return sig.get("kind", "?")
    m = re.match(r"^(AddressSanitizer|LeakSanitizer): ([\w-]+(?: \(zero page\))?)", line)
    if m:
        return f"{m.group(1)}: {m.group(2)}"
    m = re.match(r"^UndefinedBehaviorSanitizer: (.*?)(?: ADDR| N\b|,| in |$)", line)
    if m:
        return f"UndefinedBehaviorSanitizer: {m.group(1)}"
    if "GGML_ASSERT" in line:
        return "GGML_ASSERT"
    if line.startswith("terminate called"):
        return "uncaught exception"
    return "abort" if sig.get("signal") == "SIGABRT" else sig.get("signal") or "crash"


def replay_target(cfg: LibFuzzerConfig, sig: Signature) -> tuple[str, str | None]:
    """The live server a finding replays against, and why it cannot run (None: it can).
    A sanitizer error needs the pin's sanitizer build: the release server mostly survives
    it (a memcpy between overlapping ranges, an out-of-bounds read inside the heap). So does
    the sanitizer runtime's RSS bound: the in-process RSS counts ASan's shadow memory and
    quarantine, which the sanitizer server has too and the release server has not."""
    sanitizer_error = sig.kind == "crash" and sanitizer.report_key(sig.line) is not None
    asan_rss = sig.kind == "memory" and sanitizer.rss_bound(sig.line) and \
        sig.line.startswith(("AddressSanitizer", "LeakSanitizer"))
    if not (sanitizer_error or asan_rss):
        return cfg.target, None
    return sanitizer_build(cfg)


def sanitizer_build(cfg: LibFuzzerConfig) -> tuple[str, str | None]:
    """The pin's live sanitizer server, and why it cannot run (None: it can)."""
    if cfg.sanitizer_target:
        return cfg.sanitizer_target, None
    from ...impls.registry import get_peer, resolve_pin
    from ...impls.errors import PeerError
    pin = TargetSpec.parse(cfg.target).name
    try:
        name = resolve_pin(pin).variant(sanitize=SANITIZE).name
        peer = get_peer(name)
    except PeerError as e:
        return f"{pin}+asan+ubsan", str(e)
    if not peer.available:
        return name, (f"{name} is not built (`harness peers build {pin} --sanitize "
                      f"{','.join(SANITIZE)}`)")
    return name, None


def _replayed(cfg: LibFuzzerConfig, folder: Path, dialect: str, target: str,
              missing: str | None) -> dict:
    from ..replay import replay
    try:
        if missing:
            raise TargetError(missing)
        result = replay(folder / "repro.rpct", target, dialect=dialect, deadline=cfg.deadline,
                        as_limit=cfg.as_limit, rss_limit=cfg.rss_limit)
        return {"replayed_against": target, "replays": result.reproduced,
                "live_observed": result.observed.title() if result.observed else None}
    except TargetError as e:
        # not a "no": a finding whose replay could not run fails the campaign (report.py)
        return {"replayed_against": target, "replays": None, "replay_error": str(e),
                "live_observed": f"replay could not run: {e}"}


def _save(cfg: LibFuzzerConfig, f: Failure, out: Path, dialect: str, seen: Counter, *,
          minimised: bool = False, original_steps: int | None = None) -> dict:
    folder = out / "crashes" / f.signature.id
    case = lfc.input_to_case(f.data, dialect)

    def write(target: str) -> dict:
        # The reproducer's own target (its replay command and test_repro.py) is that server.
        return save_reproducer(folder, signature=f.signature, case=case, outcome=None,
                               target=target, dialect=dialect, detail=f.detail,
                               extra={"engine": ENGINE, "confirmed": True,
                                      "minimised": minimised,
                                      "original_steps": original_steps or len(case.steps),
                                      "occurrences": seen[f.signature], "source": f.source,
                                      "input": "input.bin", "campaign_target": cfg.target})

    target, missing = replay_target(cfg, f.signature)
    finding = write(target)
    (folder / "input.bin").write_bytes(f.data)
    if f.report:
        (folder / "report.txt").write_text(f.report)
    if cfg.replay:
        first = _replayed(cfg, folder, dialect, target, missing)
        finding.update(first)
        if first["replays"] is False and target == cfg.target:
            # The release server survived: a failure that needs the allocator's contents (a
            # tensor read before it was written: ASan fills new memory with 0xbe where a
            # release build's fresh pages are zero) shows on the sanitizer server, which has
            # the target's allocator.
            san, san_missing = sanitizer_build(cfg)
            second = None if san_missing else _replayed(cfg, folder, dialect, san, None)
            if second and second["replays"]:
                finding = write(san)
                finding.update(second, release_replays=False,
                               release_observed=first["live_observed"])
    (folder / "finding.json").write_text(json.dumps(finding, indent=1) + "\n")
    return finding


RELEASE_SURVIVED = " (the release server survived it)"


def render_libfuzzer_markdown(r: dict, out: Path) -> str:
    # The live campaign's report, without the rows that only mean something on the wire.
    text = render_markdown(r, out).replace(
        f"in 0 messages ({r['cases']:,} connections)", f"in {r['cases']:,} executions "
        "(connections)")
    text = "\n".join(x for x in text.splitlines() if not x.startswith(
        ("| messages sent", "| messages/s", "| RSS ", "| target restarts", "| shrink attempts",
         "| connection outcomes", "| connections |", "| sweep"))) + "\n"
    # The generator's mutation catalogue is not what drives this engine: its coverage is the
    # server code's (below), not the command x field table.
    text = text.split("\n## Coverage of the command x field space")[0] + "\n"
    head, sep, rest = text.partition("\n## ")
    lines = ["", "## In-process engine (libFuzzer)", "",
             "| | |", "|---|---|",
             f"| binary | `{Path(r['binary']).name}` (-fsanitize=fuzzer,address,undefined) |",
             f"| executions | {r['executions']:,} in {r['fuzz_seconds']:.0f} s |",
             f"| executions/s | {r['executions_per_s']:,.0f} (one execution = one connection)"
             + (f"; {r['executions_per_cpu_s']:,.0f} per CPU second of the fuzzer and its jobs "
                f"({r['fuzz_cpu_seconds']:,.0f} s)" if r.get("executions_per_cpu_s") else "")
             + " |",
             f"| edges / features / corpus | {r['edges']:,} / {r['features']:,} / "
             f"{r['corpus_size']:,} |",
             f"| seeds (generator and sweep) / imported | {r['seeds']} / {r['imported']} |",
             f"| RSS bound in process | --rss-limit above the target's own "
             f"{r.get('rss_baseline_mb', 0)} MiB |",
             f"| corpus exported for live campaigns | {r['exported_cases']} cases in "
             f"`{out}/corpus` (`harness fuzz --target {r['target']} --corpus {out}/corpus`) |",
             f"| artifacts and event groups not re-run (beyond {MAX_RERUNS} each) | "
             f"{r['artifacts_not_rerun']} |",
             "| allocation cap while fuzzing | " + (
                 f"{r['alloc_limit'] >> 20} MiB (findings named and confirmed without it) |"
                 if r.get("alloc_limit") else "none (--as-limit only) |"),
             f"| events that did not fail again re-run alone (not reported) | "
             f"{r.get('events_not_confirmed', 0)} |",
             "| findings by class | " + (", ".join(f"{k} {v}" for k, v in
                                                  sorted(r["findings_by_class"].items()))
                                        or "none") + " |", "",
             "Edges over time:", "", "| s | executions | edges | features | corpus | crashes |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {p['t']:.0f} | {p['execs']:,} | {p['edges']:,} | {p['features']:,} | "
              f"{p['corpus']:,} | {p['crashes']} |" for p in r["edges_over_time"]]
    lines.append("")
    replayed = [f for f in r["findings"] if "live_observed" in f]
    if replayed:
        lines += ["Replayed against the live server (`harness replay`; sanitizer errors, "
                  "ASan's RSS bound and what the release server survives against the pin's "
                  "sanitizer build):", "",
                  "| id | replayed against | reproduced | live server |", "|---|---|---|---|"]
        lines += [f"| {f['id']} | `{f.get('replayed_against', r['target'])}` | "
                  f"{replay_cell(f)} | "
                  f"{(f.get('live_observed') or 'survived').replace('|', '/')}"
                  f"{RELEASE_SURVIVED if f.get('release_replays') is False else ''} |"
                  for f in replayed]
        lines.append("")
    lines += render_profile_markdown(r.get("execution_profile"), r.get("executions_per_s"))
    from ..coverage import render_coverage_markdown
    lines += render_coverage_markdown(r.get("server_coverage"))
    return head + "\n".join(lines) + "\n" + sep + rest
