"""Where one in-process execution's time goes: the target's own phase clock
(``HARNESS_FUZZ_PROFILE``, rpc_server_fuzzer.cpp) over a set of inputs, each run a few times.

Set-up is the input copied and the connection accepted, up to the first command byte; a request
runs from its command byte to the next one (payload read, relocation, the server's work, the
answer parsed); teardown from the input's end until the server returned (its buffers freed).
The CPU backend is made once per process (``LLVMFuzzerInitialize``), not per input: the profile
shows it is nowhere in an execution. The gap between the campaign's executions/s and the one
the phases allow is what lies outside them (libFuzzer's mutation and coverage bookkeeping, a
fork-mode job started again after each death) and the mix: the campaign executes the kept
corpus's mutants, not the corpus (a mutant that allocates hundreds of MiB costs thousands of
corpus executions under ASan; docs/libfuzzer.md, "Rate"). The profile runs under the
campaign's allocation cap, as the campaign did.

``python -m harness.fuzz.libfuzzer.phase_clock PIN DIR...`` prints it for a corpus; the campaign's
report has it for the campaign's own corpus.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from ...proto import get_dialect
from ..errors import FuzzError

FORMAT = "ggml-rpc-harness-fuzz-profile/1"
MAX_INPUTS = 2000  # a corpus beyond this is sampled by name order: the figure is a mean
RUNS_EACH = 3


class PhaseClockError(FuzzError, RuntimeError):
    """The profiling run did not produce the target's profile."""


def _inputs(dirs: Sequence[Path]) -> list[Path]:
    files = sorted(f for d in dirs if Path(d).is_dir() for f in Path(d).iterdir() if f.is_file())
    return files[:MAX_INPUTS]


MAX_KILLERS = 20  # inputs that end the process (a sanitizer report) before giving up


def _run_once(binary: Path, inputs: Sequence[Path], env: dict[str, str], runs_each: int,
              timeout: float) -> tuple[dict | None, int | None, float]:
    """One process over ``inputs``: (its profile or None, the index of the input that ended
    it or None, wall seconds)."""
    with tempfile.TemporaryDirectory(prefix="harness-profile-") as tmp:
        out = Path(tmp) / "profile.json"
        env = {k: v for k, v in env.items()
               if k not in ("HARNESS_FUZZ_EVENTS", "HARNESS_FUZZ_ABORT", "HARNESS_FUZZ_TRACE")}
        env["HARNESS_FUZZ_PROFILE"] = str(out)
        started = time.monotonic()
        try:
            r = subprocess.run([str(binary), "-rss_limit_mb=0", f"-runs={runs_each}",
                                *map(str, inputs)], env=env, capture_output=True, text=True,
                               errors="replace", timeout=timeout)
        except subprocess.TimeoutExpired:
            raise PhaseClockError(f"profiling {len(inputs)} inputs took over {timeout:.0f} s") \
                from None
        wall = time.monotonic() - started
        if r.returncode == 0 and out.is_file():
            raw = json.loads(out.read_text())
            if raw.get("format") != FORMAT:
                raise PhaseClockError(f"unknown profile format {raw.get('format')!r}")
            return raw, None, wall
        running = [line[len("Running: "):].strip() for line in r.stderr.splitlines()
                   if line.startswith("Running: ")]
        names = [str(p) for p in inputs]
        if not running or running[-1] not in names:
            tail = "\n".join(r.stderr.splitlines()[-5:])
            raise PhaseClockError(f"the target exited {r.returncode} without its profile: {tail}")
        return None, names.index(running[-1]), wall


def _merge(total: dict | None, raw: dict) -> dict:
    if total is None:
        return {**raw, "phases": {k: list(v) for k, v in raw["phases"].items()}}
    total["executions"] += raw["executions"]
    total["relocation_ns"] += raw["relocation_ns"]
    for key, (count, ns) in raw["phases"].items():
        have = total["phases"].setdefault(key, [0, 0])
        have[0] += count
        have[1] += ns
    return total


def run_phase_clock(binary: Path, inputs: Sequence[Path], env: dict[str, str], *,
                runs_each: int = RUNS_EACH, timeout: float = 300.0) -> dict:
    """The target's profile of ``inputs`` (each run ``runs_each`` times, aborts unwinding as
    in a campaign), its wall seconds and the inputs left out because they end the process
    (a sanitizer report: its clock dies with it; the inputs before it are run again)."""
    if not inputs:
        raise PhaseClockError("no inputs to profile")
    total, wall, killers = None, 0.0, []
    remaining = list(inputs)
    while remaining:
        raw, killer, seconds = _run_once(binary, remaining, env, runs_each, timeout)
        wall += seconds
        if killer is None:
            total = _merge(total, raw)
            break
        killers.append(remaining[killer].name)
        if len(killers) > MAX_KILLERS:
            raise PhaseClockError(f"{len(killers)} of the inputs end the process: no profile")
        if killer:
            raw, again, seconds = _run_once(binary, remaining[:killer], env, runs_each, timeout)
            wall += seconds
            if again is not None:
                raise PhaseClockError(f"{remaining[again].name} ended the process on a second "
                                   "run only: the target is not deterministic")
            total = _merge(total, raw)
        remaining = remaining[killer + 1:]
    if total is None:
        raise PhaseClockError("every input ends the process: no profile")
    total["wall_seconds"] = wall
    total["left_out"] = killers
    return total


