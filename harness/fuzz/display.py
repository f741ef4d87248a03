"""Live progress of a campaign on the terminal (rich), and duration parsing for the CLI."""

from __future__ import annotations

import re
import time

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """'10m' -> 600.0, '90s' / '90' -> 90.0, '1h' -> 3600.0, '1m30s' -> 90.0, '30d'."""
    total, pos = 0.0, 0
    text = text.strip().lower()
    for m in re.finditer(r"(\d+(?:\.\d+)?)([smhd]?)", text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(text) or not text:
        raise ValueError(f"bad duration {text!r} (e.g. 90s, 10m, 1h, 30d)")
    return total


class LiveProgress:
    """Context manager; pass ``update`` as the campaign's ``on_progress``."""

    def __init__(self, console: Console, target: str, duration: float):
        self.console = console
        self.target = target
        self.duration = duration
        self.live = Live(console=console, refresh_per_second=4, transient=False)
        self._last = 0.0

    def __enter__(self):
        self.live.__enter__()
        return self

    def __exit__(self, *exc):
        self.live.__exit__(*exc)

    def update(self, progress) -> None:
        now = time.monotonic()
        if now - self._last < 0.25:
            return
        self._last = now
        elapsed = progress.elapsed
        frames = progress.total("frames")
        t = Table.grid(padding=(0, 2))
        t.add_column(style="bold")
        t.add_column()
        t.add_row("target", self.target)
        t.add_row("time", f"{elapsed:5.0f} / {self.duration:.0f} s")
        t.add_row("messages", f"{frames:,}  ({frames / max(elapsed, 1e-9):,.0f}/s)")
        t.add_row("connections", f"{progress.total('cases'):,}")
        sweep_total = progress.total("sweep_total")
        if sweep_total:
            done = progress.total("sweep_done")
            t.add_row("sweep", f"{done:,} / {sweep_total:,} cases"
                      + (" (done; random search)" if done >= sweep_total else ""))
            parts = progress.merged("sweep_parts")
            if parts:  # the deterministic phases, in the order they run
                t.add_row("", ", ".join(f"{p} {n:,}" for p, n in parts.items()))
        t.add_row("restarts", str(progress.total("restarts")))
        hunting = [w.get("hunting") for w in progress.workers.values() if w.get("hunting")]
        t.add_row("signatures", f"{len(progress.findings)} distinct, "
                                f"{sum(progress.duplicates.values())} duplicates"
                  + (f"  (minimising {', '.join(hunting)})" if hunting else ""))
        for f in progress.findings[-8:]:
            t.add_row("", f"[red]{escape(f['id'])}[/red] {escape(f['title'][:100])}")
        if progress.errors:
            t.add_row("errors", escape("; ".join(str(e.get("error")) for e in progress.errors[-3:])))
        self.live.update(t)
