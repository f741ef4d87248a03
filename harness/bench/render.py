"""Rendering a bench run's document (:func:`harness.bench.measure.run_bench`): the rows both the
table and the CLI print, bench.md, and the files bench.json / bench.md."""

from __future__ import annotations

import json
from pathlib import Path


def write_bench(out_dir: Path, doc: dict) -> None:
    """bench.json and bench.md of a bench run's document."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out_dir / "bench.md").write_text(markdown(doc))

def _fmt(x: float | None, unit: str = "") -> str:
    if x is None:
        return "-"
    s = f"{x:,.0f}" if abs(x) >= 100 else f"{x:.2f}"
    return f"{s} {unit}".strip()


def rows(figs: list[dict]) -> list[list[str]]:
    """figure, value, anchor, ratio, target, met? (what both the table and the CLI print)"""
    out = []
    for f in figs:
        met = "FAILED" if f.get("failed") else {True: "yes", False: "NO", None: "-"}[f["met"]]
        out.append([f["title"], _fmt(f["value"], f["unit"]), _fmt(f["anchor"], f["unit"]) +
                    (f" ({f['anchor_title']})" if f["anchor"] is not None else ""),
                    "-" if f["ratio"] is None else f"{f['ratio']:.2f}x", f["target"], met])
    return out


def markdown(doc: dict) -> str:
    m = doc["machine_start"]
    about = (f"{m['cpu']}, {m['cores']} cores, Python {m['python']}; peer {doc['peer']} "
             f"(proto {doc['peer_proto']}); load average {m['loadavg'][0]:.2f} at start, "
             f"{doc['machine_end']['loadavg'][0]:.2f} at the end; "
             f"{m.get('tcp_time_wait')} TCP sockets in TIME_WAIT at start; {doc['seconds']} s.")
    lines = [f"# harness bench {doc['id']}{' (quick)' if doc['quick'] else ''}", "", about, "",
             f"Medians of {doc['repeats']} rounds after a warm-up round.", "",
             "| figure | value | anchor | ratio | target | met? |", "|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows(doc["figures"])]
    failed = [f for f in doc["figures"] if f.get("failed")]
    if failed:
        lines += ["", "Failed (no measurement):", ""]
        lines += [f"- `{f['id']}`: {f['failed']}" for f in failed]
    notes = [f for f in doc["figures"] if f["notes"] or f["extra"]]
    if notes:
        lines += ["", "Notes:", ""]
        for f in notes:
            extra = ", ".join(f"{k}={v}" for k, v in f["extra"].items())
            lines.append(f"- `{f['id']}`: " + "; ".join(x for x in (f["notes"], extra) if x))
    return "\n".join(lines) + "\n"