def summarise(raw: dict, dialect: str, *, inputs: int, runs_each: int) -> dict:
    """Phases by share of the time, in microseconds per execution."""
    names = get_dialect(dialect).ids
    executions = max(int(raw["executions"]), 1)
    total_ns = sum(ns for _, ns in raw["phases"].values())
    phases = []
    for key, (count, ns) in raw["phases"].items():
        if key in ("setup", "teardown"):
            name = "set-up" if key == "setup" else "teardown"
        else:
            cmd = names.get(int(key))
            name = cmd.value if cmd is not None else f"UNKNOWN_{key}"
        phases.append({"phase": name, "count": count, "us_per_execution": ns / executions / 1e3,
                       "share": ns / max(total_ns, 1)})
    phases.sort(key=lambda p: -p["share"])
    per_execution_ns = total_ns / executions
    return {"inputs": inputs, "runs_each": runs_each, "executions": raw["executions"],
            "us_per_execution": per_execution_ns / 1e3,
            "executions_per_s_in_target": 1e9 / per_execution_ns if per_execution_ns else None,
            "relocation_us_per_execution": raw["relocation_ns"] / executions / 1e3,
            "wall_seconds": round(raw["wall_seconds"], 2), "phases": phases,
            "left_out": raw.get("left_out", [])}


def profile_corpus(binary: Path, dirs: Sequence[Path], env: dict[str, str], dialect: str, *,
                   runs_each: int = RUNS_EACH) -> dict:
    inputs = _inputs(dirs)
    raw = run_phase_clock(binary, inputs, env, runs_each=runs_each)
    return summarise(raw, dialect, inputs=len(inputs) - len(raw["left_out"]),
                     runs_each=runs_each)


def render_markdown(p: dict | None, campaign_rate: float | None = None) -> list[str]:
    if not p:
        return []
    if "error" in p:
        return ["## Where an execution's time goes", "", f"Not profiled: {p['error']}", ""]
    lines = ["## Where an execution's time goes", "",
             f"The target's own phase clock over {p['inputs']:,} corpus inputs, each run "
             f"{p['runs_each']} times ({p['executions']:,} executions, "
             f"{p['wall_seconds']:.1f} s): {p['us_per_execution']:,.1f} us per execution in "
             f"the target ({p['executions_per_s_in_target']:,.0f} executions/s of the kept "
             "corpus on one core; the kept corpus is not the campaign's mix: it holds the "
             "inputs that reached something, graphs among them"
             + (f"; the campaign ran {campaign_rate:,.0f} executions/s in all, libFuzzer's "
                "mutation, coverage bookkeeping and fork-job restarts included" if campaign_rate
                else "") +
             f"). Relocation took {p['relocation_us_per_execution']:.2f} us of it; the CPU "
             "backend is made once per process, not per input."
             + (f" Left out: {len(p['left_out'])} input(s) that end the process (a sanitizer "
                "report)." if p.get("left_out") else ""), "",
             "| phase | times | us per execution | share |", "|---|---|---|---|"]
    lines += [f"| {x['phase']} | {x['count']:,} | {x['us_per_execution']:,.2f} | "
              f"{x['share']:.1%} |" for x in p["phases"]]
    return lines + [""]


def main(argv: list[str] | None = None) -> int:
    from .build import build_target
    from .config import LibFuzzerConfig, sanitizer_env
    from ..target_spec import TargetSpec

    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2:
        print("usage: python -m harness.fuzz.libfuzzer.phase_clock PIN DIR...", file=sys.stderr)
        return 2
    spec = TargetSpec.parse(args[0])
    if spec.kind != "peer" or spec.dialect is None:
        print(f"error: {args[0]}: not a built pin with a known dialect", file=sys.stderr)
        return 2
    build = build_target(spec.name, "libfuzzer")
    try:
        p = profile_corpus(build.binary, [Path(a) for a in args[1:]],
                           sanitizer_env(LibFuzzerConfig(target=args[0]), None), spec.dialect)
    except PhaseClockError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print("\n".join(render_markdown(p)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
