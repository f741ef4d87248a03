"""The static HTML report of a matrix run (matrix.html), read at a glance.

Per design: a front table in the shape of seed 000's interoperability table (client, server,
upload span, wall, hashing) with each pairing's outcome; a client x server grid; then every
cell with its verdict, outcome, who rejected whom and with which message, why it failed or
was skipped, and its load columns. Glyphs are inline SVG (see glyphs.py) so no missing font
can turn them into boxes; ``browser.check_report`` verifies that in a real Chromium.
"""

from __future__ import annotations

import html
import math

import pandas as pd

from .glyphs import COLOUR, VERDICTS, svg_defs, svg_glyph
from .load_table import HEADERS as LOAD_HEADERS
from .load_table import load_rows

SHORT = {"works": "works", "works-degraded": "degraded", "rejected-at-hello": "rejected",
         "failed": "failed"}
MIB = 1 << 20

_CSS = ("body{font-family:'DejaVu Sans',sans-serif;margin:2em;color:#111}"
        "table{border-collapse:collapse;margin-bottom:1.5em}"
        "td,th{border:1px solid #999;padding:4px 8px;vertical-align:top;font-size:13px}"
        "th{background:#eee;text-align:left}td.num{text-align:right;white-space:nowrap}"
        "a{color:inherit}.glyph{vertical-align:-2px;margin-right:4px}"
        ".legend span{padding:2px 8px;margin-right:6px;white-space:nowrap}"
        "small{color:#333}.why{max-width:42em}td.pair{white-space:nowrap}")


def text(value) -> str:
    """A cell's value as text: None and NaN (pandas' missing value) are empty, never "nan"."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value)


def esc(value) -> str:
    return html.escape(text(value))


def outcome_text(r) -> str:
    """What was observed, with who rejected whom and the message."""
    observed = text(r.get("observed"))
    if not observed:
        return ""
    if observed == "rejected-at-hello":
        by = text(r.get("rejected_by")) or "a side"
        other = "server" if by == "client" else "client"
        who = {"client": r.get("client"), "server": r.get("server")}
        line = f"rejected at HELLO: {by} {text(who.get(by))} rejected {other} {text(who.get(other))}"
        message = text(r.get("message"))
        return line + (f": {message}" if message else "")
    if observed == "works-degraded":
        degraded = r.get("degraded")
        return "works, degraded: " + ", ".join(degraded or [])
    return observed


def why_text(r) -> str:
    """The verdict's reason where it says more than the outcome: skip, fail, error."""
    return "" if r.get("verdict") == "pass" else text(r.get("reason"))


def _load(r) -> dict:
    load = r.get("load")
    return load if isinstance(load, dict) else {}


def _secs(value) -> str:
    return f"{value:.2f} s" if isinstance(value, (int, float)) and value else "-"


def _mib(value) -> str:
    return f"{value / MIB:.1f}" if isinstance(value, (int, float)) and value else "-"


def _cell(verdict: str, body: str, title: str = "", href: str = "") -> str:
    inner = f"{svg_glyph(verdict)}{body}"
    if href:
        inner = f"<a href='{html.escape(href)}/'>{inner}</a>"
    tip = f" title='{html.escape(title)}'" if title else ""
    return f"<td style='background:{COLOUR.get(verdict, '#fff')}'{tip}>{inner}</td>"


def worst(verdicts) -> str:
    """The verdict a group of cells is shown with: the most serious one present."""
    present = set(verdicts)
    for v in ("crash", "hang", "error", "fail", "pass", "skip"):
        if v in present:
            return v
    return "skip"


def front_workload(d: pd.DataFrame) -> tuple[str, bool] | None:
    """The (scenario, cache) every pairing of the front table is measured on: the one that
    uploads in the most pairings, then the most bytes, so the rows compare like seed 000's."""
    best, best_score = None, (0, 0)
    for (scenario, cache), g in d.groupby(["scenario", "cache"], sort=False):
        sizes = [_load(r).get("set_tensor_bytes", 0) for _, r in g.iterrows()]
        score = (sum(1 for n in sizes if n), sum(sizes))
        if score > best_score:
            best, best_score = (scenario, bool(cache)), score
    return best


