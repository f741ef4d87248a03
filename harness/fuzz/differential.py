"""``harness fuzz --differential A B``: the same sessions against two servers, every
difference between them a finding.

Both targets (pins, user builds, ``ref-DIALECT``, ``ref:KNOB=V``) are launched the same way
(no cache directory on either: the same cache setting) and get the same generated and evolved
cases (:mod:`.generate`, :mod:`.evolve`). Per case and side, :meth:`CaseRunner.check` gives
the outcome and whether the side broke; the two are compared (:func:`compare`):

* **death** -- one side crashed, hung, grew too big or broke the connection rules and the
  other did not (or both broke, differently);
* **close** -- the connections ended differently: status (answered everything, closed,
  hang) or the step they ended at;
* **answer** -- the first answer whose bytes differ, after *pointer renaming*: buffer handles
  and bases (ALLOC_BUFFER, BUFFER_GET_BASE answers) are heap addresses and compare only as
  "zero or not".

An allow-list (:data:`DEFAULT_ALLOW` plus ``--allow FILE``, YAML or JSON) names intended or
host-dependent differences: ``{cmd, kind: answer, bytes: [start, end], reason}`` masks those
answer bytes of that command (no ``bytes``: the whole payload, sizes still compared),
``{cmd, kind: close|death}`` ignores such divergences at that command; ``match`` (a regular
expression) narrows an entry to divergences whose line contains it (a death by its assert; a
close point as ``close point: A ok, B closed <- framing:len_large``, the mutation it is
blamed on, and ``same-step`` when both answered as many steps; an answer as ``A <payload hex> / B <payload hex>``: such an entry masks nothing, it
passes the answers it matches). Each divergence not
allowed is deduplicated by its signature, minimised by delta debugging (both targets checked
per attempt) and saved under ``divergences/<id>/`` with the case (``repro.rpct``) and both
sides' transcripts (``a.rpct``, ``b.rpct``); ``harness replay DIR --differential A B``
replays it.
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from hypothesis import HealthCheck, Phase, Verbosity, given, seed as hyp_seed, settings
from hypothesis import strategies as st

from .allow_list import load_allow
from .campaign import SWEEP_SHARE, Progress, _is_hypothesis_error
from .case import Case
from .evolve import Corpus, behaviour, mutate
from .execute import Outcome
from .generate import cases
from .replay import load
from .report import DEFAULT_MIN_MESSAGES, campaign_problems, phases_summary
from .case_runner import CaseRunner, Finding
from .shrink import Budget, minimise_case
from .sweep import PARTS, prepare, size as sweep_size, sweep as sweep_cases
from .target import DEFAULT_AS_LIMIT, DEFAULT_RSS_LIMIT, Target
from .target_spec import TargetSpec
from .differential_report import render_markdown, save_divergence
from .divergence import Divergence, dedupe_key, compare, finding_id
from .errors import DifferentialError



# ---------------------------------------------------------------- the campaign

@dataclass
class DifferentialConfig:
    a: str
    b: str
    dialect: str | None = None
    duration: float = 120.0
    seed: int | None = None
    # Stop after this many sessions (a fixed seed then gives the same sessions on any
    # machine speed, where a duration gives more on a faster one); the duration still bounds.
    max_cases: int | None = None
    out: Path | None = None
    deadline: float = 5.0
    as_limit: int = DEFAULT_AS_LIMIT
    rss_limit: int = DEFAULT_RSS_LIMIT
    max_steps: int = 32
    shrink_seconds: float = 60.0
    allow: Path | None = None
    min_messages: int = DEFAULT_MIN_MESSAGES
    evolve_share: float = 0.8
    round_examples: int = 100
    keep_work: bool = False
    # the deterministic sweep first, for at most this share of the duration (its sessions
    # count towards max_cases); 0 leaves it out
    sweep_share: float = SWEEP_SHARE
    phases: tuple[str, ...] = PARTS  # which of the sweep's parts run
    sweep_only: bool = False  # stop once the sweep is done (max_cases may still add random)

    def to_json(self) -> dict:
        d = asdict(self)
        for k in ("out", "allow"):
            d[k] = str(d[k]) if d[k] is not None else None
        return d


class _Pair:
    """Both targets with their runners; a case runs on A and on B at once (each side mostly
    waits on its own server process: together they take the time of the slower one)."""

    def __init__(self, cfg: DifferentialConfig, work: Path):
        specs = [TargetSpec.parse(t, cfg.dialect) for t in (cfg.a, cfg.b)]
        self.labels = (specs[0].name, specs[1].name)
        self.targets = [Target(s, work / f"side{i}", as_limit=cfg.as_limit,
                               rss_limit=cfg.rss_limit, standby=True)
                        for i, s in enumerate(specs)]
        self.runners: list[CaseRunner] = []
        self.deadline = cfg.deadline
        self._side_b = ThreadPoolExecutor(1, thread_name_prefix="differential-b")

    def start(self) -> str:
        for t in self.targets:
            t.start()
        dialects = {t.dialect for t in self.targets}
        if len(dialects) != 1:
            raise DifferentialError(f"the targets speak different dialects "
                                    f"({', '.join(map(str, dialects))}): pass --dialect")
        self.runners = [CaseRunner(t, deadline=self.deadline) for t in self.targets]
        return self.targets[0].dialect

    def run(self, case: Case, *, lockstep: bool = False
            ) -> list[tuple[Finding | None, Outcome]]:
        b = self._side_b.submit(self.runners[1].check, case, record=True, lockstep=lockstep)
        a = self.runners[0].check(case, record=True, lockstep=lockstep)
        return [a, b.result()]

    def judge(self, case: Case, allow: list[dict], used: list[dict] | None = None
              ) -> tuple[Divergence | None, list[tuple[Finding | None, Outcome]]]:
        """Run ``case`` on both sides and compare. A close-point difference where a side
        closed with a reset is run again in lockstep: a reset discards answers the client
        had not read yet, so a pipelined run may show a close one step early that is not."""
        runs = self.run(case)
        got: list[dict] = []
        div = compare(case, runs, self.labels, allow, got)
        if div is not None and div.signature.line.startswith("close point") \
                and any(o.detail == "reset" for _, o in runs):
            runs = self.run(case, lockstep=True)
            got = []
            div = compare(case, runs, self.labels, allow, got)
        if used is not None:
            used.extend(got)
        return div, runs

    def stop(self) -> None:
        self._side_b.shutdown(wait=True)
        for t in self.targets:
            t.stop()


def run_differential(cfg: DifferentialConfig, *,
                     on_progress: Callable[[Progress], None] | None = None) -> tuple[Path, dict]:
    """Run the differential campaign; returns (report folder, report dict). ``on_progress``
    gets the same :class:`Progress` a campaign gives (for the live display)."""
    seed = cfg.seed if cfg.seed is not None else random.SystemRandom().randrange(1 << 31)
    specs = [TargetSpec.parse(t, cfg.dialect) for t in (cfg.a, cfg.b)]  # fail early
    out = Path(cfg.out) if cfg.out else \
        Path("reports") / f"fuzz-diff-{time.strftime('%Y%m%d-%H%M%S')}"
    (out / "divergences").mkdir(parents=True, exist_ok=True)
    allow = load_allow(cfg.allow)
    pair = _Pair(cfg, out / "work")
    stats = {"cases": 0, "frames": 0, "generated": 0, "evolved": 0, "divergences_seen": 0,
             "allowed": 0, "both_broke": 0, "restarts": 0, "sweep_total": 0, "sweep_done": 0}
    sweep_seconds = 0.0
    sweep_timing: Counter = Counter()  # seconds per deterministic phase
    sweeping = False
    findings: list[dict] = []
    seen: set[str] = set()
    hits = [0] * len(allow)  # sessions each allow-list entry let pass
    errors: list[dict] = []
    t0 = time.time()
    end = t0 + cfg.duration

    def more() -> bool:
        return time.time() < end and (cfg.max_cases is None or stats["cases"] < cfg.max_cases)
    rng = random.Random(seed)
    corpus = Corpus()
    dialect = None
    progress = Progress()

    def emit() -> None:
        progress.handle({"type": "stats", "worker": 0,
                         "stats": {**stats, "restarts": sum(r.restarts for r in pair.runners)}})
        if on_progress is not None:
            on_progress(progress)
    try:
        dialect = pair.start()
        local_only = not all(s.is_reference for s in specs)
        strategy = cases(dialect, max_steps=cfg.max_steps, local_only=local_only)
        sweeping = cfg.sweep_share > 0 or cfg.sweep_only
        if sweeping:
            # set-up, as in a campaign's worker: built (or read from the cache) before the
            # clock starts, or a first run after an upgrade spends its time on it
            prepare(dialect, local_only=local_only)
        t0 = time.time()  # the servers' start is set-up too
        end = t0 + cfg.duration

        # divergences the deterministic phases find, minimised once those phases are done:
        # minimising one (up to shrink_seconds) inside them spent their share of the duration
        deferred: list[tuple[Case, Divergence, float]] = []

        def minimise(case: Case, div: Divergence, found_after: float) -> None:
            findings.append(_minimise_and_save(cfg, pair, allow, case, div, out, dialect,
                                               found_after))
            progress.handle({"type": "finding", "finding": findings[-1]})
            emit()

        def one(case: Case, *, defer: bool = False) -> None:
            used: list[dict] = []
            div, runs = pair.judge(case, allow, used)
            stats["cases"] += 1
            stats["frames"] += sum(o.frames_sent for _, o in runs)
            if runs[0][0] is None and runs[1][0] is None:
                corpus.offer(case, behaviour(case, runs[0][1]))
            elif runs[0][0] is not None and runs[1][0] is not None:
                stats["both_broke"] += 1
            if div is None:
                if used:
                    stats["allowed"] += 1
                for e in {id(e): e for e in used}.values():
                    hits[allow.index(e)] += 1
                return
            stats["divergences_seen"] += 1
            key = dedupe_key(div)
            if key in seen:
                return
            seen.add(key)
            if defer:
                deferred.append((case, div, time.time() - t0))
            else:
                minimise(case, div, time.time() - t0)

        if sweeping:
            stats["sweep_total"] = sweep_size(dialect, local_only=local_only, only=cfg.phases)
            if on_progress is not None:
                on_progress(progress)
            share = 1.0 if cfg.sweep_only else cfg.sweep_share
            stop, s0 = t0 + share * cfg.duration, time.time()
            last = s0
            for item in sweep_cases(dialect, local_only=local_only, only=cfg.phases):
                if not more() or time.time() >= stop:
                    break
                one(item.case, defer=True)
                stats["sweep_done"] += 1
                now = time.time()
                sweep_timing[f"sweep:{item.part}"] += now - last
                last = now
            else:  # exhausted: the count was an upper bound
                stats["sweep_total"] = stats["sweep_done"]
            sweep_seconds = time.time() - s0
            emit()
            for found in deferred:
                minimise(*found)
        round_no = 0
        # after a --sweep-only sweep, random sessions only up to max_cases
        while more() and not (cfg.sweep_only and cfg.max_cases is None):
            @settings(database=None, max_examples=cfg.round_examples, deadline=None,
                      phases=(Phase.generate,), suppress_health_check=list(HealthCheck),
                      verbosity=Verbosity.quiet)
            @hyp_seed(seed * 1_000_003 + round_no)
            @given(st.data())
            def generated(data):
                if more():
                    case = data.draw(strategy)
                    stats["generated"] += 1
                    one(case)
            n0 = stats["generated"]
            try:
                generated()
            except Exception as e:  # noqa: BLE001 - hypothesis reports (Flaky...) end the round
                if not _is_hypothesis_error(e):
                    raise
            round_no += 1
            share = min(max(cfg.evolve_share, 0.0), 0.99)
            for _ in range(int((stats["generated"] - n0) * share / (1 - share))):
                if not more() or not corpus:
                    break
                stats["evolved"] += 1
                one(mutate(corpus.pick(rng), corpus, rng))
                if stats["evolved"] % 50 == 0:
                    emit()
            emit()
    except (DifferentialError, OSError) as e:
        errors.append({"error": str(e)})
    finally:
        stats["restarts"] = sum(r.restarts for r in pair.runners)
        started = [t.starts for t in pair.targets]
        pair.stop()
        if not cfg.keep_work:
            shutil.rmtree(out / "work", ignore_errors=True)
    elapsed = max(time.time() - t0, 1e-9)
    report = {
        "format": "ggml-rpc-fuzz-differential/1", "a": cfg.a, "b": cfg.b,
        "labels": list(pair.labels), "target": f"{cfg.a} vs {cfg.b}",
        "target_kind": "differential", "dialect": dialect, "seed": seed,
        "duration_s": cfg.duration, "elapsed_s": round(elapsed, 1),
        "messages_sent": stats["frames"], "messages_per_s": round(stats["frames"] / elapsed, 1),
        "cases": stats["cases"], "stats": stats,
        "allow": [{**e, "sessions": n} for e, n in zip(allow, hits)],
        "findings": findings, "distinct_signatures": len(findings),
        "nothing_found": not findings and not errors, "errors": errors,
        "sweep": {"cases": stats["sweep_total"], "done": stats["sweep_done"],
                  "complete": stats["sweep_done"] >= stats["sweep_total"],
                  "seconds": round(sweep_seconds, 1), "share": cfg.sweep_share},
        "workers_never_listened": [i for i, n in enumerate(started) if not n],
        "config": cfg.to_json(),
    }
    if sweeping and dialect is not None:
        report["sweep"].update(phases_summary(dialect, [((1, 1), stats["sweep_done"])],
                                              sweep_timing, cfg.phases))
    report["problems"] = campaign_problems(report, cfg.min_messages)
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (out / "report.md").write_text(render_markdown(report))
    return out, report


def _minimise_and_save(cfg, pair: _Pair, allow, case: Case, div: Divergence, out: Path,
                       dialect: str, found_after: float) -> dict:
    t0 = time.monotonic()
    budget = Budget(cfg.shrink_seconds)

    def same(c: Case) -> bool:
        d, _ = pair.judge(c, allow)
        # The same difference, blamed on the same step (not another one that differs too).
        return d is not None and dedupe_key(d) == dedupe_key(div) and d.culprit == div.culprit

    minimal = minimise_case(case, same, budget) if len(case.steps) > 1 else case
    final, runs = pair.judge(minimal, allow)
    if final is None or dedupe_key(final) != dedupe_key(div):  # timing: keep the original
        minimal, final = case, div
        runs = pair.judge(case, allow)[1]
    # `harness replay` starts both targets afresh: say whether that shows it (no: the outcome
    # depends on what earlier sessions left in a server process, such as its heap's layout)
    fresh, _ = run_pair(minimal, cfg.a, cfg.b, dialect=dialect, deadline=cfg.deadline,
                        allow=allow)
    return save_divergence(out / "divergences" / finding_id(div), minimal, runs, final,
                           cfg=cfg, labels=pair.labels, dialect=dialect,
                           extra={"original_steps": len(case.steps),
                                  "minimise_seconds": round(time.monotonic() - t0, 1),
                                  "minimise_attempts": budget.attempts,
                                  "found_after_s": round(found_after, 1),
                                  "replays_on_fresh_targets": fresh is not None
                                  and dedupe_key(fresh) == dedupe_key(div)})


def replay_differential(path: Path, a: str, b: str, *, dialect: str | None = None,
                        deadline: float = 5.0, allow: Path | None = None,
                        used: list[dict] | None = None) -> Divergence | None:
    """Run a saved case once against fresh A and B; the divergence it shows, or None.
    ``used`` collects the allow-list entries that let a difference pass (None with none
    used: the two agreed)."""
    case, _, _ = load(path)
    return run_pair(case, a, b, dialect=dialect, deadline=deadline,
                    allow=load_allow(allow), used=used)[0]


def run_pair(case: Case, a: str, b: str, *, dialect: str | None = None, deadline: float = 5.0,
             allow: list[dict] | None = None, used: list[dict] | None = None
             ) -> tuple[Divergence | None, list[tuple[Finding | None, Outcome]]]:
    """Run ``case`` once against fresh A and B: the divergence (``allow``: the default
    allow-list when None) and both sides' runs; ``used`` as in :func:`compare`."""
    cfg = DifferentialConfig(a=a, b=b, dialect=dialect or case.dialect, deadline=deadline)
    with tempfile.TemporaryDirectory(prefix="harness-diff-") as tmp:
        pair = _Pair(cfg, Path(tmp))
        try:
            pair.start()
            return pair.judge(case, load_allow(None) if allow is None else allow, used)
        finally:
            pair.stop()
