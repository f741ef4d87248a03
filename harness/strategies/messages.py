"""Valid messages: one request drawer and one response drawer per command (the
:data:`REQUEST_DRAWERS` / :data:`RESPONSE_DRAWERS` tables, like the reference server's handler
table), and the public strategies built on them."""

from __future__ import annotations

from typing import Callable

from hypothesis import strategies as st

from ..proto import ggml
from ..proto.codec import has_response, pack_request, pack_response
from ..proto.constants import SERVER_FLAG_CACHE, Cmd
from ..proto.dialects import Dialect, get_dialect
from ..proto.messages import (AllocBufferRequest, AllocBufferResponse, BufferClearRequest,
                               BufferGetBaseResponse, CommAllreduceRequest, CommInitRequest,
                               CommInitResponse, CopyTensorRequest, CopyTensorResponse,
                               DeviceCountRequest, DeviceCountResponse, EmptyResponse,
                               GetAlignmentResponse, GetAllocSizeRequest, GetAllocSizeResponse,
                               GetDeviceMemoryResponse, GetMaxSizeResponse, GetTensor2DRequest,
                               GetTensor2DResponse, GetTensorRequest, GetTensorResponse,
                               GraphRecomputeRequest, HelloRequest, HelloResponse,
                               InitTensorRequest, Message, MemsetTensorRequest,
                               SetTensor2DRequest, SetTensorHashRequest, SetTensorHashResponse,
                               SetTensorRequest, SupportsOpRequest, SupportsOpResponse, spec_for)
from ..proto.tensor import RpcTensor, nbytes
from .basics import (U8_MAX, U64_MAX, BufferRegion, Buffers, _BINARY_OPS, _draw_tensor,
                     _heap_pointers, _place, _regions, _sampled, conn_caps, tensor_names)
from .graphs import _draw_graph

_DEVICES = st.one_of(st.just(0), st.integers(0, 3))  # mostly device 0, as single-GPU servers


def _span(draw, n: int, max_len: int) -> tuple[int, int]:
    """An (offset, length) pair with offset + length <= n and length <= max_len."""
    offset = draw(st.integers(0, n))
    return offset, draw(st.integers(0, min(n - offset, max_len)))


def _aux_tensors(draw, region: BufferRegion, main_op_srcs: int):
    """The ``srcs[10]`` array of GET_ALLOC_SIZE / SUPPORTS_OP: a few real sources, then nulls."""
    k = draw(st.integers(0, main_op_srcs))
    srcs = [_draw_tensor(draw, region) for _ in range(k)]
    return tuple(srcs) + (RpcTensor.null(),) * (10 - k)


# ---------------------------------------------------------------- requests
# Each drawer: (draw, dialect, cmd, region) -> a valid request of ``cmd`` whose tensors lie
# inside ``region``.

RequestDrawer = Callable[..., Message]


def _hello(draw, d, cmd, region):
    return HelloRequest(conn_caps=draw(conn_caps())) if d.hello_caps else HelloRequest()


def _device_count(draw, d, cmd, region):
    return DeviceCountRequest()


def _alloc_buffer(draw, d, cmd, region):
    return AllocBufferRequest(device=draw(_DEVICES), size=draw(st.one_of(
        st.sampled_from((0, 256, 1024, 1 << 20)), st.integers(0, 1 << 34))))


def _device_only(draw, d, cmd, region):
    return spec_for(d, cmd).request.cls(device=draw(_DEVICES))


def _buffer_only(draw, d, cmd, region):
    return spec_for(d, cmd).request.cls(remote_ptr=region.handle)


def _buffer_clear(draw, d, cmd, region):
    return BufferClearRequest(remote_ptr=region.handle, value=draw(st.integers(0, U8_MAX)))


def _set_tensor(draw, d, cmd, region):
    t = _draw_tensor(draw, region)
    offset, length = _span(draw, nbytes(t), 4096)
    cache_flag = draw(st.sampled_from((0, 1))) if d.cache_flag else 0
    return SetTensorRequest(tensor=t, cache_flag=cache_flag, offset=offset,
                            data=draw(st.binary(min_size=length, max_size=length)))


def _set_tensor_hash(draw, d, cmd, region):
    return SetTensorHashRequest(tensor=_draw_tensor(draw, region), offset=0,
                                hash=draw(st.integers(0, U64_MAX)))


def _get_tensor(draw, d, cmd, region):
    t = _draw_tensor(draw, region)
    offset, size = _span(draw, nbytes(t), 4096)
    return GetTensorRequest(tensor=t, offset=offset, size=size)


