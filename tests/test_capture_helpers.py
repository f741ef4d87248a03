"""Shared helpers of the capture tests (the real-server vectors as transcripts), and their checks.

Named test_capture_* so it lives with the tests it serves; imported as a plain module.
"""

from __future__ import annotations

import json
from pathlib import Path

from harness.data import shipped
from harness.capture.transcript import C2S, S2C, Chunk, Transcript

ROOT = Path(__file__).resolve().parent.parent
VECTORS = shipped("vectors")
GOLDEN = ROOT / "fixtures" / "transcripts"
GOLDEN_NAMES = ("happy_nocache", "cache")


def vector_entries(name: str) -> list[dict]:
    return json.loads((VECTORS / f"{name}.json").read_text())


def vector_streams(name: str) -> tuple[bytes, bytes]:
    entries = vector_entries(name)
    c2s = b"".join(bytes.fromhex(e["req"]) for e in entries)
    s2c = b"".join(bytes.fromhex(e["rsp"]) for e in entries if e.get("rsp"))
    return c2s, s2c


def vector_frames(name: str) -> list[tuple[bytes, bytes | None]]:
    return [(bytes.fromhex(e["req"]), bytes.fromhex(e["rsp"]) if e.get("rsp") else None)
            for e in vector_entries(name)]


def split_transcript(tr: Transcript, sizes) -> Transcript:
    """The same conversation with every chunk cut into pieces of the given sizes (cycled).

    Pieces get fresh timestamps 1 us apart: increasing (so the order is unambiguous) and
    distinct at pcap resolution (so read_pcap does not join them again).
    """
    out = Transcript(meta=dict(tr.meta), keep=tr.keep)
    t0 = tr.chunks[0].t if tr.chunks else 0.0
    k = 0
    for c in tr.chunks:
        off = 0
        while off < c.length:
            n = min(sizes[k % len(sizes)], c.length - off)
            out.chunks.append(Chunk(t0 + k * 1e-6, c.direction, n,
                                    None if c.data is None else c.data[off:off + n]))
            off += n
            k += 1
    out.closed = {d: (t0 + (k + i) * 1e-6, how) for i, (d, (_, how)) in
                  enumerate(sorted(tr.closed.items(), key=lambda kv: kv[1][0]))}
    return out


def pipelined_transcript(name: str) -> Transcript:
    """All requests in one chunk, then all responses in one chunk (several frames per segment)."""
    c2s, s2c = vector_streams(name)
    tr = Transcript(meta={"client": ["127.0.0.1", 40001], "server": ["127.0.0.1", 50052]})
    tr.add(1000.0, C2S, c2s)
    tr.add(1000.5, S2C, s2c)
    return tr


def test_split_transcript_keeps_bytes_and_order():
    c2s, s2c = vector_streams("cache")
    tr = pipelined_transcript("cache")
    cut = split_transcript(tr, [1, 2, 3, 4, 5, 6, 7])
    assert cut.bytes_of(C2S) == c2s and cut.bytes_of(S2C) == s2c
    assert max(c.length for c in cut.chunks) == 7
