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
from .html_report import SHORT, outcome_text, pivot, text, worst, why_text


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


def _rich_grid(d: pd.DataFrame, row_key: str, col_key: str, title: str, head, cell,
               **column) -> Table:
    cols, rows = pivot(d, row_key, col_key)
    t = Table(title=title, title_justify="left", pad_edge=False)
    t.add_column(head, no_wrap=True)
    for c in cols:
        t.add_column(_short_role(c), **column)
    for value, _, groups in rows:
        t.add_row(_short_role(value), *(Text("") if g is None else cell(g) for g in groups))
    return t


def design_grid(design: str, d: pd.DataFrame) -> Table:
    return _rich_grid(d, "client_label", "server_label", design, "client \\ server",
                      cell_summary, overflow="fold")


def releases_grid(d: pd.DataFrame) -> Table:
    def cell(g):
        r = g.iloc[0]
        v = r["verdict"]
        return Text(f"{SYMBOL[v]} {TERSE.get(text(r['observed']), '-')}",
                    style=INK[v] if v != "pass" else "")
    # fold, not no_wrap: with --with builds the server columns give way at 80 columns, never
    # the row's build name (every column no_wrap made rich cut the key and drop columns)
    return _rich_grid(d, "client", "server", "releases: rows client, columns server build "
                      "(✔ = as the version rule predicts; rej = rejected at HELLO)", "", cell,
                      overflow="fold")


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
