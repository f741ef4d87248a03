"""``harness fuzz --transport rdma-soft``: partial-receive campaigns against real RDMA servers.

The target is a pin's ``+rdma`` build (``--target p7`` fuzzes ``p7+rdma``) started on the soft
verbs device, with the fault shim that names a silent segfault (:mod:`harness.fuzz.faultinfo`);
the fuzzer is :class:`~.worker.FuzzPeer`. Each hypothesis-drawn case (:func:`.plans.rdma_cases`)
gets one connection, then:

* **death** -- the server process ended (signal, fault site, the command whose frame holds the
  first SEND off 7.0.0's read boundaries); it is restarted;
* **liveness** -- after any case that did not end in a correct answer (and after the plans
  that leave early) a fresh correct 7.0.0 client must be served; if not, the server is stuck
  and restarted;
* on a *legal* plan (every SEND fits the server's 256 KiB slot, every answer fits ours, the
  fuzzer stays and reads), which a correct server must answer: **hang** (no answer within the
  deadline on an open connection), **overrun** (an answer of the wrong size, the probe's bytes
  differ, or the connection closed: its reads lost the frame boundaries) and **rdma-error**
  (an error completion at the fuzzer). On the other plans (a SEND above the slot, receive
  slots below the server's SENDs, receives not reposted, TCP closed mid-traffic) the
  connection may end any way; only death and liveness count.

Findings are deduplicated by signature, minimised (requests dropped, writes merged, plan
options dropped while the same kind/signal/line comes back), replayed once more, and saved in
``crashes/<id>/`` (``repro.json``: the request frames, the SEND plan and the signature;
``finding.json``); the report is the TCP campaigns' ``report.json`` / ``report.md`` with the
SEND plans as the coverage table and an RDMA section (SENDs, SENDs/s, findings by class).
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

from hypothesis import HealthCheck, Phase, Verbosity, given, seed as hyp_seed, settings

from ...impls.registry import PeerError, get_peer
from ...transport.softverbs import (STATS_DIR_ENV, SoftverbsUnavailable, build_softverbs,
                                    read_qp_stats, softverbs_env)
from ..target import Target
from ..signature import Signature, normalise, reproduces
from ..target_spec import TargetSpec, dialect_or_none
from ..errors import TargetError
from .plans import (DIALECT, SEND_PLANS, RdmaCase, aligned, first_misfit, plan_catalogue, predict,
                    rdma_cases, sweep_cases, with_requests)
from .worker import FuzzPeer, WorkerDied

TRANSPORT = "rdma-soft"
CLASSES = ("death", "hang", "overrun", "liveness", "rdma-error")
SETUP_FRAMES = 5  # HELLO, 2 x (ALLOC_BUFFER, BUFFER_GET_BASE) before every fuzzed stream
DEATH_WAIT = 0.3  # a crash lands just after the bad completion


def resolve_target(name: str) -> TargetSpec:
    """``p7`` -> the ``p7+rdma`` build (``p7f`` -> ``p7f+rdma``; a ``+rdma`` name as is)."""
    rdma = name if name.endswith("+rdma") else f"{name}+rdma"
    try:
        peer = get_peer(rdma)
    except PeerError as e:
        raise TargetError(f"{rdma}: {e}") from None
    if not peer.available:
        base = rdma[:-len("+rdma")]
        raise TargetError(f"{rdma} is not built ({peer.reason}): harness peers build {base} "
                          "--rdma")
    proto = dialect_or_none(peer.proto or peer.verified_proto)
    if proto != DIALECT:
        raise TargetError(f"{peer.name} speaks {proto}; the RDMA fuzzer speaks {DIALECT}")
    return TargetSpec("peer", peer.name, proto, peer=peer.name)


@dataclass
class RdmaOutcome:
    """One case against the target: the worker's result and the finding class, if any."""

    result: dict
    kind: str | None = None
    signature: Signature | None = None
    detail: str = ""
    server_qp: list | None = None
    log_tail: list | None = None


