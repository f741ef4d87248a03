"""Scapy layers for ggml-rpc, generated from the codec's message table.

Nothing here is written per command: every payload layer is built from a ``Layout`` /
``GraphLayout`` of ``harness.proto.messages.TABLE``, one Packet class per layout object, so a
dialect-specific layout (HELLO before 4.0, SET_TENSOR's cache_flag from 7.0.0, the graph uid
from 8.0.0) gets its own class exactly where the table's ``Row.when`` puts it. Request frames
are one class per dialect because command ids collide across dialects (19 is SUPPORTS_OP in
7.0.1 and GET_TENSOR_2D in 8.0.0).

A response cannot be dissected on its own: its layout depends on the request it answers. The
session-aware dissector (``dissect_transcript`` and friends) therefore runs the codec's
``SessionDecoder`` over both directions and uses the byte offsets of each exchange to cut the
streams into frames, which it then dissects with the right classes. ``bind_port`` binds the
frame classes to a TCP port for per-segment dissection; that is only right when TCP segments
start at frame boundaries (typical for small requests), so use the session dissector for the
truth.
"""

from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from scapy.fields import (ByteEnumField, ByteField, FieldLenField, FieldListField,
                          LEIntEnumField, LEIntField, LELongField, LESignedIntField,
                          PacketField, PacketListField, StrField, StrFixedLenField,
                          XLELongField)
from scapy.layers.inet import TCP
from scapy.packet import Packet, Raw, bind_layers, split_layers

from ..proto import ggml
from ..proto.codec import REQUEST_HEADER_SIZE, RESPONSE_HEADER_SIZE
from ..proto.constants import Cmd
from ..proto.dialects import DIALECTS, D700, Dialect, get_dialect
from ..proto.messages import (CAPS, HOST64, TABLE, TENSOR, TENSORS10, U8, U32, U64,
                              EmptyResponse, GraphComputeRequest, GraphLayout, Layout, Message,
                              WireType, spec_for)
from ..proto.session import Exchange, Session
from ..proto.tensor import RpcTensor
from .transcript import C2S, S2C, Chunk, Transcript

# u64 fields that hold addresses or hashes read better in hex
_HEX_U64 = frozenset({"remote_ptr", "base_ptr", "hash", "uid"})
_TYPE_NAMES = {i: t.name for i, t in enumerate(ggml.TYPES) if t.blck_size}
_OP_NAMES = dict(enumerate(ggml.OPS))


# ---------------------------------------------------------------- rpc_tensor

class RPC_Tensor(Packet):
    """The 296-byte packed ``rpc_tensor`` record (spec 3.1)."""

    name = "rpc_tensor"
    fields_desc = [
        XLELongField("id", 0),
        LEIntEnumField("type", 0, _TYPE_NAMES),
        XLELongField("buffer", 0),
        FieldListField("ne", [0, 0, 0, 0], LEIntField("", 0), count_from=lambda p: 4),
        FieldListField("nb", [0, 0, 0, 0], LEIntField("", 0), count_from=lambda p: 4),
        LEIntEnumField("op", 0, _OP_NAMES),
        FieldListField("op_params", [0] * 16, LESignedIntField("", 0), count_from=lambda p: 16),
        LESignedIntField("flags", 0),
        FieldListField("src", [0] * 10, XLELongField("", 0), count_from=lambda p: 10),
        XLELongField("view_src", 0),
        LELongField("view_offs", 0),
        XLELongField("data", 0),
        StrFixedLenField("name", bytes(64), 64),
        LESignedIntField("use_count", 0),
    ]

    def extract_padding(self, s):
        # a sub-record: whatever follows belongs to the enclosing layer
        return b"", s


def tensor_to_packet(t: RpcTensor) -> RPC_Tensor:
    return RPC_Tensor(id=t.id, type=t.type, buffer=t.buffer, ne=list(t.ne), nb=list(t.nb),
                      op=t.op, op_params=list(t.op_params), flags=t.flags, src=list(t.src),
                      view_src=t.view_src, view_offs=t.view_offs, data=t.data, name=t.name,
                      use_count=t.use_count)


