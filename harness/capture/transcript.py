"""Application-level transcripts: the bytes each side sent, in order, with timestamps.

A transcript is what a recording proxy saw on one TCP connection: chunks of bytes, each with
its direction and the wall-clock time it passed. Bulk payload beyond ``keep`` bytes per
direction is elided (its length is kept, its bytes are not) so a 1 GiB upload does not
become a 1 GiB file; decoding still works because elided bytes only ever sit inside payloads
that the decoder summarises by length.

File format (``.rpct``): one JSON header line, then records
``<u8 direction><f64 t><u64 length><u8 elided>[bytes]``; compact and append-only. Format 2
adds ``elided = 2``: the record is followed by the SHA-256 of the bytes it stands for (a
passing matrix cell's payloads, elided after its verdict: the bytes are gone, what they were
is still checkable). A reader of format 1 cannot read a format-2 file, so a file without a
hash is written as format 1.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from . import compressed
from ..proto.session import Session, SessionDecoder

C2S, S2C = "c2s", "s2c"
_DIRS = {C2S: 0, S2C: 1}
_REC = struct.Struct("<BdQB")
MAGIC = "ggml-rpc-transcript/1"
MAGIC_HASHED = "ggml-rpc-transcript/2"
KEPT, ELIDED, ELIDED_HASHED = 0, 1, 2


@dataclass
class Chunk:
    t: float
    direction: str
    length: int
    data: bytes | None  # None when elided
    sha256: bytes | None = None  # of the elided bytes, when they were seen


@dataclass
class Transcript:
    chunks: list[Chunk] = field(default_factory=list)
    meta: dict = field(default_factory=dict)
    keep: int = 64 << 20  # bytes kept per direction before payload is elided
    _kept: dict = field(default_factory=lambda: {C2S: 0, S2C: 0})
    closed: dict = field(default_factory=dict)  # direction -> (t, how: "fin" | "rst")
    _decoded: dict = field(default_factory=dict, repr=False, compare=False)

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
        """Decode in arrival order, so responses follow the requests that caused them.

        The result is remembered while the chunks are the same objects with the same data (a
        matrix cell reads one transcript four or five times: its checks, the label and wire
        evidence, the upload timing; each read hashed every payload again). Callers treat the
        Session as read-only."""
        key = (dialect if dialect is None or isinstance(dialect, str) else dialect.name,
               keep_data)
        seen = [(c, c.data) for c in self.chunks]
        hit = self._decoded.get(key)
        if hit is not None and len(hit[0]) == len(seen) and all(
                a is c and b is d for (a, b), (c, d) in zip(hit[0], seen)):
            return hit[1]
        dec = SessionDecoder(dialect, keep_data=keep_data)
        for c, data in seen:  # the snapshot: a recorder may still be appending
            data = data if data is not None else bytes(c.length)
            (dec.feed_c2s if c.direction == C2S else dec.feed_s2c)(data)
        session = dec.close()
        self._decoded[key] = (seen, session)
        return session

    # -- files
    def save(self, path: str | Path, *, compress: bool = False) -> None:
        path = Path(path)
        hashed = any(c.data is None and c.sha256 for c in self.chunks)
        header = {"format": MAGIC_HASHED if hashed else MAGIC, "meta": self.meta,
                  "closed": {k: list(v) for k, v in self.closed.items()}}
        with compressed.open_write(path, compress=compress) as f:
            f.write(json.dumps(header, sort_keys=True).encode() + b"\n")
            for c in self.chunks:
                flag = KEPT if c.data is not None else ELIDED_HASHED if c.sha256 else ELIDED
                f.write(_REC.pack(_DIRS[c.direction], c.t, c.length, flag))
                if c.data is not None:
                    f.write(c.data)
                elif c.sha256:
                    f.write(c.sha256)

    @classmethod
    def load(cls, path: str | Path) -> "Transcript":
        raw = compressed.read_bounded(path)
        nl = raw.find(b"\n")
        if nl < 0:
            raise ValueError(f"{path}: not a ggml-rpc transcript")
        header = json.loads(raw[:nl])
        if header.get("format") not in (MAGIC, MAGIC_HASHED):
            raise ValueError(f"{path}: not a ggml-rpc transcript")
        tr = cls(meta=header.get("meta", {}), keep=1 << 62)
        tr.closed = {k: tuple(v) for k, v in header.get("closed", {}).items()}
        off = nl + 1
        names = {v: k for k, v in _DIRS.items()}
        while off < len(raw):
            if off + _REC.size > len(raw):
                raise ValueError(f"{path}: truncated record at byte {off}")
            d, t, n, flag = _REC.unpack_from(raw, off)
            off += _REC.size
            if d not in names or flag not in (KEPT, ELIDED, ELIDED_HASHED):
                raise ValueError(f"{path}: bad record at byte {off - _REC.size}")
            data = digest = None
            if flag == KEPT:
                data = raw[off:off + n]
                if len(data) != n:
                    raise ValueError(f"{path}: truncated record at byte {off}")
                off += n
            elif flag == ELIDED_HASHED:
                digest = raw[off:off + 32]
                if len(digest) != 32:
                    raise ValueError(f"{path}: truncated hash at byte {off}")
                off += 32
            tr.chunks.append(Chunk(t, names[d], n, data, digest))
        return tr
