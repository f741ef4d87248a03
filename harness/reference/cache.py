"""The server's hash cache directory (spec 9): files named by the FNV-1a of their content."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ..proto.fnv import Fnv1a64, cache_file_name


class HashCache:
    def __init__(self, directory: str | Path, max_entry: int = 1 << 40):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_entry = max_entry

    def path(self, h: int) -> Path:
        return self.dir / cache_file_name(h)

    def size(self, h: int) -> int | None:
        """Size of the entry for ``h``, or None if there is none (lookups trust the name)."""
        try:
            return self.path(h).stat().st_size
        except OSError:
            return None

    def read_into(self, h: int, dest: memoryview) -> None:
        with open(self.path(h), "rb") as f:
            got = f.readinto(dest)
        if got != len(dest):
            raise OSError(f"cache entry {cache_file_name(h)} shrank while reading")

    def writer(self) -> "CacheWriter":
        return CacheWriter(self)

    def entries(self) -> list[str]:
        return sorted(p.name for p in self.dir.iterdir() if len(p.name) == 16)


class CacheWriter:
    """Hashes a payload as it streams in and files it under its hash when complete.

    Unlike the real server (plain overwrite before the tensor write) the entry appears
    atomically, so a client that disconnects mid-upload leaves no truncated entry.
    """

    def __init__(self, cache: HashCache):
        self.cache = cache
        self.hasher = Fnv1a64()
        fd, self._tmp = tempfile.mkstemp(dir=cache.dir, prefix=".incoming-")
        self._f = os.fdopen(fd, "wb")

    def update(self, data) -> None:
        self.hasher.update(data)
        self._f.write(data)

    def commit(self) -> str:
        self._f.close()
        name = self.hasher.hexdigest()
        os.replace(self._tmp, self.cache.dir / name)
        return name

    def abort(self) -> None:
        try:
            self._f.close()
        finally:
            try:
                os.unlink(self._tmp)
            except FileNotFoundError:
                pass
