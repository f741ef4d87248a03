"""Pack and unpack messages of any dialect, driven only by the message table."""

from __future__ import annotations

import functools
import struct
import threading
from collections import OrderedDict

from .wire import (REQUEST_HEADER_SIZE, RESPONSE_HEADER_SIZE,  # noqa: F401
                   U32, request_header, response_frame)  # the header sizes are codec's names too
from .constants import Cmd
from .dialects import Dialect
from .errors import LocalProtocolError, RemoteProtocolError
from .messages import (EmptyResponse, GraphComputeRequest, GraphLayout, Layout, Message,
                       spec_for)
from .tensor import RpcTensor, TENSOR_SIZE



# ---------------------------------------------------------------- layouts

def _flatten(layout: Layout, msg) -> list:
    items: list = []
    for name, wt in layout.fields:
        items.extend(wt.to_wire(getattr(msg, name)))
    return items


def pack_fixed(layout: Layout, msg) -> bytes:
    """The fixed part of a payload (the whole payload when the layout has no tail)."""
    try:
        return layout.struct.pack(*_flatten(layout, msg))
    except struct.error as e:
        raise LocalProtocolError(f"cannot pack {type(msg).__name__}: {e}") from None


def unpack_fixed(layout: Layout, payload, offset: int = 0) -> dict:
    values = layout.struct.unpack_from(payload, offset)
    out, i = {}, 0
    for name, wt in layout.fields:
        out[name] = wt.from_wire(values[i:i + wt.width])
        i += wt.width
    return out


def _pack_graph(layout: GraphLayout, msg: GraphComputeRequest) -> bytes:
    if not layout.with_uid and msg.uid:
        raise LocalProtocolError("this dialect's GRAPH_COMPUTE has no uid field")
    try:
        head = (layout.head.pack(msg.device, msg.uid, len(msg.nodes)) if layout.with_uid
                else layout.head.pack(msg.device, len(msg.nodes)))
        return b"".join((head, struct.pack(f"<{len(msg.nodes)}Q", *msg.nodes),
                         U32.pack(len(msg.tensors)), *(t.pack() for t in msg.tensors),
                         msg.trailing))
    except struct.error as e:  # same contract as pack_fixed: out-of-range values are local errors
        raise LocalProtocolError(f"cannot pack {type(msg).__name__}: {e}") from None


def _unpack_graph(layout: GraphLayout, payload, cmd_name) -> GraphComputeRequest:
    """Mirror of rpc_server::graph_compute's length checks (spec 6.2 step 1)."""
    n = len(payload)
    if n < layout.head.size:
        raise RemoteProtocolError(f"graph payload of {n} bytes is shorter than its header",
                                  command=cmd_name, field="len", offset=1)
    if layout.with_uid:
        device, uid, n_nodes = layout.head.unpack_from(payload, 0)
    else:
        (device, n_nodes), uid = layout.head.unpack_from(payload, 0), 0
    off = layout.head.size
    if n < off + 8 * n_nodes + 4:
        raise RemoteProtocolError(f"graph declares {n_nodes} nodes but the payload has {n} bytes",
                                  command=cmd_name, field="n_nodes", offset=off - 4)
    nodes = struct.unpack_from(f"<{n_nodes}Q", payload, off)
    off += 8 * n_nodes
    (n_tensors,) = U32.unpack_from(payload, off)
    off += 4
    if n < off + TENSOR_SIZE * n_tensors:
        raise RemoteProtocolError(f"graph declares {n_tensors} tensors but the payload has {n} bytes",
                                  command=cmd_name, field="n_tensors", offset=off - 4)
    tensors = tuple(RpcTensor.unpack_from(payload, off + i * TENSOR_SIZE) for i in range(n_tensors))
    off += TENSOR_SIZE * n_tensors
    return GraphComputeRequest(device=device, uid=uid, nodes=nodes, tensors=tensors,
                               trailing=bytes(payload[off:]))


