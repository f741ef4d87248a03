"""What a differential campaign writes: each divergence's folder (the case, both sides'
transcripts and pcaps, finding.json) and report.md."""

from __future__ import annotations

import json
from pathlib import Path

from ..capture.pcap import write_pcap
from .case import Case
from .divergence import Divergence
from .report import sweep_row, phases_lines
from .shrink import transcript_of

FORMAT = "ggml-rpc-fuzz-divergence/1"


def save_divergence(folder: Path, case: Case, runs, div: Divergence, *, cfg, labels,
                    dialect: str, extra: dict) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    meta = {"format": FORMAT, "signature": div.signature.to_json(), "a": cfg.a, "b": cfg.b,
            "dialect": dialect, "case": case.to_json()}
    transcript_of(case, None, meta).save(folder / "repro.rpct")
    for name, (_, o) in zip(("a", "b"), runs):
        tr = transcript_of(case, o, {**meta, "side": name})
        tr.save(folder / f"{name}.rpct")
        write_pcap(tr, folder / f"{name}.pcap")
    finding = {"format": FORMAT, "id": folder.name, "signature": div.signature.to_json(),
               "title": div.signature.title(), "detail": div.detail, "step": div.step,
               "a": cfg.a, "b": cfg.b, "labels": list(labels), "dialect": dialect,
               "steps": len(case.steps), "listing": case.describe(),
               "outcomes": [{"status": o.status, "at": o.at,
                             "broke": v.signature.title() if v else None} for v, o in runs],
               "replay": f"harness replay {folder}/repro.rpct --differential {cfg.a} {cfg.b}",
               **extra}
    (folder / "finding.json").write_text(json.dumps(finding, indent=1) + "\n")
    return finding


def render_markdown(r: dict) -> str:
    s = r["stats"]
    lines = [f"# Differential fuzzing: {r['a']} vs {r['b']} (dialect {r['dialect']})", ""]
    if r.get("problems"):
        lines += ["**The campaign did not test the targets**: " + "; ".join(r["problems"]) + ".",
                  ""]
    lines += [("**No divergence**" if r["nothing_found"] else
               f"**{r['distinct_signatures']} divergence(s)**")
              + f" in {r['cases']:,} sessions ({r['messages_sent']:,} messages to both sides) "
              f"over {r['elapsed_s']:.0f} s; seed {r['seed']}.", "",
              "| | |", "|---|---|",
              f"| sessions | {r['cases']:,}: {s.get('sweep_done', 0):,} of the sweep, "
              f"{s['generated']:,} generated, {s['evolved']:,} evolved |",
              sweep_row(r.get("sweep")),
              f"| divergent sessions (not allow-listed / allow-listed) | {s['divergences_seen']:,} / "
              f"{s['allowed']:,} |",
              f"| sessions where both broke the same way | {s['both_broke']:,} |",
              f"| target restarts | {s['restarts']} |", ""]
    if r["errors"]:
        lines += ["## Errors", ""] + [f"* {e['error']}" for e in r["errors"]] + [""]
    lines += phases_lines(r.get("sweep"))
    lines += ["## Divergences", ""]
    for f in r["findings"]:
        lines += [f"### {f['id']}", "", f"{f['title']}", "", f"Detail: {f['detail']}", "",
                  f"Minimised from {f.get('original_steps')} to {f['steps']} steps; both sides' "
                  f"transcripts next to the reproducer (`a.rpct`, `b.rpct`). "
                  + ("Replays on freshly started targets." if f.get("replays_on_fresh_targets")
                     else "Does not replay on freshly started targets: the outcome depends on "
                          "what earlier sessions left in a server process (its heap, say)."),
                  "",
                  "```", f["replay"], "```", "", "```"] + f["listing"] + ["```", ""]
    if not r["findings"]:
        lines += ["None beyond the allow-list.", ""]
    lines += ["## Allow-list", "", "Sessions: how many divergent sessions each entry let pass.",
              "", "| command | kind | bytes | match | sessions | reason |",
              "|---|---|---|---|---|---|"]
    for e in r["allow"]:
        match = f"`{e['match']}`".replace("|", "\\|") if e.get("match") else ""
        lines.append(f"| {e['cmd']} | {e['kind']} | {e.get('bytes') or 'all'} | {match} | "
                     f"{e.get('sessions', 0):,} | {e.get('reason', '')} |")
    return "\n".join(lines + [""])
