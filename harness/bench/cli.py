"""Body of ``harness bench`` (the typer layer only parses options)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table


def bench_command(console: Console, *, quick: bool, out: Path, peer: str
                  ) -> tuple[int, Path | None]:
    """The exit code, and the folder bench.json was written to (None: nothing was)."""
    from .measure import BenchConfig, run_bench
    from .render import rows

    def log(line: str) -> None:
        console.print(line, highlight=False, markup=False)

    cfg = (BenchConfig.quick_config(out=out, peer=peer, log=log) if quick
           else BenchConfig(out=out, peer=peer, log=log))
    try:
        folder, figures = run_bench(cfg)
    except RuntimeError as e:
        console.print(f"[red]{e}", highlight=False)
        return 2, None
    t = Table("figure", "value", "anchor", "ratio", "target", "met?")
    for r in rows([f.to_json() for f in figures]):
        t.add_row(*r)
    console.print(t)
    console.print(f"report: {folder}/bench.md", highlight=False)
    from ..history.cli import file_history
    filed = file_history(console, folder)
    failed = [f for f in figures if f.failed]
    for f in failed:
        console.print(f"[red]{f.id} failed:[/red] {f.failed}", highlight=False)
    return (1 if failed else 0 if filed else 2), folder  # a failed figure is said first
