"""Readable and JSON views of a recorded session (a ``.rpct`` transcript or a pcap).

Every message becomes one record: the exchange index it belongs to, the time since the
connection opened, its direction, command and fields. Decoder errors (``Session.c2s_error`` /
``s2c_error``) and how each side closed are records too, placed where they happened in the
byte streams, so a listing reads in wire order.
"""

from __future__ import annotations

import gzip
import json
import zlib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Iterator

from ..proto import ggml
from ..proto.fnv import fnv1a64
from ..proto.messages import Message
from ..proto.session import Exchange, Session
from ..proto.tensor import RpcTensor
from . import compressed
from .dissect import StreamView, frame_spans
from .transcript import C2S, MAGIC, MAGIC_HASHED, S2C, Transcript

INLINE_BYTES = 64  # longer byte fields are shown as length + FNV-1a hash
ARROWS = {C2S: "C->S", S2C: "S->C"}
# every transcript format this reader takes: 2 is what a passing matrix cell keeps (long
# payloads as their length and SHA-256), so `harness decode` must read it as well as 1
FORMATS = (MAGIC, MAGIC_HASHED)
_TENSOR_FLAGS = ((1, "INPUT"), (2, "OUTPUT"), (4, "PARAM"), (8, "LOSS"), (16, "COMPUTE"))


# ---------------------------------------------------------------- loading

def is_pcap(path: str | Path) -> bool:
    try:
        magic = compressed.head(path, 4)
    except (gzip.BadGzipFile, EOFError, zlib.error):
        return False  # a damaged gzip file: load_transcripts names the damage
    return magic in (b"\xd4\xc3\xb2\xa1", b"\xa1\xb2\xc3\xd4", b"\x4d\x3c\xb2\xa1",
                     b"\xa1\xb2\x3c\x4d", b"\x0a\x0d\x0d\x0a")


def load_transcripts(path: str | Path, *, server_port: int | None = None) -> list[Transcript]:
    """The connections in a capture file: pcap/pcapng (any number) or ``.rpct`` (one)."""
    if is_pcap(path):
        from scapy.error import Scapy_Exception

        from .pcap import read_pcap

        try:
            return read_pcap(path, server_port=server_port)
        except Scapy_Exception as e:  # a damaged capture is bad input, not a crash
            raise ValueError(f"{Path(path).name}: {e}") from None
    try:
        head = compressed.head(path, 200)
    except (OSError, EOFError) as e:
        raise ValueError(f"{Path(path).name}: damaged compressed file: {e}") from None
    if not any(m.encode() in head for m in FORMATS):
        raise ValueError(f"{Path(path).name}: neither a pcap nor a ggml-rpc transcript")
    return [Transcript.load(path)]


# ---------------------------------------------------------------- JSON values

