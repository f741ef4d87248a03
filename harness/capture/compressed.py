"""Capture files on disk, plain or gzip-compressed.

A passing matrix cell's transcripts and pcap are written gzip-compressed under their usual
names (``conn0.rpct``, ``wire.pcap``): Wireshark, tshark and scapy read a gzip pcap by its
magic bytes, and the project's readers go through here, so nothing that reads them changes.
Reading is bounded: a compressed file cannot expand past ``MAX_EXPANDED`` in memory.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path
from typing import IO

GZIP_MAGIC = b"\x1f\x8b"
MAX_EXPANDED = 4 << 30  # larger than any transcript a run writes, smaller than the machine
_CHUNK = 1 << 20


def is_gzip(path: str | Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == GZIP_MAGIC


def open_read(path: str | Path) -> IO[bytes]:
    """A binary reader of the file's content, decompressed when it is gzip."""
    return gzip.open(path, "rb") if is_gzip(path) else open(path, "rb")


class _OwnedGzipWriter(gzip.GzipFile):
    """A gzip writer that closes the file it was given: no name and no time in the header,
    so the same content gives the same bytes (runs compare files by hash)."""

    def __init__(self, path: str | Path):
        self._raw = open(path, "wb")
        super().__init__(filename="", mode="wb", compresslevel=6, fileobj=self._raw, mtime=0)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._raw.close()


def open_write(path: str | Path, *, compress: bool) -> IO[bytes]:
    return _OwnedGzipWriter(path) if compress else open(path, "wb")


def head(path: str | Path, n: int) -> bytes:
    with open_read(path) as f:
        return f.read(n)


def read_bounded(path: str | Path, limit: int = MAX_EXPANDED) -> bytes:
    """The whole (decompressed) content; ValueError past ``limit`` bytes or on a damaged
    gzip stream, never an unbounded allocation."""
    try:
        with open_read(path) as f:
            parts, total = [], 0
            while chunk := f.read(_CHUNK):
                total += len(chunk)
                if total > limit:
                    raise ValueError(f"{Path(path).name}: expands past {limit} bytes")
                parts.append(chunk)
    except (OSError, EOFError, zlib.error) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise ValueError(f"{Path(path).name}: damaged compressed file: {e}") from None
    return b"".join(parts)
