"""``harness fuzz --engine libfuzzer --target PIN``: a coverage-guided campaign in process.

1. the pin's in-process target is built (cached, :mod:`.build`);
2. the seed corpus comes from the structured generator (valid sessions and mutated ones) and
   the deterministic sweep (every case within ``max_len``), plus
   ``--corpus`` (a live campaign's ``corpus/`` or a previous in-process corpus);
3. libFuzzer runs in fork mode (``-fork=<workers> -ignore_crashes=1``: a sanitizer error ends a
   job, not the campaign), its status lines give executions and edges over time; the server's
   allocations above ``alloc_limit`` fail in it and UBSan prints no stack trace there
   (docs/libfuzzer.md, "Rate"); configuration and environment in :mod:`.config`, the runs
   in :mod:`.running`;
4. triage (:mod:`.triage`): every distinct failure becomes a finding with a signature from
   its report (:mod:`harness.fuzz.sanitizer`): the aborts and sanitizer reports the target records itself
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
import random
import re
import shutil
import subprocess
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from ...proto import DEFAULT
from .. import sanitizer
from ..campaign import Progress, campaign_id
from ..report import build_report, campaign_problems, render_markdown, replay_cell
from ..shrink import save_reproducer
from ..signature import Signature
from ..target_spec import TargetSpec
from ..errors import TargetError
from . import corpus as lfc
from .build import TARGET_NAME, BuildError, build_target
from .phase_clock import PhaseClockError, profile_corpus, render_markdown as render_profile_markdown
from .config import (ENGINE, FINALISE_GRACE, MAX_RERUNS, SANITIZE, LibFuzzerConfig,
                     libfuzzer_args, rss_baseline_mb, sanitizer_env)
from .running import Timeline, _children_cpu, _run_fuzzer
from .triage import Failure, minimise, triage


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
    except PhaseClockError as e:
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