def packet_to_tensor(p: RPC_Tensor) -> RpcTensor:
    # getfieldval: ``p.name`` would be the scapy layer name, not the field
    v = p.getfieldval
    return RpcTensor(v("id"), v("type"), v("buffer"), tuple(v("ne")), tuple(v("nb")), v("op"),
                     tuple(v("op_params")), v("flags"), tuple(v("src")), v("view_src"),
                     v("view_offs"), v("data"), bytes(v("name")), v("use_count"))


# ---------------------------------------------------------------- payload layers

class RPC_Payload(Packet):
    """Base of every generated payload layer; ``rpc_layout`` is the table layout it mirrors."""

    name = "ggml-rpc payload"
    rpc_layout: Layout | GraphLayout | None = None
    rpc_direction = "request"

    def mysummary(self) -> str:
        try:
            return f"{self.name}: {to_message(self).summary()}"
        except Exception:  # noqa: BLE001 - a summary must never fail on a malformed layer
            return self.name


def _scapy_field(name: str, wt: WireType):
    """The scapy field for one wire type of the message table."""
    if wt is U8:
        return ByteField(name, 0)
    if wt is U32:
        return LEIntField(name, 0)
    if wt is U64:
        return XLELongField(name, 0) if name in _HEX_U64 else LELongField(name, 0)
    if wt is CAPS:
        return StrFixedLenField(name, bytes(struct.calcsize(wt.fmt)), struct.calcsize(wt.fmt))
    if wt is HOST64:
        return StrFixedLenField(name, bytes(64), 64)
    if wt is TENSOR:
        return PacketField(name, RPC_Tensor(), RPC_Tensor)
    if wt is TENSORS10:
        return PacketListField(name, [RPC_Tensor() for _ in range(10)], RPC_Tensor,
                               count_from=lambda p: 10)
    raise TypeError(f"no scapy field for wire type {wt.name}")  # pragma: no cover


def _graph_fields(layout: GraphLayout) -> list:
    head = [LEIntField("device", 0)]
    if layout.with_uid:
        head.append(XLELongField("uid", 0))
    return head + [
        FieldLenField("n_nodes", None, count_of="nodes", fmt="<I"),
        FieldListField("nodes", [], XLELongField("", 0), count_from=lambda p: p.n_nodes),
        FieldLenField("n_tensors", None, count_of="tensors", fmt="<I"),
        PacketListField("tensors", [], RPC_Tensor, count_from=lambda p: p.n_tensors),
        # the real server ignores bytes after the tensor array; kept for byte-exact round trips
        StrField("trailing", b""),
    ]


def _dialects_using(layout, direction: str) -> list[Dialect]:
    out = []
    for d in DIALECTS.values():
        for cmd in d.cmd_ids:
            spec = spec_for(d, cmd)
            if (spec.request if direction == "request" else spec.response) is layout:
                out.append(d)
                break
    return out


_LAYERS: dict[int, type[RPC_Payload]] = {}  # id(layout) -> generated class
_VARIANTS: dict[tuple[Cmd | str, str], int] = {}  # how many layouts a (cmd, direction) has


def _count_variants() -> None:
    seen: dict[tuple, set] = {}
    for row in TABLE:
        seen.setdefault((row.cmd, "request"), set()).add(id(row.request))
        if row.response is not None:
            seen.setdefault((row.cmd, "response"), set()).add(id(row.response))
    _VARIANTS.update({k: len(v) for k, v in seen.items()})


def layer_for(layout: Layout | GraphLayout, direction: str | None = None) -> type[RPC_Payload]:
    """The payload Packet class generated for one table layout (memoised by layout object)."""
    cls = _LAYERS.get(id(layout))
    if cls is not None:
        return cls
    direction = direction or layout.cls.direction
    if isinstance(layout, GraphLayout):
        fields_desc = _graph_fields(layout)
    else:
        fields_desc = [_scapy_field(n, wt) for n, wt in layout.fields]
        if layout.tail:
            fields_desc.append(StrField(layout.tail, b""))
    base = layout.cls.__name__
    cmd = getattr(layout.cls, "cmd", None)
    users = _dialects_using(layout, direction)
    suffix = ""
    if cmd is not None and _VARIANTS.get((cmd, direction), 1) > 1 and users:
        # several layouts for this command: name each after the oldest dialect using it
        suffix = "_v" + users[0].version_str.replace(".", "")
    since = f" ({users[0].name}+)" if suffix else ""
    title = (f"ggml-rpc {cmd.value} {direction}{since}" if cmd is not None and base != "EmptyResponse"
             else "ggml-rpc empty acknowledgement")
    cls = type(f"RPC_{base}{suffix}", (RPC_Payload,), {
        "name": title,
        "fields_desc": fields_desc,
        "rpc_layout": layout,
        "rpc_direction": direction,
        "__module__": __name__,
    })
    _LAYERS[id(layout)] = cls
    return cls


