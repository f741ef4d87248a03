"""The campaign report: ``reports/fuzz-<id>/report.json`` and ``report.md``.

Throughput (messages = request frames written, and messages/s over the campaign's wall time,
minimisation included), restarts, the distinct signatures with their minimal reproducers and
the one-line replay command, and the coverage of the command x field space, counted from the
descriptions of the mutations that were actually sent, against the catalogue of every
mutation the strategies can produce for the dialect.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

from .. import strategies as rst
from ..proto import DEFAULT, Cmd
from .triage import root_cause_lines, root_causes



def build_report(cfg, spec, progress, *, interrupted: bool = False) -> dict:
    elapsed = max(progress.elapsed, 1e-9)
    frames = progress.total("frames")
    cases = progress.total("cases")
    dialect = next((w.get("dialect") for w in progress.workers.values() if w.get("dialect")),
                   spec.dialect or DEFAULT.name)
    coverage = progress.merged("coverage")
    findings = sorted(progress.findings, key=lambda f: f.get("found_after_s", 0))
    for f in findings:
        ids = {f["id"], f.get("claim_id", f["id"])}
        f["duplicates"] = sum(progress.duplicates.get(i, 0) for i in ids)
    rss_peak = max((w.get("rss_peak", 0) for w in progress.workers.values()), default=0)
    # First and last sample of each worker's current target process: growth over a run
    # without restarts is the leak indicator (the bound catches only what exceeds it).
    rss_trend = {str(i): {"first": w.get("rss_first"), "last": w.get("rss_last"),
                          "target_starts": w.get("target_starts")}
                 for i, w in sorted(progress.workers.items())}
    totals = {"messages_sent": frames, "bytes_sent": progress.total("bytes"), "cases": cases,
              "generated_cases": progress.total("generated"),
              "evolved_cases": progress.total("evolved"), "restarts": progress.total("restarts"),
              "shrink_attempts": progress.total("shrink_attempts"),
              "verdicts": progress.total("verdicts"), "duplicates": progress.total("duplicates"),
              "unconfirmed": progress.total("unconfirmed"), "workers": cfg.workers}
    template = {"target": cfg.target, "target_kind": spec.kind, "dialect": dialect,
                "rss_limit_bytes": cfg.rss_limit, "deadline_s": cfg.deadline,
                "as_limit_bytes": cfg.as_limit, "config": cfg.to_json()}
    errors = [{k: v for k, v in e.items() if k != "traceback"} for e in progress.errors]
    report = build_report_from_parts(
        template, totals=totals, elapsed=elapsed, coverage=coverage,
        statuses=dict(progress.merged("statuses")), timing=dict(progress.merged("timing")),
        findings=findings, errors=errors, rss_peak=rss_peak,
        extra={"seed": cfg.seed, "duration_s": cfg.duration, "interrupted": interrupted,
               "rss_trend": rss_trend,
               "behaviours": sum(w.get("behaviours", 0) for w in progress.workers.values()),
               "corpus_entries": sum(w.get("corpus", 0) for w in progress.workers.values()),
               "shard": list(cfg.shard),
               "oracles": oracle_summary(cfg.oracles, progress.workers.values()),
               "workers_never_listened": [i for i in range(cfg.workers) if not
                                          progress.workers.get(i, {}).get("target_starts")]})
    if hasattr(cfg, "sweep_share"):  # the in-process engine seeds with the sweep instead
        done, total = progress.total("sweep_done"), progress.total("sweep_total")
        timing = progress.merged("timing")
        report["sweep"] = {"cases": total, "done": done, "complete": done >= total,
                           "seconds": round(timing.get("sweep", 0.0), 1),
                           "share": cfg.sweep_share}
        shards = [(tuple(w["sweep_shard"]), w.get("stats", {}).get("sweep_done", 0))
                  for w in progress.workers.values() if w.get("sweep_shard")]
        if shards and cfg.sweep_share > 0:
            report["sweep"].update(phases_summary(dialect, shards, timing, cfg.phases))
    report["problems"] = campaign_problems(report, cfg.min_messages)
    return report


def build_report_from_parts(template: dict, *, totals: dict, elapsed: float, coverage: Counter,
                            statuses: dict, timing: dict, findings: list, errors: list,
                            rss_peak: int, extra: dict) -> dict:
    """A report from its counts (one campaign's workers, or several campaigns merged):
    ``template`` gives target, dialect and limits; rates and coverage are computed here."""
    elapsed = max(elapsed, 1e-9)
    report = {"format": "ggml-rpc-fuzz-report/1", "interrupted": False, "rss_trend": {},
              **template, **totals,
              "elapsed_s": round(elapsed, 1),
              "messages_per_s": round(totals["messages_sent"] / elapsed, 1),
              "cases_per_s": round(totals["cases"] / elapsed, 1),
              "statuses": statuses, "rss_peak_bytes": rss_peak,
              "findings": findings, "distinct_signatures": len(findings),
              "coverage": coverage_summary(template["dialect"], coverage),
              "coverage_counts": dict(coverage),  # raw, so shard reports can be merged
              "timing_s": {k: round(v, 1) for k, v in sorted(timing.items())},
              "errors": errors, **extra}
    report["nothing_found"] = not findings and not errors
    report["root_causes"] = [rc.to_json() for rc in root_causes(findings)]
    return report


DEFAULT_MIN_MESSAGES = 100


def oracle_summary(limits: dict, workers) -> dict:
    """Thresholds of the oracles beyond death, the known properties the workers noted about
    the target (e.g. a serial server), and how many campaign samples fired."""
    from .oracles import OracleLimits
    notes: dict = {}
    for w in workers:
        notes.update(w.get("oracle_notes") or {})
    return {"limits": OracleLimits.from_json(limits).to_json(), "notes": notes,
            "triggers": sum(w.get("oracle_triggers", 0) for w in workers)}


def _oracle_rows(o: dict | None) -> list[str]:
    if not o:
        return []
    lim = o["limits"]
    rows = [f"| oracles | amplification > {lim['amplification']:g}x and > "
            f"{_mib(lim['amplification_floor'])}, freeze wait {lim['freeze_wait']:g} s, "
            f"cache {'on (-c)' if lim['cache'] else 'off'}, fd growth {lim['fd_growth']}, "
            f"spin {lim['spin_seconds']:g} s CPU (0: off); {o.get('triggers', 0)} sample(s) "
            "fired |"]
    rows += [f"| known property ({k}) | {_md(v)} |" for k, v in sorted(o["notes"].items())]
    return rows


def campaign_problems(report: dict, min_messages: int = DEFAULT_MIN_MESSAGES) -> list[str]:
    """Why a campaign tested nothing worth its verdict: a worker whose target never listened,
    or fewer messages exchanged than ``min_messages`` (client targets: no session at all).
    A finding whose replay could not run (:func:`replay_problems`) is one too. Empty when
    the campaign ran; ``harness fuzz`` exits non-zero otherwise."""
    out = replay_problems(report)
    if report.get("engine") == "libfuzzer":  # in process: no server listens, inputs count
        least = max(min_messages, 1)
        if report.get("executions", 0) < least:
            out.append(f"only {report.get('executions', 0):,} executions, fewer than the "
                       f"minimum {least:,} (--min-messages)")
        return out
    never = report.get("workers_never_listened") or []
    if never:
        why = "; ".join(str(e.get("error", "")) for e in report.get("errors", []))
        out.append(f"target never listened (worker {', '.join(map(str, never))})"
                   + (f": {why}" if why else ""))
    if report.get("target_kind") == "client":
        if not report.get("cases"):
            out.append("no client session ran")
    elif report.get("messages_sent", 0) < min_messages:
        out.append(f"only {report.get('messages_sent', 0):,} messages exchanged, fewer than the "
                   f"minimum {min_messages:,} (--min-messages)")
    out += systematic_problems(report)
    return out


def replay_problems(report: dict) -> list[str]:
    """Findings whose replay could not run (the live server it needs is missing, or would not
    start): an unconfirmed finding is no "does not replay", and no campaign is green on it."""
    return [f"finding {f['id']}: its replay could not run ({f['replay_error']})"
            for f in report.get("findings") or [] if f.get("replay_error")]


def replay_cell(finding: dict) -> str:
    """A finding's replay column: yes, no, or that it could not run."""
    if finding.get("replay_error"):
        return "**could not run**"
    return {True: "yes", False: "**no**", None: "?"}[finding.get("replays")]


SYSTEMATIC_FROM_S = 120.0  # a campaign this long must have exercised every catalogue entry
# ... and this long must have finished its sweep: its 20% share (60 s) is above the 22-48 s
# the whole sweep took against p7 and p8 on a 2-core machine, where a 2-minute share (24 s)
# is not. A shorter campaign's report still says how much of the sweep it ran.
SWEEP_COMPLETE_FROM_S = 300.0


def systematic_problems(report: dict) -> list[str]:
    """A campaign of at least two minutes that left catalogue entries unexercised, or of at
    least five that did not finish its sweep, did not try what it claims to try."""
    duration = report.get("duration_s") or 0
    if duration < SYSTEMATIC_FROM_S or report.get("interrupted"):
        return []
    out = []
    sweep = report.get("sweep") or {}
    if sweep.get("cases") and not sweep.get("complete") and duration >= SWEEP_COMPLETE_FROM_S:
        out.append(f"the sweep ran {sweep['done']:,} of its {sweep['cases']:,} cases in its "
                   f"share of the time ({sweep.get('seconds', 0):.0f} s)")
    missing = (report.get("coverage") or {}).get("missing") or []
    if missing:
        out.append(f"{len(missing)} mutation x command pairs not exercised: "
                   + ", ".join(missing[:8]) + (" ..." if len(missing) > 8 else ""))
    return out


def coverage_summary(dialect: str, coverage: Counter, *, local_only: bool = True) -> dict:
    """Which (kind, what, cmd) mutations and which command x field pairs were exercised.

    The denominators come from the mutation registry (:func:`rst.mutation_catalogue`): the
    request-side operators of the dialect and the fields each can write per command, so a
    newly registered mutation shows up here (with 0 until a campaign sends it). With
    ``local_only`` (every live campaign) the pairs a campaign never sends by the loopback
    rule, a well-formed COMM_INIT (the server would connect to the addresses it names), are
    ``withheld``, not missing."""
    catalogue = [c for c in rst.mutation_catalogue(dialect) if c["direction"] == "request"]
    withheld = [f"{c['kind']}:{c['what']}:{c['cmd']}" for c in catalogue
                if local_only and c["cmd"] == Cmd.COMM_INIT.value
                and not rst.MUTATIONS[(c["kind"], c["what"])].never_runs]
    seen_ops: Counter = Counter()
    fields: dict = defaultdict(Counter)
    for c in catalogue:
        for f in c["fields"]:
            fields[c["cmd"]][f] += 0
    valid: Counter = Counter()
    for key, n in coverage.items():
        parts = key.split("|")
        if parts[0] == "valid":
            valid[parts[1]] += n
            continue
        kind, what, cmd, field = parts
        cmd_key = "UNKNOWN" if cmd.startswith("UNKNOWN_") else cmd
        seen_ops[(kind, what, cmd_key)] += n
        fields[cmd_key][field] += n
    exercised = [c for c in catalogue if (c["kind"], c["what"], c["cmd"]) in seen_ops]
    missing = [f"{c['kind']}:{c['what']}:{c['cmd']}" for c in catalogue
               if (c["kind"], c["what"], c["cmd"]) not in seen_ops
               and f"{c['kind']}:{c['what']}:{c['cmd']}" not in withheld]
    by_kind = {}
    for kind in rst.MUTATION_KINDS:
        total = sum(1 for c in catalogue if c["kind"] == kind)
        hit = sum(1 for c in exercised if c["kind"] == kind)
        by_kind[kind] = {"exercised": hit, "catalogue": total}
    command_field = {cmd: dict(sorted(f.items())) for cmd, f in sorted(fields.items())}
    # fields only withheld operators write: never sent by the rule, so not "not reached"
    open_fields = {(c["cmd"], f) for c in catalogue
                   if f"{c['kind']}:{c['what']}:{c['cmd']}" not in withheld for f in c["fields"]}
    withheld_fields = {cmd: sorted(f for f, n in fs.items()
                                   if not n and (cmd, f) not in open_fields)
                       for cmd, fs in command_field.items()}
    withheld_fields = {cmd: fs for cmd, fs in withheld_fields.items() if fs}
    return {
        "mutations_exercised": len(exercised), "mutations_catalogue": len(catalogue),
        "by_kind": by_kind, "missing": missing, "withheld": withheld,
        "command_field": command_field,
        "fields_exercised": sum(1 for f in command_field.values() for n in f.values() if n),
        "fields_catalogue": sum(len(f) for f in command_field.values())
        - sum(len(f) for f in withheld_fields.values()),
        "fields_withheld": withheld_fields,
        "valid_commands": dict(sorted(valid.items())),
        "mutated_messages": sum(seen_ops.values()), "valid_messages": sum(valid.values()),
    }


def write_report(out: Path, report: dict) -> None:
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (out / "report.md").write_text(render_markdown(report, out))


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.0f} MiB"


