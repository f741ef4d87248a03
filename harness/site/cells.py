"""A cell's page, and the decoded pages of the transcripts in the site.

A cell page shows its verdict over runs, then the evidence itself, not a list of file
names: the verdict's facts first (expected and observed, who rejected whom with the message,
the checks and what each rests on), then the decoded exchange (``transcript.txt``, what
``harness decode wire.pcap`` prints; a failing cell's first difference marked), then for a
cell that uploaded much the load table and the bytes-over-time plot, and the raw files after.
Every ``.rpct`` transcript in the site gets a page of its own beside it (``conn0.rpct.html``)
with ``harness decode``'s listing, where a browser would show bytes.
"""

from __future__ import annotations

import gzip
import json
import zlib
from itertools import islice
from pathlib import Path
from urllib.parse import quote

import pandas as pd

from ..capture.decode import iter_lines
from ..report.html_report import load_table, outcome_text
from ..report.load_table import LOAD_SCENARIOS
from .model import Site
from .pages import build_href, cell_href, esc, legend, page, slug, verdict, when

MAX_INLINE_LINES = 400  # of transcript.txt on a cell page; the linked file has them all
MAX_DECODED_LINES = 5000  # per transcript page; `harness decode FILE` prints every line
# A decoded exchange scrolls sideways: it takes the keyboard's focus so it can be scrolled
# without a mouse (axe-core: scrollable-region-focusable)
EXCHANGE_PRE = "<pre class='exchange' tabindex='0' aria-label='decoded exchange'>"
MAX_VERDICT_BYTES = 8 << 20  # a verdict.json larger than this is not one the matrix wrote
MAX_LISTED_FILES = 200  # raw files listed per cell and run
DECODED = ".html"  # conn0.rpct -> conn0.rpct.html
DECODE_ERRORS = (OSError, ValueError, EOFError, zlib.error, gzip.BadGzipFile)


def _href(depth: int, *parts: str) -> str:
    return esc("../" * depth + "/".join(quote(p) for p in parts))


def _lines(path: Path, limit: int) -> tuple[list[str], int]:
    """The first ``limit`` lines of a text file and how many lines it has in all."""
    head, total = [], 0
    with path.open(encoding="utf-8", errors="replace") as f:
        for line in f:
            if total < limit:
                head.append(line.rstrip("\n"))
            total += 1
    return head, total


# ---------------------------------------------------------------- transcript pages
def render_transcripts(site_root: Path, folder: Path) -> int:
    """A decoded page beside every ``.rpct`` under ``folder``; returns how many."""
    count = 0
    for rpct in sorted(folder.rglob("*.rpct")):
        if not rpct.is_file():
            continue
        depth = len(rpct.relative_to(site_root).parts) - 1
        rpct.with_name(rpct.name + DECODED).write_text(transcript_page(rpct, depth))
        count += 1
    return count


def transcript_page(rpct: Path, depth: int) -> str:
    title = rpct.name
    try:
        lines = list(islice(iter_lines(rpct), MAX_DECODED_LINES + 1))
    except DECODE_ERRORS as e:  # a damaged file: the page says so, the raw file is linked
        body = f"<p><b>could not decode</b>: {esc(e)}</p>"
    else:
        more = (f"<p><small>the first {MAX_DECODED_LINES:,} lines; <code>harness decode "
                f"{esc(rpct.name)}</code> prints them all</small></p>"
                if len(lines) > MAX_DECODED_LINES else "")
        body = (f"{EXCHANGE_PRE}{esc(chr(10).join(lines[:MAX_DECODED_LINES]))}</pre>"
                f"{more}")
    intro = (f"<p>The recorded connection decoded as <code>harness decode {esc(rpct.name)}"
             f"</code> prints it: one line per message, in wire order. "
             f"<a href='{esc(quote(rpct.name))}'>raw file</a> "
             f"({rpct.stat().st_size:,} bytes; the harness's readers take it gzip-compressed "
             "or plain).</p>")
    return page(title, f"{intro}{body}", depth)


# ---------------------------------------------------------------- a cell's evidence
def _verdict_row(root: Path) -> dict | None:
    path = root / "verdict.json"
    if not path.is_file() or path.stat().st_size > MAX_VERDICT_BYTES:
        return None
    try:
        row = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except json.JSONDecodeError:
        return None
    return row if isinstance(row, dict) else None