def _generate_all() -> None:
    _count_variants()
    for row in TABLE:
        layer_for(row.request, "request")
        if row.response is not None:
            layer_for(row.response, "response")
    for d in DIALECTS.values():  # the empty acknowledgement of <= 5.0.0 is not a TABLE row
        for cmd in d.cmd_ids:
            rsp = spec_for(d, cmd).response
            if rsp is not None:
                layer_for(rsp, "response")


_generate_all()
PAYLOAD_LAYERS: tuple[type[RPC_Payload], ...] = tuple(_LAYERS.values())


# ---------------------------------------------------------------- frames

class _RpcFrame(Packet):
    """Common frame behaviour: ``len`` delimits the payload; following bytes are the next frame."""

    header_size = 0

    def extract_padding(self, s):
        n = self.len if self.len is not None else len(s)
        return s[:n], s[n:]

    def next_frame_class(self) -> type[Packet]:
        return type(self)

    def dissect(self, s):
        s = self.pre_dissect(s)
        s = self.do_dissect(s)
        s = self.post_dissect(s)
        payload, rest = self.extract_padding(s)
        self.do_dissect_payload(payload)
        if rest:
            # several frames in one segment: stack the next frame after this one's payload
            nxt: Packet
            if len(rest) >= self.header_size:
                try:
                    nxt = self.next_frame_class()(rest, _internal=1)
                except Exception:  # noqa: BLE001 - garbage after a frame stays visible as Raw
                    nxt = Raw(rest)
            else:
                nxt = Raw(rest)  # a frame header cut by the segment boundary
            self.add_payload(nxt)

    def post_build(self, pkt: bytes, pay: bytes) -> bytes:
        if self.len is None:
            n = len(pay)
            later = self.payload
            while later is not None and not isinstance(later, _RpcFrame) and later.payload:
                later = later.payload
            if isinstance(later, _RpcFrame):  # stacked frames: count only this frame's payload
                n -= len(bytes(later))
            off = self.header_size - 8
            pkt = pkt[:off] + struct.pack("<Q", n) + pkt[off + 8:]
        return pkt + pay

    def frames(self) -> list[Packet]:
        """The frames stacked in this packet (one per frame carried by a segment)."""
        out: list[Packet] = []
        p: Packet | None = self
        while p:
            if isinstance(p, _RpcFrame):
                out.append(p)
            p = p.payload if p.payload else None
        return out


class RPC_Request(_RpcFrame):
    """Request frame header; subclasses fix the dialect that maps command ids to layouts."""

    name = "ggml-rpc request"
    header_size = REQUEST_HEADER_SIZE
    rpc_dialect: Dialect = D700
    fields_desc = [ByteField("cmd", 0), LELongField("len", None)]

    def guess_payload_class(self, payload):
        cmd = self.rpc_dialect.ids.get(self.cmd)
        if cmd is None:
            return Raw
        return layer_for(spec_for(self.rpc_dialect, cmd).request)

    @property
    def command(self) -> Cmd | None:
        return self.rpc_dialect.ids.get(self.cmd)


class RPC_Response(_RpcFrame):
    """Response frame header. Alone it cannot know its payload layout (that needs the request):
    its payload is Raw unless built by ``response_frame_class``."""

    name = "ggml-rpc response"
    header_size = RESPONSE_HEADER_SIZE
    rpc_layer: type[RPC_Payload] | None = None  # set by response_frame_class
    fields_desc = [LELongField("len", None)]

    def next_frame_class(self) -> type[Packet]:
        return RPC_Response


def _ident(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)


_REQUEST_FRAMES: dict[str, type[RPC_Request]] = {}
_RESPONSE_FRAMES: dict[int, type[RPC_Response]] = {}