class RdmaSession:
    """The target on the soft device and the fuzz worker; every process reaped on close."""

    def __init__(self, spec: TargetSpec, workdir: Path, *, deadline: float = 2.0,
                 as_limit: int = 3 << 30, server_env: dict[str, str] | None = None):
        try:
            self.lib_dir = build_softverbs()
        except SoftverbsUnavailable as e:
            raise TargetError(f"the soft verbs device cannot be built: {e}") from None
        self.workdir = Path(workdir)
        self.deadline = deadline
        self.server_stats = self.workdir / "server-qps"
        self.fuzzer_stats = self.workdir / "fuzzer-qps"
        self.server_stats.mkdir(parents=True, exist_ok=True)
        env = softverbs_env(self.lib_dir, stats_dir=self.server_stats)
        self.target = Target(spec, self.workdir / "target", as_limit=as_limit,
                             env={k: env[k] for k in ("LD_LIBRARY_PATH", STATS_DIR_ENV)}
                             | (server_env or {}))
        self.peer: FuzzPeer | None = None
        self.restarts = 0
        self.worker_restarts = 0
        self.qp_totals: Counter = Counter()

    def start(self) -> None:
        self.target.start()
        self._peer()

    def _peer(self) -> FuzzPeer:
        if self.peer is None or not self.peer.alive():
            if self.peer is not None:
                self.peer.close()
                self.worker_restarts += 1
            self.peer = FuzzPeer(self.lib_dir, self.fuzzer_stats, self.workdir / "worker.log")
        return self.peer

    def close(self) -> None:
        if self.peer is not None:
            self.peer.close()
        self.target.stop()

    @property
    def endpoint(self) -> str:
        return f"{self.target.host}:{self.target.port}"

    def _call(self, request: dict) -> dict:
        # the worker bounds each wait by the deadline; a case has a handful of them
        return self._peer().call(request, deadline=30 + 8 * self.deadline)

    def _restart(self) -> None:
        self.restarts += 1
        self.target.restart()

    def _drain_qp_stats(self) -> list[dict]:
        """The server QPs' counters since the last call; the files are removed (the device
        keeps writing through its open descriptor, so a live QP is not disturbed)."""
        qps = [{"state": q.state, "errors": q.errors, "rnr_naks_received": q.rnr_naks_received,
                "sends": q.sends, "recvs": q.recvs} for q in read_qp_stats(self.server_stats)]
        for d in (self.server_stats, self.fuzzer_stats):
            for p in d.glob("qp-*.json"):
                p.unlink(missing_ok=True)
        for q in qps:
            self.qp_totals.update(errors=q["errors"], rnr_naks=q["rnr_naks_received"])
        return qps

    def observe(self, case: RdmaCase) -> RdmaOutcome:
        res = self._call({"op": "case", "case": case.to_json(), "endpoint": self.endpoint,
                          "timeout": self.deadline})
        if res.get("verdict") == "no-rdma":
            raise TargetError(f"{self.target.spec.name} did not switch to RDMA after HELLO "
                              "(is it an RDMA build? is the soft device loaded?)")
        obs = RdmaOutcome(res)
        info = self.target.exit_info() if res["verdict"] == "ok" else \
            self.target.wait_exit(DEATH_WAIT)
        if info is None and (res["verdict"] != "ok" or not case.legal):
            alive = self._call({"op": "liveness", "endpoint": self.endpoint,
                                "timeout": self.deadline})
            obs.result["liveness"] = alive["verdict"]
            if alive["verdict"] != "ok":
                info = self.target.wait_exit(DEATH_WAIT)
                if info is None:
                    obs.kind = "liveness"
                    obs.signature = Signature("liveness", "", "a fresh correct client is not "
                                              f"served afterwards ({alive['verdict']})",
                                              case.plan.get("what", "?"))
                    obs.detail = f"liveness client: {alive.get('why', alive['verdict'])}"
        obs.server_qp = self._drain_qp_stats()
        if info is not None:
            obs.kind = "death"
            read, cmd = first_misfit(case)
            obs.signature, obs.detail = self.target.death_verdict(info, read)
            if cmd:
                obs.detail += f" (the first SEND off 7.0.0's reads lands in {cmd}'s {read})"
            obs.log_tail = [normalise(x) for x in self.target.log_lines()[-20:]]
        elif obs.kind is None and case.legal:
            obs.kind, obs.signature, obs.detail = _legal_verdict(case, res)
            if obs.kind is not None and case.plan.get("what") != "aligned-reads" and \
                    self.observe(aligned(case)).result["verdict"] != "ok":
                # the server refuses these requests on 7.0.0's own read boundaries too: not
                # a receive-path finding (the valid-message model and the server disagree)
                obs.kind = obs.signature = None
                obs.result["verdict"] = "refused-stream"
        if obs.kind in ("death", "liveness"):
            self._restart()
        else:
            self.target.rss()  # the report's RSS peak (no memory oracle here)
        return obs