def _facts(row: dict) -> str:
    lines = [f"<tr><th>verdict</th><td>{verdict(str(row.get('verdict')))}</td></tr>",
             f"<tr><th>expected</th><td>{esc(row.get('expected'))}"
             + (f" <small>({esc(row['because'])})</small>" if row.get("because") else "")
             + "</td></tr>",
             f"<tr><th>observed</th><td>{esc(outcome_text(row))}</td></tr>"]
    if row.get("verdict") != "pass" and row.get("reason"):
        lines.append(f"<tr><th>why</th><td>{esc(row['reason'])}</td></tr>")
    first = row.get("first_difference")
    if isinstance(first, dict):
        lines.append(
            "<tr><th>first difference</th><td><a href='#first-difference'>connection "
            f"{esc(first.get('connection'))}, exchange {esc(first.get('exchange'))} "
            f"({esc(first.get('command'))})</a>: <code>{esc(first.get('field'))}</code> is "
            f"<code>{esc(first.get('here'))}</code> here, <code>{esc(first.get('there'))}"
            f"</code> in <a href='{cell_href(str(first.get('against')), 1)}'>"
            f"{esc(first.get('against'))}</a> (its design's all-new cell)</td></tr>")
    checks = [c for c in row.get("checks") or [] if isinstance(c, dict)]
    rows = "".join(f"<tr><td>{verdict('pass' if c.get('ok') else 'fail', word=False)}</td>"
                   f"<td>{esc(c.get('name'))}</td><td>{esc(c.get('evidence'))}</td></tr>"
                   for c in checks)
    table = (f"<table class='checks'><tr><th></th><th>check</th><th>evidence</th></tr>{rows}"
             "</table>") if rows else "<p><small>no checks recorded</small></p>"
    return f"<table>{''.join(lines)}</table><h4>Checks</h4>{table}"


def _load(row: dict | None, root: Path, depth: int, run_folder: str, cell_folder: str) -> str:
    parts = []
    if row and row.get("scenario") in LOAD_SCENARIOS:
        parts += load_table(pd.DataFrame([row]))
    plot = root / "load.png"
    if plot.is_file():
        src = _href(depth, run_folder, cell_folder, "load.png")
        parts.append(f"<p><img class='load' src='{src}'"
                     " alt='bytes the client sent over time, per connection (load.png)'></p>")
    return f"<h4>Load</h4>{''.join(parts)}" if parts else ""


def _marked(lines: list[str], first: dict | None) -> str:
    """The listing, escaped, with the lines of the first differing exchange marked (the
    listing's connections start with ``# connection N``; an exchange's lines with its index)."""
    if not isinstance(first, dict):
        return esc("\n".join(lines))
    conn, index = f"# connection {first.get('connection')} ", str(first.get("exchange"))
    out, inside, marked = [], False, False
    for line in lines:
        if line.startswith("# connection "):
            inside = line.startswith(conn)
        hit = inside and line.split(None, 1)[:1] == [index]
        if hit:
            anchor = "" if marked else " id='first-difference'"
            out.append(f"<mark{anchor}>{esc(line)}</mark>")
            marked = True
        else:
            out.append(esc(line))
    return "\n".join(out)


def _exchange(root: Path, depth: int, run_folder: str, cell_folder: str,
              first: dict | None = None) -> str:
    parts = []
    listing = root / "transcript.txt"
    if listing.is_file():
        head, total = _lines(listing, MAX_INLINE_LINES)
        href = _href(depth, run_folder, cell_folder, "transcript.txt")
        more = (f"<p><small>the first {MAX_INLINE_LINES} of {total:,} lines: "
                f"<a href='{href}'>transcript.txt</a> has them all</small></p>"
                if total > MAX_INLINE_LINES else "")
        parts.append(f"<p>Every connection of the cell in wire order, as <code>harness decode "
                     f"wire.pcap</code> prints it (<a href='{href}'>transcript.txt</a>):</p>"
                     f"{EXCHANGE_PRE}{_marked(head, first)}</pre>{more}")
    decoded = sorted(p for p in root.rglob("*.rpct") if p.is_file())
    if decoded:
        rels = [p.relative_to(root) for p in decoded[:MAX_LISTED_FILES]]
        links = "".join(
            f"<li><a href='{_href(depth, run_folder, cell_folder, *r.parts[:-1], r.name + DECODED)}"
            f"'>{esc(r.as_posix())}</a> decoded (<a href='"
            f"{_href(depth, run_folder, cell_folder, *r.parts)}'>raw</a>)</li>" for r in rels)
        parts.append(f"<p>Each connection on its own:</p><ul>{links}</ul>")
    return f"<h4>The exchange</h4>{''.join(parts)}" if parts else ""


def _raw(root: Path, files: list[Path], depth: int, run_folder: str, cell_folder: str) -> str:
    links = [f"<li><a href='{_href(depth, run_folder, cell_folder, *p.relative_to(root).parts)}'>"
             f"{esc(p.relative_to(root).as_posix())}</a> <small>{p.stat().st_size:,} bytes"
             "</small></li>" for p in files[:MAX_LISTED_FILES]]
    more = (f"<li><small>and {len(files) - MAX_LISTED_FILES} more</small></li>"
            if len(files) > MAX_LISTED_FILES else "")
    return f"<h4>Raw files</h4><ul>{''.join(links)}{more}</ul>"


