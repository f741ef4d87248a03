"""Message types and the one declarative message table.

Every request and response is a frozen dataclass. ``TABLE`` says, per command, which fields go
on the wire in which order for a dialect, and whether (and how big) the response is. Packing and
unpacking in ``codec.py`` is driven by this table only.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, fields
from typing import Callable, ClassVar, NamedTuple

from .constants import CONN_CAPS_SIZE, Cmd
from .dialects import Dialect
from .tensor import RpcTensor, TENSOR_SIZE
from .wire import U64_MAX

_CAPS0 = bytes(CONN_CAPS_SIZE)
_NULL = RpcTensor.null()
_NULL10 = (_NULL,) * 10


class Message:
    """Base of all messages: ``cmd`` and ``direction`` are class attributes."""

    cmd: ClassVar[Cmd]
    direction: ClassVar[str]  # "request" | "response"

    def summary(self) -> str:
        """One line for transcripts: scalars in full, tensors by id/type/shape, data by size."""
        parts = []
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, RpcTensor):
                parts.append(f"{f.name}=<{_tensor_brief(v)}>")
            elif isinstance(v, (bytes, bytearray, memoryview)):
                parts.append(f"{f.name}={len(v)}B" if len(v) > 8 or f.name == "data"
                             else f"{f.name}={bytes(v).hex()}")
            elif isinstance(v, tuple) and v and isinstance(v[0], RpcTensor):
                parts.append(f"{f.name}=[{len(v)} tensors]")
            elif isinstance(v, tuple) and len(v) > 8:
                parts.append(f"{f.name}=[{len(v)} items]")
            elif isinstance(v, int) and v > 0xFFFF:
                parts.append(f"{f.name}=0x{v:x}")
            else:
                parts.append(f"{f.name}={v}")
        return " ".join(parts)


def _tensor_brief(t: RpcTensor) -> str:
    ne = "x".join(str(n) for n in t.ne)
    name = t.name_str
    return (f"id=0x{t.id:x} type={t.type} ne={ne} buf=0x{t.buffer:x} data=0x{t.data:x}"
            + (f" op={t.op}" if t.op else "") + (f" '{name}'" if name else ""))


def _msg(cmd: Cmd, direction: str):
    def deco(cls):
        cls = dataclass(frozen=True, slots=True)(cls)
        cls.cmd = cmd
        cls.direction = direction
        return cls
    return deco


# ---------------------------------------------------------------- requests

@_msg(Cmd.HELLO, "request")
class HelloRequest(Message):
    conn_caps: bytes = _CAPS0


@_msg(Cmd.DEVICE_COUNT, "request")
class DeviceCountRequest(Message):
    pass


@_msg(Cmd.ALLOC_BUFFER, "request")
class AllocBufferRequest(Message):
    device: int = 0
    size: int = 0


@_msg(Cmd.GET_ALIGNMENT, "request")
class GetAlignmentRequest(Message):
    device: int = 0


@_msg(Cmd.GET_MAX_SIZE, "request")
class GetMaxSizeRequest(Message):
    device: int = 0


@_msg(Cmd.BUFFER_GET_BASE, "request")
class BufferGetBaseRequest(Message):
    remote_ptr: int = 0


@_msg(Cmd.FREE_BUFFER, "request")
class FreeBufferRequest(Message):
    remote_ptr: int = 0


@_msg(Cmd.BUFFER_CLEAR, "request")
class BufferClearRequest(Message):
    remote_ptr: int = 0
    value: int = 0


@_msg(Cmd.SET_TENSOR, "request")
class SetTensorRequest(Message):
    tensor: RpcTensor = _NULL
    cache_flag: int = 0  # proto >= 7
    offset: int = 0
    data: bytes = b""


@_msg(Cmd.SET_TENSOR_HASH, "request")
class SetTensorHashRequest(Message):
    tensor: RpcTensor = _NULL
    offset: int = 0
    hash: int = 0


@_msg(Cmd.GET_TENSOR, "request")
class GetTensorRequest(Message):
    tensor: RpcTensor = _NULL
    offset: int = 0
    size: int = 0


@_msg(Cmd.COPY_TENSOR, "request")
class CopyTensorRequest(Message):
    src: RpcTensor = _NULL
    dst: RpcTensor = _NULL


@_msg(Cmd.GRAPH_COMPUTE, "request")
class GraphComputeRequest(Message):
    device: int = 0
    uid: int = 0  # proto >= 8
    nodes: tuple[int, ...] = ()
    tensors: tuple[RpcTensor, ...] = ()
    trailing: bytes = b""  # the server ignores bytes after the tensor array; kept for round trips


@_msg(Cmd.GET_DEVICE_MEMORY, "request")
class GetDeviceMemoryRequest(Message):
    device: int = 0


@_msg(Cmd.INIT_TENSOR, "request")
class InitTensorRequest(Message):
    tensor: RpcTensor = _NULL


@_msg(Cmd.GET_ALLOC_SIZE, "request")
class GetAllocSizeRequest(Message):
    device: int = 0
    tensor: RpcTensor = _NULL
    srcs: tuple[RpcTensor, ...] = _NULL10


@_msg(Cmd.GRAPH_RECOMPUTE, "request")
class GraphRecomputeRequest(Message):
    device: int = 0
    uid: int = 0  # proto >= 8


@_msg(Cmd.MEMSET_TENSOR, "request")
class MemsetTensorRequest(Message):
    tensor: RpcTensor = _NULL
    offset: int = 0
    size: int = 0
    value: int = 0


@_msg(Cmd.GET_DEVICE_SUPPORTS_OP, "request")
class SupportsOpRequest(Message):
    device: int = 0
    op: RpcTensor = _NULL
    srcs: tuple[RpcTensor, ...] = _NULL10


@_msg(Cmd.SET_TENSOR_2D, "request")
class SetTensor2DRequest(Message):
    tensor: RpcTensor = _NULL
    offset: int = 0
    size: int = 0
    n_copies: int = 0
    stride: int = 0
    data: bytes = b""


@_msg(Cmd.GET_TENSOR_2D, "request")
class GetTensor2DRequest(Message):
    tensor: RpcTensor = _NULL
    offset: int = 0
    size: int = 0
    n_copies: int = 0
    stride: int = 0


@_msg(Cmd.COMM_INIT, "request")
class CommInitRequest(Message):
    device: int = 0
    rank: int = 0
    world: int = 0
    port: int = 0
    host: bytes = bytes(64)


@_msg(Cmd.COMM_ALLREDUCE, "request")
class CommAllreduceRequest(Message):
    device: int = 0
    tensor: RpcTensor = _NULL


@_msg(Cmd.COMM_FREE, "request")
class CommFreeRequest(Message):
    device: int = 0


# ---------------------------------------------------------------- responses

@_msg(Cmd.HELLO, "response")
class HelloResponse(Message):
    major: int = 0
    minor: int = 0
    patch: int = 0
    flags: int = 0  # padding (always 0) before 7.0.0+flags / 9.0.0
    conn_caps: bytes = _CAPS0

    @property
    def version(self) -> tuple[int, int, int]:
        return (self.major, self.minor, self.patch)


@_msg(Cmd.DEVICE_COUNT, "response")
class DeviceCountResponse(Message):
    device_count: int = 0


@_msg(Cmd.ALLOC_BUFFER, "response")
class AllocBufferResponse(Message):
    remote_ptr: int = 0
    remote_size: int = 0


@_msg(Cmd.GET_ALIGNMENT, "response")
class GetAlignmentResponse(Message):
    alignment: int = 0


@_msg(Cmd.GET_MAX_SIZE, "response")
class GetMaxSizeResponse(Message):
    max_size: int = 0


@_msg(Cmd.BUFFER_GET_BASE, "response")
class BufferGetBaseResponse(Message):
    base_ptr: int = 0


@_msg(Cmd.SET_TENSOR_HASH, "response")
class SetTensorHashResponse(Message):
    result: int = 0


@_msg(Cmd.GET_TENSOR, "response")
class GetTensorResponse(Message):
    data: bytes = b""


@_msg(Cmd.COPY_TENSOR, "response")
class CopyTensorResponse(Message):
    result: int = 0


@_msg(Cmd.GET_DEVICE_MEMORY, "response")
class GetDeviceMemoryResponse(Message):
    free_mem: int = 0
    total_mem: int = 0


@_msg(Cmd.GET_ALLOC_SIZE, "response")
class GetAllocSizeResponse(Message):
    alloc_size: int = 0


@_msg(Cmd.GET_DEVICE_SUPPORTS_OP, "response")
class SupportsOpResponse(Message):
    supported: int = 0


@_msg(Cmd.GET_TENSOR_2D, "response")
class GetTensor2DResponse(Message):
    data: bytes = b""


@_msg(Cmd.COMM_INIT, "response")
class CommInitResponse(Message):
    ok: int = 0


@dataclass(frozen=True, slots=True)
class EmptyResponse(Message):
    """The zero-length answer old servers (<= 5.0.0) gave to fire-and-forget commands."""

    cmd_name: Cmd = Cmd.FREE_BUFFER
    direction: ClassVar[str] = "response"

    @property
    def cmd(self) -> Cmd:  # type: ignore[override]
        return self.cmd_name


# ---------------------------------------------------------------- wire types

class WireType(NamedTuple):
    name: str
    fmt: str  # struct format of the value(s), little-endian, no padding
    width: int  # number of struct items the field consumes
    to_wire: Callable  # value -> tuple of struct items
    from_wire: Callable  # tuple of struct items -> value


def _scalar(name: str, fmt: str) -> WireType:
    return WireType(name, fmt, 1, lambda v: (v,), lambda t: t[0])


def _tensor_items(t: RpcTensor) -> tuple:
    return (t.id, t.type, t.buffer, *t.ne, *t.nb, t.op, *t.op_params, t.flags, *t.src,
            t.view_src, t.view_offs, t.data, t.name, t.use_count)


def _tensor_from(v: tuple) -> RpcTensor:
    return RpcTensor(v[0], v[1], v[2], v[3:7], v[7:11], v[11], v[12:28], v[28], v[29:39],
                     v[39], v[40], v[41], v[42], v[43])


_TFMT = "QIQ4I4II16ii10QQQQ64si"
_TW = 44  # struct items per tensor

U8_FIELD = _scalar("u8", "B")
U32_FIELD = _scalar("u32", "I")
U64_FIELD = _scalar("u64", "Q")
CAPS = _scalar("caps", f"{CONN_CAPS_SIZE}s")
HOST64 = _scalar("char64", "64s")
TENSOR = WireType("rpc_tensor", _TFMT, _TW, _tensor_items, _tensor_from)
TENSORS10 = WireType(
    "rpc_tensor[10]", _TFMT * 10, _TW * 10,
    lambda ts: tuple(x for t in ts for x in _tensor_items(t)),
    lambda v: tuple(_tensor_from(v[i * _TW:(i + 1) * _TW]) for i in range(10)))


class Layout:
    """Fixed fields in order, optionally followed by a variable ``data`` tail."""

    def __init__(self, cls: type, fields_: tuple[tuple[str, WireType], ...] = (),
                 tail: str | None = None):
        self.cls = cls
        self.fields = fields_
        self.tail = tail
        self.struct = struct.Struct("<" + "".join(t.fmt for _, t in fields_))
        self.fixed_size = self.struct.size
        offsets, off = {}, 0
        for name, t in fields_:
            offsets[name] = off
            off += struct.calcsize("<" + t.fmt)
        self.offsets = offsets

    @property
    def variable(self) -> bool:
        return self.tail is not None

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}:{t.name}" for n, t in self.fields)
        return f"Layout({self.cls.__name__}[{inner}{', ' + self.tail + '...' if self.tail else ''}])"


class GraphLayout:
    """GRAPH_COMPUTE: device [uid] n_nodes nodes[] n_tensors tensors[] (spec 6.1, 12.2)."""

    variable = True

    def __init__(self, with_uid: bool):
        self.cls = GraphComputeRequest
        self.with_uid = with_uid
        self.head = struct.Struct("<IQI" if with_uid else "<II")
        self.fixed_size = self.head.size + 4  # smallest valid payload: no nodes, no tensors
        self.offsets = ({"device": 0, "uid": 4, "n_nodes": 12, "nodes": 16} if with_uid
                        else {"device": 0, "n_nodes": 4, "nodes": 8})

    def __repr__(self) -> str:
        return f"GraphLayout(uid={self.with_uid})"


class Spec(NamedTuple):
    """One row of the message table, resolved for a dialect."""

    cmd: Cmd
    request: Layout | GraphLayout
    response: Layout | None  # None = fire-and-forget
    # size of the response payload given the request, when it is not the layout's fixed size
    response_size: Callable | None = None


class Row(NamedTuple):
    cmd: Cmd
    request: Layout | GraphLayout
    response: Layout | None
    when: Callable[[Dialect], bool] = lambda d: True
    response_size: Callable | None = None


_always = lambda d: True  # noqa: E731
_caps = lambda d: d.hello_caps  # noqa: E731
_uid = lambda d: d.graph_uid  # noqa: E731

# The message table. Rows whose ``when`` holds for a dialect define it; the first match wins.
TABLE: tuple[Row, ...] = (
    Row(Cmd.HELLO, Layout(HelloRequest, (("conn_caps", CAPS),)),
        Layout(HelloResponse, (("major", U8_FIELD), ("minor", U8_FIELD), ("patch", U8_FIELD), ("flags", U8_FIELD),
                               ("conn_caps", CAPS))), _caps),
    # proto 1..3: empty HELLO request, 3-byte version response
    Row(Cmd.HELLO, Layout(HelloRequest), Layout(HelloResponse, (("major", U8_FIELD), ("minor", U8_FIELD),
                                                                ("patch", U8_FIELD)))),
    Row(Cmd.DEVICE_COUNT, Layout(DeviceCountRequest),
        Layout(DeviceCountResponse, (("device_count", U32_FIELD),))),
    Row(Cmd.ALLOC_BUFFER, Layout(AllocBufferRequest, (("device", U32_FIELD), ("size", U64_FIELD))),
        Layout(AllocBufferResponse, (("remote_ptr", U64_FIELD), ("remote_size", U64_FIELD)))),
    Row(Cmd.GET_ALIGNMENT, Layout(GetAlignmentRequest, (("device", U32_FIELD),)),
        Layout(GetAlignmentResponse, (("alignment", U64_FIELD),))),
    Row(Cmd.GET_MAX_SIZE, Layout(GetMaxSizeRequest, (("device", U32_FIELD),)),
        Layout(GetMaxSizeResponse, (("max_size", U64_FIELD),))),
    Row(Cmd.BUFFER_GET_BASE, Layout(BufferGetBaseRequest, (("remote_ptr", U64_FIELD),)),
        Layout(BufferGetBaseResponse, (("base_ptr", U64_FIELD),))),
    Row(Cmd.FREE_BUFFER, Layout(FreeBufferRequest, (("remote_ptr", U64_FIELD),)), None),
    Row(Cmd.BUFFER_CLEAR, Layout(BufferClearRequest, (("remote_ptr", U64_FIELD), ("value", U8_FIELD))), None),
    Row(Cmd.SET_TENSOR, Layout(SetTensorRequest, (("tensor", TENSOR), ("cache_flag", U8_FIELD),
                                                  ("offset", U64_FIELD)), tail="data"),
        None, lambda d: d.cache_flag),
    Row(Cmd.SET_TENSOR, Layout(SetTensorRequest, (("tensor", TENSOR), ("offset", U64_FIELD)),
                               tail="data"), None),
    Row(Cmd.SET_TENSOR_HASH, Layout(SetTensorHashRequest, (("tensor", TENSOR), ("offset", U64_FIELD),
                                                           ("hash", U64_FIELD))),
        Layout(SetTensorHashResponse, (("result", U8_FIELD),))),
    Row(Cmd.GET_TENSOR, Layout(GetTensorRequest, (("tensor", TENSOR), ("offset", U64_FIELD),
                                                  ("size", U64_FIELD))),
        Layout(GetTensorResponse, (), tail="data"), response_size=lambda r: r.size),
    Row(Cmd.COPY_TENSOR, Layout(CopyTensorRequest, (("src", TENSOR), ("dst", TENSOR))),
        Layout(CopyTensorResponse, (("result", U8_FIELD),))),
    Row(Cmd.GRAPH_COMPUTE, GraphLayout(with_uid=True), None, _uid),
    Row(Cmd.GRAPH_COMPUTE, GraphLayout(with_uid=False), None),
    Row(Cmd.GET_DEVICE_MEMORY, Layout(GetDeviceMemoryRequest, (("device", U32_FIELD),)),
        Layout(GetDeviceMemoryResponse, (("free_mem", U64_FIELD), ("total_mem", U64_FIELD)))),
    Row(Cmd.INIT_TENSOR, Layout(InitTensorRequest, (("tensor", TENSOR),)), None),
    Row(Cmd.GET_ALLOC_SIZE, Layout(GetAllocSizeRequest, (("device", U32_FIELD), ("tensor", TENSOR),
                                                         ("srcs", TENSORS10))),
        Layout(GetAllocSizeResponse, (("alloc_size", U64_FIELD),))),
    Row(Cmd.GRAPH_RECOMPUTE, Layout(GraphRecomputeRequest, (("device", U32_FIELD), ("uid", U64_FIELD))),
        None, _uid),
    Row(Cmd.GRAPH_RECOMPUTE, Layout(GraphRecomputeRequest, (("device", U32_FIELD),)), None),
    Row(Cmd.MEMSET_TENSOR, Layout(MemsetTensorRequest, (("tensor", TENSOR), ("offset", U64_FIELD),
                                                        ("size", U64_FIELD), ("value", U8_FIELD))), None),
    Row(Cmd.GET_DEVICE_SUPPORTS_OP, Layout(SupportsOpRequest, (("device", U32_FIELD), ("op", TENSOR),
                                                               ("srcs", TENSORS10))),
        Layout(SupportsOpResponse, (("supported", U8_FIELD),))),
    Row(Cmd.SET_TENSOR_2D, Layout(SetTensor2DRequest, (("tensor", TENSOR), ("offset", U64_FIELD),
                                                       ("size", U64_FIELD), ("n_copies", U64_FIELD),
                                                       ("stride", U64_FIELD)), tail="data"), None),
    Row(Cmd.GET_TENSOR_2D, Layout(GetTensor2DRequest, (("tensor", TENSOR), ("offset", U64_FIELD),
                                                       ("size", U64_FIELD), ("n_copies", U64_FIELD),
                                                       ("stride", U64_FIELD))),
        Layout(GetTensor2DResponse, (), tail="data"),
        response_size=lambda r: (r.size * r.n_copies) & U64_MAX),
    Row(Cmd.COMM_INIT, Layout(CommInitRequest, (("device", U32_FIELD), ("rank", U32_FIELD), ("world", U32_FIELD),
                                                ("port", U32_FIELD), ("host", HOST64))),
        Layout(CommInitResponse, (("ok", U8_FIELD),))),
    Row(Cmd.COMM_ALLREDUCE, Layout(CommAllreduceRequest, (("device", U32_FIELD), ("tensor", TENSOR))),
        None),
    Row(Cmd.COMM_FREE, Layout(CommFreeRequest, (("device", U32_FIELD),)), None),
)

_EMPTY_ACK = Layout(EmptyResponse)
_SPEC_CACHE: dict[tuple[str, Cmd], Spec] = {}


def spec_for(dialect: Dialect, cmd: Cmd) -> Spec:
    """The message spec of ``cmd`` in ``dialect`` (the command must exist there)."""
    key = (dialect.name, cmd)
    spec = _SPEC_CACHE.get(key)
    if spec is None:
        for row in TABLE:
            if row.cmd == cmd and row.when(dialect):
                response = row.response
                if response is None and cmd in dialect.acked:
                    response = _EMPTY_ACK
                spec = Spec(cmd, row.request, response, row.response_size)
                break
        else:  # pragma: no cover - TABLE covers every Cmd
            raise KeyError(cmd)
        _SPEC_CACHE[key] = spec
    return spec


REQUEST_TYPES = {row.cmd: row.request.cls for row in TABLE}
RESPONSE_TYPES = {row.cmd: row.response.cls for row in TABLE if row.response is not None}
TENSOR_RECORD_SIZE = TENSOR_SIZE
