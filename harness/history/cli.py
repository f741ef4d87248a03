"""``harness history``, ``harness reports`` and ``harness site``: file report folders into the
history store, prune old report folders, build the results site."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from .errors import HistoryError

console = Console()
history_app = typer.Typer(no_args_is_help=True, add_completion=False,
                          help="The append-only history store (reports/history.jsonl).")
reports_app = typer.Typer(no_args_is_help=True, add_completion=False,
                          help="Report folders under reports/.")
DEFAULT_STORE = Path("reports") / "history.jsonl"


def _fail(e: Exception) -> None:
    console.print(str(e), style="red", highlight=False, markup=False, soft_wrap=True)
    raise typer.Exit(2)


def file_history(console: Console, folder: Path) -> bool:
    """File a finished report folder into the history beside it; False (said why) when the
    store cannot take it."""
    from .ingest import file_report
    try:
        store, _ = file_report(folder)
    except (HistoryError, OSError) as e:
        console.print(f"history: {e}", style="red", highlight=False, markup=False, soft_wrap=True)
        return False
    if store is not None:
        console.print(f"history: {store}", highlight=False, soft_wrap=True)
    return True


@history_app.command("add")
def history_add(folders: list[Path] = typer.Argument(..., help="Report folders: matrix runs, "
                                                     "fuzz campaigns, bench runs, bisects."),
                store_path: Path = typer.Option(DEFAULT_STORE, "--store",
                                                help="The history store to append to."),
                run_id: Optional[str] = typer.Option(None, "--run-id",
                                                     help="File one folder under this run id "
                                                     "(e.g. a CI run's merged shards).")):
    """File report folders into the history (a folder filed before adds nothing)."""
    from . import ingest, store
    if run_id and len(folders) != 1:
        _fail(HistoryError("--run-id names one folder's run: give one folder"))
    try:
        records = [r for f in folders for r in ingest.records_from(f, run_id=run_id)]
        n = store.append(store_path, records)
    except (HistoryError, OSError) as e:
        _fail(e)
    console.print(f"{store_path}: {n} record(s) added, {len(records) - n} already held",
                  highlight=False)


@history_app.command("show")
def history_show(store_path: Path = typer.Option(DEFAULT_STORE, "--store")):
    """Count the store's records by kind (and check every line reads)."""
    from collections import Counter
    from . import store
    try:
        records = store.read(store_path)
    except (HistoryError, OSError) as e:
        _fail(e)
    counts = Counter(r.kind for r in records)
    console.print(f"{store_path}: {len(records)} record(s): " +
                  ", ".join(f"{n} {k}" for k, n in sorted(counts.items())), highlight=False,
                  soft_wrap=True)


FIGURES_STORE = Path("fixtures") / "figures" / "history.jsonl"


@history_app.command("figures")
def history_figures(document: Path = typer.Argument(Path("README.md"),
                                                   help="A document with marked figures."),
                    store_path: Path = typer.Option(FIGURES_STORE, "--store",
                                                    help="The records the figures quote (a "
                                                    "store committed with the document)."),
                    add: list[Path] = typer.Option([], "--add", help="First file this report "
                                                   "folder's run or campaign record into the "
                                                   "store (its local path left out)."),
                    write: bool = typer.Option(False, "--write",
                                               help="Put the rendered figures into DOCUMENT.")):
    """Hold a document's measured figures (<!-- figure run:ID -->...<!-- /figure -->) to the
    records they were measured in: list the stale ones (exit 1), or rewrite them."""
    from . import figures as fig, store
    try:
        for folder in add:
            n = store.append(store_path, fig.summary_records(folder))
            console.print(f"{store_path}: {n} record(s) added from {folder}", highlight=False)
        records = store.read(store_path)
        text = document.read_text()
        if write:
            document.write_text(fig.rewrite(text, records))
            text = document.read_text()
        found = fig.figures(text, records)
    except (HistoryError, OSError) as e:
        _fail(e)
    stale = [f for f in found if f.stale]
    for f in stale:
        console.print(f"{document}: figure {f.kind}:{f.record_id} says {f.said!r}; "
                      + (f"the record says {f.measured!r}" if f.measured is not None
                         else f"{store_path} has no such record"),
                      highlight=False, markup=False, soft_wrap=True)
    console.print(f"{document}: {len(found)} figure(s), {len(stale)} stale", highlight=False)
    if stale:
        raise typer.Exit(1)