def render_markdown(r: dict, out: Path) -> str:
    lines = [f"# Fuzz campaign: {r['target']} (dialect {r['dialect']})", ""]
    verdict = ("**Nothing found**: no crash, hang, memory growth beyond the bound or protocol "
               "violation" if r["nothing_found"] else
               f"**{r['distinct_signatures']} distinct signature(s) found**")
    if r["target_kind"] == "client":
        if r["nothing_found"]:
            verdict = "**Nothing found**: no crash or unexpected hang of the client"
        lines += [verdict + f" in {r['cases']:,} client sessions against a misbehaving "
                  f"reference server over {r['elapsed_s']:.0f} s (its expected defences are "
                  "listed under session outcomes).", ""]
    else:
        lines += [verdict + f" in {r['messages_sent']:,} messages ({r['cases']:,} connections) "
                  f"over {r['elapsed_s']:.0f} s.", ""]
    if r["interrupted"]:
        lines += ["The campaign was interrupted before its duration ended.", ""]
    unreplayed = replay_problems(r)
    untested = [p for p in r.get("problems") or [] if p not in unreplayed]
    if untested:
        lines += ["**The campaign did not test the target**: " + "; ".join(
            _md(p) for p in untested) + ".", ""]
    if unreplayed:
        lines += ["**Findings whose replay could not run** (the campaign fails on them): "
                  + "; ".join(_md(p) for p in unreplayed) + ".", ""]
    if r["target_kind"] == "client":
        # Each session is a fresh client process facing one misbehaving server: no message
        # counts, restarts or server memory to report.
        lines += ["| | |", "|---|---|",
                  f"| target | `{r['target']}` (the peer's client library) |",
                  f"| seed | {r['seed']} |",
                  f"| duration | {r['elapsed_s']:.0f} s (asked {r['duration_s']:.0f} s) |",
                  f"| client sessions | {r['cases']:,} ({r['cases_per_s']:,.1f}/s) |",
                  f"| step deadline | {r['deadline_s']:g} s |",
                  "| session outcomes | " + ", ".join(f"{k} {v:,}" for k, v in
                                                       sorted(r["statuses"].items())) + " |",
                  ""]
        return _render_rest(r, out, lines)
    lines += ["| | |", "|---|---|",
              f"| target | `{r['target']}` ({r['target_kind']}) |",
              f"| seed / workers | {r['seed']} / {r['workers']}"
              + _shard_text(r) + " |",
              f"| duration | {r['elapsed_s']:.0f} s (asked {r['duration_s']:.0f} s) |",
              f"| messages sent | {r['messages_sent']:,} ({r['bytes_sent']:,} bytes) |",
              f"| messages/s | {r['messages_per_s']:,.0f} (all workers, minimisation included) |",
              f"| connections | {r['cases']:,} ({r['cases_per_s']:,.1f}/s): "
              f"{r.get('generated_cases', 0):,} generated, {r.get('evolved_cases', 0):,} "
              "derived from the evolving corpus |",
              sweep_row(r.get("sweep")),
              f"| corpus | {r.get('corpus_entries', 0):,} entries kept for "
              f"{r.get('behaviours', 0):,} distinct behaviours |",
              "| worker time | " + (", ".join(f"{k} {v:,.1f} s" for k, v in
                                              r.get("timing_s", {}).items()) or "-") + " |",
              f"| target restarts | {r['restarts']} |",
              f"| verdicts / duplicates / unconfirmed | {r['verdicts']} / {r['duplicates']} / "
              f"{r['unconfirmed']} |",
              f"| shrink attempts | {r['shrink_attempts']} |",
              f"| RSS peak / bound | {_mib(r['rss_peak_bytes'])} / {_mib(r['rss_limit_bytes'])} |",
              "| RSS first -> last sample of one target process | " + ", ".join(
                  _trend(k, v) for k, v in r.get("rss_trend", {}).items()) + " |",
              f"| hang deadline | {r['deadline_s']:g} s |",
              *_oracle_rows(r.get("oracles")),
              "| connection outcomes | " + ", ".join(f"{k} {v:,}" for k, v in
                                                      sorted(r["statuses"].items())) + " |",
              ""]
    return _render_rest(r, out, lines)