def _legal_verdict(case: RdmaCase, res: dict) -> tuple[str | None, Signature | None, str]:
    """A stream a correct server must answer: what the answer (or its absence) says."""
    verdict = res["verdict"]
    if verdict == "ok":
        return None, None, ""
    stage = res.get("stage", "")
    # as for deaths: the read a whole-completion receive overruns first, not the command whose
    # answer went missing (every command after the overrun waits the same way)
    read, cmd = first_misfit(case)
    where = f"{stage}" + (f"; the first SEND off 7.0.0's reads lands in {cmd}'s {read}"
                          if cmd else "")
    why = res.get("why", "")
    if verdict == "hang":
        return "hang", Signature("hang", "", "no answer within the deadline, the connection "
                                 "stays open", read), f"{where}: {why}"
    if verdict == "wrong-data":
        line = "the probe read back differs" if "probe" in why else \
            "an answer of the wrong size or value"
        return "overrun", Signature("overrun", "", line, read), f"{where}: {why}"
    if verdict == "closed":
        return "overrun", Signature("overrun", "", "the server closed a stream of valid "
                                    "requests in legal SENDs", read), f"{where}: {why}"
    if verdict == "rdma-error":
        return "rdma-error", Signature("rdma-error", "", normalise(why.split(" (wr_id")[0]),
                                       read), f"{where}: {why}"
    return None, None, ""


def same_finding(a: Signature | None, b: Signature | None) -> bool:
    """Minimisation and replay keep a finding while its whole signature stays: kind, signal,
    line and the read the first misfit SEND overruns (a shrink that moves the overrun to
    another read, or makes a death of starvation one of overrun, is another finding), by the
    one replay rule (``a`` observed, ``b`` the finding's)."""
    return reproduces(b, a)


# ---------------------------------------------------------------- minimisation

def minimise(session: RdmaSession, case: RdmaCase, sig: Signature, budget: float,
             ) -> tuple[RdmaCase, int]:
    """The smallest case (fewest requests, then fewest writes, then plain options) that still
    gives ``sig``; returns it and the number of attempts. Bounded by ``budget`` seconds."""
    end = time.monotonic() + budget
    attempts = 0

    def keeps(cand: RdmaCase) -> bool:
        nonlocal attempts
        if time.monotonic() >= end or cand == best:
            return False
        attempts += 1
        return same_finding(session.observe(cand).signature, sig)

    best = case
    changed = True
    while changed and time.monotonic() < end:
        changed = False
        for i in reversed(range(len(best.requests) - 2)):  # never the probe (last two)
            cand = with_requests(best, [j for j in range(len(best.requests)) if j != i])
            if keeps(cand):
                best, changed = cand, True
        for cand in (replace(best, close_after=None), replace(best, slots=1),
                     replace(best, starve=False, recv_depth=24)):
            if keeps(cand):
                best, changed = cand, True
        group = max(2, len(best.writes) // 2)
        while group >= 2 and time.monotonic() < end:
            s = 0
            while s < len(best.writes) - 1 and time.monotonic() < end:
                w = list(best.writes)
                cand = replace(best, writes=tuple(w[:s] + [sum(w[s:s + group])] + w[s + group:]))
                if keeps(cand):
                    best, changed = cand, True
                s += 1
            group //= 2
    return best, attempts


# ---------------------------------------------------------------- campaign

@dataclass
class RdmaCampaignConfig:
    target: str = "p7"  # a pin or peer name; its +rdma build is fuzzed
    plans: tuple[str, ...] | None = None  # only these SEND plans (default: every registered)
    duration: float = 600.0
    deadline: float = 2.0  # seconds without an answer (or a SEND completion): a hang
    seed: int | None = None
    shrink_seconds: float = 60.0
    out: Path | None = None
    keep_work: bool = False
    min_messages: int = 100
    as_limit: int = 3 << 30
    round_examples: int = 50
    workers: int = 1  # one worker: every connection is its own QP pair and 4 device threads
    sweep_share: float = 0.2  # the deterministic phase (plans.sweep_cases) may take this much

    def to_json(self) -> dict:
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self).items()}