def request_frame_class(dialect: Dialect | str = D700) -> type[RPC_Request]:
    """The request frame class of a dialect (its ``cmd`` field is an enum of that dialect's ids)."""
    d = get_dialect(dialect)
    cls = _REQUEST_FRAMES.get(d.name)
    if cls is None:
        cls = type(f"RPC_Request_{_ident(d.name)}", (RPC_Request,), {
            "name": f"ggml-rpc request ({d.name})",
            "rpc_dialect": d,
            "fields_desc": [ByteEnumField("cmd", 0, {i: c.value for i, c in d.ids.items()}),
                            LELongField("len", None)],
            "__module__": __name__,
        })
        _REQUEST_FRAMES[d.name] = cls
    return cls


def response_frame_class(layer: type[RPC_Payload]) -> type[RPC_Response]:
    """A response frame class whose payload dissects as ``layer`` (for a known request)."""
    cls = _RESPONSE_FRAMES.get(id(layer))
    if cls is None:
        cls = type(f"RPC_Response_{layer.__name__[4:]}", (RPC_Response,), {
            "name": "ggml-rpc response",
            "rpc_layer": layer,
            "guess_payload_class": lambda self, payload, _l=layer: _l,
            "fields_desc": [LELongField("len", None)],
            "__module__": __name__,
        })
        _RESPONSE_FRAMES[id(layer)] = cls
    return cls


for _d in DIALECTS.values():
    request_frame_class(_d)


def bind_port(port: int, dialect: Dialect | str = D700) -> None:
    """Dissect TCP segments to ``port`` as requests and from it as (raw-payload) responses."""
    bind_layers(TCP, request_frame_class(dialect), dport=port)
    bind_layers(TCP, RPC_Response, sport=port)


def unbind_port(port: int, dialect: Dialect | str = D700) -> None:
    split_layers(TCP, request_frame_class(dialect), dport=port)
    split_layers(TCP, RPC_Response, sport=port)


# ---------------------------------------------------------------- packet <-> message

def _value_to_scapy(wt: WireType, v):
    if wt is TENSOR:
        return tensor_to_packet(v)
    if wt is TENSORS10:
        return [tensor_to_packet(t) for t in v]
    return v


def _value_from_scapy(wt: WireType, v):
    if wt is TENSOR:
        return packet_to_tensor(v)
    if wt is TENSORS10:
        return tuple(packet_to_tensor(t) for t in v)
    if wt in (CAPS, HOST64):
        return bytes(v)
    return v


def payload_packet(msg: Message, dialect: Dialect | str = D700) -> RPC_Payload:
    """The payload layer of ``msg`` as the dialect lays it out."""
    d = get_dialect(dialect)
    spec = spec_for(d, msg.cmd)
    layout = spec.request if msg.direction == "request" else spec.response
    cls = layer_for(layout)
    if isinstance(layout, GraphLayout):
        kw = dict(device=msg.device, nodes=list(msg.nodes),
                  tensors=[tensor_to_packet(t) for t in msg.tensors], trailing=msg.trailing)
        if layout.with_uid:
            kw["uid"] = msg.uid
        return cls(**kw)
    kw = {n: _value_to_scapy(wt, getattr(msg, n)) for n, wt in layout.fields}
    if layout.tail:
        kw[layout.tail] = bytes(getattr(msg, layout.tail))
    return cls(**kw)


def request_packet(msg: Message, dialect: Dialect | str = D700) -> RPC_Request:
    """A whole request frame (``bytes()`` of it equals ``pack_request(dialect, msg)``)."""
    d = get_dialect(dialect)
    return request_frame_class(d)(cmd=d.id_of(msg.cmd)) / payload_packet(msg, d)


def response_packet(msg: Message, dialect: Dialect | str = D700) -> RPC_Response:
    pay = payload_packet(msg, dialect)
    return response_frame_class(type(pay))() / pay


def _frame_payload_class(pkt: Packet) -> type[RPC_Payload] | None:
    if isinstance(pkt, RPC_Request) and pkt.command is not None:
        return layer_for(spec_for(pkt.rpc_dialect, pkt.command).request)
    return getattr(pkt, "rpc_layer", None)


