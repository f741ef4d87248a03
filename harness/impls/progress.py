"""Build progress: events from a peer build, shown as lines or as a live rich bar."""

from __future__ import annotations

from collections.abc import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class BuildProgress:
    """Receives build events. The base class ignores them (quiet builds)."""

    def stage(self, pin: str, stage: str, detail: str = "") -> None:
        """A new stage began: download, unpack, patch, configure, build, install, verify."""

    def step(self, pin: str, done: int, total: int, text: str) -> None:
        """Ninja finished step ``done`` of ``total``."""

    def finish(self, pin: str, message: str) -> None:
        """The pin is built (or was already)."""


class LineProgress(BuildProgress):
    """Plain one-line-per-event progress into a callable (tests, logs)."""

    def __init__(self, emit: Callable[[str], None], every_percent: int = 10):
        self.emit = emit
        self.every_percent = every_percent
        self._last_bucket: dict[str, int] = {}

    def stage(self, pin, stage, detail=""):
        self._last_bucket.pop(pin, None)
        self.emit(f"{pin}: {stage}" + (f" {detail}" if detail else ""))

    def step(self, pin, done, total, text):
        bucket = done * 100 // max(total, 1) // self.every_percent
        if bucket != self._last_bucket.get(pin) or done == total:
            self._last_bucket[pin] = bucket
            self.emit(f"{pin}: build [{done}/{total}] {text}")

    def finish(self, pin, message):
        self.emit(f"{pin}: {message}")


class RichBuildProgress(BuildProgress):
    """Status lines on a rich console, with a live bar for the ninja steps on a terminal."""

    def __init__(self, console: Console | None = None):
        self.console = console or Console(stderr=True)
        self._bar: Progress | None = None
        self._task = None
        self._lines = LineProgress(lambda s: self.console.print(s, highlight=False, markup=False))

    def _close_bar(self):
        if self._bar is not None:
            self._bar.stop()
            self._bar = self._task = None

    def stage(self, pin, stage, detail=""):
        self._close_bar()
        self._lines.stage(pin, stage, detail)

    def step(self, pin, done, total, text):
        if not self.console.is_terminal:
            self._lines.step(pin, done, total, text)
            return
        if self._bar is None:
            self._bar = Progress(TextColumn(f"{pin}: build"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("{task.description}"),
                                 console=self.console, transient=True)
            self._bar.start()
            self._task = self._bar.add_task("", total=total)
        self._bar.update(self._task, completed=done, total=total, description=text[-60:])

    def finish(self, pin, message):
        self._close_bar()
        self._lines.finish(pin, message)


def as_progress(progress) -> BuildProgress:
    """A BuildProgress from None (quiet), a BuildProgress, or a callable taking one line."""
    if progress is None:
        return BuildProgress()
    if isinstance(progress, BuildProgress):
        return progress
    if callable(progress):
        return LineProgress(progress)
    raise TypeError(f"progress must be a BuildProgress or a callable, not {type(progress)}")
