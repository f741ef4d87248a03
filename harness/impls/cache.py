"""Where the harness keeps real peers, and how a cache entry is created and removed atomically.

Layout (root: $GGML_RPC_HARNESS_CACHE, else the platform user cache dir)::

    peers/<key>/bin/            server + libggml*.so (+ extra targets)
    peers/<key>/manifest.json   what was built from what, how long it took, what it announced
    downloads/                  kept sdists/wheels, so a rebuild skips pip
    logs/                       the full log of the last failed build step, per entry
    user-peers.json             user build dirs registered with `harness peers add`

``<key>`` is ``<package>==<version>`` for a release, plus one suffix per variant
(``+patch-<sha256 prefix>``, ``+san-address-undefined``, ``+rdma``).
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import platformdirs

CACHE_ENV = "GGML_RPC_HARNESS_CACHE"


def cache_root() -> Path:
    """Root of everything the harness caches; $GGML_RPC_HARNESS_CACHE overrides it."""
    override = os.environ.get(CACHE_ENV)
    return Path(override) if override else Path(platformdirs.user_cache_dir("ggml-rpc-harness"))


def peers_dir() -> Path:
    return cache_root() / "peers"


def downloads_dir() -> Path:
    return cache_root() / "downloads"


def logs_dir() -> Path:
    return cache_root() / "logs"


def _failed_logs(key: str) -> list[Path]:
    """The logs failed builds of the entry ``key`` left (``logs/<key>.<step>.log``); a longer
    key that starts with this one (``<key>+asan``) is another entry's."""
    return [p for p in logs_dir().glob(f"{key}.*.log")
            if re.fullmatch(r"[A-Za-z_-]+\.log", p.name[len(key) + 1:])]


def failed_build_log(key: str) -> Path | None:
    """The newest log a failed build of ``key`` left, or None: the build has not failed, or
    has succeeded since."""
    return max(_failed_logs(key), key=lambda p: p.stat().st_mtime, default=None)


def forget_failed_builds(key: str) -> None:
    for p in _failed_logs(key):
        p.unlink(missing_ok=True)


def user_peers_file() -> Path:
    return cache_root() / "user-peers.json"


def entry_dirs() -> list[Path]:
    """Every finished entry under peers/ (temp dirs and lock files start with a dot)."""
    root = peers_dir()
    if not root.is_dir():
        return []
    return sorted(d for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))


@contextmanager
def entry_lock(key: str):
    """Serialise work on one entry across processes (the second waits, then sees the result)."""
    peers_dir().mkdir(parents=True, exist_ok=True)
    with open(peers_dir() / f".{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def new_stage_dir(key: str) -> Path:
    """A private temp dir next to the entries (same filesystem, so installing is a rename).
    Its name carries our pid, so a later build can tell that its builder died."""
    remove_stale_temp_dirs()
    return Path(tempfile.mkdtemp(prefix=f".tmp-{key}-pid{os.getpid()}-", dir=peers_dir()))


def remove_stale_temp_dirs() -> None:
    """Remove temp dirs left by builds whose process died."""
    for d in peers_dir().glob(".tmp-*"):
        m = re.search(r"-pid(\d+)-", d.name)
        if m and not _pid_alive(int(m.group(1))):
            shutil.rmtree(d, ignore_errors=True)


def install_entry(stage_dir: Path, entry_dir: Path) -> None:
    """Move the finished stage into place; an old entry is swapped out, then deleted."""
    old = None
    if entry_dir.exists():
        old = entry_dir.with_name(f".tmp-old-{entry_dir.name}-pid{os.getpid()}-{time.time_ns()}")
        os.rename(entry_dir, old)
    try:
        os.rename(stage_dir, entry_dir)
    except OSError:
        if old is not None:
            os.rename(old, entry_dir)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def remove_entry(key: str) -> bool:
    """Delete the entry ``key`` (renamed away first, so readers never see half of it)."""
    entry = peers_dir() / key
    with entry_lock(key):
        if not entry.exists():
            return False
        doomed = entry.with_name(f".tmp-rm-{key}-pid{os.getpid()}-{time.time_ns()}")
        os.rename(entry, doomed)
    shutil.rmtree(doomed, ignore_errors=True)
    return True