def front_table(d: pd.DataFrame) -> list[str]:
    """Seed 000's interoperability table: a row per pairing (client, server), its outcome
    over all its cells, and the load of one workload, the same for every row."""
    workload = front_workload(d)
    where = (f"load columns from <b>{esc(workload[0])}</b>, server cache "
             f"{'on' if workload[1] else 'off'}" if workload else "no cell uploaded tensors")
    out = [f"<p class='workload'>{where}</p><table class='front'><tr><th>client</th>"
           "<th>server</th><th>outcome</th><th>upload span</th><th>wall</th><th>hashing</th>"
           "<th>uploaded MiB</th><th>hashed MiB</th></tr>"]
    for pair, g in d.groupby("pair", sort=False):
        r0 = g.iloc[0]
        counts = g["verdict"].value_counts()
        summary = ", ".join(f"{v} {counts[v]}" for v in VERDICTS if v in counts)
        client = f"{esc(r0['client_role'])}: {esc(r0['client'])}"
        server = f"{esc(r0['server_role'])}: {esc(r0['server'])}"
        pick = g[(g["scenario"] == workload[0]) & (g["cache"] == workload[1])] if workload \
            else g.iloc[:0]
        if len(pick) and _load(pick.iloc[0]).get("set_tensor_bytes"):
            r = pick.iloc[0]
            load = _load(r)
            nums = (f"<td class='num'>{_secs(load.get('upload_span'))}</td>"
                    f"<td class='num'>{_secs(r.get('duration'))}</td>"
                    f"<td class='num'>{_secs(load.get('hashing_seconds'))}</td>"
                    f"<td class='num'>{_mib(load.get('set_tensor_bytes'))}</td>"
                    f"<td class='num'>{_mib(load.get('bytes_hashed'))}</td>")
        else:
            why = "not run" if not len(pick) else (
                SHORT.get(text(pick.iloc[0]["observed"])) or text(pick.iloc[0]["verdict"]))
            nums = "<td class='num'>-</td>" * 4 + f"<td>no upload ({esc(why)})</td>"
        out.append(f"<tr><td>{client}</td><td>{server}</td>"
                   + _cell(worst(g["verdict"]), html.escape(summary)) + nums + "</tr>")
    out.append("</table>")
    return out


def load_table(d: pd.DataFrame) -> list[str]:
    """Seed 000's four-way load table from this design's model-load and mixed-fleet cells."""
    rows = load_rows(d)
    if not rows:
        return []
    head = "".join(f"<th>{esc(h)}</th>" for h in LOAD_HEADERS)
    body = "".join("<tr>" + "".join(f"<td class='num'>{esc(v)}</td>" if i >= 4 and i < 13
                                    else f"<td>{esc(v)}</td>" for i, v in enumerate(row))
                   + "</tr>" for row in rows)
    return ["<p class='workload'>model load over RPC (llama-simple), per run and server: from "
            "the wire and the builds' own load profilers</p>"
            f"<table class='load'><tr>{head}</tr>{body}</table>"]


def pivot(d: pd.DataFrame, row_key: str, col_key: str):
    """Columns (first-seen order) and, per row value, its rows and its cells' rows per column
    (None where that pairing has no cell): the shape of every client x server grid."""
    cols = list(dict.fromkeys(d[col_key]))
    rows = []
    for value, dr in d.groupby(row_key, sort=False):
        rows.append((value, dr, [dr[dr[col_key] == c] if (dr[col_key] == c).any() else None
                                 for c in cols]))
    return cols, rows


def _html_grid(d: pd.DataFrame, row_key: str, col_key: str, row_head, cell, intro="") -> list[str]:
    cols, rows = pivot(d, row_key, col_key)
    out = [f"{intro}<table class='grid'><tr><th>client \\ server</th>"
           + "".join(f"<th>{esc(c)}</th>" for c in cols) + "</tr>"]
    for value, dr, groups in rows:
        out.append(f"<tr><th>{esc(row_head(value, dr))}</th>"
                   + "".join("<td></td>" if g is None else cell(g) for g in groups) + "</tr>")
    out.append("</table>")
    return out


def grid(d: pd.DataFrame) -> list[str]:
    """Rows: clients, columns: servers; each cell its worst verdict and the outcomes."""
    def cell(g):
        seen = g[g["verdict"] != "skip"]["observed"].map(text).value_counts()
        body = ", ".join(f"{SHORT.get(o, o)}×{n}" for o, n in seen.items() if o) or "skipped"
        return _cell(worst(g["verdict"]), html.escape(body))
    return _html_grid(d, "client_label", "server_label", lambda v, _: v, cell)


