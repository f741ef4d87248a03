"""The in-process campaign's report: the live campaign's Markdown without the rows that only
mean something on the wire, plus the engine's own figures, edges over time, the live replays,
the phase clock and the server's line coverage; and the class a finding is counted under."""

from __future__ import annotations

import re
from pathlib import Path

from ..report import render_markdown, replay_cell
from .config import MAX_RERUNS
from .phase_clock import render_markdown as render_phase_clock_markdown


def finding_class(sig: dict) -> str:
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
    lines += render_phase_clock_markdown(r.get("execution_profile"), r.get("executions_per_s"))
    from ..coverage import render_coverage_markdown
    lines += render_coverage_markdown(r.get("server_coverage"))
    return head + "\n".join(lines) + "\n" + sep + rest
