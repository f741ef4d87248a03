"""``harness fuzz``: a time-bounded campaign against one target, with several workers.

Each worker owns a target instance (own work dir, own port) and runs hypothesis "rounds": a
``@given`` test, run programmatically with its own seed, whose body draws a case
(:func:`harness.fuzz.generate.cases`), runs it (:meth:`CaseRunner.run_fast`) and raises when
the target broke in a way nobody has claimed yet. Hypothesis then shrinks the case's
choices, each shrink attempt checked against the live target (restarted when it breaks); the
smallest case that keeps the same signature wins, and delta debugging over its steps
finishes the job (:mod:`harness.fuzz.shrink`). The next round starts with the next seed, so
the campaign keeps going after every finding until the duration is over.

Dedupe across workers is an atomic ``mkdir`` of ``claims/<signature id>``; every worker
restarts its own target after a death. Results: ``crashes/<id>/`` (one minimal reproducer
per distinct signature), ``corpus/`` (cases that showed a new behaviour, replayed first by a
campaign given ``--corpus``), and ``report.md`` / ``report.json`` (:mod:`harness.fuzz.report`).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import queue
import random
import re
import shutil
import time
import traceback
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from hypothesis import HealthCheck, Phase, Verbosity, given, seed as hyp_seed, settings
from hypothesis import strategies as st
from hypothesis import target as hyp_target

from .case import Case
from .execute import REFUSED, Outcome
from .generate import cases
from .replay import load, replay
from .runner import CaseRunner, Verdict, culprit
from .shrink import Budget, minimise_case, save_reproducer, transcript_of
from .target import DEFAULT_AS_LIMIT, DEFAULT_RSS_LIMIT, Signature, Target, TargetError, \
    TargetSpec

STATS_EVERY = 0.5  # seconds between progress events from a worker
FINALISE_GRACE = 30.0  # a finding made just before the end may finish minimising this late


@dataclass
class CampaignConfig:
    target: str
    dialect: str | None = None
    duration: float = 600.0
    seed: int | None = None  # None: drawn at start and written to the report
    workers: int = 1
    out: Path | None = None  # default reports/fuzz-<id>
    deadline: float = 5.0  # seconds a due answer may take before the target counts as hung
    as_limit: int = DEFAULT_AS_LIMIT
    rss_limit: int = DEFAULT_RSS_LIMIT
    max_steps: int = 32
    shrink_seconds: float = 60.0  # per finding, both passes
    hypothesis_shrink_seconds: float = 5.0  # of which hypothesis's shrinker may use this much
    corpus: Path | None = None  # replay these cases first (a previous campaign's corpus/)
    max_corpus: int = 500
    keep_work: bool = False
    round_examples: int = 500

    def to_json(self) -> dict:
        d = asdict(self)
        for k in ("out", "corpus"):
            d[k] = str(d[k]) if d[k] is not None else None
        return d


def campaign_id(target_name: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", target_name).strip("-")
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{slug}"


# ---------------------------------------------------------------- worker

class _Found(Exception):
    """Raised inside the hypothesis test: this example broke the target (being shrunk)."""


def _found() -> None:
    # One raise site for every branch: hypothesis tells bugs apart by where they were raised,
    # and would call a shrunk example that raises from another line a different (flaky) bug.
    raise _Found()


class _Worker:
    def __init__(self, cfg: CampaignConfig, index: int, seed: int, out: Path, end: float,
                 emit: Callable[[dict], None]):
        self.cfg = cfg
        self.index = index
        self.seed = seed
        self.out = out
        self.end = end  # wall-clock (time.time) end of the campaign
        self.emit = emit
        self.spec = TargetSpec.parse(cfg.target, cfg.dialect)
        self.target = Target(self.spec, out / "work" / f"w{index}", as_limit=cfg.as_limit,
                             rss_limit=cfg.rss_limit, standby=True)
        self.runner: CaseRunner | None = None
        self.dialect = self.spec.dialect
        self.strategy = None
        self.stats = Counter()
        self.statuses = Counter()
        self.coverage = Counter()
        self.behaviours: set = set()
        self.fast_seen: dict[Signature, str] = {}  # fast-path signature -> confirmed id
        self.corpus_saved = 0
        self.hunting: Signature | None = None  # the signature being shrunk by hypothesis
        self.best: Case | None = None
        self.hunt_end = 0.0
        self.generated_steps = 0  # length of the case hypothesis started shrinking from
        self.queue: list[Verdict] = []  # confirmed new findings waiting to be minimised
        self._last_emit = 0.0
        self.t0 = time.time()

    # -- lifecycle
    def run(self) -> None:
        self.target.start()
        self.dialect = self.target.dialect
        self.runner = CaseRunner(self.target, deadline=self.cfg.deadline)
        # Every server acts on a well-formed COMM_INIT (it listens or connects out), the
        # reference server included since it links like p8: none comes from the fuzzer.
        self.strategy = cases(self.dialect, max_steps=self.cfg.max_steps, local_only=True)
        try:
            self._warm_up()
            round_no = 0
            while time.time() < self.end:
                self._round(self.seed * 1_000_003 + round_no)
                round_no += 1
                self._drain_queue()
            for v in self.runner.finish():
                self._consider(v)
            self._drain_queue()
        finally:
            self.stats["restarts"] = self.runner.restarts if self.runner else 0
            self.target.stop()
            self._emit_stats(force=True, done=True)
            if not self.cfg.keep_work:
                shutil.rmtree(self.target.workdir, ignore_errors=True)

    def _warm_up(self) -> None:
        """Replay a previous corpus (this worker's share of it) before generating."""
        folder = self.cfg.corpus
        if folder is None or not Path(folder).is_dir():
            return
        files = sorted(Path(folder).glob("*.rpct"))[self.index::max(self.cfg.workers, 1)]
        for f in files[:self.cfg.max_corpus]:
            if time.time() >= self.end:
                return
            try:
                case, _, _ = load(f)
            except (OSError, ValueError, KeyError):
                continue
            self._run_case(case)
            if self.hunting is not None:  # no hypothesis round to shrink it: ddmin only
                sig, self.hunting = self.hunting, None
                self._finalise(Verdict(sig, self.best), generated=self.generated_steps)

    # -- one hypothesis round
    def _round(self, round_seed: int) -> None:
        self.hunting, self.best = None, None

        @settings(database=None, max_examples=self.cfg.round_examples, deadline=None,
                  phases=(Phase.generate, Phase.target, Phase.shrink),
                  suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
                  verbosity=Verbosity.quiet, print_blob=False)
        @hyp_seed(round_seed)
        @given(st.data())
        def fuzz_case(data):
            if self.hunting is None:
                if time.time() >= self.end:
                    return  # draw nothing: hypothesis runs out of distinct examples at once
                case = data.draw(self.strategy)
                out = self._run_case(case)
                hyp_target(float(out.proven), label="answered steps")
                if self.hunting is not None:
                    _found()
                return
            if time.monotonic() >= self.hunt_end:
                return  # shrink budget spent: every further attempt "passes"
            case = data.draw(self.strategy)
            verdict, _ = self.runner.check(case)
            self.stats["shrink_attempts"] += 1
            self._emit_stats()
            if verdict is not None and verdict.signature.same_bug(self.hunting, command=False):
                if _smaller(case, self.best):
                    self.best = case
                _found()
            if verdict is not None:
                self._consider(verdict, confirmed=True)

        try:
            fuzz_case()
        except _Found:
            pass
        except Exception as e:  # noqa: BLE001 - hypothesis reports (Flaky...) end the round
            if self.hunting is None and not _is_hypothesis_error(e):
                raise
        if self.hunting is not None:
            sig, best = self.hunting, self.best
            self.hunting = None
            self._finalise(Verdict(sig, best), generated=self.generated_steps)

    def _run_case(self, case: Case) -> Outcome:
        verdicts, out = self.runner.run_fast(case)
        self.stats["cases"] += 1
        self.stats["frames"] += out.frames_sent
        self.stats["bytes"] += out.bytes_sent
        self.statuses[out.status] += 1
        # Coverage counts what reached the wire: up to the step the connection ended at.
        sent = 0 if out.status == REFUSED else (len(case.steps) if out.at is None
                                                else min(out.at + 1, len(case.steps)))
        for s in case.steps[:sent]:
            d = s.desc
            key = f"valid|{s.cmd}" if d is None else \
                f"{d['kind']}|{d['what']}|{d['cmd']}|{d['field']}"
            self.coverage[key] += 1
        self._maybe_corpus(case, out)
        for v in verdicts:
            self._consider(v, hunt=v.case is case)
        self._emit_stats()
        return out

    def _consider(self, verdict: Verdict, *, hunt: bool = False, confirmed: bool = False) -> None:
        """A case broke the target: confirm it in isolation, claim its signature, and either
        hunt it with hypothesis (``hunt``: it is the current example) or queue it."""
        self.stats["verdicts"] += 1
        if not confirmed:
            # A signature seen on the fast path before is a duplicate: confirming it again
            # would cost restarts for nothing.
            if verdict.signature in self.fast_seen:
                self.stats["duplicates"] += 1
                self.emit({"type": "duplicate", "worker": self.index,
                           "id": self.fast_seen[verdict.signature]})
                return
            fast = verdict.signature
            again, _ = self.runner.check(verdict.case)
            if again is None or not again.signature.same_bug(verdict.signature, command=False):
                again, _ = self.runner.check(verdict.case)  # one more try: timing
            if again is None:
                # Not counted as seen: a later occurrence that does reproduce alone replaces
                # this record with a minimised one.
                self.stats["unconfirmed"] += 1
                verdict.detail = (verdict.detail + "; " if verdict.detail else "") + \
                    "did not reproduce in isolation (depends on earlier connections or timing)"
                if self._claim(verdict.signature, unconfirmed=True):
                    self._save(verdict, verdict.case, None, minimised=False, confirmed=False)
                return
            verdict = Verdict(again.signature, verdict.case, again.detail or verdict.detail,
                              again.outcome)
            self.fast_seen[fast] = verdict.signature.id
        if not self._claim(verdict.signature):
            self.stats["duplicates"] += 1
            self.emit({"type": "duplicate", "worker": self.index, "id": verdict.signature.id})
            return
        if hunt and self.hunting is None:
            self.hunting, self.best = verdict.signature, verdict.case
            self.generated_steps = len(verdict.case.steps)
            self.hunt_end = time.monotonic() + min(self._shrink_seconds() / 2,
                                                   self.cfg.hypothesis_shrink_seconds)
        else:
            self.queue.append(verdict)

    def _claim(self, sig: Signature, *, unconfirmed: bool = False) -> bool:
        """Atomically take a signature (across workers). Unconfirmed records have their own
        claim, so a confirmed finding of the same signature can still take the real one."""
        name = sig.id + (".unconfirmed" if unconfirmed else "")
        try:
            os.mkdir(self.out / "claims" / name)
            return True
        except FileExistsError:
            return False

    def _drain_queue(self) -> None:
        while self.queue:
            self._finalise(self.queue.pop(0))

    def _shrink_seconds(self) -> float:
        left = self.end + FINALISE_GRACE - time.time()
        return max(5.0, min(self.cfg.shrink_seconds, left))

    # -- minimise and save
    def _finalise(self, verdict: Verdict, generated: int | None = None) -> None:
        sig, case = verdict.signature, verdict.case
        claim_id = sig.id
        t0 = time.monotonic()
        original = generated or len(case.steps)
        budget = Budget(self._shrink_seconds())

        def same(c: Case) -> bool:
            v, _ = self.runner.check(c)
            self.stats["shrink_attempts"] += 1
            self._emit_stats()
            return v is not None and v.signature.same_bug(sig, command=False)
        minimal = minimise_case(case, same, budget) if len(case.steps) > 1 else case
        final, out = self.runner.check(minimal, lockstep=True, record=True)
        if final is None or not final.signature.same_bug(sig, command=False):
            final, out = self.runner.check(minimal, record=True)
        if final is None or not final.signature.same_bug(sig, command=False):
            minimal, final, out = case, verdict, None
            final.detail += "; the minimised case stopped reproducing (timing)"
        self._save(final, minimal, out, minimised=True, confirmed=True, claim_id=claim_id,
                   original=original, shrunk=len(case.steps), seconds=time.monotonic() - t0,
                   attempts=budget.attempts)

    def _save(self, verdict: Verdict, case: Case, out: Outcome | None, *, minimised: bool,
              confirmed: bool, claim_id: str | None = None, original: int | None = None,
              shrunk: int | None = None, seconds: float = 0.0, attempts: int = 0) -> None:
        sig = verdict.signature
        folder = self.out / "crashes" / sig.id
        try:
            folder.mkdir(parents=True)
        except FileExistsError:
            if confirmed and _unconfirmed_record(folder):
                shutil.rmtree(folder, ignore_errors=True)  # a better record of the same bug
                folder.mkdir(parents=True)
            else:  # the lockstep run named it like an earlier finding
                self.stats["duplicates"] += 1
                self.emit({"type": "duplicate", "worker": self.index, "id": claim_id or sig.id})
                return
        finding = save_reproducer(folder, signature=sig, case=case, outcome=out,
                                  target=self.cfg.target, dialect=self.dialect,
                                  detail=verdict.detail,
                                  extra={"claim_id": claim_id or sig.id,
                                         "confirmed": confirmed, "minimised": minimised,
                                         "original_steps": original or len(case.steps),
                                         "hypothesis_shrunk_steps": shrunk,
                                         "minimise_seconds": round(seconds, 1),
                                         "minimise_attempts": attempts,
                                         "found_after_s": round(time.time() - self.t0, 1),
                                         "worker": self.index})
        if confirmed:
            # The acceptance test of a reproducer: one command against a fresh target.
            try:
                finding["replays"] = replay(folder / "repro.rpct", self.cfg.target,
                                            dialect=self.dialect, deadline=self.cfg.deadline,
                                            as_limit=self.cfg.as_limit,
                                            rss_limit=self.cfg.rss_limit).reproduced
            except TargetError:
                finding["replays"] = None
            (folder / "finding.json").write_text(json.dumps(finding, indent=1) + "\n")
        self.stats["findings"] += 1
        self.emit({"type": "finding", "worker": self.index, "folder": str(folder),
                   "finding": finding})
        self._emit_stats(force=True)

    # -- corpus and stats
    def _maybe_corpus(self, case: Case, out: Outcome) -> None:
        """Keep cases that showed a behaviour (status x culprit x mutation) not seen before."""
        first, last = out.window(len(case.steps))
        muts = tuple(sorted({f"{s.desc['kind']}:{s.desc['what']}" for s in case.steps[first:last + 1]
                             if s.desc}))
        key = (out.status, culprit(case, out), muts)
        if key in self.behaviours:
            return
        self.behaviours.add(key)
        if self.corpus_saved >= self.cfg.max_corpus // max(self.cfg.workers, 1):
            return
        self.corpus_saved += 1
        meta = {"format": "ggml-rpc-fuzz-corpus/1", "dialect": self.dialect,
                "case": case.to_json(), "behaviour": list(key[:2]) + [list(muts)]}
        transcript_of(case, None, meta).save(
            self.out / "corpus" / f"w{self.index}-{self.corpus_saved:05d}.rpct")

    def _emit_stats(self, *, force: bool = False, done: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_emit < STATS_EVERY:
            return
        self._last_emit = now
        if self.runner is not None:
            self.stats["restarts"] = self.runner.restarts
        self.emit({"type": "done" if done else "stats", "worker": self.index,
                   "stats": dict(self.stats), "statuses": dict(self.statuses),
                   "coverage": dict(self.coverage), "rss_peak": self.target.rss_peak,
                   "rss_first": self.target.rss_first, "rss_last": self.target.rss_last,
                   "target_starts": self.target.starts,
                   "behaviours": len(self.behaviours), "dialect": self.dialect,
                   "hunting": self.hunting.id if self.hunting else None})


def _unconfirmed_record(folder: Path) -> bool:
    try:
        return json.loads((folder / "finding.json").read_text()).get("confirmed") is False
    except (OSError, ValueError):
        return False


def _smaller(a: Case, b: Case | None) -> bool:
    """Is ``a`` at least as good a reproducer as ``b``? Fewer steps win; at equal length the
    newer case wins, because hypothesis only tries candidates simpler than its current best."""
    return b is None or len(a.steps) <= len(b.steps)


def _is_hypothesis_error(e: BaseException) -> bool:
    mod = type(e).__module__ or ""
    return mod.startswith("hypothesis") or isinstance(e, BaseExceptionGroup)


def _worker_entry(cfg_json: dict, index: int, seed: int, out: str, end: float, q) -> None:
    """Process entry point of one worker (spawned)."""
    cfg = CampaignConfig(**{**cfg_json, "out": Path(cfg_json["out"]) if cfg_json["out"] else None,
                            "corpus": Path(cfg_json["corpus"]) if cfg_json["corpus"] else None})
    try:
        _Worker(cfg, index, seed, Path(out), end, q.put).run()
    except KeyboardInterrupt:
        q.put({"type": "done", "worker": index, "interrupted": True})
    except BaseException as e:  # noqa: BLE001 - reported to the parent, then the worker ends
        q.put({"type": "error", "worker": index, "error": f"{type(e).__name__}: {e}",
               "traceback": traceback.format_exc()})


# ---------------------------------------------------------------- campaign

@dataclass
class Progress:
    """What the parent knows, updated from worker events."""

    started: float = field(default_factory=time.time)
    workers: dict = field(default_factory=dict)  # index -> last stats event
    findings: list = field(default_factory=list)
    duplicates: Counter = field(default_factory=Counter)
    errors: list = field(default_factory=list)

    def handle(self, ev: dict) -> None:
        kind = ev.get("type")
        if kind in ("stats", "done"):
            prev = self.workers.get(ev["worker"], {})
            self.workers[ev["worker"]] = {**prev, **ev}
        elif kind == "finding":
            f = ev["finding"]
            # A confirmed record replaces an unconfirmed one of the same signature.
            self.findings = [x for x in self.findings if x["id"] != f["id"]] + [f]
        elif kind == "duplicate":
            self.duplicates[ev["id"]] += 1
        elif kind == "error":
            self.errors.append(ev)

    def total(self, key: str) -> int:
        return sum(w.get("stats", {}).get(key, 0) for w in self.workers.values())

    def merged(self, key: str) -> Counter:
        c = Counter()
        for w in self.workers.values():
            c.update(w.get(key, {}))
        return c

    @property
    def elapsed(self) -> float:
        return time.time() - self.started


def run_campaign(cfg: CampaignConfig, *, on_progress: Callable[[Progress], None] | None = None,
                 ) -> tuple[Path, dict]:
    """Run the campaign; returns (report folder, report dict)."""
    from .report import build_report, write_report

    spec = TargetSpec.parse(cfg.target, cfg.dialect)  # fail before anything starts
    out = Path(cfg.out) if cfg.out else Path("reports") / f"fuzz-{campaign_id(spec.name)}"
    for sub in ("crashes", "corpus", "claims"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    seed = cfg.seed if cfg.seed is not None else random.SystemRandom().randrange(1 << 31)
    cfg = CampaignConfig(**{**asdict(cfg), "seed": seed, "out": out})
    progress = Progress()
    end = time.time() + cfg.duration
    interrupted = False
    try:
        if cfg.workers <= 1:
            def emit(ev: dict) -> None:
                progress.handle(ev)
                if on_progress is not None:
                    on_progress(progress)
            try:
                _Worker(cfg, 0, seed, out, end, emit).run()
            except TargetError as e:
                progress.errors.append({"worker": 0, "error": str(e)})
        else:
            _run_processes(cfg, seed, out, end, progress, on_progress)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if not cfg.keep_work:
            shutil.rmtree(out / "work", ignore_errors=True)
    report = build_report(cfg, spec, progress, interrupted=interrupted)
    write_report(out, report)
    return out, report


def _run_processes(cfg: CampaignConfig, seed: int, out: Path, end: float, progress: Progress,
                   on_progress) -> None:
    ctx = mp.get_context("spawn")  # no fork of a process with threads and open sockets
    q = ctx.Queue()
    procs = [ctx.Process(target=_worker_entry, name=f"fuzz-worker-{i}",
                         args=(cfg.to_json(), i, seed + i, str(out), end, q))
             for i in range(cfg.workers)]
    for p in procs:
        p.start()
    done: set = set()
    hard_stop = end + cfg.shrink_seconds + FINALISE_GRACE + 60
    try:
        while len(done) < len(procs) and time.time() < hard_stop:
            try:
                ev = q.get(timeout=0.5)
            except queue.Empty:
                for i, p in enumerate(procs):
                    if not p.is_alive() and i not in done:
                        done.add(i)  # died without a word; its target is reaped by its group
                        progress.errors.append({"worker": i, "error": f"exit {p.exitcode}"})
                if on_progress is not None:
                    on_progress(progress)
                continue
            progress.handle(ev)
            if ev.get("type") in ("done", "error"):
                done.add(ev["worker"])
            if on_progress is not None:
                on_progress(progress)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join(timeout=10)
        while True:  # drain what arrived after the loop
            try:
                progress.handle(q.get_nowait())
            except queue.Empty:
                break