def _round_settings(examples: int):
    # generate only: a finding is minimised by the campaign's own shrinker, on the target
    return settings(database=None, max_examples=examples, deadline=None,
                    phases=(Phase.generate,), suppress_health_check=list(HealthCheck),
                    verbosity=Verbosity.quiet, print_blob=False)


def run_rdma_campaign(cfg: RdmaCampaignConfig, *, on_progress: Callable | None = None,
                      ) -> tuple[Path, dict]:
    from ..campaign import Progress, campaign_id
    from ..report import write_report

    spec = resolve_target(cfg.target)
    for p in cfg.plans or ():
        if p not in SEND_PLANS:
            raise ValueError(f"unknown SEND plan {p!r}; known: {', '.join(SEND_PLANS)}")
    out = Path(cfg.out) if cfg.out else \
        Path("reports") / f"fuzz-{campaign_id(spec.name + '-rdma-soft')}"
    (out / "crashes").mkdir(parents=True, exist_ok=True)
    seed = cfg.seed if cfg.seed is not None else random.SystemRandom().randrange(1 << 31)
    cfg = replace(cfg, seed=seed, out=out)
    work = Path(tempfile.mkdtemp(prefix="harness-rdma-fuzz-"))
    progress = Progress()
    stats: Counter = Counter()
    statuses: Counter = Counter()
    plans_seen: Counter = Counter()
    commands: Counter = Counter()
    timing: Counter = Counter()
    seen: dict[str, Signature] = {}
    end = time.time() + cfg.duration
    session = RdmaSession(spec, work, deadline=cfg.deadline, as_limit=cfg.as_limit)
    interrupted = False

    def emit() -> None:
        progress.handle({"type": "stats", "worker": 0, "dialect": DIALECT,
                         "stats": dict(stats, restarts=session.restarts,
                                       target_starts=session.target.starts),
                         "statuses": dict(statuses), "target_starts": session.target.starts})
        if on_progress is not None:
            on_progress(progress)

    def count(case: RdmaCase, obs: RdmaOutcome) -> None:
        stats["cases"] += 1
        stats["generated"] += 1
        stats["frames"] += SETUP_FRAMES + len(case.requests)
        stats["bytes"] += obs.result.get("bytes", 0)
        stats["sends"] += obs.result.get("sends", 0)
        if "liveness" in obs.result:
            stats["frames"] += SETUP_FRAMES
        statuses[obs.kind or obs.result["verdict"]] += 1
        plans_seen[case.plan["what"]] += 1
        for s in case.requests:
            commands[f"valid|{s.cmd}"] += 1

    def run_one(case: RdmaCase) -> None:
        t0 = time.monotonic()
        try:
            obs = session.observe(case)
        except WorkerDied as e:
            # the case too: what the worker was doing when it stopped answering
            progress.errors.append({"worker": 0, "error": str(e)[:2000],
                                    "case": case.describe()})
            stats["worker_restarts"] += 1
            return
        timing["cases"] += time.monotonic() - t0
        count(case, obs)
        if obs.signature is not None:
            stats["verdicts"] += 1
            sid = obs.signature.id
            if sid in seen:
                progress.duplicates[sid] += 1
                stats["duplicates"] += 1
            else:
                seen[sid] = obs.signature
                t1 = time.monotonic()
                progress.findings.append(_save_finding(session, cfg, case, obs,
                                                       progress.elapsed, stats))
                timing["minimise"] += time.monotonic() - t1
        emit()

    try:
        session.start()
        if cfg.sweep_share > 0:
            # the deterministic phase first (every plan x the probe edges), in at most its
            # share of the time; what it did not reach is counted and reported
            sweep = sweep_cases(cfg.plans)
            stats["sweep_total"] = len(sweep)
            emit()
            stop, s0 = time.time() + cfg.sweep_share * cfg.duration, time.monotonic()
            for case in sweep:
                if time.time() >= min(stop, end):
                    break
                run_one(case)
                stats["sweep_done"] += 1
            timing["sweep"] += time.monotonic() - s0
        round_no = 0
        while time.time() < end:
            @_round_settings(cfg.round_examples)
            @hyp_seed(seed * 1_000_003 + round_no)
            @given(rdma_cases(cfg.plans))
            def one_case(case):
                if time.time() < end:
                    run_one(case)
            one_case()
            round_no += 1
    except KeyboardInterrupt:
        interrupted = True
    finally:
        session.close()
        if cfg.keep_work:
            shutil.copytree(work, out / "work", dirs_exist_ok=True)
        shutil.rmtree(work, ignore_errors=True)  # the soft device's counters too
    report = _report(cfg, spec, progress, stats, statuses, plans_seen, commands, timing,
                     session, interrupted)
    write_report(out, report)
    with open(out / "report.md", "a") as f:
        f.write(render_rdma_section(report))
    return out, report


