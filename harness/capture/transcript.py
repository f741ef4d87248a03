"""Application-level transcripts: the bytes each side sent, in order, with timestamps.

A transcript is what a recording proxy saw on one TCP connection: chunks of bytes, each with
its direction and the wall-clock time it passed. Bulk payload beyond ``keep`` bytes per
direction is elided (its length is kept, its bytes are not) so a 1 GiB upload does not
become a 1 GiB file; decoding still works because elided bytes only ever sit inside payloads
that the decoder summarises by length.

File format (``.rpct``): one JSON header line, then records
``<u8 direction><f64 t><u64 length><u8 elided>[bytes]``; compact and append-only.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from ..proto.session import Session, SessionDecoder

C2S, S2C = "c2s", "s2c"
_DIRS = {C2S: 0, S2C: 1}
_REC = struct.Struct("<BdQB")
MAGIC = "ggml-rpc-transcript/1"


@dataclass
class Chunk:
    t: float
    direction: str
    length: int
    data: bytes | None  # None when elided


@dataclass
class Transcript:
    chunks: list[Chunk] = field(default_factory=list)
    meta: dict = field(default_factory=dict)
    keep: int = 64 << 20  # bytes kept per direction before payload is elided
    _kept: dict = field(default_factory=lambda: {C2S: 0, S2C: 0})
    closed: dict = field(default_factory=dict)  # direction -> (t, how: "fin" | "rst")

    def add(self, t: float, direction: str, data: bytes) -> None:
        if self._kept[direction] < self.keep:
            self._kept[direction] += len(data)
            self.chunks.append(Chunk(t, direction, len(data), bytes(data)))
        else:
            self.chunks.append(Chunk(t, direction, len(data), None))

    def add_elided(self, t: float, direction: str, length: int) -> None:
        self.chunks.append(Chunk(t, direction, length, None))

    def close(self, t: float, direction: str, how: str = "fin") -> None:
        self.closed.setdefault(direction, (t, how))

    def stream(self, direction: str) -> Iterator[Chunk]:
        return (c for c in self.chunks if c.direction == direction)

    def bytes_of(self, direction: str) -> bytes:
        """Concatenated bytes of one direction (elided bytes as zeros)."""
        return b"".join(c.data if c.data is not None else bytes(c.length)
                        for c in self.stream(direction))

    def total(self, direction: str) -> int:
        return sum(c.length for c in self.stream(direction))

    @property
    def complete(self) -> bool:
        return all(c.data is not None for c in self.chunks)

    def decode(self, dialect=None, keep_data: int = 1 << 20) -> Session:
        """Decode in arrival order, so responses follow the requests that caused them."""
        dec = SessionDecoder(dialect, keep_data=keep_data)
        for c in self.chunks:
            data = c.data if c.data is not None else bytes(c.length)
            (dec.feed_c2s if c.direction == C2S else dec.feed_s2c)(data)
        return dec.close()

    # -- files
    def save(self, path: str | Path) -> None:
        path = Path(path)
        header = {"format": MAGIC, "meta": self.meta,
                  "closed": {k: list(v) for k, v in self.closed.items()}}
        with open(path, "wb") as f:
            f.write(json.dumps(header, sort_keys=True).encode() + b"\n")
            for c in self.chunks:
                f.write(_REC.pack(_DIRS[c.direction], c.t, c.length, c.data is None))
                if c.data is not None:
                    f.write(c.data)

    @classmethod
    def load(cls, path: str | Path) -> "Transcript":
        raw = Path(path).read_bytes()
        nl = raw.index(b"\n")
        header = json.loads(raw[:nl])
        if header.get("format") != MAGIC:
            raise ValueError(f"{path}: not a ggml-rpc transcript")
        tr = cls(meta=header.get("meta", {}), keep=1 << 62)
        tr.closed = {k: tuple(v) for k, v in header.get("closed", {}).items()}
        off = nl + 1
        names = {v: k for k, v in _DIRS.items()}
        while off < len(raw):
            d, t, n, elided = _REC.unpack_from(raw, off)
            off += _REC.size
            data = None
            if not elided:
                data = raw[off:off + n]
                if len(data) != n:
                    raise ValueError(f"{path}: truncated record at byte {off}")
                off += n
            tr.chunks.append(Chunk(t, names[d], n, data))
        return tr
