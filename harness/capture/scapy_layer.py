"""Scapy layers for ggml-rpc, generated from the codec's message table (the session-aware
dissection that uses them is :mod:`.dissect`).

Nothing here is written per command: every payload layer is built from a ``Layout`` /
``GraphLayout`` of ``harness.proto.messages.TABLE``, one Packet class per layout object, so a
dialect-specific layout (HELLO before 4.0, SET_TENSOR's cache_flag from 7.0.0, the graph uid
from 8.0.0) gets its own class exactly where the table's ``Row.when`` puts it. Request frames
are one class per dialect because command ids collide across dialects (19 is SUPPORTS_OP in
7.0.1 and GET_TENSOR_2D in 8.0.0).

A response cannot be dissected on its own: its layout depends on the request it answers, which
is why the session-aware dissector (:mod:`.dissect`) exists. ``bind_port`` binds the frame
classes to a TCP port for per-segment dissection; that is only right when TCP segments start at
frame boundaries (typical for small requests), so use the session dissector for the truth.
"""

from __future__ import annotations

import struct

from scapy.fields import (ByteEnumField, ByteField, FieldLenField, FieldListField,
                          LEIntEnumField, LEIntField, LELongField, LESignedIntField,
                          PacketField, PacketListField, StrField, StrFixedLenField,
                          XLELongField)
from scapy.layers.inet import TCP
from scapy.packet import Packet, Raw, bind_layers, split_layers

from ..proto import ggml
from ..proto.constants import Cmd
from ..proto.dialects import DEFAULT, DIALECTS, Dialect, get_dialect
from ..proto.messages import (CAPS, HOST64, TABLE, TENSOR, TENSORS10, U8_FIELD, U32_FIELD,
                              U64_FIELD, EmptyResponse, GraphComputeRequest, GraphLayout, Layout,
                              Message, WireType, spec_for)
from ..proto.tensor import RpcTensor
from ..proto.wire import LENGTH_SIZE, REQUEST_HEADER_SIZE, RESPONSE_HEADER_SIZE, U64

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
    if wt is U8_FIELD:
        return ByteField(name, 0)
    if wt is U32_FIELD:
        return LEIntField(name, 0)
    if wt is U64_FIELD:
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
            off = self.header_size - LENGTH_SIZE
            pkt = pkt[:off] + U64.pack(n) + pkt[off + LENGTH_SIZE:]
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
    rpc_dialect: Dialect = DEFAULT
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


def request_frame_class(dialect: Dialect | str = DEFAULT) -> type[RPC_Request]:
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


def bind_port(port: int, dialect: Dialect | str = DEFAULT) -> None:
    """Dissect TCP segments to ``port`` as requests and from it as (raw-payload) responses."""
    bind_layers(TCP, request_frame_class(dialect), dport=port)
    bind_layers(TCP, RPC_Response, sport=port)


def unbind_port(port: int, dialect: Dialect | str = DEFAULT) -> None:
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


def payload_packet(msg: Message, dialect: Dialect | str = DEFAULT) -> RPC_Payload:
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


def request_packet(msg: Message, dialect: Dialect | str = DEFAULT) -> RPC_Request:
    """A whole request frame (``bytes()`` of it equals ``pack_request(dialect, msg)``)."""
    d = get_dialect(dialect)
    return request_frame_class(d)(cmd=d.id_of(msg.cmd)) / payload_packet(msg, d)


def response_packet(msg: Message, dialect: Dialect | str = DEFAULT) -> RPC_Response:
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