def _save_finding(session: RdmaSession, cfg: RdmaCampaignConfig, case: RdmaCase,
                  obs: RdmaOutcome, found_after: float, stats: Counter) -> dict:
    sig = obs.signature
    t0 = time.monotonic()
    small, attempts = minimise(session, case, sig, cfg.shrink_seconds)
    stats["shrink_attempts"] += attempts
    again = session.observe(small)  # confirmed on a fresh look
    confirmed = same_finding(again.signature, sig)
    # the same requests on 7.0.0's own read boundaries: a receive-path finding leaves them ok
    control = session.observe(aligned(small))
    if not confirmed:
        stats["unconfirmed"] += 1
    folder = Path(cfg.out) / "crashes" / sig.id
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "repro.json").write_text(json.dumps(
        {"format": REPRO_FORMAT, "transport": TRANSPORT, "target": cfg.target,
         "signature": sig.to_json(), "kind": obs.kind, "deadline_s": cfg.deadline,
         "case": small.to_json()}, indent=1) + "\n")
    replay = f"harness replay {folder}/repro.json --target {cfg.target} --transport {TRANSPORT}"
    finding = {
        "format": "ggml-rpc-fuzz-rdma-finding/1", "id": sig.id, "class": obs.kind,
        "signature": sig.to_json(), "title": sig.title(), "target": cfg.target,
        "transport": TRANSPORT, "dialect": small.dialect, "detail": obs.detail,
        "plan": small.plan, "found_after_s": round(found_after, 1),
        "steps": len(small.requests), "original_steps": len(case.requests),
        "sends": again.result.get("sends"), "writes": len(small.writes),
        "original_writes": len(case.writes), "original_sends": obs.result.get("sends"),
        "minimise_seconds": round(time.monotonic() - t0, 1), "shrink_attempts": attempts,
        "predicted": predict(small), "legal_plan": small.legal, "result": obs.result,
        "aligned_control": control.kind or control.result["verdict"],
        "server_qp": obs.server_qp, "log_tail": obs.log_tail or [],
        "replay": replay, "replays": confirmed, "confirmed": confirmed,
        "reproducer_text": f"`{folder}/repro.json` (request frames, SEND plan, signature; "
                           f"`finding.json` beside it)",
        "listing": small.describe(), "reproducer": "repro.json",
    }
    (folder / "finding.json").write_text(json.dumps(finding, indent=1, default=str) + "\n")
    return finding


REPRO_FORMAT = "ggml-rpc-rdma-repro/1"