def to_message(pkt: Packet, cmd: Cmd | None = None) -> Message:
    """Turn a dissected frame or payload layer back into the codec's message dataclass.

    ``cmd`` is only needed for the empty acknowledgement, whose layout is shared by commands.
    """
    layer: Packet | None = pkt
    if isinstance(pkt, RPC_Request):
        cmd = cmd or pkt.command
    while layer is not None and not isinstance(layer, RPC_Payload):
        layer = layer.payload if layer.payload else None
    if layer is None:
        # scapy adds no payload layer for an empty payload (DEVICE_COUNT, empty answers)
        layer_cls = _frame_payload_class(pkt)
        if layer_cls is None:
            raise ValueError(f"{pkt.summary()} has no ggml-rpc payload layer")
        layer = layer_cls()
    layout = layer.rpc_layout
    if isinstance(layout, GraphLayout):
        return GraphComputeRequest(
            device=layer.device, uid=layer.uid if layout.with_uid else 0,
            nodes=tuple(layer.nodes), tensors=tuple(packet_to_tensor(t) for t in layer.tensors),
            trailing=bytes(layer.trailing))
    if layout.cls is EmptyResponse:
        return EmptyResponse(cmd or Cmd.FREE_BUFFER)
    kw = {n: _value_from_scapy(wt, layer.getfieldval(n)) for n, wt in layout.fields}
    if layout.tail:
        kw[layout.tail] = bytes(layer.getfieldval(layout.tail))
    return layout.cls(**kw)


# ---------------------------------------------------------------- session-aware dissection

@dataclass
class DissectedExchange:
    index: int
    exchange: Exchange
    request: Packet | None  # request frame (header layer with the payload layer under it)
    response: Packet | None  # response frame, None for fire-and-forget commands

    @property
    def cmd(self) -> Cmd | None:
        return self.exchange.cmd


@dataclass
class Dissection:
    """A dissected TCP conversation; errors are the codec's (``session.c2s_error`` ...)."""

    session: Session
    exchanges: list[DissectedExchange] = field(default_factory=list)
    transcript: Transcript | None = None
    c2s_rest: Packet | None = None  # undecodable client bytes from the error on, if any
    s2c_rest: Packet | None = None

    @property
    def dialect(self) -> Dialect | None:
        return self.session.dialect

    @property
    def packets(self) -> list[Packet]:
        """Request, then its response, for every exchange in order."""
        out: list[Packet] = []
        for ex in self.exchanges:
            if ex.request is not None:
                out.append(ex.request)
            if ex.response is not None:
                out.append(ex.response)
        return out


class StreamView:
    """Random access into one direction of a transcript without joining it (elided = zeros)."""

    def __init__(self, chunks: Sequence[Chunk]):
        self.chunks = list(chunks)
        self.starts: list[int] = []
        off = 0
        for c in self.chunks:
            self.starts.append(off)
            off += c.length
        self.size = off

    def _index(self, offset: int) -> int:
        return max(bisect.bisect_right(self.starts, offset) - 1, 0)

    def read(self, offset: int, n: int) -> bytes:
        n = max(0, min(n, self.size - offset))
        out, i = [], self._index(offset)
        while n > 0 and i < len(self.chunks):
            c, start = self.chunks[i], self.starts[i]
            lo = offset - start
            take = min(c.length - lo, n)
            out.append(c.data[lo:lo + take] if c.data is not None else bytes(take))
            offset += take
            n -= take
            i += 1
        return b"".join(out)

    def time_at(self, offset: int) -> float | None:
        if not self.chunks:
            return None
        return self.chunks[min(self._index(offset), len(self.chunks) - 1)].t

    def chunk_at(self, offset: int) -> Chunk | None:
        return self.chunks[self._index(offset)] if self.chunks else None

    def captured(self, offset: int, n: int) -> bool:
        """Whether every byte of ``[offset, offset + n)`` was kept (none elided or missing)."""
        if offset + n > self.size:
            return False
        i = self._index(offset)
        while n > 0 and i < len(self.chunks):
            if self.chunks[i].data is None:
                return False
            n -= self.starts[i] + self.chunks[i].length - max(offset, self.starts[i])
            i += 1
        return True


@dataclass
class FrameSpan:
    """Where an exchange's frames sit in the two byte streams."""

    req_offset: int
    req_size: int
    rsp_offset: int | None = None
    rsp_size: int = 0