def cell_table(d: pd.DataFrame) -> list[str]:
    """Every cell: verdict, outcome (who rejected whom), why, and the load columns."""
    out = ["<table class='cells'><tr><th>scenario</th><th>cache</th><th>transport</th>"
           "<th>client → server</th><th>verdict</th><th>outcome</th><th>why</th>"
           "<th>SET_TENSOR MiB</th><th>hashed MiB</th><th>hash hits</th><th>upload span</th>"
           "<th>wire</th><th>hashing</th><th>gaps</th><th>wall</th></tr>"]
    for _, r in d.iterrows():
        load = _load(r)
        verdict = text(r.get("verdict")) or "error"
        out.append(
            f"<tr><td>{esc(r['scenario'])}</td><td>{'on' if r.get('cache') else 'off'}</td>"
            f"<td>{esc(r.get('transport') or 'tcp')}</td>"
            f"<td class='pair'>{esc(r['client'])} → {esc(r['server'])}<br>"
            f"<small>{esc(r['pair'])}</small></td>"
            + _cell(verdict, html.escape(verdict), f"expected {text(r.get('expected'))}",
                    text(r.get("folder")))
            + f"<td>{esc(outcome_text(r))}</td><td class='why'>{esc(why_text(r))}</td>"
            f"<td class='num'>{_mib(load.get('set_tensor_bytes'))}</td>"
            f"<td class='num'>{_mib(load.get('bytes_hashed'))}</td>"
            f"<td class='num'>{load.get('hash_hits') or '-'}</td>"
            f"<td class='num'>{_secs(load.get('upload_span'))}</td>"
            f"<td class='num'>{_secs(load.get('wire_seconds'))}</td>"
            f"<td class='num'>{_secs(load.get('hashing_seconds'))}</td>"
            f"<td class='num'>{_secs(load.get('gap_seconds'))}</td>"
            f"<td class='num'>{_secs(r.get('duration'))}</td></tr>")
    out.append("</table>")
    return out


def releases_table(d: pd.DataFrame) -> list[str]:
    def cell(g):
        r = g.iloc[0]
        observed = SHORT.get(text(r["observed"]), text(r["observed"]) or "-")
        expected = SHORT.get(text(r["expected_outcome"]), text(r["expected_outcome"]))
        return _cell(r["verdict"], html.escape(f"{observed} ({expected})"), why_text(r),
                     text(r.get("folder")))
    return _html_grid(d, "client", "server",
                      lambda v, dr: f"{v} ({text(dr['client_dialect'].iloc[0])})", cell,
                      "<p>Rows: client build, columns: server build; observed (predicted by "
                      "the version rule).</p>")


def skipped_list(df: pd.DataFrame) -> list[str]:
    skipped = df[df["verdict"] == "skip"]
    if not len(skipped):
        return []
    out = ["<h2>Skipped</h2><ul class='skipped'>"]
    for reason, g in skipped.groupby(skipped["reason"].map(text)):
        out.append(f"<li>{svg_glyph('skip')}{len(g)} cell(s): "
                   f"{html.escape(reason or 'no reason recorded')}</li>")
    out.append("</ul>")
    return out


def diffs_table(diffs: list[dict]) -> list[str]:
    out = ["<h2>Differential transcripts</h2><p>Each cell against the new-client/new-server "
           "cell of the same design, scenario and cache setting (pointers renamed, timing "
           "dropped): the first diverging field and the commands only one side sent. "
           "Reproduce with <code>harness diff A B</code>.</p><table><tr><th>design</th>"
           "<th>scenario</th><th>cache</th><th>cell</th><th>difference</th></tr>"]
    for d in diffs:
        out.append(f"<tr><td>{esc(d['design'])}</td><td>{esc(d['scenario'])}</td>"
                   f"<td>{'on' if d['cache'] else 'off'}</td><td><a href='{esc(d['a'])}/'>"
                   f"{esc(d['cell'])}</a></td><td><pre>{esc(d['summary'])}</pre></td></tr>")
    out.append("</table>")
    return out


def render(df: pd.DataFrame, title: str, diffs: list[dict] | None = None,
           notes: dict[str, list[str]] | None = None) -> str:
    counts = df["verdict"].value_counts()
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(title)}</title>"
             f"<style>{_CSS}</style></head><body>{svg_defs()}<h1>{esc(title)}</h1>",
             "<p class='legend'>"
             + "".join(f"<span style='background:{COLOUR[v]}'>{svg_glyph(v)}{v} "
                       f"{counts.get(v, 0)}</span>" for v in VERDICTS) + "</p>"]
    for design, d in df.groupby("design", sort=False):
        parts.append(f"<h2>{esc(design)}</h2>")
        if (notes or {}).get(design):
            parts.append("<ul class='notes'>" + "".join(f"<li>{esc(n)}</li>"
                                                        for n in notes[design]) + "</ul>")
        if design == "releases":
            parts += releases_table(d)
            continue
        parts += front_table(d) + load_table(d) + grid(d) + cell_table(d)
    parts += skipped_list(df)
    if diffs:
        parts += diffs_table(diffs)
    parts.append("</body></html>")
    return "".join(parts)