def cell_evidence(site_dir: Path, run_folder: str, cell_folder: str | None, depth: int) -> str:
    """The evidence of one cell in one run whose folder is in the site, as HTML."""
    if not cell_folder:
        return "<p><small>no cell folder recorded</small></p>"
    root = site_dir / run_folder / cell_folder
    if not root.is_dir():
        return "<p><small>the cell's folder is not in the site</small></p>"
    # index.html: the folder listings the site adds for static hosts; *.rpct.html: the decoded
    # pages of the transcripts, linked beside them
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name != "index.html"
                   and not p.name.endswith(".rpct" + DECODED))
    if not files:
        return "<p><small>not kept in the site (a passing cell; the run folder has it)</small></p>"
    row = _verdict_row(root)
    facts = _facts(row) if row else "<p><small>no readable verdict.json</small></p>"
    first = (row or {}).get("first_difference")
    # the facts, then what went over the wire, then (upload cells) its timing, then the files
    return (f"<h4>Verdict</h4>{facts}{_exchange(root, depth, run_folder, cell_folder, first)}"
            f"{_load(row, root, depth, run_folder, cell_folder)}"
            f"{_raw(root, files, depth, run_folder, cell_folder)}")


# ---------------------------------------------------------------- the page
def strip(site: Site, cell_id: str, depth: int) -> str:
    items = []
    for c in site.by_cell.get(cell_id, []):
        href = (f"{'../' * depth}{site.run_folders[c.run_id]}/matrix.html"
                if c.run_id in site.run_folders else f"#at-{slug(c.run_id)}")
        items.append(f"<a href='{href}' title='{esc(c.verdict)} {when(c.time)}'>"
                     f"{verdict(c.verdict, word=False)}</a>")
    return f"<span class='strip'>{''.join(items)}</span>"


def cell_page(site: Site, site_dir: Path, cell_id: str) -> str:
    history = site.by_cell[cell_id]
    last = history[-1]
    facts = (f"<table><tr><th>design</th><td>{esc(last.design)}</td></tr>"
             f"<tr><th>scenario</th><td>{esc(last.scenario)}</td></tr>"
             f"<tr><th>client</th><td><a href='{build_href(last.client, 1)}'>{esc(last.client)}"
             f"</a> ({esc(last.client_dialect)})</td></tr>"
             f"<tr><th>server</th><td><a href='{build_href(last.server, 1)}'>{esc(last.server)}"
             f"</a> ({esc(last.server_dialect)})</td></tr>"
             f"<tr><th>server cache</th><td>{'on' if last.cache else 'off'}</td></tr>"
             f"<tr><th>transport</th><td>{esc(last.transport or 'tcp')}</td></tr></table>")
    rows, sections = [], []
    for c in reversed(history):  # newest first; every section open (a glyph folded away in
        # a closed <details> is one the browser check cannot see drawn)
        before = site.previous(c)
        mark = " <b>changed</b>" if before is not None and before.verdict != c.verdict else ""
        folder = site.run_folders.get(c.run_id)
        anchor = f"evidence-{slug(c.run_id)}"
        if folder:
            title = f"run {esc(c.run_id)}, ended {when(c.time)}: {verdict(c.verdict)}"
            inner = cell_evidence(site_dir, folder, c.folder, 1)
            sections.append(f"<section id='{anchor}'><h3>{title}</h3>{inner}</section>")
            where = f"<a href='#{anchor}'>evidence</a>"
        else:
            where = "<small>run not in the site (history only)</small>"
        rows.append(f"<tr id='at-{slug(c.run_id)}'><td>{when(c.time)}</td><td>{esc(c.run_id)}"
                    f"</td><td>{verdict(c.verdict)}{mark}</td><td>{esc(c.observed)}</td><td>"
                    f"{esc(c.expected)}</td><td>{esc(c.reason)}</td><td>{where}</td></tr>")
    newest = sections[0] if sections else ("<p><small>No run of this cell is in the site "
                                           "(built from the history only).</small></p>")
    earlier = f"<h2>Earlier runs' evidence</h2>{''.join(sections[1:])}" if sections[1:] else ""
    body = (f"{legend()}<p>Verdict over runs, oldest first: "
            f"{strip(site, cell_id, 1)}</p>{facts}<h2>Evidence</h2>{newest}"
            "<h2>Runs</h2><table><tr><th>ended</th><th>run</th><th>verdict</th>"
            "<th>observed</th><th>expected</th><th>why</th><th>evidence</th></tr>"
            f"{''.join(rows)}</table>{earlier}")
    return page(cell_id, body, 1)