# Decoded graphs by payload bytes. The fuzzer's evolved cases reuse corpus steps verbatim and
# annotate decodes every step of every case: a live p8 campaign spent 40% of its time decoding
# the same graphs of thousands of tensors again. Results (messages, or the refusal) are
# immutable; the memo is bounded by payload bytes and shared by threads.
GRAPH_MEMO_MIN = 4096  # smaller graphs decode in microseconds: not worth a key
GRAPH_MEMO_BYTES = 64 << 20
_graph_memo: OrderedDict = OrderedDict()
_graph_memo_size = 0
_graph_memo_lock = threading.Lock()


def _unpack_graph_memo(layout: GraphLayout, payload, cmd_name) -> GraphComputeRequest:
    global _graph_memo_size
    if len(payload) < GRAPH_MEMO_MIN:
        return _unpack_graph(layout, payload, cmd_name)
    data = bytes(payload)
    key = (layout.with_uid, cmd_name, data)
    with _graph_memo_lock:
        hit = _graph_memo.get(key)
        if hit is not None:
            _graph_memo.move_to_end(key)
    if hit is None:
        try:
            hit = (True, _unpack_graph(layout, data, cmd_name))
        except RemoteProtocolError as e:
            hit = (False, (e.reason, e.command, e.field, e.offset))
        with _graph_memo_lock:
            if key not in _graph_memo:
                _graph_memo[key] = hit
                _graph_memo_size += len(data)
                while _graph_memo_size > GRAPH_MEMO_BYTES and len(_graph_memo) > 1:
                    old, _ = _graph_memo.popitem(last=False)
                    _graph_memo_size -= len(old[2])
    ok, value = hit
    if ok:
        return value
    message, command, field, offset = value
    raise RemoteProtocolError(message, command=command, field=field, offset=offset)


def graph_payload_size(with_uid: bool, n_nodes: int, n_tensors: int) -> int:
    return (16 if with_uid else 8) + 8 * n_nodes + 4 + TENSOR_SIZE * n_tensors


# ---------------------------------------------------------------- requests

def _check_fields(layout: Layout, msg) -> None:
    """Fields that exist in the message class but not on this dialect's wire must be default."""
    on_wire = {name for name, _ in layout.fields}
    if layout.tail:
        on_wire.add(layout.tail)
    for name in getattr(type(msg), "__dataclass_fields__", {}):
        if name not in on_wire and getattr(msg, name) != type(msg).__dataclass_fields__[name].default:
            raise LocalProtocolError(f"{type(msg).__name__}.{name} does not exist in this dialect")


def pack_request_payload(dialect: Dialect, msg: Message) -> bytes:
    spec = spec_for(dialect, msg.cmd)
    if isinstance(spec.request, GraphLayout):
        return _pack_graph(spec.request, msg)
    if not isinstance(msg, spec.request.cls):
        raise LocalProtocolError(f"{type(msg).__name__} is not a {spec.request.cls.__name__}")
    _check_fields(spec.request, msg)
    fixed = pack_fixed(spec.request, msg)
    if spec.request.tail:
        return fixed + bytes(getattr(msg, spec.request.tail))
    return fixed


def pack_request(dialect: Dialect, msg: Message) -> bytes:
    """The whole request frame: cmd byte, u64 length, payload."""
    payload = pack_request_payload(dialect, msg)
    return request_header(dialect.id_of(msg.cmd), len(payload)) + payload


def unpack_request_payload(dialect: Dialect, cmd: Cmd, payload) -> Message:
    """Decode a complete request payload; the length rules are those of the real server."""
    spec = spec_for(dialect, cmd)
    layout = spec.request
    if isinstance(layout, GraphLayout):
        return _unpack_graph_memo(layout, payload, cmd.value)
    if len(payload) <= PLAIN_MEMO_MAX:
        return _unpack_plain_memo(layout, cmd, bytes(payload))
    return _unpack_plain(layout, cmd, payload)