def _report(cfg, spec, progress, stats, statuses, plans_seen, commands, timing, session,
            interrupted) -> dict:
    from ..report import build_report_from_parts, campaign_problems
    elapsed = max(progress.elapsed, 1e-9)
    findings = sorted(progress.findings, key=lambda f: f.get("found_after_s", 0))
    for f in findings:
        f["duplicates"] = progress.duplicates.get(f["id"], 0)
    totals = {"messages_sent": stats["frames"], "bytes_sent": stats["bytes"],
              "cases": stats["cases"], "generated_cases": stats["cases"], "evolved_cases": 0,
              "restarts": session.restarts, "shrink_attempts": stats["shrink_attempts"],
              "verdicts": stats["verdicts"], "duplicates": stats["duplicates"],
              "unconfirmed": stats["unconfirmed"], "workers": 1}
    template = {"target": f"{spec.name} over {TRANSPORT}", "target_kind": "rdma",
                "dialect": DIALECT, "rss_limit_bytes": 0, "deadline_s": cfg.deadline,
                "as_limit_bytes": cfg.as_limit, "config": cfg.to_json()}
    by_class = Counter(f["class"] for f in findings)
    report = build_report_from_parts(
        template, totals=totals, elapsed=elapsed, coverage=commands, statuses=dict(statuses),
        timing=dict(timing), findings=findings, errors=progress.errors,
        rss_peak=session.target.rss_peak,
        extra={"seed": cfg.seed, "duration_s": cfg.duration, "interrupted": interrupted,
               "transport": TRANSPORT,
               "rdma": {"sends": stats["sends"],
                        "sends_per_s": round(stats["sends"] / elapsed, 1),
                        "findings_by_class": {c: by_class.get(c, 0) for c in CLASSES},
                        "worker_restarts": stats["worker_restarts"],
                        "server_error_completions": session.qp_totals["errors"],
                        "server_rnr_naks_received": session.qp_totals["rnr_naks"]},
               "workers_never_listened": [] if session.target.starts else [0]})
    report["coverage"] = plan_coverage(plans_seen, report["coverage"])
    report["sweep"] = {"cases": stats["sweep_total"], "done": stats["sweep_done"],
                       "complete": stats["sweep_done"] >= stats["sweep_total"],
                       "seconds": round(timing.get("sweep", 0.0), 1), "share": cfg.sweep_share}
    report["problems"] = campaign_problems(report, cfg.min_messages)
    return report


def plan_coverage(plans_seen: Counter, base: dict) -> dict:
    """The coverage table of a report, over the SEND-plan registry instead of the TCP
    mutation catalogue (valid-command counts kept)."""
    catalogue = [p["what"] for p in plan_catalogue()]
    hit = [p for p in catalogue if plans_seen.get(p)]
    return {**base, "mutations_exercised": len(hit), "mutations_catalogue": len(catalogue),
            "by_kind": {"send-plan": {"exercised": len(hit), "catalogue": len(catalogue)}},
            "missing": [p for p in catalogue if p not in hit],
            "command_field": {"SEND plan": {p: plans_seen.get(p, 0) for p in catalogue}},
            "fields_exercised": len(hit), "fields_catalogue": len(catalogue),
            "mutated_messages": sum(plans_seen.values())}


def render_rdma_section(r: dict) -> str:
    x = r["rdma"]
    lines = ["", "## RDMA (soft verbs device)", "",
             f"{x['sends']:,} SENDs ({x['sends_per_s']:,.1f}/s) in {r['cases']:,} cases "
             f"({r['cases_per_s']:,.1f}/s); the server's QPs saw "
             f"{x['server_error_completions']:,} error completions and "
             f"{x['server_rnr_naks_received']:,} receiver-not-ready NAKs; fuzz worker "
             f"restarts {x['worker_restarts']}.", "",
             "Findings by class: " + ", ".join(f"{k} {v}" for k, v in
                                               x["findings_by_class"].items()), ""]
    for f in r["findings"]:
        lines += [f"* `{f['id']}` ({f['class']}): SEND plan {f['plan'].get('what')}, "
                  f"{f['original_writes']} -> {f['writes']} writes, "
                  f"{f['original_steps']} -> {f['steps']} requests; on 7.0.0's read "
                  f"boundaries: {f['aligned_control']}; the emulation predicts "
                  + "; ".join(f"{k}: {v}" for k, v in f["predicted"].items())]
    return "\n".join(lines) + "\n"