@reports_app.command("prune")
def reports_prune(keep: Optional[int] = typer.Option(None, "--keep",
                                                     help="Keep the newest N of each kind."),
                  older_than: Optional[str] = typer.Option(None, "--older-than",
                                                           help="Remove only folders older "
                                                           "than this (e.g. 30d, 12h)."),
                  root: Path = typer.Option(Path("reports"), "--root"),
                  dry_run: bool = typer.Option(False, "--dry-run",
                                               help="List what would go; remove nothing.")):
    """Remove old report folders (never the history store)."""
    from ..fuzz.display import parse_duration
    from .prune import prune, to_prune
    try:
        age = parse_duration(older_than) if older_than else None
        gone = to_prune(root, keep=keep, older_than=age)
    except (HistoryError, ValueError) as e:
        _fail(e)
    for c in gone:
        console.print(f"{'would remove' if dry_run else 'remove'} {c.path} ({c.kind}, "
                      f"{c.size / (1 << 20):,.1f} MiB)", highlight=False, markup=False,
                      soft_wrap=True)
    freed = sum(c.size for c in gone) if dry_run else prune(gone)
    console.print(f"{len(gone)} folder(s), {freed / (1 << 20):,.1f} MiB "
                  f"{'would be ' if dry_run else ''}freed", highlight=False, soft_wrap=True)


def site_command(folders: list[Path] = typer.Argument(None, help="Report folders to show with "
                                                      "their evidence (matrix runs, fuzz, "
                                                      "bench, bisect)."),
                 out: Path = typer.Option(Path("site"), "--out", help="Where the site goes."),
                 history: Optional[Path] = typer.Option(None, "--history",
                                                        help="A history store to read (default:"
                                                        " reports/history.jsonl if it exists)."),
                 evidence: str = typer.Option("all", "--evidence",
                                              help="all: copy every cell's folder; failing: "
                                              "only failing, crashing, hanging and erroring "
                                              "cells' (a site to publish)."),
                 accessibility: bool = typer.Option(
                     False, "--check-accessibility",
                     help="Run axe-core's WCAG 2.x A/AA rules on the index, one page of each "
                          "kind (build, cell, transcript, fuzzing, bench, bisect) in headless "
                          "Chromium at 1366 x 768; their first screens go to "
                          "OUT/screens/. Exit 1 on any violation."),
                 ):
    """Build the static results site: the newest grid per design with what changed, a page
    per build and per cell with its verdict over runs, fuzzing, bench and bisect history."""
    from ..site.build import build_site
    if history is None and DEFAULT_STORE.is_file():
        history = DEFAULT_STORE
    if not folders and history is None:
        _fail(HistoryError("nothing to show: give report folders or --history"))
    try:
        site, broken = build_site(list(folders or []), out, history=history,
                                  evidence=evidence)
    except (HistoryError, OSError) as e:
        _fail(e)
    console.print(f"{out}/index.html: {len(site.runs)} matrix run(s), {len(site.by_cell)} "
                  f"cell(s), {len(site.builds)} build(s), {len(site.campaigns)} campaign(s), "
                  f"{len({b.run_id for b in site.bench})} bench run(s), {len(site.bisects)} "
                  "bisect(s)", highlight=False, soft_wrap=True)
    if broken:
        console.print(f"[red]{len(broken)} broken internal link(s):", highlight=False,
                      soft_wrap=True)
        for line in broken[:20]:
            console.print(f"  {line}", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(1)
    if accessibility:
        _check_accessibility(out)


def _check_accessibility(site: Path) -> None:
    from ..report.a11y import AccessibilityUnavailable, DevToolsError, audit
    # one page of each kind: each kind is one template
    chosen = [site / "index.html"] + [
        next(iter(sorted(site.glob(pattern))), None)
        for pattern in ("builds/*.html", "cells/*.html", "**/*.rpct.html",
                        "fuzz*.html", "bench*.html", "bisect*.html")]
    chosen = [p for p in chosen if p is not None and p.is_file()]
    try:
        found = audit(chosen, screenshots=site / "screens")
    except (AccessibilityUnavailable, DevToolsError) as e:
        _fail(e)
    bad = {p: vs for p, vs in found.items() if vs}
    for page in chosen:
        console.print(f"{page.relative_to(site)}: "
                      + (f"[red]{len(bad[page])} accessibility violation(s)" if page in bad
                         else "no accessibility violation"), highlight=False, soft_wrap=True)
        for v in bad.get(page, []):
            console.print(f"  {v.line}", highlight=False, markup=False, soft_wrap=True)
    if bad:
        raise typer.Exit(1)