def jsonable(value: Any) -> Any:
    """Any message field as plain JSON: bytes as hex (long ones as length + hash)."""
    if isinstance(value, RpcTensor):
        return tensor_dict(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes_value(bytes(value))
    if isinstance(value, tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, Message):
        return message_fields(value)
    if hasattr(value, "value") and isinstance(getattr(value, "value"), str):  # enums
        return value.value
    return value


def bytes_value(b: bytes) -> Any:
    if len(b) <= INLINE_BYTES:
        return b.hex()
    return {"len": len(b), "fnv1a64": f"{fnv1a64(b):016x}"}


def tensor_dict(t: RpcTensor) -> dict:
    out = {f.name: jsonable(getattr(t, f.name)) for f in fields(t)}
    name = t.name_str
    # the name as text, plus the raw bytes only if something hides after the terminator
    out["name"] = name
    if t.name != name.encode() + bytes(64 - len(name.encode())):
        out["name_raw"] = t.name.hex()
    return out


def message_fields(msg: Message) -> dict:
    return {f.name: jsonable(getattr(msg, f.name)) for f in fields(msg)}


# ---------------------------------------------------------------- records

@dataclass
class ListingLine:
    """One line of a listing."""

    kind: str  # "request" | "response" | "error" | "close"
    direction: str
    t: float | None  # seconds since the connection opened
    order: tuple  # sort key: (chunk index, byte offset) of where the record starts
    index: int | None = None  # exchange index
    cmd: str | None = None
    message: Message | None = None
    exchange: Exchange | None = None
    size: int = 0  # frame bytes on the wire
    captured: bool = True  # False: some of the frame's bytes were elided (read as zeros)
    text: str = ""  # error reason / close kind

    def summary(self) -> str:
        if self.message is None:
            return self.text
        s = self.message.summary()
        if self.streamed_elsewhere:
            # the decoder hashed the payload instead of keeping it, so the message's data is empty
            ex = self.exchange
            digest = f" fnv1a64={ex.data_hash}" if self.captured else ""
            s = s.replace("data=0B", f"data={ex.data_length}B{digest}")
        if not self.captured:
            s += " [not all bytes captured]"
        return s

    @property
    def streamed_elsewhere(self) -> bool:
        """The payload was not kept: ``exchange.data_length`` / ``data_hash`` describe it."""
        ex = self.exchange
        if ex is None or ex.data_hash is None or self.message is None:
            return False
        # the streamed payload is the response's (GET_TENSOR) or a request's without response
        return self.kind == "response" or not ex.expects_response

    def to_json(self, conversation: int = 0) -> dict:
        out: dict[str, Any] = {"conversation": conversation, "kind": self.kind,
                               "direction": self.direction,
                               "t": None if self.t is None else round(self.t, 6)}
        if self.index is not None:
            out["index"] = self.index
        if self.cmd is not None:
            out["cmd"] = self.cmd
        if self.message is not None:
            out["size"] = self.size
            out["fields"] = message_fields(self.message)
            if self.streamed_elsewhere:
                ex = self.exchange
                out["fields"]["data"] = {"len": ex.data_length,
                                         "fnv1a64": ex.data_hash if self.captured else None}
            out["captured"] = self.captured
        if self.text:
            out["text"] = self.text
        return out


def session_records(tr: Transcript, session: Session) -> list[ListingLine]:
    """All records of one connection, in wire order."""
    views = {C2S: StreamView(list(tr.stream(C2S))), S2C: StreamView(list(tr.stream(S2C)))}
    position = {id(c): i for i, c in enumerate(tr.chunks)}
    t0 = tr.meta.get("t_open") if tr.meta else None
    if t0 is None:
        t0 = tr.chunks[0].t if tr.chunks else 0.0

    def where(direction: str, offset: int) -> tuple[float | None, tuple]:
        view = views[direction]
        if offset >= view.size:  # at the very end of the stream: after everything seen
            close = tr.closed.get(direction)
            t = close[0] if close else (view.chunks[-1].t if view.chunks else None)
            return (None if t is None else t - t0), (len(tr.chunks), 0, offset)
        c = view.chunk_at(offset)
        return c.t - t0, (position[id(c)], 0, offset)

    recs: list[ListingLine] = []
    for ex, span in zip(session.exchanges, frame_spans(session, views[C2S], views[S2C])):
        if ex.request is not None:
            t, order = where(C2S, span.req_offset)
            recs.append(ListingLine("request", C2S, t, order, ex.index, ex.request.cmd.value,
                                   ex.request, ex, span.req_size,
                                   views[C2S].captured(span.req_offset, span.req_size)))
        if ex.response is not None and span.rsp_offset is not None:
            t, order = where(S2C, span.rsp_offset)
            recs.append(ListingLine("response", S2C, t, order, ex.index, ex.request.cmd.value,
                                   ex.response, ex, span.rsp_size,
                                   views[S2C].captured(span.rsp_offset, span.rsp_size)))
    for direction, err, off in ((C2S, session.c2s_error, session.c2s_error_offset),
                                (S2C, session.s2c_error, session.s2c_error_offset)):
        if err is not None:
            t, order = where(direction, off or 0)
            recs.append(ListingLine("error", direction, t, order[:1] + (1,) + order[2:],
                                   text=f"decode error at byte {off}: {err}"))
    for direction, (t_close, how) in tr.closed.items():
        size = views[direction].size
        recs.append(ListingLine("close", direction, t_close - t0, (len(tr.chunks), 2, t_close),
                               text=f"{how.upper()} after {size} bytes"))
    recs.sort(key=lambda r: (r.order, r.kind == "response"))
    return recs


# ---------------------------------------------------------------- formatting

def format_record(rec: ListingLine) -> str:
    idx = f"{rec.index:>4}" if rec.index is not None else "   -"
    t = f"+{rec.t:.6f}" if rec.t is not None else "         ?"
    what = rec.cmd if rec.cmd is not None else rec.kind.upper()
    return f"{idx} {t:>12} {ARROWS[rec.direction]} {what:<22} {rec.summary()}".rstrip()


def format_fields(rec: ListingLine, indent: str = "        ") -> list[str]:
    """Every field of the message, rpc_tensor fields included, one per line."""
    if rec.message is None:
        return []
    lines: list[str] = []
    doc = rec.to_json()["fields"]
    for name, value in doc.items():
        if isinstance(value, dict) and "id" in value and "ne" in value:
            lines.append(f"{indent}{name}:")
            lines.extend(_tensor_lines(value, indent + "    "))
        elif isinstance(value, list) and value and isinstance(value[0], dict) and "ne" in value[0]:
            for i, t in enumerate(value):
                lines.append(f"{indent}{name}[{i}]:")
                lines.extend(_tensor_lines(t, indent + "    "))
        else:
            lines.append(f"{indent}{name} = {_scalar(name, value)}")
    return lines


def _tensor_lines(t: dict, indent: str) -> list[str]:
    lines = []
    for name, value in t.items():
        if name == "flags" and value:
            names = "|".join(n for bit, n in _TENSOR_FLAGS if value & bit)
            lines.append(f"{indent}{name} = {value} ({names})" if names else f"{indent}{name} = {value}")
        elif name == "type" and 0 <= value < len(ggml.TYPES):
            lines.append(f"{indent}{name} = {value} ({ggml.TYPES[value].name})")
        elif name == "op" and 0 <= value < len(ggml.OPS):
            lines.append(f"{indent}{name} = {value} ({ggml.OPS[value]})")
        else:
            lines.append(f"{indent}{name} = {_scalar(name, value)}")
    return lines


_HEX_NAMES = {"id", "buffer", "data", "view_src", "remote_ptr", "base_ptr", "hash", "uid"}


def _scalar(name: str, value: Any) -> str:
    if isinstance(value, int) and name in _HEX_NAMES:
        return f"0x{value:x}"
    if isinstance(value, list) and name in ("src", "nodes"):
        return "[" + ", ".join(f"0x{v:x}" for v in value) + "]"
    if isinstance(value, str) and name == "name":
        return repr(value)
    return json.dumps(value) if isinstance(value, (dict, list)) else str(value)


def iter_lines(path: str | Path, *, dialect: str | None = None, as_json: bool = False,
               with_fields: bool = False, server_port: int | None = None) -> Iterator[str]:
    """The listing of a capture file, as ``harness decode`` prints it."""
    transcripts = load_transcripts(path, server_port=server_port)
    for n, tr in enumerate(transcripts):
        session = tr.decode(dialect, keep_data=INLINE_BYTES)
        recs = session_records(tr, session)
        if as_json:
            for rec in recs:
                yield json.dumps(rec.to_json(n), sort_keys=False)
            continue
        yield _header(n, tr, session)
        for rec in recs:
            yield format_record(rec)
            if with_fields:
                yield from format_fields(rec)


def _header(n: int, tr: Transcript, session: Session) -> str:
    meta = tr.meta or {}
    ends = ""
    if meta.get("client") and meta.get("server"):
        c, s = meta["client"], meta["server"]
        ends = f" {c[0]}:{c[1]} -> {s[0]}:{s[1]}"
    dialect = session.dialect.name if session.dialect is not None else "?"
    return (f"# connection {n}{ends}: dialect {dialect}, {len(session.exchanges)} requests, "
            f"{tr.total(C2S)} B client->server, {tr.total(S2C)} B server->client")


def print_listing(path: str | Path, **options) -> None:
    """Print ``iter_lines(path, **options)``; a closed pipe (``| head``) ends it quietly."""
    import os
    import sys

    try:
        for line in iter_lines(path, **options):
            print(line)
        sys.stdout.flush()
    except BrokenPipeError:
        # the reader left; keep the interpreter from complaining while it flushes at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