def _copy_tensor(draw, d, cmd, region):
    src = _draw_tensor(draw, region)
    # Same shape for dst so that dst.data + nbytes(src) stays inside the buffer.
    dst = _place(draw, src.with_(id=draw(_heap_pointers(16)), name=draw(tensor_names())),
                 region, 32)
    return CopyTensorRequest(src=src, dst=dst)


def _graph_compute(draw, d, cmd, region):
    return _draw_graph(draw, d, region, device=_DEVICES)


def _init_tensor(draw, d, cmd, region):
    return InitTensorRequest(tensor=_draw_tensor(draw, region))


def _op_query(draw, d, cmd, region):
    """GET_ALLOC_SIZE and GET_DEVICE_SUPPORTS_OP: an op tensor and its sources."""
    srcs = _aux_tensors(draw, region, 2)
    op = draw(st.sampled_from(_BINARY_OPS + (ggml.OP["MUL_MAT"], ggml.OP["NONE"])))
    main = _draw_tensor(draw, region).with_(op=op, src=tuple(s.id for s in srcs))
    if cmd is Cmd.GET_ALLOC_SIZE:
        if draw(st.booleans()):  # asked before allocation: no buffer yet
            main = main.with_(buffer=0, data=0)
        return GetAllocSizeRequest(device=draw(_DEVICES), tensor=main, srcs=srcs)
    return SupportsOpRequest(device=draw(_DEVICES), op=main.with_(buffer=0, data=0), srcs=srcs)


def _graph_recompute(draw, d, cmd, region):
    uid = draw(st.integers(1, U64_MAX)) if d.graph_uid else 0
    return GraphRecomputeRequest(device=draw(_DEVICES), uid=uid)


def _memset_tensor(draw, d, cmd, region):
    t = _draw_tensor(draw, region)
    offset, size = _span(draw, nbytes(t), 1 << 20)
    return MemsetTensorRequest(tensor=t, offset=offset, size=size,
                               value=draw(st.integers(0, U8_MAX)))


