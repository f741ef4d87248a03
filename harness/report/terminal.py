"""What a matrix run prints: one compact grid per design (rows: clients, columns: servers,
one symbol and outcome per cell), what went wrong, why cells skipped, and where the full
tables are (matrix.md / matrix.html / results.csv in the run folder)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table
from rich.text import Text

from .glyphs import INK, SYMBOL, VERDICTS
from .html_report import SHORT, outcome_text, text, worst, why_text


TERSE = {"works": "works", "works-degraded": "degr", "rejected-at-hello": "rej",
         "failed": "fail"}  # the releases grid has a column per build


def _short_role(label: str) -> str:
    """"old client: llama-7" -> "old: llama-7" (the grid's axes already say client/server)."""
    return label.replace(" client:", ":").replace(" server:", ":")


def cell_summary(g: pd.DataFrame) -> Text:
    """A grid cell: the worst verdict's symbol, then the outcomes with their counts."""
    verdict = worst(g["verdict"])
    seen = g[g["verdict"] != "skip"]["observed"].map(text).value_counts()
    body = " ".join(f"{SHORT.get(o, o)}×{n}" if n > 1 else SHORT.get(o, o)
                    for o, n in seen.items() if o) or "skipped"
    bad = int((~g["verdict"].isin(["pass", "skip"])).sum())
    out = Text(f"{SYMBOL[verdict]} ", style=f"bold {INK[verdict]}")
    out.append(body)
    if bad:
        out.append(f" ({bad} {verdict})", style=INK[verdict])
    return out


def design_grid(design: str, d: pd.DataFrame) -> Table:
    servers = list(dict.fromkeys(d["server_label"]))
    t = Table(title=f"{design}", title_justify="left", show_lines=False, pad_edge=False)
    t.add_column("client \\ server", no_wrap=True)
    for s in servers:
        t.add_column(_short_role(s), overflow="fold")
    for client, dr in d.groupby("client_label", sort=False):
        cells = [cell_summary(dr[dr["server_label"] == s]) if (dr["server_label"] == s).any()
                 else Text("") for s in servers]
        t.add_row(_short_role(client), *cells)
    return t


def releases_grid(d: pd.DataFrame) -> Table:
    peers = list(dict.fromkeys(d["server"]))
    t = Table(title="releases: rows client, columns server build (✔ = as the version rule "
                    "predicts; rej = rejected at HELLO)", title_justify="left", pad_edge=False)
    t.add_column("", no_wrap=True)
    for p in peers:
        t.add_column(p, no_wrap=True)
    for client, dr in d.groupby("client", sort=False):
        row = []
        for p in peers:
            r = dr[dr["server"] == p]
            if not len(r):
                row.append(Text(""))
                continue
            r = r.iloc[0]
            v = r["verdict"]
            row.append(Text(f"{SYMBOL[v]} {TERSE.get(text(r['observed']), '-')}",
                            style=INK[v] if v != "pass" else ""))
        t.add_row(client, *row)
    return t


def print_summary(console: Console, df: pd.DataFrame, run_dir: Path) -> None:
    """The terminal view of a run; the files in ``run_dir`` keep every detail."""
    legend = Text("  ".join(f"{SYMBOL[v]} {v}" for v in VERDICTS))
    console.print(legend, style="dim")
    for design, d in df.groupby("design", sort=False):
        console.print(releases_grid(d) if design == "releases" else design_grid(design, d))
    bad = df[~df["verdict"].isin(["pass", "skip"])]
    if len(bad):
        console.print(Text("Unexpected", style="bold red"))
        for _, r in bad.iterrows():
            line = Text(f" {SYMBOL[r['verdict']]} ", style=INK[r["verdict"]])
            line.append(f"{r['cell_id']}: ", style="bold")
            observed = outcome_text(r)
            reason = why_text(r).strip().splitlines()
            line.append((reason[-1] if reason else "") + (f" [{observed}]" if observed else ""))
            console.print(line, overflow="fold")
    skipped = df[df["verdict"] == "skip"]
    if len(skipped):
        console.print(Text("Skipped", style="bold"))
        for reason, g in skipped.groupby(skipped["reason"].map(text)):
            console.print(Text(f" {SYMBOL['skip']} {len(g)} cell(s): {reason or 'no reason'}"),
                          overflow="fold")
    counts = df["verdict"].value_counts()
    console.print("Totals: " + ", ".join(f"{v} {counts[v]}" for v in VERDICTS if v in counts),
                  highlight=False)
    console.print(f"full tables: {run_dir}/matrix.html, matrix.md, results.csv", highlight=False)