def frame_spans(session: Session, c2s: StreamView, s2c: StreamView) -> list[FrameSpan]:
    """Stream offsets of every exchange's request and response frames.

    Recomputed from the frame headers instead of taken from ``Exchange.req_offset``: the
    decoder measures that from the event that completed the frame, which lands after the
    header when the header and the payload arrived in different reads.
    """
    spans: list[FrameSpan] = []
    off = 0
    for ex in session.exchanges:
        head = c2s.read(off, REQUEST_HEADER_SIZE)
        size = REQUEST_HEADER_SIZE + struct.unpack_from("<Q", head, 1)[0] if len(head) == 9 else len(head)
        spans.append(FrameSpan(off, size))
        off += size
    off = 0
    for ex, span in zip(session.exchanges, spans):
        if ex.response is None and ex.rsp_offset is None:
            continue
        head = s2c.read(off, RESPONSE_HEADER_SIZE)
        if len(head) < RESPONSE_HEADER_SIZE:
            break
        span.rsp_offset = off
        span.rsp_size = RESPONSE_HEADER_SIZE + struct.unpack_from("<Q", head)[0]
        off += span.rsp_size
    return spans


def dissect_transcript(tr: Transcript, dialect: Dialect | str | None = None, *,
                       max_frame: int = 1 << 20) -> Dissection:
    """Dissect every frame of a recorded connection, in order, with its timestamp.

    Frames longer than ``max_frame`` bytes are dissected from their first ``max_frame`` bytes
    (like a capture snap length): ``len`` still gives the real size, the data field is cut.
    """
    session = tr.decode(dialect, keep_data=0)
    c2s = StreamView(list(tr.stream(C2S)))
    s2c = StreamView(list(tr.stream(S2C)))
    d = session.dialect or D700
    req_cls = request_frame_class(d)
    out = Dissection(session, transcript=tr)
    spans = frame_spans(session, c2s, s2c)
    for ex, span in zip(session.exchanges, spans):
        req = rsp = None
        if ex.request is not None:
            req = req_cls(c2s.read(span.req_offset, min(span.req_size, max_frame)))
            req.time = c2s.time_at(span.req_offset)
        if ex.response is not None and span.rsp_offset is not None:
            spec = spec_for(d, ex.request.cmd)
            frame_cls = response_frame_class(layer_for(spec.response))
            rsp = frame_cls(s2c.read(span.rsp_offset, min(span.rsp_size, max_frame)))
            rsp.time = s2c.time_at(span.rsp_offset)
        out.exchanges.append(DissectedExchange(ex.index, ex, req, rsp))
    # what follows the last good frame, when the decoder gave up on a direction
    c2s_end = spans[-1].req_offset + spans[-1].req_size if spans else 0
    s2c_end = max((sp.rsp_offset + sp.rsp_size for sp in spans if sp.rsp_offset is not None),
                  default=0)
    if session.c2s_error is not None and c2s_end < c2s.size:
        out.c2s_rest = Raw(c2s.read(c2s_end, max_frame))
        out.c2s_rest.time = c2s.time_at(c2s_end)
    if session.s2c_error is not None and s2c_end < s2c.size:
        out.s2c_rest = Raw(s2c.read(s2c_end, max_frame))
        out.s2c_rest.time = s2c.time_at(s2c_end)
    return out


def dissect_streams(c2s: bytes, s2c: bytes, dialect: Dialect | str | None = None, *,
                    max_frame: int = 1 << 20) -> Dissection:
    """Dissect two reassembled byte streams of one TCP conversation."""
    tr = Transcript(keep=1 << 62)
    if c2s:
        tr.chunks.append(Chunk(0.0, C2S, len(c2s), bytes(c2s)))
    if s2c:  # after the requests, so each response finds its request already registered
        tr.chunks.append(Chunk(0.0, S2C, len(s2c), bytes(s2c)))
    return dissect_transcript(tr, dialect, max_frame=max_frame)


def dissect_packets(packets: Iterable[Packet], dialect: Dialect | str | None = None, *,
                    server_port: int | None = None, max_frame: int = 1 << 20) -> list[Dissection]:
    """Reassemble the TCP conversations in ``packets`` (e.g. ``rdpcap(...)``) and dissect each."""
    from .pcap import transcripts_from_packets  # pcap imports this module's siblings only

    return [dissect_transcript(tr, dialect, max_frame=max_frame)
            for tr in transcripts_from_packets(packets, server_port=server_port)]
