"""Values built once and kept in the user cache (``<cache>/sweep``): the sweep's parts and the
covering arrays cost seconds that every campaign, worker and test would otherwise pay again
for the same result. One process builds while the others wait for it (a lock file: two workers
building the same arrays at once would only halve each other's CPU); a damaged or unreadable
entry is built again; a read-only cache costs the time, not the result."""

from __future__ import annotations

import fcntl
import hashlib
import os
import pickle
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Callable, TypeVar

T = TypeVar("T")


def _load(path: Path):
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except Exception:  # noqa: BLE001 - absent, or damaged in any way: built again
        return None


def cached(kind: str, key: str, version: str, build: Callable[[], T]) -> T:
    """``build()`` for ``key``, kept as ``<kind>-<key>-<version>.pickle``; entries of the same
    kind and key with another version are removed when a new one is written."""
    from ..impls.registry import cache_root
    path = cache_root() / "sweep" / f"{kind}-{key}-{version}.pickle"
    value = _load(path)
    if value is not None:
        return value
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(path.with_suffix(".lock"), "a")
    except OSError:
        return build()
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        value = _load(path)  # built by another process while we waited
        if value is not None:
            return value
        value = build()
        try:
            with tempfile.NamedTemporaryFile("wb", dir=path.parent, delete=False) as f:
                pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(f.name, path)  # atomic: a reader never sees half a file
            for old in path.parent.glob(f"{kind}-{key}-*.pickle"):
                if old != path:
                    old.unlink(missing_ok=True)  # built by an older harness
        except OSError:
            pass
    return value


@lru_cache(maxsize=None)
def source_digest(*modules: str) -> str:
    """Of the named modules of the harness (file paths under ``harness/``), or of every module
    when none is named: a cached value built by other code is built again."""
    root = Path(__file__).resolve().parents[1]
    files = [root / m for m in modules] if modules else sorted(root.rglob("*.py"))
    h = hashlib.sha256()
    for f in files:
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]