def phases_summary(dialect: str, shards, timing, phases) -> dict:
    """The deterministic phases' coverage from what each worker sent (its shard of the sweep
    and how many of its cases it ran): per phase cases and seconds, per command the covering
    array's rows and the pairs and triples they covered, the stateful pairs covered. Phases
    the campaign was not asked to run are left out."""
    from .sweep import coverage, sent
    cov = coverage(dialect, sent(dialect, shards, phases))
    return {"parts": {p: {"done": cov["parts"][p][0], "cases": cov["parts"][p][1],
                          "seconds": round(timing.get(f"sweep:{p}", 0.0), 1)}
                      for p in phases if p in cov["parts"]},
            "interactions": cov["commands"] if "combinatorial" in phases else {},
            "stateful": cov["stateful"] if "stateful" in phases else {}}


def _pct(pair) -> str:
    covered, possible = pair
    return f"{covered:,} / {possible:,} ({100 * covered / possible:.1f}%)" if possible else "-"


def phases_lines(sweep: dict | None) -> list[str]:
    """Markdown: each deterministic phase's progress and time, the interaction coverage of
    each command's covering array, and the stateful pairs covered."""
    if not sweep or not sweep.get("parts"):
        return []
    lines = ["## Deterministic phases", "",
             "| phase | cases sent | of | seconds |", "|---|---|---|---|"]
    for part, p in sweep["parts"].items():
        lines.append(f"| {part} | {p['done']:,} | {p['cases']:,} | {p['seconds']:.1f} |")
    inter = sweep.get("interactions") or {}
    if inter:
        lines += ["", "Interaction coverage of the combinatorial phase (every pair of classes of "
                  "any two fields, t = 2; every placement triple of a tensor and of a tensor "
                  "and its source, t = 3):", "",
                  "| command | factors | array rows | rows sent | pairs covered | "
                  "triples covered |", "|---|---|---|---|---|---|"]
        for cmd, c in inter.items():
            lines.append(f"| {cmd} | {c['factors']} | {c['rows']:,} | {c['sent']:,} | "
                         f"{_pct(c['pairs'])} | {_pct(c['triples'])} |")
        pairs = [sum(c["pairs"][i] for c in inter.values()) for i in (0, 1)]
        triples = [sum(c["triples"][i] for c in inter.values()) for i in (0, 1)]
        lines.append(f"| **all** | | {sum(c['rows'] for c in inter.values()):,} | "
                     f"{sum(c['sent'] for c in inter.values()):,} | {_pct(pairs)} | "
                     f"{_pct(triples)} |")
    st = sweep.get("stateful") or {}
    if st.get("pairs"):
        lines += ["", f"Stateful pairs covered (every ordered pair of state-changing requests "
                  f"on one buffer, each followed by all {st['uses']} uses): "
                  f"{_pct(st['pairs'])}."]
    return lines + [""]


