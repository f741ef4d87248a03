"""Writing a matrix run's results: JSONL, CSV, Markdown grid, static HTML, JUnit XML."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd

from . import html_report
from .glyphs import COLOUR, SYMBOL  # noqa: F401 - re-exported for the job's progress line
from .html_report import SHORT, text
from .load_table import markdown_table as load_table_md


def frame(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows)


def write_tables(df: pd.DataFrame, out: Path) -> None:
    df.to_json(out / "results.jsonl", orient="records", lines=True, default_handler=str)
    flat = df.copy()
    for col in ("facts", "checks", "degraded", "load"):
        if col in flat:
            flat[col] = flat[col].map(lambda v: json.dumps(v, default=str))
    flat.to_csv(out / "results.csv", index=False)


def _cell_text(group: pd.DataFrame) -> str:
    """One grid cell: the verdicts and the outcomes behind them."""
    verdicts = group["verdict"].value_counts()
    head = " ".join(f"{SYMBOL[v]}{n}" for v, n in verdicts.items())
    outcomes = group[group["verdict"] != "skip"]["observed"].value_counts()
    body = ", ".join(f"{SHORT.get(o, o)}×{n}" for o, n in outcomes.items())
    notes = []
    for _, r in group.iterrows():
        if r["observed"] == "works-degraded":
            notes.append(f"{r['scenario']}: {', '.join(r['degraded'])}")
        if r["verdict"] not in ("pass", "skip"):
            notes.append(f"{r['scenario']}: {r['verdict'].upper()}")
    return f"{head} {body}" + (f" [{'; '.join(notes)}]" if notes else "")


def markdown(df: pd.DataFrame, title: str, notes: dict[str, list[str]] | None = None) -> str:
    out = [f"# {title}", ""]
    for design, d in df.groupby("design", sort=False):
        out.append(f"## {design}")
        out.append("")
        for note in (notes or {}).get(design, []):
            out.append(f"- {note}")
        if (notes or {}).get(design):
            out.append("")
        if design == "releases":
            out += _releases_md(d)
            continue
        keys = ["cache", "transport"] if "transport" in d else ["cache"]
        for key, dc in d.groupby(keys, sort=False):
            cache, transport = (key if isinstance(key, tuple) else (key, "tcp"))
            out.append(f"**server cache {'on' if cache else 'off'}"
                       f"{'' if transport == 'tcp' else ', over ' + transport}**")
            out.append("")
            servers = list(dict.fromkeys(dc["server_label"]))
            out.append("| client \\ server | " + " | ".join(servers) + " |")
            out.append("|---" * (len(servers) + 1) + "|")
            for client, dr in dc.groupby("client_label", sort=False):
                row = [client]
                for s in servers:
                    g = dr[dr["server_label"] == s]
                    row.append(_cell_text(g) if len(g) else "")
                out.append("| " + " | ".join(row) + " |")
            out.append("")
        out += load_table_md(d)
        out.append("| scenario | cache | transport | " + " | ".join(dict.fromkeys(d["pair"])) + " |")
        out.append("|---|---|---" + "|---" * d["pair"].nunique() + "|")
        tcol = "transport" if "transport" in d else "cache"
        for (scen, cache, transport), ds in d.groupby(["scenario", "cache", tcol], sort=False):
            cells = []
            for pair in dict.fromkeys(d["pair"]):
                r = ds[ds["pair"] == pair]
                if len(r):
                    r = r.iloc[0]
                    observed = text(r["observed"])
                    cells.append(f"{SYMBOL[r['verdict']]} {SHORT.get(observed, observed)}")
                else:
                    cells.append("")
            tname = transport if tcol == "transport" else "tcp"
            out.append(f"| {scen} | {'on' if cache else 'off'} | {tname} | " + " | ".join(cells) + " |")
        out.append("")
    out += _load_md(df)
    bad = df[~df["verdict"].isin(["pass", "skip"])]
    if len(bad):
        out.append("## Unexpected")
        out.append("")
        for _, r in bad.iterrows():
            out.append(f"- **{r['verdict'].upper()}** `{r['cell_id']}`: {r['reason']}")
        out.append("")
    skipped = df[df["verdict"] == "skip"]
    if len(skipped):
        out.append("## Skipped")
        out.append("")
        for reason, g in skipped.groupby(skipped["reason"].map(text)):
            out.append(f"- {len(g)} cell(s): {reason or 'no reason recorded'}")
        out.append("")
    counts = df["verdict"].value_counts().to_dict()
    out.append("Totals: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return "\n".join(out) + "\n"


def _load_md(df: pd.DataFrame) -> list[str]:
    """Per-cell upload timing of the cells that uploaded at least 1 MiB."""
    if "load" not in df:
        return []
    rows = [r for _, r in df.iterrows()
            if isinstance(r["load"], dict) and r["load"].get("set_tensor_bytes", 0) >= 1 << 20]
    if not rows:
        return []
    out = ["## Upload timing (from the wire)", "",
           "| cell | SET_TENSOR | MiB | SET_TENSOR_HASH | hits | MiB hashed by client "
           "| wire s | hashing s | gaps s |", "|---" * 9 + "|"]
    for r in rows:
        p = r["load"]
        out.append(f"| {r['cell_id']} | {p['set_tensor_calls']} | {p['set_tensor_bytes'] / (1 << 20):.1f}"
                   f" | {p['hash_calls']} | {p['hash_hits']} | {p['bytes_hashed'] / (1 << 20):.1f}"
                   f" | {p['wire_seconds']:.3f} | {p['hashing_seconds']:.3f} | {p['gap_seconds']:.3f} |")
    out.append("")
    return out


def _releases_md(d: pd.DataFrame) -> list[str]:
    peers = list(dict.fromkeys(d["server"]))
    out = ["Rows: client build, columns: server build. Each cell: observed (predicted by the "
           "version rule).", "", "| client \\ server | " + " | ".join(
               f"{p} ({d[d['server'] == p]['server_dialect'].iloc[0]})" for p in peers) + " |",
           "|---" * (len(peers) + 1) + "|"]
    for client, dr in d.groupby("client", sort=False):
        row = [f"{client} ({dr['client_dialect'].iloc[0]})"]
        for p in peers:
            r = dr[dr["server"] == p]
            if not len(r):
                row.append("")
                continue
            r = r.iloc[0]
            row.append(f"{SYMBOL[r['verdict']]} {SHORT.get(text(r['observed']), text(r['observed']) or '-')}"
                       f" ({SHORT.get(r['expected_outcome'], r['expected_outcome'])})")
        out.append("| " + " | ".join(row) + " |")
    out.append("")
    return out


def write_html(df: pd.DataFrame, out: Path, title: str, diffs: list[dict] | None = None,
               notes: dict[str, list[str]] | None = None) -> None:
    (out / "matrix.html").write_text(html_report.render(df, title, diffs, notes))


def write_junit(df: pd.DataFrame, out: Path, name: str = "ggml-rpc-matrix") -> None:
    suites = ET.Element("testsuites", name=name)
    for design, d in df.groupby("design", sort=False):
        counts = d["verdict"].value_counts()
        suite = ET.SubElement(suites, "testsuite", name=str(design), tests=str(len(d)),
                              failures=str(counts.get("fail", 0)),
                              errors=str(sum(counts.get(v, 0) for v in ("crash", "hang", "error"))),
                              skipped=str(counts.get("skip", 0)))
        for _, r in d.iterrows():
            tc = ET.SubElement(suite, "testcase", classname=f"{design}.{r['pair']}",
                               name=r["cell_id"], time=f"{r['duration']:.3f}")
            v = r["verdict"]
            if v == "fail":
                ET.SubElement(tc, "failure", message=r["reason"]).text = r["reason"]
            elif v in ("crash", "hang", "error"):
                ET.SubElement(tc, "error", type=v, message=r["reason"]).text = r["reason"]
            elif v == "skip":
                ET.SubElement(tc, "skipped", message=r["reason"])
    ET.ElementTree(suites).write(out / "junit.xml", encoding="utf-8", xml_declaration=True)


def write_all(rows: list[dict], out: Path, title: str, diffs: list[dict] | None = None,
              notes: dict[str, list[str]] | None = None) -> pd.DataFrame:
    """``notes``: lines shown under a design's heading (e.g. the builds a class stood in for),
    also kept in notes.json so `harness report` can show them again."""
    out.mkdir(parents=True, exist_ok=True)
    if notes is None and (out / "notes.json").is_file():
        notes = json.loads((out / "notes.json").read_text())
    elif notes:
        (out / "notes.json").write_text(json.dumps(notes, indent=1))
    df = frame(rows)
    write_tables(df, out)
    (out / "matrix.md").write_text(markdown(df, title, notes))
    write_html(df, out, title, diffs, notes)
    if diffs is not None:
        (out / "diffs.json").write_text(json.dumps(diffs, indent=1))
    write_junit(df, out)
    return df
