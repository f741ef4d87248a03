"""A fuzz case: the request frames of one connection, replayable against any fresh server.

Real servers hand out heap addresses as buffer handles and bases, and those differ between
runs (and between processes). So frames are generated against *sentinel* handles and bases and
carry a list of relocations; the executor patches each relocated u64 with the live value it
learned on this connection (from ALLOC_BUFFER and BUFFER_GET_BASE answers) plus the same
addend. A reproducer therefore means "4 bytes past the end of buffer 0" on every run, not
"address 0x55d1c0a0".

Sentinels are chosen far from any heap or reference-server address (top bytes 0x0AA5 /
0x0BA5), so finding them is a substring search, and a value near one is relocated whatever
the field it sits in (tensor.data, tensor.buffer, remote_ptr, a src id...).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterable, NamedTuple

from ..proto.wire import U64, U64_MAX
from ..proto import (Cmd, ConnectionClosed, Data, EndOfMessage, NEED_DATA, Request, RequestHead,
                     RequestReader, get_dialect, response_payload_size)
from ..proto.dialects import Dialect
from ..proto.errors import ProtocolError


HANDLE, BASE = "handle", "base"
SIZE = "size"  # an ALLOC_BUFFER answer's remote_size (learned with the handle, never relocated)
SENTINEL = {HANDLE: 0x0AA5_D000_0000_0000, BASE: 0x0BA5_E000_0000_0000}
_TAGS = {HANDLE: b"\xa5\x0a", BASE: b"\xa5\x0b"}  # bytes 6..7 of the little-endian u64
BUFFER_SPACING = 1 << 36  # sentinel i = SENTINEL + i * BUFFER_SPACING
# Values within this distance of a sentinel are relocated: room for any buffer the generator
# allocates plus near-bounds offsets, small enough that random payload bytes almost never
# look like a sentinel (about 2**-17 per occurrence of a 2-byte tag).
RELOC_WINDOW = 1 << 26
MAX_BUFFERS = 16


def sentinel(kind: str, index: int) -> int:
    return SENTINEL[kind] + index * BUFFER_SPACING


class Reloc(NamedTuple):
    """Patch the u64 at ``offset`` with ``live[kind][index] + addend`` (mod 2**64)."""

    offset: int
    kind: str
    index: int
    addend: int


# A server reads the command byte, the size and the payload separately, and the in-process
# target relocates inside each read only (rpc_server_fuzzer.cpp): in the header, only the size
# field itself is a relocatable u64; one straddling header and payload is left as it is.
# Relocated u64s never overlap: the scan goes on after a patched one (else the bytes patched
# in, 0 for a buffer not yet learned, can complete a sentinel that was not in the input).
_SIZE_FIELD, _PAYLOAD = 1, 9


def find_relocs(frame: bytes) -> tuple[Reloc, ...]:
    """The u64s of ``frame`` that lie near a sentinel handle or base, scanning from the left
    and going on after each one found: at any byte offset of the payload, or the size
    field."""
    out = []
    for kind, tag in _TAGS.items():
        base = SENTINEL[kind]
        pos = frame.find(tag, 6)
        while pos >= 0:
            start = pos - 6
            if start + 8 <= len(frame) and (start >= _PAYLOAD or start == _SIZE_FIELD):
                (v,) = U64.unpack_from(frame, start)
                index = (v - base + BUFFER_SPACING // 2) // BUFFER_SPACING
                addend = v - base - index * BUFFER_SPACING
                if 0 <= index < MAX_BUFFERS and abs(addend) < RELOC_WINDOW:
                    out.append(Reloc(start, kind, index, addend))
            pos = frame.find(tag, pos + 1)
    kept: list[Reloc] = []
    for r in sorted(out):
        if not kept or r.offset >= kept[-1].offset + 8:
            kept.append(r)
    return tuple(kept)


def relocate(frame: bytes, relocs: Iterable[Reloc], live: dict[str, list[int]]) -> bytes:
    """``frame`` with every relocation applied against the ``live`` handles and bases.

    A buffer whose value was never learned (its ALLOC failed or was cut away) counts as 0.
    """
    buf = bytearray(frame)
    for r in relocs:
        values = live[r.kind]
        v = values[r.index] if r.index < len(values) else 0
        U64.pack_into(buf, r.offset, (v + r.addend) & U64_MAX)
    return bytes(buf)


@dataclass(frozen=True)
class Step:
    """One write of request bytes (usually exactly one frame).

    ``expect``: payload sizes of the responses these bytes must produce if the server accepts
    every complete request in them (from decoding the whole case, see :func:`annotate`).
    ``learn``: ("handle" | "base", buffer index) -- read that value from the (single) response.
    ``desc``: the mutation description for mutated steps, None for valid ones.
    ``eof``: shut our sending side down after these bytes (truncated-frame mutations).
    """

    frame: bytes
    cmd: str
    relocs: tuple[Reloc, ...] = ()
    expect: tuple[int, ...] = ()
    learn: tuple[str, int] | None = None
    desc: dict | None = None
    eof: bool = False

    @property
    def mutated(self) -> bool:
        return self.desc is not None

    def to_json(self) -> dict:
        d = {"frame": self.frame.hex(), "cmd": self.cmd}
        if self.relocs:
            d["relocs"] = [list(r) for r in self.relocs]
        if self.learn:
            d["learn"] = list(self.learn)
        if self.desc is not None:
            d["desc"] = self.desc
        if self.eof:
            d["eof"] = True
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Step":
        return cls(frame=bytes.fromhex(d["frame"]), cmd=d.get("cmd", "RAW"),
                   relocs=tuple(Reloc(*r) for r in d.get("relocs", ())),
                   learn=tuple(d["learn"]) if d.get("learn") else None, desc=d.get("desc"),
                   eof=bool(d.get("eof", False)))


def step(frame: bytes, cmd: str, *, learn=None, desc=None, eof: bool = False) -> Step:
    """A step with its relocations found (``expect`` is filled in by :func:`annotate`)."""
    return Step(frame=frame, cmd=cmd, relocs=find_relocs(frame), learn=learn, desc=desc, eof=eof)


@dataclass(frozen=True)
class Case:
    """The steps of one connection, in order, for one dialect."""

    dialect: str
    steps: tuple[Step, ...]
    # Steps the decoder says leave the server waiting for more payload bytes (no answer due).
    open_ended: bool = False
    protocol_error_at: int | None = None  # first step the server must refuse (close on)
    meta: dict = field(default_factory=dict, compare=False)

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def n_buffers(self) -> int:
        n = 0
        for s in self.steps:
            for r in s.relocs:
                n = max(n, r.index + 1)
            if s.learn:
                n = max(n, s.learn[1] + 1)
        return n

    def with_steps(self, steps: Iterable[Step]) -> "Case":
        return annotate(self.dialect, tuple(steps), meta=self.meta)

    def to_json(self) -> dict:
        return {"dialect": self.dialect, "steps": [s.to_json() for s in self.steps]}

    @classmethod
    def from_json(cls, d: dict) -> "Case":
        return annotate(d["dialect"], tuple(Step.from_json(s) for s in d["steps"]))

    def describe(self) -> list[str]:
        """One line per step, for reports."""
        lines = []
        for i, s in enumerate(self.steps):
            what = ""
            if s.desc:
                extra = {k: v for k, v in s.desc.items()
                         if k in ("value", "case", "index") and v is not None}
                what = f"  <- {s.desc['kind']}:{s.desc['what']} {s.desc['field']}"
                if extra:
                    what += " " + " ".join(f"{k}={v}" for k, v in extra.items())
            lines.append(f"{i:3d} {s.cmd:<18} {len(s.frame):6d} B{what}")
        return lines


_MAX_DECODE = 1 << 62  # decode whatever length is announced; nothing is buffered beyond it


def annotate_after(head: Case, tail: tuple[Step, ...], meta: dict | None = None) -> Case:
    """``annotate`` of ``head``'s steps followed by ``tail``, decoding only the tail: a head
    of whole frames the server accepts leaves the decoder where a new connection starts (the
    sweep's sessions share one set-up of five frames; decoding it 30,000 times was most of
    building them)."""
    if head.open_ended or head.protocol_error_at is not None:
        return annotate(head.dialect, head.steps + tail, meta)
    # the decoder's only state between whole frames: whether a HELLO was read
    hello = any(s.cmd == "HELLO" and s.expect for s in head.steps)
    rest = annotate(head.dialect, tail, hello_seen=hello)
    error_at = None if rest.protocol_error_at is None \
        else len(head.steps) + rest.protocol_error_at
    return Case(head.dialect, head.steps + rest.steps, open_ended=rest.open_ended,
                protocol_error_at=error_at, meta=dict(meta or {}))


def annotate(dialect: Dialect | str, steps: tuple[Step, ...], meta: dict | None = None, *,
             hello_seen: bool = False) -> Case:
    """Decode the steps as the server would (the sans-IO reader, one stream) and record, per
    step, the responses it must produce: that is the spec's answer to "what may come back".
    ``hello_seen``: the steps follow a connection's HELLO (see :func:`annotate_after`)."""
    d = get_dialect(dialect)
    reader = RequestReader(d, max_payload=_MAX_DECODE, max_stream=_MAX_DECODE,
                           stream=frozenset({Cmd.SET_TENSOR, Cmd.SET_TENSOR_2D}))
    reader.hello_seen = hello_seen
    out = []
    error_at = None
    for i, s in enumerate(steps):
        expect: list[int] = []
        if error_at is None:
            reader.feed(s.frame)
            if s.eof:
                reader.feed(b"")
            try:
                while True:
                    ev = reader.next_event()
                    if ev is NEED_DATA or isinstance(ev, ConnectionClosed):
                        break
                    if isinstance(ev, Request):
                        size = response_payload_size(d, ev.message)
                        if size is not None:
                            expect.append(size)
                    elif isinstance(ev, (RequestHead, Data, EndOfMessage)):
                        continue
            except ProtocolError:
                error_at = i
            except Exception:  # noqa: BLE001 - a payload the codec cannot represent
                error_at = i
        out.append(s if tuple(expect) == s.expect else replace(s, expect=tuple(expect)))
    open_ended = error_at is None and reader.in_frame
    return Case(d.name, tuple(out), open_ended=open_ended, protocol_error_at=error_at,
                meta=dict(meta or {}))