def sweep_row(sweep: dict | None) -> str:
    if not sweep or not sweep.get("cases"):
        return "| sweep | not run |"
    state = "complete" if sweep["complete"] else \
        f"**stopped at its share of the time: {sweep['cases'] - sweep['done']:,} cases not run**"
    return (f"| sweep (deterministic, first) | {sweep['done']:,} of {sweep['cases']:,} cases in "
            f"{sweep.get('seconds', 0):.1f} s, {state} |")


def _render_rest(r: dict, out: Path, lines: list[str]) -> str:
    if r["errors"]:
        lines += ["## Worker errors", ""] + [f"* worker {e.get('worker')}: {e.get('error')}"
                                            for e in r["errors"]] + [""]
    lines += root_cause_lines(r["findings"], _md)
    lines += phases_lines(r.get("sweep"))
    lines += ["## Findings", ""]
    if not r["findings"]:
        lines += ["None." + (" The reference server must never crash, hang, grow beyond its "
                             "memory bound or break the connection rules; it did not."
                             if r["target_kind"] == "ref" else ""), ""]
    else:
        lines += ["| id | kind | signal | command | log line / observation | steps (from) | "
                  "replays | dups |", "|---|---|---|---|---|---|---|---|"]
        for f in r["findings"]:
            s = f["signature"]
            replays = replay_cell(f)
            lines.append(f"| [{f['id']}](#{f['id']}) | {s['kind']} | {s['signal'] or '-'} | "
                         f"{s['command']} | `{_md(s['line'] or '-')}` | {f['steps']} "
                         f"({f.get('original_steps', f['steps'])}) | {replays} | "
                         f"{f.get('duplicates', 0)} |")
        lines.append("")
        for f in r["findings"]:
            folder = Path(f["replay"].split()[2]).parent
            lines += [f"### {f['id']}", "", f"{_md(f['title'])}", ""]
            if f.get("detail"):
                lines += [f"Detail: {_md(f['detail'])}", ""]
            if not f.get("confirmed", True):
                lines += ["Not confirmed in isolation: the saved case is the connection that "
                          "was running when it happened, not minimised.", ""]
            via = (f" (hypothesis shrink: {f['hypothesis_shrunk_steps']})"
                   if f.get("hypothesis_shrunk_steps") else "")
            files = f.get("reproducer_text") or (
                f"`{folder}/repro.rpct` (pcap: `{folder}/repro.pcap`, regression test: "
                f"`{folder}/test_repro.py`)")
            lines += [f"Reproducer: {files}, minimised from "
                      f"{f.get('original_steps', f['steps'])}{via} to {f['steps']} steps in "
                      f"{f.get('minimise_seconds', 0)} s.", "",
                      "```", f["replay"], "```", "", "```"] + f["listing"] + ["```", ""]
    cov = r["coverage"]
    if r["target_kind"] == "client":
        lines += ["## Coverage of the server's misbehaviours", "",
                  f"{cov['mutations_exercised']} of {cov['mutations_catalogue']} knobs were "
                  "used:", "", "| knob | sessions |", "|---|---|"]
        for fields in cov["command_field"].values():
            for knob, values in fields.items():
                text = (", ".join(f"{k} {v}" for k, v in values.items())
                        if isinstance(values, dict) else str(values))
                lines.append(f"| {knob} | {_md(text)} |")
        if cov["missing"]:
            lines += ["", "Not used: " + ", ".join(cov["missing"])]
        return "\n".join(lines + [""])
    lines += ["## Coverage of the command x field space", "",
              f"{cov['mutations_exercised']} of {cov['mutations_catalogue']} mutation operators "
              f"(kind x what x command) of the dialect's catalogue were sent; "
              f"{cov['mutated_messages']:,} mutated and {cov['valid_messages']:,} valid "
              "messages.", "", "| kind | exercised | catalogue |", "|---|---|---|"]
    for kind, v in cov["by_kind"].items():
        lines.append(f"| {kind} | {v['exercised']} | {v['catalogue']} |")
    lines += ["", f"Mutated fields per command (messages sent; "
              f"{cov.get('fields_exercised', 0)} of {cov.get('fields_catalogue', 0)} command x "
              "field pairs of the registry reached):", "",
              "| command | fields reached | not reached |", "|---|---|---|"]
    withheld_fields = cov.get("fields_withheld", {})
    for cmd, fields in cov["command_field"].items():
        held = withheld_fields.get(cmd, [])
        lines.append(f"| {cmd} | " + ", ".join(f"{k} {v}" for k, v in fields.items() if v)
                     + " | " + ", ".join(k for k, v in fields.items() if not v and k not in held)
                     + (f" (withheld: {', '.join(held)})" if held else "") + " |")
    lines += ["", "Valid messages per command: " + ", ".join(
        f"{k} {v:,}" for k, v in cov["valid_commands"].items()), ""]
    if cov["missing"]:
        lines += [f"Not exercised ({len(cov['missing'])}): " + ", ".join(cov["missing"]), ""]
    if cov.get("withheld"):
        lines += [f"Withheld by the loopback rule ({len(cov['withheld'])}; a well-formed "
                  "COMM_INIT makes the server connect to the addresses it names): "
                  + ", ".join(cov["withheld"]), ""]
    return "\n".join(lines)


def _shard_text(r: dict) -> str:
    if r.get("merged_from"):
        shards = ", ".join(f"{i}/{n}" for i, n in r.get("shards", []))
        missing = (f"; **shards missing: {', '.join(map(str, r['shards_missing']))}**"
                   if r.get("shards_missing") else "")
        return f" ({len(r['merged_from'])} campaigns merged: shards {shards}{missing})"
    shard = r.get("shard") or [1, 1]
    return f" (shard {shard[0]}/{shard[1]})" if shard[1] > 1 else ""


def _trend(worker: str, v: dict) -> str:
    if (v.get("target_starts") or 0) > 1 or not v.get("first"):
        return f"w{worker}: n/a ({v.get('target_starts') or 0} target processes)"
    return f"w{worker}: {_mib(v['first'])} -> {_mib(v['last'])} (no restart)"


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("`", "'")
