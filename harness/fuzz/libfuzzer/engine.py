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
5. each finding is saved like a live campaign's and replayed against the live server
   (:mod:`.findings`);
6. the corpus is exported as ``.rpct`` cases (``corpus/``, for a live campaign's ``--corpus``)
   and replayed by the pin's coverage build (:mod:`harness.fuzz.coverage`);
7. ``report.md`` / ``report.json`` in the live campaign's format, plus the in-process figures
   (:mod:`.report`).
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
from ..campaign import Progress, campaign_id
from ..report import build_report, campaign_problems
from ..target_spec import TargetSpec
from ..errors import TargetError
from . import corpus as lfc
from .build import TARGET_NAME, BuildError, build_target
from .findings import save_finding
from .phase_clock import PhaseClockError, profile_corpus
from .config import (ENGINE, FINALISE_GRACE, LibFuzzerConfig, libfuzzer_args,
                     rss_baseline_mb, sanitizer_env)
from .report import finding_class, render_libfuzzer_markdown
from .running import Timeline, children_cpu, run_fuzzer
from .triage import minimise, triage


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
    swept = lfc.sweep_seed_dir(dialect, cfg.max_len) if cfg.seeds_sweep else None
    n_seeds = lfc.write_seed_corpus(seeds, dialect, valid=cfg.seeds_valid,
                                    mutated=cfg.seeds_mutated, seed=seed,
                                    sweep_max_len=cfg.max_len if cfg.seeds_sweep and not swept
                                    else None)
    seed_dirs = [seeds] + ([swept] if swept else [])
    if swept:
        n_seeds += sum(1 for _ in swept.iterdir())
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
    cpu_before = children_cpu()
    rc = run_fuzzer(build.binary, libfuzzer_args(cfg, seed, dictionary, artifacts, remaining)
                     + [str(dirs["inputs"])] + [str(d) for d in seed_dirs], fuzz_env, work / "libfuzzer.log",
                     timeline,
                     time.monotonic() + remaining + FINALISE_GRACE, on_line)
    fuzz_seconds = time.monotonic() - fuzz_started
    fuzz_cpu = children_cpu() - cpu_before
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
        findings.append(save_finding(cfg, f, out, dialect, seen, minimised=minimised,
                              original_steps=original))
    exported = lfc.export_corpus(dirs["inputs"], dirs["corpus"], dialect)
    server_coverage = None
    if cfg.coverage:
        from ..coverage import corpus_coverage
        try:
            server_coverage = corpus_coverage(spec.name, [dirs["inputs"], *seed_dirs],
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
        "findings_by_class": dict(Counter(finding_class(f["signature"]) for f in findings)),
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
