"""``harness reports prune``: remove old report folders, never the history store.

Only folders that are report folders (:func:`harness.history.ingest.kind_of`) directly under
the reports root are candidates; ``--keep N`` keeps the newest N of each kind (matrix run,
fuzz campaign, bench, bisect), ``--older-than`` removes only folders older than that, and both
together remove what is both beyond the newest N and older. Files (the history store, a
README) are never removed, whatever their name.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from .errors import HistoryError
from .ingest import folder_size, kind_of


@dataclass(frozen=True)
class Candidate:
    path: Path
    kind: str
    mtime: float
    size: int


def report_folders(root: Path) -> list[Candidate]:
    out = []
    for p in sorted(Path(root).iterdir()):
        if not p.is_dir() or p.is_symlink():
            continue
        try:
            kind = kind_of(p)
        except HistoryError:
            continue
        out.append(Candidate(p, kind, p.stat().st_mtime, folder_size(p)[0]))
    return out


def to_prune(root: Path, *, keep: int | None, older_than: float | None,
             now: float | None = None) -> list[Candidate]:
    if keep is None and older_than is None:
        raise HistoryError("say what to remove: --keep N, --older-than AGE or both")
    if keep is not None and keep < 0:
        raise HistoryError(f"--keep {keep}: a count, 0 or more")
    if not Path(root).is_dir():
        raise HistoryError(f"{root}: no such reports folder")
    now = time.time() if now is None else now
    by_kind: dict[str, list[Candidate]] = {}
    for c in report_folders(root):
        by_kind.setdefault(c.kind, []).append(c)
    out = []
    for folders in by_kind.values():
        folders.sort(key=lambda c: c.mtime, reverse=True)  # newest first
        for i, c in enumerate(folders):
            beyond = keep is None or i >= keep
            old = older_than is None or now - c.mtime > older_than
            if beyond and old:
                out.append(c)
    return sorted(out, key=lambda c: c.mtime)


def prune(candidates: list[Candidate]) -> int:
    """Remove them; returns the bytes freed."""
    freed = 0
    for c in candidates:
        shutil.rmtree(c.path)
        freed += c.size
    return freed
