"""A whole matrix job: pick cells, run them with progress, write the reports, set the exit code."""

from __future__ import annotations

import datetime as _dt
import json
import os
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..history.ingest import file_report
from ..report.writers import SYMBOL, write_all
from .cells import Cell
from .execute import run_cells
from .model import Matrix
from .skips import AllowSkip, exit_code


def new_run_id(prefix: str = "run") -> str:
    return f"{prefix}-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


BASELINE = "new-client/new-server"


def _note_first_difference(run_dir: Path, row: dict, base: dict, d) -> None:
    """A failing cell's first exchange that differs from its design's all-new cell, kept in
    its verdict.json: its page marks that step of the decoded exchange."""
    div = d.divergence
    row["first_difference"] = {
        "against": base["cell_id"], "connection": d.connection, "exchange": div.index,
        "command": div.cmd, "field": div.path, "here": repr(div.a), "there": repr(div.b)}
    path = run_dir / row["folder"] / "verdict.json"
    if path.is_file():
        path.write_text(json.dumps(row, indent=2, default=str))


def differential(rows: list[dict], run_dir: Path) -> list[dict]:
    """Each cell's transcript against the all-new cell of the same design, scenario and cache
    setting: where the bytes first diverge, and which commands only one side sent."""
    from ..capture.differ import diff_cells

    by_key: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        if r["verdict"] in ("pass", "fail") and r["design"] != "releases":
            by_key.setdefault((r["design"], r["scenario"], r["cache"]), {})[r["pair"]] = r
    out = []
    for (design, scenario, cache), cells in by_key.items():
        base = cells.get(BASELINE)
        if base is None:
            continue
        for pair, r in cells.items():
            if pair == BASELINE:
                continue
            try:
                d = diff_cells(run_dir / r["folder"], run_dir / base["folder"], context=0)
                summary = d.summary()
            except Exception as e:  # noqa: BLE001 - a missing transcript is reported, not fatal
                d, summary = None, f"could not compare: {e}"
            if r["verdict"] == "fail" and d is not None and d.divergence is not None:
                _note_first_difference(run_dir, r, base, d)
            out.append({"design": design, "scenario": scenario, "cache": cache, "cell": pair,
                        "baseline": BASELINE, "summary": summary,
                        "a": r["folder"], "b": base["folder"]})
    return out


def run_job(matrix: Matrix, cells: list[Cell], out_root: Path, *, title: str,
            workers: int | None = None, console: Console | None = None,
            run_id: str | None = None, deliver: str | None = None,
            allow_skip: AllowSkip = AllowSkip(),
            notes: dict[str, list[str]] | None = None,
            keep_payloads: bool = False) -> tuple[list[dict], Path, int]:
    """Run ``cells`` and write the reports; returns (result rows, report folder, exit code). The
    exit code is 1 if a verdict is unexpected or a cell skipped for a reason ``allow_skip``
    does not name. ``notes``: lines per design for the reports (which builds a class stood
    in for). ``keep_payloads``: passing cells keep their payload bytes too."""
    console = console or Console()
    run_id = run_id or new_run_id()
    run_dir = out_root / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TextColumn("{task.fields[last]}"), console=console,
                  transient=False) as bar:
        task = bar.add_task(title, total=len(cells), last="")

        def progress(row: dict) -> None:
            bar.update(task, advance=1,
                       last=f"{SYMBOL[row['verdict']]} {row['cell_id']} ({row['verdict']})")

        rows = run_cells(matrix, cells, run_dir, run_id=run_id, workers=workers, deliver=deliver,
                         progress=progress, keep_payloads=keep_payloads)
    write_all(rows, run_dir, title, diffs=differential(rows, run_dir), notes=notes)
    # the run's size on disk is part of its record: printed, and kept in the history
    store, records = file_report(run_dir)
    run = next(r for r in records if r.kind == "run")
    console.print(f"run folder: {run_dir} ({run.size_bytes / (1 << 20):,.1f} MiB in "
                  f"{run.files:,} files)" + (f"; history: {store}" if store else ""),
                  highlight=False, soft_wrap=True)
    return rows, run_dir, exit_code(rows, allow_skip)