def _tensor_2d(draw, d, cmd, region):
    # Copies i = 0..n_copies-1 of `size` bytes at offset + i * stride, all inside the tensor.
    t = _draw_tensor(draw, region)
    # An empty buffer can only hold a zero-element tensor; one byte is then the least bad.
    n = max(nbytes(t), 1)
    size = draw(st.integers(1, min(n, 1024)))
    n_copies = draw(st.integers(1, min(4, n // size)))
    max_stride = (n - size) // (n_copies - 1) if n_copies > 1 else size + 64
    stride = draw(st.integers(size, max_stride))
    offset = draw(st.integers(0, n - ((n_copies - 1) * stride + size)))
    fields = dict(tensor=t, offset=offset, size=size, n_copies=n_copies, stride=stride)
    if cmd is Cmd.GET_TENSOR_2D:
        return GetTensor2DRequest(**fields)
    data = draw(st.binary(min_size=size * n_copies, max_size=size * n_copies))
    return SetTensor2DRequest(**fields, data=data)


def _comm_init(draw, d, cmd, region):
    host = draw(st.sampled_from((b"127.0.0.1", b"10.0.0.2", b"192.168.1.20", b"localhost")))
    return CommInitRequest(device=draw(_DEVICES), rank=draw(st.integers(0, 1)), world=2,
                           port=draw(st.integers(1, 65535)), host=host.ljust(64, b"\0"))


def _comm_allreduce(draw, d, cmd, region):
    return CommAllreduceRequest(device=draw(_DEVICES), tensor=_draw_tensor(draw, region))


#: One drawer per command (a new command of a new dialect needs a row here; a test checks
#: that every command of every dialect has one).
REQUEST_DRAWERS: dict[Cmd, RequestDrawer] = {
    Cmd.HELLO: _hello,
    Cmd.DEVICE_COUNT: _device_count,
    Cmd.ALLOC_BUFFER: _alloc_buffer,
    Cmd.GET_ALIGNMENT: _device_only,
    Cmd.GET_MAX_SIZE: _device_only,
    Cmd.GET_DEVICE_MEMORY: _device_only,
    Cmd.COMM_FREE: _device_only,
    Cmd.BUFFER_GET_BASE: _buffer_only,
    Cmd.FREE_BUFFER: _buffer_only,
    Cmd.BUFFER_CLEAR: _buffer_clear,
    Cmd.SET_TENSOR: _set_tensor,
    Cmd.SET_TENSOR_HASH: _set_tensor_hash,
    Cmd.GET_TENSOR: _get_tensor,
    Cmd.COPY_TENSOR: _copy_tensor,
    Cmd.GRAPH_COMPUTE: _graph_compute,
    Cmd.INIT_TENSOR: _init_tensor,
    Cmd.GET_ALLOC_SIZE: _op_query,
    Cmd.GET_DEVICE_SUPPORTS_OP: _op_query,
    Cmd.GRAPH_RECOMPUTE: _graph_recompute,
    Cmd.MEMSET_TENSOR: _memset_tensor,
    Cmd.SET_TENSOR_2D: _tensor_2d,
    Cmd.GET_TENSOR_2D: _tensor_2d,
    Cmd.COMM_INIT: _comm_init,
    Cmd.COMM_ALLREDUCE: _comm_allreduce,
}


def _draw_request(draw, d: Dialect, cmd: Cmd, region: BufferRegion) -> Message:
    return REQUEST_DRAWERS[cmd](draw, d, cmd, region)


# ---------------------------------------------------------------- responses
# Each drawer: (draw, dialect, request) -> a valid response to ``request``.

def _hello_response(draw, d, request):
    major, minor, patch = d.version
    if not d.hello_caps:
        return HelloResponse(major=major, minor=minor, patch=patch)
    flags = draw(st.sampled_from((0, SERVER_FLAG_CACHE))) if d.server_flags else 0
    return HelloResponse(major=major, minor=minor, patch=patch, flags=flags,
                         conn_caps=draw(conn_caps()))


def _alloc_buffer_response(draw, d, request):
    if draw(st.integers(0, 7)) == 0:  # allocation failure is answered with zeros
        return AllocBufferResponse()
    return AllocBufferResponse(remote_ptr=draw(_heap_pointers(16)), remote_size=request.size)


def _device_memory_response(draw, d, request):
    total = draw(st.integers(0, 1 << 40))
    return GetDeviceMemoryResponse(free_mem=draw(st.integers(0, total)), total_mem=total)


def _get_tensor_2d_response(draw, d, request):
    n = request.size * request.n_copies
    return GetTensor2DResponse(data=draw(st.binary(min_size=n, max_size=n)))


#: One drawer per command with a non-empty response (acknowledged fire-and-forget commands
#: answer :class:`~harness.proto.EmptyResponse` without one).
RESPONSE_DRAWERS: dict[Cmd, Callable[..., Message]] = {
    Cmd.HELLO: _hello_response,
    Cmd.DEVICE_COUNT: lambda draw, d, r: DeviceCountResponse(device_count=draw(
        st.integers(1, 16))),
    Cmd.ALLOC_BUFFER: _alloc_buffer_response,
    Cmd.GET_ALIGNMENT: lambda draw, d, r: GetAlignmentResponse(alignment=1 << draw(
        st.integers(0, 12))),
    Cmd.GET_MAX_SIZE: lambda draw, d, r: GetMaxSizeResponse(max_size=draw(
        st.just(U64_MAX) | st.integers(1, U64_MAX))),
    Cmd.BUFFER_GET_BASE: lambda draw, d, r: BufferGetBaseResponse(base_ptr=draw(
        _heap_pointers(32))),
    Cmd.SET_TENSOR_HASH: lambda draw, d, r: SetTensorHashResponse(result=draw(
        st.integers(0, 1))),
    Cmd.GET_TENSOR: lambda draw, d, r: GetTensorResponse(data=draw(
        st.binary(min_size=r.size, max_size=r.size))),
    Cmd.GET_TENSOR_2D: _get_tensor_2d_response,
    Cmd.COPY_TENSOR: lambda draw, d, r: CopyTensorResponse(result=draw(st.integers(0, 1))),
    Cmd.GET_DEVICE_MEMORY: _device_memory_response,
    Cmd.GET_ALLOC_SIZE: lambda draw, d, r: GetAllocSizeResponse(alloc_size=draw(
        st.integers(0, 1 << 32))),
    Cmd.GET_DEVICE_SUPPORTS_OP: lambda draw, d, r: SupportsOpResponse(supported=draw(
        st.integers(0, 1))),
    Cmd.COMM_INIT: lambda draw, d, r: CommInitResponse(ok=draw(st.integers(0, 1))),
}


def _draw_response(draw, d: Dialect, request: Message) -> Message:
    if spec_for(d, request.cmd).response.cls is EmptyResponse:
        return EmptyResponse(request.cmd)
    return RESPONSE_DRAWERS[request.cmd](draw, d, request)


# ---------------------------------------------------------------- public strategies

def _commands(d: Dialect, cmd: Cmd | str | None, direction: str) -> list[Cmd]:
    if direction not in ("request", "response"):
        raise ValueError(f"direction must be 'request' or 'response', not {direction!r}")
    if cmd is not None:
        cmd = Cmd(cmd)
        if not d.has(cmd):
            raise ValueError(f"{cmd} does not exist in dialect {d.name}")
        if direction == "response" and not has_response(d, cmd):
            raise ValueError(f"{cmd} has no response in dialect {d.name}")
        return [cmd]
    cmds = [c for _, c in sorted(d.ids.items())]
    return cmds if direction == "request" else [c for c in cmds if has_response(d, c)]


@st.composite
def exchanges(draw, dialect: Dialect | str, cmd: Cmd | str | None = None, *,
              buffers: Buffers = None,
              ) -> tuple[Message, Message | None]:
    """A valid ``(request, response)`` pair of ``dialect`` (``response`` is None for
    fire-and-forget commands). Response sizes match the request (GET_TENSOR returns exactly
    ``size`` bytes, GET_TENSOR_2D ``size * n_copies``), so the pair feeds a
    :class:`~harness.proto.ResponseReader` as is. ``cmd`` restricts the command; tensors go
    into ``buffers`` (default: a plausible :func:`buffer_regions`)."""
    d = get_dialect(dialect)
    return _draw_exchange(draw, d, _commands(d, cmd, "request"), buffers)


def _draw_exchange(draw, d: Dialect, cmds: list[Cmd], buffers):
    c = draw(_sampled(tuple(cmds)))
    request = _draw_request(draw, d, c, draw(_regions(buffers)))
    response = _draw_response(draw, d, request) if has_response(d, c) else None
    return request, response


@st.composite
def _responses(draw, d: Dialect, cmds: list[Cmd], buffers) -> Message:
    return _draw_exchange(draw, d, cmds, buffers)[1]


def messages(dialect: Dialect | str, cmd: Cmd | str | None = None, direction: str = "request",
             *, buffers: Buffers = None,
             ) -> st.SearchStrategy[Message]:
    """Valid messages of every command that exists in ``dialect`` (or only ``cmd``).

    ``direction="request"`` draws requests; ``"response"`` draws responses of the commands that
    have one in that dialect (the acknowledged fire-and-forget commands of <= 5.0.0 give
    :class:`~harness.proto.EmptyResponse`). Values are realistic: tensors lie inside a buffer
    (``buffers``, see :func:`rpc_tensors`), offsets and sizes inside the tensor, HELLO
    responses announce the dialect's own version. Fields that are not on this dialect's wire
    keep their defaults. Raises ValueError for a command the dialect does not have.
    """
    d = get_dialect(dialect)
    _commands(d, cmd, direction)  # validate eagerly, not at draw time
    if direction == "request":
        return exchanges(d, cmd, buffers=buffers).map(lambda ex: ex[0])
    return _responses(d, _commands(d, cmd, "response"), buffers)


def request_frames(dialect: Dialect | str, cmd: Cmd | str | None = None,
                   **kwargs) -> st.SearchStrategy[bytes]:
    """Whole request frames (cmd byte, u64 length, payload) of :func:`messages`."""
    d = get_dialect(dialect)
    return messages(d, cmd, "request", **kwargs).map(lambda m: pack_request(d, m))


def response_frames(dialect: Dialect | str, cmd: Cmd | str | None = None,
                    **kwargs) -> st.SearchStrategy[bytes]:
    """Whole response frames (u64 length, payload) of :func:`messages` responses."""
    d = get_dialect(dialect)
    return messages(d, cmd, "response", **kwargs).map(lambda m: pack_response(d, m))


@st.composite
def sessions(draw, dialect: Dialect | str, *, max_exchanges: int = 8,
             buffers: Buffers = None,
             ) -> list[tuple[Message, Message | None]]:
    """A list of :func:`exchanges` that starts with HELLO and never repeats it -- the shape of
    a well-behaved connection (commands are independent draws, not a stateful model)."""
    d = get_dialect(dialect)
    others = [c for c in _commands(d, None, "request") if c is not Cmd.HELLO]
    out = [draw(exchanges(d, Cmd.HELLO))]
    for c in draw(st.lists(st.sampled_from(others), max_size=max_exchanges)):
        out.append(draw(exchanges(d, c, buffers=buffers)))
    return out


def hello_request_frame(dialect: Dialect | str) -> bytes:
    """The plain-TCP HELLO request frame of ``dialect`` (what mutations with
    ``at == "after_hello"`` assume has been sent and answered)."""
    return pack_request(get_dialect(dialect), HelloRequest())