def _unpack_plain(layout: Layout, cmd: Cmd, payload) -> Message:
    n = len(payload)
    if layout.tail is None and n != layout.fixed_size:
        raise RemoteProtocolError(f"{cmd} payload must be {layout.fixed_size} bytes, got {n}",
                                  command=cmd.value, field="len", offset=1)
    if n < layout.fixed_size:
        raise RemoteProtocolError(f"{cmd} payload must be at least {layout.fixed_size} bytes, got {n}",
                                  command=cmd.value, field="len", offset=1)
    values = unpack_fixed(layout, payload)
    if layout.tail:
        values[layout.tail] = bytes(payload[layout.fixed_size:])
    return layout.cls(**values)


# Small request payloads decoded by their bytes. A sweep sends the same set-up requests
# (ALLOC_BUFFER, BUFFER_GET_BASE, tensor headers) in every case, and the server, the annotator
# and the bounds oracle each decode every one: the bounds oracle alone decoded 422,426 payloads
# of the 8.0.0 sweep, 34,987 of them distinct. Messages are frozen, so a decoded one can be
# shared; refusals are not kept (lru_cache does not cache exceptions).
PLAIN_MEMO_MAX = 1024
_unpack_plain_memo = functools.lru_cache(maxsize=1 << 13)(_unpack_plain)


def unpack_request_header(dialect: Dialect, cmd: Cmd, header) -> Message:
    """Decode only the fixed header of a streamed request (``data`` left empty)."""
    layout = spec_for(dialect, cmd).request
    return layout.cls(**unpack_fixed(layout, header))


# ---------------------------------------------------------------- responses

def response_payload_size(dialect: Dialect, request: Message) -> int | None:
    """Exact size the response to ``request`` must have; None if it has no response."""
    spec = spec_for(dialect, request.cmd)
    if spec.response is None:
        return None
    if spec.response_size is not None:
        return spec.response_size(request)
    return spec.response.fixed_size


def has_response(dialect: Dialect, cmd: Cmd) -> bool:
    return spec_for(dialect, cmd).response is not None


def pack_response_payload(dialect: Dialect, msg: Message) -> bytes:
    spec = spec_for(dialect, msg.cmd)
    if spec.response is None:
        raise LocalProtocolError(f"{msg.cmd} has no response in dialect {dialect.name}")
    layout = spec.response
    if not isinstance(msg, layout.cls):  # e.g. an EmptyResponse for a command that is not acked
        raise LocalProtocolError(f"{type(msg).__name__} is not a {layout.cls.__name__} "
                                 f"in dialect {dialect.name}")
    if isinstance(msg, EmptyResponse):
        return b""
    _check_fields(layout, msg)
    fixed = pack_fixed(layout, msg)
    return fixed + bytes(msg.data) if layout.tail else fixed


def pack_response(dialect: Dialect, msg: Message) -> bytes:
    return response_frame(pack_response_payload(dialect, msg))


def unpack_response_payload(dialect: Dialect, cmd: Cmd, payload) -> Message:
    spec = spec_for(dialect, cmd)
    layout = spec.response
    if layout is None:
        raise LocalProtocolError(f"{cmd} has no response in dialect {dialect.name}")
    if layout.cls is EmptyResponse:
        if len(payload):
            raise RemoteProtocolError(f"{cmd} acknowledgement must be empty, got {len(payload)} bytes",
                                      command=cmd.value, field="len", offset=0)
        return EmptyResponse(cmd)
    if layout.tail:
        return layout.cls(**{layout.tail: bytes(payload)})
    if len(payload) != layout.fixed_size:
        raise RemoteProtocolError(f"{cmd} response must be {layout.fixed_size} bytes, got {len(payload)}",
                                  command=cmd.value, field="len", offset=0)
    return layout.cls(**unpack_fixed(layout, payload))
