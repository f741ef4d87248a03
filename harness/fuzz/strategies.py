"""Hypothesis strategies for ggml-rpc messages, frames, graphs and structured mutations.

Public as ``harness.strategies``. Two families:

* **Valid data** -- :func:`rpc_tensors`, :func:`messages`, :func:`exchanges`,
  :func:`request_frames`, :func:`response_frames`, :func:`graphs`, :func:`sessions`. Everything
  they produce packs and decodes under the dialect it was drawn for, and only uses fields that
  exist on that dialect's wire (``cache_flag`` only where ``dialect.cache_flag``, ``uid`` only
  where ``dialect.graph_uid``, HELLO caps/flags only where ``dialect.hello_caps`` /
  ``dialect.server_flags``).
* **Structured mutations** -- :func:`framing_mutations`, :func:`flag_mutations`,
  :func:`field_mutations` and their union :func:`mutations`. Each draws a :class:`Mutation`, a
  ``(description, data)`` pair: ``data`` is the bytes to put on the wire and ``description`` a
  small JSON-serialisable dict (see :data:`DESCRIPTION_KEYS`) such as
  ``{"kind": "framing", "what": "len_too_large", "cmd": "GET_ALIGNMENT", "field": "len", ...}``
  so a fuzz report can count coverage of command x field. :func:`mutation_catalogue` lists
  every ``(kind, what, cmd)`` the strategies can produce for a dialect.

Dialect arguments accept a :class:`~harness.proto.Dialect` or any name/alias
:func:`~harness.proto.get_dialect` knows ("7.0.0", "7f", "9", ...).
"""

from __future__ import annotations

import struct
from dataclasses import replace
from functools import lru_cache
from typing import Iterable, NamedTuple, Sequence, Union

from hypothesis import strategies as st

from ..proto import ggml
from ..proto.codec import (REQUEST_HEADER_SIZE, has_response, pack_request,
                           pack_request_payload, pack_response)
from ..proto.constants import CONN_CAPS_SIZE, HELLO_ID, SERVER_FLAG_CACHE, Cmd
from ..proto.dialects import DIALECTS, Dialect, get_dialect
from ..proto.messages import (TENSOR, TENSORS10, AllocBufferRequest, AllocBufferResponse,
                              BufferClearRequest, BufferGetBaseResponse, CommAllreduceRequest,
                              CommInitRequest, CommInitResponse, CopyTensorRequest,
                              CopyTensorResponse, DeviceCountRequest, DeviceCountResponse,
                              EmptyResponse, GetAlignmentResponse, GetAllocSizeRequest,
                              GetAllocSizeResponse, GetDeviceMemoryResponse, GetMaxSizeResponse,
                              GetTensor2DRequest, GetTensor2DResponse, GetTensorRequest,
                              GetTensorResponse, GraphComputeRequest, GraphLayout,
                              GraphRecomputeRequest, HelloRequest, HelloResponse,
                              InitTensorRequest, Message, MemsetTensorRequest,
                              SetTensor2DRequest, SetTensorHashRequest, SetTensorHashResponse,
                              SetTensorRequest, SupportsOpRequest, SupportsOpResponse,
                              spec_for)
from ..proto.tensor import RpcTensor, nbytes

__all__ = [
    # building blocks
    "BufferRegion", "Buffers", "buffer_regions", "dialects", "type_ids", "VALID_TYPE_IDS",
    "REMOVED_TYPE_IDS", "INVALID_TYPE_IDS", "tensor_names", "conn_caps", "rpc_tensors",
    # valid messages
    "messages", "exchanges", "request_frames", "response_frames", "sessions", "graphs",
    "GRAPH_SHAPES", "hello_request_frame",
    # mutations
    "Mutation", "framing_mutations", "flag_mutations", "field_mutations", "mutations",
    "mutation_catalogue", "check_description", "DESCRIPTION_KEYS", "MUTATION_KINDS",
    "FRAMING_WHATS", "FLAG_WHATS", "FIELD_WHATS",
]

U8_MAX = 0xFF
U32_MAX = 0xFFFF_FFFF
U64_MAX = 0xFFFF_FFFF_FFFF_FFFF
I32_MIN, I32_MAX = -(1 << 31), (1 << 31) - 1

VALID_TYPE_IDS: tuple[int, ...] = tuple(i for i, t in enumerate(ggml.TYPES) if t.blck_size)
REMOVED_TYPE_IDS: tuple[int, ...] = tuple(i for i, t in enumerate(ggml.TYPES) if not t.blck_size)
# 43 = GGML_TYPE_COUNT (first id the 7.0.0 server rejects), 99 seen on the wire [V].
INVALID_TYPE_IDS: tuple[int, ...] = (43, 44, 99, 255, 1 << 31, U32_MAX)

# Elementwise ops keep graph shapes consistent, so a generated graph also computes on a real
# backend. Ids from the 7.0.0 enum (spec A.2).
_BINARY_OPS = tuple(ggml.OP[n] for n in ("ADD", "SUB", "MUL", "DIV"))
_UNARY_OPS = tuple(ggml.OP[n] for n in ("DUP", "SQR", "SQRT", "CONT"))
_OP_VIEW = ggml.OP["VIEW"]


# ---------------------------------------------------------------- building blocks

class BufferRegion(NamedTuple):
    """A server buffer as the client knows it: ALLOC_BUFFER handle, BUFFER_GET_BASE base, size.

    Pass real ones (from a live session) to place tensors inside buffers the server knows;
    otherwise :func:`buffer_regions` draws plausible ones.
    """

    handle: int
    base: int
    size: int

    @property
    def end(self) -> int:
        return self.base + self.size


#: The ``buffers`` knob: live regions to sample from, a strategy for them, or None.
Buffers = Union[Sequence[BufferRegion], st.SearchStrategy[BufferRegion], None]


@lru_cache(maxsize=None)
def _heap_pointers(align: int = 16) -> st.SearchStrategy[int]:
    # Linux x86-64 heap/mmap addresses look like 0x55xx_xxxx_xxxx .. 0x7fxx_xxxx_xxxx.
    low, high = 0x5555_0000_0000 // align, 0x7FFF_FFFF_0000 // align
    return st.integers(low, high).map(lambda p: p * align)


@lru_cache(maxsize=None)
def buffer_regions(*, min_size: int = 0,
                   max_size: int = 1 << 20) -> st.SearchStrategy[BufferRegion]:
    """Plausible buffers: 16-aligned handle, 32-aligned base (the CPU alignment), a size in
    ``[min_size, max_size]`` biased towards the small sizes the real-server vectors use."""
    common = [s for s in (256, 1024, 4096, 65536) if min_size <= s <= max_size]
    sizes = st.integers(min_size, max_size)
    if common:
        sizes = st.one_of(st.sampled_from(common), sizes)
    return st.builds(BufferRegion, _heap_pointers(16), _heap_pointers(32), sizes)


def dialects(names: Iterable[str] | None = None) -> st.SearchStrategy[Dialect]:
    """One of the known dialects (all of :data:`~harness.proto.DIALECTS` by default)."""
    return st.sampled_from([get_dialect(n) for n in (names if names is not None else DIALECTS)])


@lru_cache(maxsize=None)
def type_ids(kind: str = "valid") -> st.SearchStrategy[int]:
    """``ggml_type`` ids: ``"valid"`` (non-zero block size), ``"removed"`` (block size 0),
    ``"invalid"`` (>= GGML_TYPE_COUNT), or ``"any"`` (any u32, biased to the interesting ones)."""
    if kind == "valid":
        return st.sampled_from(VALID_TYPE_IDS)
    if kind == "removed":
        return st.sampled_from(REMOVED_TYPE_IDS)
    if kind == "invalid":
        return st.one_of(st.sampled_from(INVALID_TYPE_IDS), st.integers(ggml.TYPE_COUNT, U32_MAX))
    if kind == "any":
        return st.one_of(st.sampled_from(VALID_TYPE_IDS + REMOVED_TYPE_IDS + INVALID_TYPE_IDS),
                         st.integers(0, U32_MAX))
    raise ValueError(f"unknown type-id kind {kind!r}")


def _pad_name(raw: bytes) -> bytes:
    return raw[:ggml.MAX_NAME - 1].ljust(ggml.MAX_NAME, b"\0")


@lru_cache(maxsize=None)
def tensor_names(*, raw: bool = False) -> st.SearchStrategy[bytes]:
    """The 64-byte ``name`` field. By default like the C client writes it: a short ASCII name
    (often llama.cpp style, e.g. ``blk.3.attn_q.weight``), NUL-terminated and zero padded.
    ``raw=True``: any 64 bytes (no terminator guaranteed)."""
    if raw:
        return st.binary(min_size=ggml.MAX_NAME, max_size=ggml.MAX_NAME)
    llama = st.builds(lambda i, part: f"blk.{i}.{part}".encode(), st.integers(0, 79),
                      st.sampled_from(("attn_q.weight", "attn_k.weight", "ffn_up.weight",
                                       "attn_norm.weight", "ffn_down.weight")))
    short = st.text("abcdefghijklmnopqrstuvwxyz0123456789_.", max_size=63).map(str.encode)
    return st.one_of(st.just(b""), llama, short).map(_pad_name)


@lru_cache(maxsize=None)
def conn_caps(*, zero_only: bool = False) -> st.SearchStrategy[bytes]:
    """24-byte HELLO ``conn_caps``: all zero (plain TCP) or the Linux RDMA layout
    (``qpn u32, psn u32 = qpn & 0xFFFFFF, gid[16]`` with an IPv4-mapped GID, spec 10.1)."""
    zero = st.just(bytes(CONN_CAPS_SIZE))
    if zero_only:
        return zero

    def linux(qpn: int, ip: bytes) -> bytes:
        gid = bytes(10) + b"\xff\xff" + ip
        return struct.pack("<II", qpn, qpn & 0xFFFFFF) + gid

    return st.one_of(zero, st.builds(linux, st.integers(1, 0xFFFFFF),
                                     st.binary(min_size=4, max_size=4)))


def _tensor_nbytes(t: RpcTensor) -> int:
    """nbytes for placement; tensors of an invalid type are sized as if they were f32."""
    traits = ggml.type_traits(t.type)
    return nbytes(t if traits is not None and traits.blck_size else t.with_(type=ggml.TYPE_F32))


def _strides_for(type_id: int, ne) -> tuple[int, int, int, int]:
    traits = ggml.type_traits(type_id)
    ok = traits is not None and traits.blck_size
    return tuple(s & U32_MAX for s in ggml.contiguous_strides(type_id if ok else ggml.TYPE_F32, ne))


def _place(draw, t: RpcTensor, region: BufferRegion, alignment: int) -> RpcTensor:
    """Put ``t`` at an aligned offset of ``region`` so that it lies entirely inside it.

    A tensor too big for the region is shrunk to one block; if even that does not fit (tiny or
    empty region) it gets ``ne[0] = 0`` (zero elements, nbytes 0) and sits at the base.
    """
    n = _tensor_nbytes(t)
    if n > region.size:
        traits = ggml.type_traits(t.type)
        blck = traits.blck_size if traits is not None and traits.blck_size else 1
        ne = (blck, 1, 1, 1)
        t = t.with_(ne=ne, nb=_strides_for(t.type, ne))
        n = _tensor_nbytes(t)
        if n > region.size:
            ne = (0, 1, 1, 1)
            t = t.with_(ne=ne, nb=_strides_for(t.type, ne))
            n = 0
    slots = (region.size - n) // alignment
    offset = draw(st.integers(0, slots)) * alignment
    return t.with_(buffer=region.handle, data=region.base + offset)


@st.composite
def rpc_tensors(draw, *, types: str | st.SearchStrategy[int] = "valid",
                buffers: Buffers = None,
                ids: st.SearchStrategy[int] | None = None,
                names: st.SearchStrategy[bytes] | None = None,
                ops: st.SearchStrategy[int] | None = None,
                flags: st.SearchStrategy[int] | None = None,
                max_dim: int = 4, strides: str = "contiguous", alignment: int = 32,
                any_pointers: bool = False) -> RpcTensor:
    """``rpc_tensor`` records (:class:`~harness.proto.RpcTensor`).

    * ``types``: ``"valid"`` | ``"removed"`` | ``"invalid"`` | ``"any"`` (see :func:`type_ids`)
      or a strategy of ids.
    * Shape: ``ne[0]`` is a multiple of the type's block size (what real clients send),
      every ``ne[i]`` at most ``max_dim`` blocks/elements; ``strides="contiguous"`` gives the
      ``nb`` of a fresh ggml tensor, ``"any"`` arbitrary u32 strides.
    * Placement: with ``buffers`` (a sequence of, or strategy for, :class:`BufferRegion`) the
      tensor gets that buffer's handle and a ``data`` pointer (``alignment``-aligned) such
      that ``[data, data + nbytes)`` lies inside ``[base, base + size)``; ``"valid"`` types
      are then limited to those of which one block fits the buffer. Without buffers
      ``buffer = data = 0`` (a host tensor, or one of another server). ``any_pointers=True``
      draws both as arbitrary u64 instead.
    * ``ids`` (default: non-zero heap-like addresses), ``names`` (default
      :func:`tensor_names`), ``ops`` and ``flags`` (default 0). ``op_params``, ``src``,
      ``view_*`` and ``use_count`` are zero, as for a standalone tensor.
    """
    if strides not in ("contiguous", "any"):
        raise ValueError(f"strides must be 'contiguous' or 'any', not {strides!r}")
    region = None if buffers is None or any_pointers else draw(_regions(buffers))
    return _draw_tensor(draw, region, types=types, ids=ids, names=names, ops=ops, flags=flags,
                        max_dim=max_dim, strides=strides, alignment=alignment,
                        any_pointers=any_pointers)


def _draw_tensor(draw, region: BufferRegion | None, *, types="valid", ids=None, names=None,
                 ops=None, flags=None, max_dim: int = 4, strides: str = "contiguous",
                 alignment: int = 32, any_pointers: bool = False) -> RpcTensor:
    """rpc_tensors' body as a plain function, so other strategies can call it without
    building (and validating) a new strategy object per draw."""
    if types == "valid" and region is not None:
        # Only types of which one block fits the region, so the tensor can lie inside it.
        fitting = tuple(i for i in VALID_TYPE_IDS if ggml.TYPES[i].type_size <= region.size)
        types = _sampled(fitting) if fitting else type_ids("valid")
    elif isinstance(types, str):
        types = type_ids(types)
    type_id = draw(types)
    traits = ggml.type_traits(type_id)
    blck = traits.blck_size if traits is not None and traits.blck_size else 1
    dim = st.integers(1, max_dim)
    ne = (blck * draw(dim), draw(dim), draw(dim), draw(dim))
    if strides == "contiguous":
        nb = _strides_for(type_id, ne)
    else:
        nb = tuple(draw(_U32_QUAD))
    t = RpcTensor(id=draw(ids if ids is not None else _heap_pointers(16)), type=type_id,
                  ne=ne, nb=nb, op=draw(ops) if ops is not None else 0,
                  flags=draw(flags) if flags is not None else 0,
                  name=draw(names if names is not None else tensor_names()))
    if any_pointers:
        return t.with_(buffer=draw(_U64), data=draw(_U64))
    if region is None:
        return t
    if strides == "any" and _tensor_nbytes(t) > region.size:
        t = t.with_(nb=_strides_for(type_id, ne))  # so that _place can fit it
    return _place(draw, t, region, alignment)


_U64 = st.integers(0, U64_MAX)
_U32_QUAD = st.lists(st.integers(0, U32_MAX), min_size=4, max_size=4)


# ---------------------------------------------------------------- graphs

GRAPH_SHAPES = ("chain", "dag", "cycle", "duplicate_ids", "dangling")
_VALID_SHAPES = ("chain", "dag")
_GRAPH_REGIONS = buffer_regions(min_size=4096, max_size=1 << 20)


def _post_order(nodes: list[RpcTensor], by_id: dict[int, RpcTensor]) -> list[RpcTensor]:
    """Tensor order of the C client's serialisation (spec 6.1): per node, a depth-first walk
    over ``src[0..9]``, then ``view_src``, then the tensor itself, each tensor once."""
    seen: set[int] = set()
    out: list[RpcTensor] = []
    for node in nodes:
        stack = [(node, False)]
        while stack:  # iterative, so deep generated chains do not hit the recursion limit
            t, expanded = stack.pop()
            if t.id in seen:
                continue
            if expanded:
                seen.add(t.id)
                out.append(t)
                continue
            stack.append((t, True))
            children = [i for i in (*t.src, t.view_src) if i]
            for cid in reversed(children):
                if cid not in seen and cid in by_id:
                    stack.append((by_id[cid], False))
    return out


@st.composite
def graphs(draw, dialect: Dialect | str = "7.0.0", *, shape: str = "valid",
           buffers: Buffers = None,
           max_nodes: int = 6, max_leaves: int = 3,
           device: st.SearchStrategy[int] | None = None) -> GraphComputeRequest:
    """GRAPH_COMPUTE requests (:class:`~harness.proto.GraphComputeRequest`).

    ``shape`` is one of :data:`GRAPH_SHAPES`, ``"valid"`` (chain or dag) or ``"any"``:

    * ``chain``: each node consumes the previous one (plus a leaf for binary ops);
    * ``dag``: each node's sources are any earlier tensors, occasionally through a VIEW node
      (``view_src``/``view_offs`` set, ``data`` inside the viewed tensor);
    * ``cycle``: a valid graph where one node lists itself or a later node as a source;
    * ``duplicate_ids``: a second record reusing an existing id (the server keeps the first);
    * ``dangling``: a ``src`` or ``view_src`` id that no record in ``tensors`` has.

    Nodes are elementwise f32/f16 ops with the COMPUTE flag, leaves have op NONE; the tensor
    array is in the client's post-order and ``use_count`` holds each tensor's consumer count.
    All tensors are placed in one buffer (drawn from ``buffers``, or a plausible one); if
    it is too small, tensors get ``buffer = data = 0``. ``uid`` is non-zero only in dialects
    with graph uids (and then sometimes 0, the "do not cache" value).
    """
    d = get_dialect(dialect)
    if shape not in GRAPH_SHAPES + ("valid", "any"):
        raise ValueError(f"unknown graph shape {shape!r}; known: {', '.join(GRAPH_SHAPES)}")
    region = draw(_regions(buffers, _GRAPH_REGIONS))
    return _draw_graph(draw, d, region, shape=shape, max_nodes=max_nodes, max_leaves=max_leaves,
                       device=device)


def _draw_graph(draw, d: Dialect, region: BufferRegion, *, shape: str = "valid",
                max_nodes: int = 6, max_leaves: int = 3, device=None) -> GraphComputeRequest:
    if shape == "valid":
        shape = draw(st.sampled_from(_VALID_SHAPES))
    elif shape == "any":
        shape = draw(st.sampled_from(GRAPH_SHAPES))
    type_id = draw(st.sampled_from((ggml.TYPE_F32, ggml.TYPE_F16)))
    ne = (draw(st.integers(1, 16)), draw(st.integers(1, 4)), 1, 1)
    nb = _strides_for(type_id, ne)
    proto_t = RpcTensor(type=type_id, ne=ne, nb=nb)
    size = nbytes(proto_t)
    fits = size <= region.size
    slots = (region.size - size) // 32 if fits else 0

    def placed() -> tuple[int, int]:
        if not fits:
            return 0, 0
        return region.handle, region.base + draw(st.integers(0, slots)) * 32

    n_leaves = draw(st.integers(1, max_leaves))
    n_nodes = draw(st.integers(1 if shape != "chain" else 2, max(max_nodes, 2)))
    ids = draw(st.lists(_heap_pointers(16), min_size=n_leaves + n_nodes + 1,
                        max_size=n_leaves + n_nodes + 1, unique=True))
    fresh_id = ids.pop()  # guaranteed unused: for dangling references
    # ggml's own naming of unnamed tensors ("leaf_3", "node_12"); drawing 64-byte names per
    # tensor would triple the cost of a graph for no coverage (names are opaque to the server).
    names = iter([_pad_name(b"leaf_%d" % i) for i in range(n_leaves)]
                 + [_pad_name(b"node_%d" % i) for i in range(n_nodes)])
    leaves = []
    for i in range(n_leaves):
        buf, data = placed()
        leaves.append(proto_t.with_(id=ids[i], buffer=buf, data=data, name=next(names),
                                    flags=ggml.FLAG_INPUT if draw(st.booleans()) else 0))
    made = list(leaves)
    nodes: list[RpcTensor] = []
    for i in range(n_nodes):
        tid = ids[n_leaves + i]
        buf, data = placed()
        if shape == "chain":
            srcs = [made[-1]]
        else:
            srcs = [draw(st.sampled_from(made))]
        if shape != "chain" and fits and draw(st.integers(0, 5)) == 0:
            # A VIEW node: aliases part of its source, data = source data + view_offs.
            src = srcs[0]
            offs = draw(st.integers(0, size // nb[0] - 1)) * nb[0] if src.data else 0
            view_ne = (ne[0] * ne[1] - offs // nb[0], 1, 1, 1) if offs else ne
            t = proto_t.with_(id=tid, buffer=src.buffer, data=src.data + offs if src.data else 0,
                              ne=view_ne, nb=_strides_for(type_id, view_ne), op=_OP_VIEW,
                              view_src=src.id, view_offs=offs, src=(src.id,) + (0,) * 9,
                              flags=ggml.FLAG_COMPUTE, name=next(names))
        else:
            binary = draw(st.booleans())
            if binary:
                srcs.append(draw(st.sampled_from(leaves if shape == "chain" else made)))
            op = draw(st.sampled_from(_BINARY_OPS if binary else _UNARY_OPS))
            src_ids = tuple(s.id for s in srcs)
            t = proto_t.with_(id=tid, buffer=buf, data=data, op=op, flags=ggml.FLAG_COMPUTE,
                              src=src_ids + (0,) * (10 - len(src_ids)), name=next(names))
        made.append(t)
        nodes.append(t)
    if draw(st.booleans()):
        last = nodes[-1]
        nodes[-1] = last.with_(flags=last.flags | ggml.FLAG_OUTPUT)
    by_id = {t.id: t for t in leaves + nodes}
    uses: dict[int, int] = {}
    for t in nodes:
        for s in (*t.src, t.view_src):
            if s:
                uses[s] = uses.get(s, 0) + 1
    tensors = [t.with_(use_count=uses.get(t.id, 0)) for t in _post_order(nodes, by_id)]

    node_ids = {n.id for n in nodes}
    if shape == "cycle":
        k = draw(st.sampled_from([k for k, t in enumerate(tensors) if t.id in node_ids]))
        target = draw(st.sampled_from([t.id for t in tensors[k:]]))  # itself or a later one
        tensors[k] = tensors[k].with_(src=(target,) + tensors[k].src[1:])
    elif shape == "duplicate_ids":
        k = draw(st.integers(0, len(tensors) - 1))
        dup = tensors[k].with_(name=_pad_name(b"duplicate"), use_count=0,
                               data=placed()[1] if fits else 0)
        tensors.insert(draw(st.integers(k + 1, len(tensors))), dup)
    elif shape == "dangling":
        k = draw(st.sampled_from([k for k, t in enumerate(tensors) if t.id in node_ids]))
        t = tensors[k]
        if draw(st.booleans()):
            slot = draw(st.integers(0, 9))
            src = list(t.src)
            src[slot] = fresh_id
            tensors[k] = t.with_(src=tuple(src))
        else:
            tensors[k] = t.with_(view_src=fresh_id)
    uid = 0
    if d.graph_uid:
        uid = draw(st.one_of(st.just(0), st.integers(1, U64_MAX)))
    dev = draw(device) if device is not None else 0
    return GraphComputeRequest(device=dev, uid=uid, nodes=tuple(n.id for n in nodes),
                               tensors=tuple(tensors))


# ---------------------------------------------------------------- valid messages

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


def _draw_request(draw, d: Dialect, cmd: Cmd, region: BufferRegion) -> Message:
    def tensor_in_region() -> RpcTensor:
        return _draw_tensor(draw, region)
    if cmd is Cmd.HELLO:
        return HelloRequest(conn_caps=draw(conn_caps())) if d.hello_caps else HelloRequest()
    if cmd is Cmd.DEVICE_COUNT:
        return DeviceCountRequest()
    if cmd is Cmd.ALLOC_BUFFER:
        return AllocBufferRequest(device=draw(_DEVICES), size=draw(st.one_of(
            st.sampled_from((0, 256, 1024, 1 << 20)), st.integers(0, 1 << 34))))
    if cmd in (Cmd.GET_ALIGNMENT, Cmd.GET_MAX_SIZE, Cmd.GET_DEVICE_MEMORY, Cmd.COMM_FREE):
        return spec_for(d, cmd).request.cls(device=draw(_DEVICES))
    if cmd in (Cmd.BUFFER_GET_BASE, Cmd.FREE_BUFFER):
        return spec_for(d, cmd).request.cls(remote_ptr=region.handle)
    if cmd is Cmd.BUFFER_CLEAR:
        return BufferClearRequest(remote_ptr=region.handle, value=draw(st.integers(0, U8_MAX)))
    if cmd is Cmd.SET_TENSOR:
        t = tensor_in_region()
        offset, length = _span(draw, nbytes(t), 4096)
        cache_flag = draw(st.sampled_from((0, 1))) if d.cache_flag else 0
        return SetTensorRequest(tensor=t, cache_flag=cache_flag, offset=offset,
                                data=draw(st.binary(min_size=length, max_size=length)))
    if cmd is Cmd.SET_TENSOR_HASH:
        return SetTensorHashRequest(tensor=tensor_in_region(), offset=0,
                                    hash=draw(st.integers(0, U64_MAX)))
    if cmd is Cmd.GET_TENSOR:
        t = tensor_in_region()
        offset, size = _span(draw, nbytes(t), 4096)
        return GetTensorRequest(tensor=t, offset=offset, size=size)
    if cmd is Cmd.COPY_TENSOR:
        src = tensor_in_region()
        # Same shape for dst so that dst.data + nbytes(src) stays inside the buffer.
        dst = _place(draw, src.with_(id=draw(_heap_pointers(16)), name=draw(tensor_names())),
                     region, 32)
        return CopyTensorRequest(src=src, dst=dst)
    if cmd is Cmd.GRAPH_COMPUTE:
        return _draw_graph(draw, d, region, device=_DEVICES)
    if cmd is Cmd.INIT_TENSOR:
        return InitTensorRequest(tensor=tensor_in_region())
    if cmd in (Cmd.GET_ALLOC_SIZE, Cmd.GET_DEVICE_SUPPORTS_OP):
        srcs = _aux_tensors(draw, region, 2)
        op = draw(st.sampled_from(_BINARY_OPS + (ggml.OP["MUL_MAT"], ggml.OP["NONE"])))
        main = tensor_in_region().with_(op=op, src=tuple(s.id for s in srcs))
        if cmd is Cmd.GET_ALLOC_SIZE:
            if draw(st.booleans()):  # asked before allocation: no buffer yet
                main = main.with_(buffer=0, data=0)
            return GetAllocSizeRequest(device=draw(_DEVICES), tensor=main, srcs=srcs)
        return SupportsOpRequest(device=draw(_DEVICES), op=main.with_(buffer=0, data=0), srcs=srcs)
    if cmd is Cmd.GRAPH_RECOMPUTE:
        uid = draw(st.integers(1, U64_MAX)) if d.graph_uid else 0
        return GraphRecomputeRequest(device=draw(_DEVICES), uid=uid)
    if cmd is Cmd.MEMSET_TENSOR:
        t = tensor_in_region()
        offset, size = _span(draw, nbytes(t), 1 << 20)
        return MemsetTensorRequest(tensor=t, offset=offset, size=size,
                                   value=draw(st.integers(0, U8_MAX)))
    if cmd in (Cmd.SET_TENSOR_2D, Cmd.GET_TENSOR_2D):
        # Copies i = 0..n_copies-1 of `size` bytes at offset + i * stride, all inside the tensor.
        t = tensor_in_region()
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
    if cmd is Cmd.COMM_INIT:
        host = draw(st.sampled_from((b"127.0.0.1", b"10.0.0.2", b"192.168.1.20", b"localhost")))
        return CommInitRequest(device=draw(_DEVICES), rank=draw(st.integers(0, 1)), world=2,
                               port=draw(st.integers(1, 65535)), host=host.ljust(64, b"\0"))
    if cmd is Cmd.COMM_ALLREDUCE:
        return CommAllreduceRequest(device=draw(_DEVICES), tensor=tensor_in_region())
    raise AssertionError(f"no request strategy for {cmd}")  # pragma: no cover


def _draw_response(draw, d: Dialect, request: Message) -> Message:
    cmd = request.cmd
    layout = spec_for(d, cmd).response
    if layout.cls is EmptyResponse:
        return EmptyResponse(cmd)
    if cmd is Cmd.HELLO:
        major, minor, patch = d.version
        if not d.hello_caps:
            return HelloResponse(major=major, minor=minor, patch=patch)
        flags = draw(st.sampled_from((0, SERVER_FLAG_CACHE))) if d.server_flags else 0
        return HelloResponse(major=major, minor=minor, patch=patch, flags=flags,
                             conn_caps=draw(conn_caps()))
    if cmd is Cmd.DEVICE_COUNT:
        return DeviceCountResponse(device_count=draw(st.integers(1, 16)))
    if cmd is Cmd.ALLOC_BUFFER:
        if draw(st.integers(0, 7)) == 0:  # allocation failure is answered with zeros
            return AllocBufferResponse()
        return AllocBufferResponse(remote_ptr=draw(_heap_pointers(16)), remote_size=request.size)
    if cmd is Cmd.GET_ALIGNMENT:
        return GetAlignmentResponse(alignment=1 << draw(st.integers(0, 12)))
    if cmd is Cmd.GET_MAX_SIZE:
        return GetMaxSizeResponse(max_size=draw(st.just(U64_MAX) | st.integers(1, U64_MAX)))
    if cmd is Cmd.BUFFER_GET_BASE:
        return BufferGetBaseResponse(base_ptr=draw(_heap_pointers(32)))
    if cmd is Cmd.SET_TENSOR_HASH:
        return SetTensorHashResponse(result=draw(st.integers(0, 1)))
    if cmd is Cmd.GET_TENSOR:
        return GetTensorResponse(data=draw(st.binary(min_size=request.size, max_size=request.size)))
    if cmd is Cmd.GET_TENSOR_2D:
        n = request.size * request.n_copies
        return GetTensor2DResponse(data=draw(st.binary(min_size=n, max_size=n)))
    if cmd is Cmd.COPY_TENSOR:
        return CopyTensorResponse(result=draw(st.integers(0, 1)))
    if cmd is Cmd.GET_DEVICE_MEMORY:
        total = draw(st.integers(0, 1 << 40))
        return GetDeviceMemoryResponse(free_mem=draw(st.integers(0, total)), total_mem=total)
    if cmd is Cmd.GET_ALLOC_SIZE:
        return GetAllocSizeResponse(alloc_size=draw(st.integers(0, 1 << 32)))
    if cmd is Cmd.GET_DEVICE_SUPPORTS_OP:
        return SupportsOpResponse(supported=draw(st.integers(0, 1)))
    if cmd is Cmd.COMM_INIT:
        return CommInitResponse(ok=draw(st.integers(0, 1)))
    raise AssertionError(f"no response strategy for {cmd}")  # pragma: no cover


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


def _regions(buffers, default: st.SearchStrategy[BufferRegion] | None = None,
             ) -> st.SearchStrategy[BufferRegion]:
    if buffers is None:
        return default if default is not None else buffer_regions()
    if isinstance(buffers, st.SearchStrategy):
        return buffers
    return _sampled(tuple(buffers))


@lru_cache(maxsize=256)
def _sampled(items: tuple) -> st.SearchStrategy:
    return st.sampled_from(items)


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


# ---------------------------------------------------------------- mutations

class Mutation(NamedTuple):
    """A structured mutation: ``description`` (JSON-ready dict) and the wire ``data``."""

    description: dict
    data: bytes


MUTATION_KINDS = ("framing", "flag", "field")
FRAMING_WHATS = ("len_too_small", "len_too_large", "len_huge", "len_large", "truncated",
                 "trailing_garbage", "unknown_cmd", "hello_missing", "hello_repeated")
FLAG_WHATS = ("hello_flags", "server_conn_caps", "client_conn_caps", "cache_flag")
_TENSOR_WHATS = ("type_out_of_range", "type_removed", "ne_extreme", "ne_unaligned", "nb_extreme",
                 "data_near_bounds", "buffer_invalid", "view_extreme", "op_invalid",
                 "op_params_extreme", "flags_extreme", "src_ids", "name_bytes",
                 "use_count_extreme")
_COMMAND_WHATS = ("offset_near_bounds", "size_near_bounds", "device_invalid", "handle_invalid",
                  "uid_extreme", "n_copies_extreme", "stride_extreme", "data_length_mismatch",
                  "comm_params")
_GRAPH_WHATS = ("n_nodes_mismatch", "n_tensors_mismatch", "node_id", "graph_shape",
                "graph_trailing", "graph_depth")
FIELD_WHATS = _TENSOR_WHATS + _COMMAND_WHATS + _GRAPH_WHATS
_WHATS = {"framing": FRAMING_WHATS, "flag": FLAG_WHATS, "field": FIELD_WHATS}

#: Keys every description has (name -> type). Optional extras: ``value`` (int or str: the
#: value written), ``case`` (str: which edge, e.g. ``"end-nbytes+1"``), ``index`` (int:
#: array element or byte index), ``eof`` (bool: close the sending side after ``data``).
DESCRIPTION_KEYS = {"kind": str, "what": str, "cmd": str, "cmd_id": int, "field": str,
                    "dialect": str, "direction": str, "at": str}
_OPTIONAL_KEYS = {"value": (int, str), "case": str, "index": int, "eof": bool}
_ATS = ("connect", "after_hello", "after_setup")


def check_description(desc: dict) -> None:
    """Raise ValueError unless ``desc`` is a well-formed mutation description.

    ``at`` says where ``data`` goes: ``"connect"`` (first bytes of a fresh connection, or for
    ``direction == "response"`` the answer to the client's HELLO), ``"after_hello"`` (after a
    successful plain HELLO, see :func:`hello_request_frame`), ``"after_setup"`` (after the
    buffers passed to the strategy were allocated on this connection).
    """
    problems = []
    for key, typ in DESCRIPTION_KEYS.items():
        if key not in desc:
            problems.append(f"missing {key!r}")
        elif not isinstance(desc[key], typ) or isinstance(desc[key], bool):
            problems.append(f"{key!r} must be {typ.__name__}, got {desc[key]!r}")
    for key, value in desc.items():
        if key in DESCRIPTION_KEYS:
            continue
        if key not in _OPTIONAL_KEYS:
            problems.append(f"unknown key {key!r}")
        elif (not isinstance(value, _OPTIONAL_KEYS[key])
              or (key != "eof" and isinstance(value, bool))):  # bool is an int subclass
            problems.append(f"{key!r} has the wrong type: {value!r}")
    if not problems:
        if desc["kind"] not in _WHATS:
            problems.append(f"unknown kind {desc['kind']!r}")
        elif desc["what"] not in _WHATS[desc["kind"]]:
            problems.append(f"unknown {desc['kind']} mutation {desc['what']!r}")
        if desc["direction"] not in ("request", "response"):
            problems.append(f"bad direction {desc['direction']!r}")
        if desc["at"] not in _ATS:
            problems.append(f"bad at {desc['at']!r}")
        if desc["dialect"] not in DIALECTS:
            problems.append(f"unknown dialect {desc['dialect']!r}")
        elif not 0 <= desc["cmd_id"] <= 255:
            problems.append(f"cmd_id {desc['cmd_id']} is not a byte")
        else:
            known = DIALECTS[desc["dialect"]].ids.get(desc["cmd_id"])
            expected = known.value if known is not None else f"UNKNOWN_{desc['cmd_id']}"
            if desc["cmd"] != expected:
                problems.append(f"cmd {desc['cmd']!r} does not match cmd_id {desc['cmd_id']} "
                                f"({expected})")
        if not desc["field"]:
            problems.append("empty field")
    if problems:
        raise ValueError("malformed mutation description: " + "; ".join(problems))


def _desc(kind: str, what: str, d: Dialect, cmd: Cmd | int, field: str, *,
          direction: str = "request", at: str = "after_hello", **extra) -> dict:
    cmd_id = d.id_of(cmd) if isinstance(cmd, Cmd) else cmd
    known = d.ids.get(cmd_id)
    desc = {"kind": kind, "what": what, "cmd": known.value if known else f"UNKNOWN_{cmd_id}",
            "cmd_id": cmd_id, "field": field, "dialect": d.name, "direction": direction,
            "at": at}
    desc.update({k: v for k, v in extra.items() if v is not None})
    return desc


def _header(cmd_id: int, length: int) -> bytes:
    return struct.pack("<BQ", cmd_id, length)


def _min_payload(d: Dialect, msg: Message) -> int:
    """Smallest payload length the receiver accepts for this message (exact for fixed sizes)."""
    layout = spec_for(d, msg.cmd).request
    if isinstance(layout, GraphLayout):
        return len(pack_request_payload(d, msg)) - len(msg.trailing)
    return layout.fixed_size


def _is_fixed(d: Dialect, cmd: Cmd) -> bool:
    return not spec_for(d, cmd).request.variable


def _at_for(cmd: Cmd) -> str:
    return "connect" if cmd is Cmd.HELLO else "after_hello"


# -- framing

def _framing_candidates(d: Dialect, cmd: Cmd | None = None) -> list[tuple[str, Cmd | None]]:
    cmds = _commands(d, cmd, "request")
    out: list[tuple[str, Cmd | None]] = []
    for c in cmds:
        layout = spec_for(d, c).request
        if isinstance(layout, GraphLayout) or layout.fixed_size > 0:
            out.append(("len_too_small", c))
        if _is_fixed(d, c):
            out.append(("len_too_large", c))
        else:
            out.append(("len_large", c))
        out += [("len_huge", c), ("truncated", c), ("trailing_garbage", c)]
        out.append(("hello_repeated" if c is Cmd.HELLO else "hello_missing", c))
    if cmd is None:
        out.append(("unknown_cmd", None))
    return out


_HUGE_LENGTHS = (1 << 41, 1 << 48, 1 << 62, 1 << 63, U64_MAX)


@st.composite
def _framing(draw, d: Dialect, what: str, cmd: Cmd | None, buffers) -> Mutation:
    if what == "unknown_cmd":
        unknown = [i for i in range(256) if i not in d.ids]
        interesting = [i for i in (18, 19, 20, 21, 22, 23, 24, 127, 128, 255) if i in unknown]
        cid = draw(st.one_of(st.sampled_from(interesting), st.sampled_from(unknown)))
        payload = draw(st.binary(max_size=16))
        return Mutation(_desc("framing", what, d, cid, "cmd", value=cid),
                        _header(cid, len(payload)) + payload)
    msg = _draw_request(draw, d, cmd, draw(_regions(buffers)))
    frame = pack_request(d, msg)
    cid, payload = frame[0], frame[REQUEST_HEADER_SIZE:]
    at = _at_for(cmd)
    if what == "len_too_small":
        n = draw(st.integers(0, _min_payload(d, msg) - 1))
        return Mutation(_desc("framing", what, d, cmd, "len", at=at, value=n),
                        _header(cid, n) + payload[:n])
    if what == "len_too_large":
        extra = draw(st.binary(min_size=1, max_size=64))
        n = len(payload) + len(extra)
        return Mutation(_desc("framing", what, d, cmd, "len", at=at, value=n),
                        _header(cid, n) + payload + extra)
    if what in ("len_huge", "len_large"):
        n = draw(st.sampled_from(_HUGE_LENGTHS) if what == "len_huge"
                 else st.integers(1 << 20, 1 << 40))
        return Mutation(_desc("framing", what, d, cmd, "len", at=at, value=n),
                        _header(cid, n) + payload)
    if what == "truncated":
        cut = draw(st.integers(1, len(frame) - 1))
        field = "len" if cut < REQUEST_HEADER_SIZE else "payload"
        return Mutation(_desc("framing", what, d, cmd, field, at=at, value=cut, eof=True),
                        frame[:cut])
    if what == "trailing_garbage":
        # Garbage that cannot complete a frame: a bare partial header, or an unknown command.
        known = sorted(i for i in d.ids if i != HELLO_ID)
        unknown = [i for i in range(256) if i not in d.ids]
        partial = st.builds(lambda c, rest: bytes([c]) + rest, st.sampled_from(known),
                            st.binary(max_size=REQUEST_HEADER_SIZE - 2))
        foreign = st.builds(lambda c, rest: bytes([c]) + rest, st.sampled_from(unknown),
                            st.binary(max_size=32))
        garbage = draw(st.one_of(partial, foreign))
        return Mutation(_desc("framing", what, d, cmd, "frame", at=at, value=len(garbage)),
                        frame + garbage)
    if what == "hello_missing":
        return Mutation(_desc("framing", what, d, cmd, "cmd", at="connect"), frame)
    if what == "hello_repeated":
        return Mutation(_desc("framing", what, d, cmd, "cmd", at="after_hello"), frame)
    raise AssertionError(what)  # pragma: no cover


def _only(candidates: list, what: str | None, label: str) -> list:
    """Restrict (what, cmd) candidates to one operator; refuse one that cannot apply."""
    if what is None:
        return candidates
    kept = [c for c in candidates if c[0] == what]
    if not kept:
        raise ValueError(f"no {label} mutation {what!r} applies here")
    return kept


def framing_mutations(dialect: Dialect | str, cmd: Cmd | str | None = None, *,
                      what: str | None = None,
                      buffers: Buffers = None,
                      ) -> st.SearchStrategy[Mutation]:
    """Framing mutations of valid request frames (``kind == "framing"``, see
    :data:`FRAMING_WHATS`):

    * ``len_too_small`` -- length below the exact/minimum payload size, payload cut to it;
    * ``len_too_large`` -- fixed-size commands: length above the exact size, payload padded;
    * ``len_huge`` -- length 2**41 .. 2**64-1 followed by the original payload;
    * ``len_large`` -- variable-size commands: 1 MiB .. 1 TiB (not specified for real
      servers, spec 15.1);
    * ``truncated`` -- a valid frame cut inside header or payload, then EOF (``eof: True``);
    * ``trailing_garbage`` -- a valid frame followed by a partial header or an unknown command;
    * ``unknown_cmd`` -- a command byte the dialect does not define (18..255 for 7.0.0);
    * ``hello_missing`` -- a valid non-HELLO frame as the first bytes of the connection;
    * ``hello_repeated`` -- a second HELLO.

    Mutations of HELLO's own length use ``at == "connect"``.
    """
    d = get_dialect(dialect)
    candidates = _only(_framing_candidates(d, Cmd(cmd) if cmd is not None else None), what,
                       "framing")

    @st.composite
    def build(draw):
        w, c = draw(st.sampled_from(candidates))
        return draw(_framing(d, w, c, buffers))
    return build()


# -- flags

_HELLO_FLAG_BYTES = (0x00, 0x01, 0x02, 0x80, 0xFF)
_CACHE_FLAG_BYTES = (0x00, 0x01, 0x02, 0xFF)


def _flag_candidates(d: Dialect) -> list[tuple[str, Cmd]]:
    out = []
    if d.hello_caps:
        out += [("hello_flags", Cmd.HELLO), ("server_conn_caps", Cmd.HELLO),
                ("client_conn_caps", Cmd.HELLO)]
    if d.cache_flag:
        out.append(("cache_flag", Cmd.SET_TENSOR))
    return out


def _one_hot_caps(draw) -> tuple[int, int, bytes]:
    index = draw(st.integers(0, CONN_CAPS_SIZE - 1))
    value = draw(st.sampled_from((0x01, 0x80, 0xFF)) | st.integers(1, 0xFF))
    caps = bytearray(CONN_CAPS_SIZE)
    caps[index] = value
    return index, value, bytes(caps)


def flag_mutations(dialect: Dialect | str, *, what: str | None = None,
                   buffers: Buffers = None,
                   ) -> st.SearchStrategy[Mutation]:
    """Flag-byte mutations (``kind == "flag"``, see :data:`FLAG_WHATS`):

    * ``hello_flags`` -- HELLO *response* (for client targets) announcing the dialect's
      version with byte 3 in {0x00, 0x01, 0x02, 0x80, 0xFF};
    * ``server_conn_caps`` -- HELLO response whose ``conn_caps`` has exactly one non-zero byte
      (``index``/``value``): "server is RDMA capable" to a client (spec 10.1);
    * ``client_conn_caps`` -- the same in the HELLO request, for server targets;
    * ``cache_flag`` -- a valid SET_TENSOR with ``cache_flag`` in {0, 1, 2, 0xFF}
      (dialects with the cache flag only).
    """
    d = get_dialect(dialect)
    candidates = _flag_candidates(d)
    if not candidates:
        raise ValueError(f"dialect {d.name} has no flag bytes")
    candidates = _only(candidates, what, "flag")

    @st.composite
    def build(draw):
        w, c = draw(st.sampled_from(candidates))
        major, minor, patch = d.version
        if w == "hello_flags":
            value = draw(st.sampled_from(_HELLO_FLAG_BYTES))
            rsp = HelloResponse(major=major, minor=minor, patch=patch, flags=value)
            return Mutation(_desc("flag", w, d, c, "flags", direction="response", at="connect",
                                  value=value), pack_response(d, rsp))
        if w in ("server_conn_caps", "client_conn_caps"):
            index, value, caps = _one_hot_caps(draw)
            if w == "server_conn_caps":
                data = pack_response(d, HelloResponse(major=major, minor=minor, patch=patch,
                                                      conn_caps=caps))
                direction = "response"
            else:
                data, direction = pack_request(d, HelloRequest(conn_caps=caps)), "request"
            return Mutation(_desc("flag", w, d, c, "conn_caps", direction=direction,
                                  at="connect", value=value, index=index), data)
        value = draw(st.sampled_from(_CACHE_FLAG_BYTES))
        msg = replace(_draw_request(draw, d, Cmd.SET_TENSOR, draw(_regions(buffers))),
                      cache_flag=value)
        at = "after_setup" if buffers is not None else "after_hello"
        return Mutation(_desc("flag", w, d, c, "cache_flag", at=at, value=value),
                        pack_request(d, msg))
    return build()


# -- fields

def _tensor_slots(d: Dialect, cmd: Cmd) -> list[str]:
    """Names of the message fields that hold rpc_tensors (``srcs[]``/``tensors[]`` for arrays)."""
    layout = spec_for(d, cmd).request
    if isinstance(layout, GraphLayout):
        return ["tensors[]"]
    out = []
    for name, wt in layout.fields:
        if wt is TENSOR:
            out.append(name)
        elif wt is TENSORS10:
            out.append(name + "[]")
    return out


def _request_fields(d: Dialect, cmd: Cmd) -> set[str]:
    layout = spec_for(d, cmd).request
    if isinstance(layout, GraphLayout):
        return set(layout.offsets) | {"tensors"}
    return {name for name, _ in layout.fields} | ({layout.tail} if layout.tail else set())


_TENSOR_CMDS_WITH_OFFSET = (Cmd.SET_TENSOR, Cmd.SET_TENSOR_HASH, Cmd.GET_TENSOR, Cmd.MEMSET_TENSOR,
                            Cmd.SET_TENSOR_2D, Cmd.GET_TENSOR_2D)
# Commands with a size (SET_TENSOR's is its data length; ALLOC_BUFFER sizes a buffer).
_TENSOR_CMDS_WITH_SIZE = (Cmd.SET_TENSOR, Cmd.GET_TENSOR, Cmd.MEMSET_TENSOR, Cmd.SET_TENSOR_2D,
                          Cmd.GET_TENSOR_2D, Cmd.ALLOC_BUFFER)


def _field_candidates(d: Dialect, cmd: Cmd | None = None) -> list[tuple[str, Cmd]]:
    out: list[tuple[str, Cmd]] = []
    for c in _commands(d, cmd, "request"):
        fields = _request_fields(d, c)
        if _tensor_slots(d, c):
            out += [(w, c) for w in _TENSOR_WHATS]
        if c in _TENSOR_CMDS_WITH_OFFSET:
            out.append(("offset_near_bounds", c))
        if c in _TENSOR_CMDS_WITH_SIZE:
            out.append(("size_near_bounds", c))
        if "device" in fields:
            out.append(("device_invalid", c))
        if "remote_ptr" in fields:
            out.append(("handle_invalid", c))
        if "uid" in fields and d.graph_uid:
            out.append(("uid_extreme", c))
        if c in (Cmd.SET_TENSOR_2D, Cmd.GET_TENSOR_2D):
            out += [("n_copies_extreme", c), ("stride_extreme", c)]
        if c is Cmd.SET_TENSOR_2D:
            out.append(("data_length_mismatch", c))
        if c is Cmd.COMM_INIT:
            out.append(("comm_params", c))
        if c is Cmd.GRAPH_COMPUTE:
            out += [(w, c) for w in _GRAPH_WHATS]
    return out


def _near_bounds(candidates: dict[str, int]) -> st.SearchStrategy[tuple[str, int]]:
    return st.sampled_from(sorted((k, v) for k, v in candidates.items() if 0 <= v <= U64_MAX))


def _mutate_tensor(draw, what: str, t: RpcTensor, region: BufferRegion):
    """Apply one tensor-level mutation; returns (tensor, attribute, extra description)."""
    if what == "type_out_of_range":
        v = draw(st.sampled_from(INVALID_TYPE_IDS))
        return t.with_(type=v), "type", dict(value=v)
    if what == "type_removed":
        v = draw(st.sampled_from(REMOVED_TYPE_IDS))
        return t.with_(type=v), "type", dict(value=v)
    if what == "ne_extreme":
        if draw(st.booleans()):
            ne = (U32_MAX,) * 4  # element count far beyond int64 (spec 3.2 step 3)
            return t.with_(ne=ne), "ne", dict(value=U32_MAX, case="all_dims_max")
        i = draw(st.integers(0, 3))
        v = draw(st.sampled_from((0, I32_MAX, 1 << 31, U32_MAX)))
        ne = list(t.ne)
        ne[i] = v
        return t.with_(ne=tuple(ne)), "ne", dict(value=v, index=i)
    if what == "ne_unaligned":
        # ne[0] not a multiple of the block size: release builds accept it [V q4_0 ne0=33].
        type_id = draw(st.sampled_from([i for i in VALID_TYPE_IDS if ggml.TYPES[i].blck_size > 1]))
        blck = ggml.TYPES[type_id].blck_size
        ne0 = blck * draw(st.integers(0, 3)) + draw(st.integers(1, blck - 1))
        return (t.with_(type=type_id, ne=(ne0,) + t.ne[1:]), "ne",
                dict(value=ne0, index=0, case=ggml.TYPES[type_id].name))
    if what == "nb_extreme":
        i = draw(st.integers(0, 3))
        v = draw(st.sampled_from((0, 1, 1 << 31, U32_MAX)))
        nb = list(t.nb)
        nb[i] = v
        return t.with_(nb=tuple(nb)), "nb", dict(value=v, index=i)
    if what == "data_near_bounds":
        n = _tensor_nbytes(t)
        base, end = region.base, region.end
        case, v = draw(_near_bounds({
            "base-1": base - 1, "base": base, "end-nbytes": end - n, "end-nbytes+1": end - n + 1,
            "end-1": end - 1, "end": end, "end+1": end + 1, "zero": 0, "max": U64_MAX,
            "wrap": (1 << 64) - max(n, 1)}))
        return t.with_(buffer=region.handle, data=v), "data", dict(value=v, case=case)
    if what == "buffer_invalid":
        case, v = draw(_near_bounds({"zero": 0, "handle+1": region.handle + 1,
                                     "handle-16": region.handle - 16, "max": U64_MAX,
                                     "base": region.base}))
        return t.with_(buffer=v), "buffer", dict(value=v, case=case)
    if what == "view_extreme":
        case = draw(st.sampled_from(("self", "unknown", "offs_max", "offs_past_end")))
        if case == "self":
            return t.with_(view_src=t.id), "view_src", dict(case=case)
        if case == "unknown":
            return t.with_(view_src=t.id ^ 0x10_0000), "view_src", dict(case=case)
        v = U64_MAX if case == "offs_max" else region.size + 1
        return (t.with_(view_src=t.id ^ 0x20_0000, view_offs=v), "view_offs",
                dict(value=v, case=case))
    if what == "op_invalid":
        v = draw(st.sampled_from((ggml.OP_COUNT, ggml.OP_COUNT + 1, 255, 1 << 31, U32_MAX)))
        return t.with_(op=v), "op", dict(value=v)
    if what == "op_params_extreme":
        case = draw(st.sampled_from(("all_min", "all_max", "all_minus_one", "random")))
        params = {"all_min": (I32_MIN,) * 16, "all_max": (I32_MAX,) * 16,
                  "all_minus_one": (-1,) * 16}.get(case)
        if params is None:
            params = tuple(draw(st.lists(st.integers(I32_MIN, I32_MAX), min_size=16, max_size=16)))
        return t.with_(op_params=params), "op_params", dict(case=case)
    if what == "flags_extreme":
        v = draw(st.sampled_from((0, -1, I32_MAX, I32_MIN, 0x1F, 0x20)))
        return t.with_(flags=v), "flags", dict(value=v)
    if what == "src_ids":
        case = draw(st.sampled_from(("self", "dangling", "all_ten", "max")))
        src = {"self": (t.id,) + (0,) * 9, "dangling": (t.id ^ 0x40_0000,) + (0,) * 9,
               "all_ten": tuple(t.id + 16 * (i + 1) for i in range(10)),
               "max": (U64_MAX,) * 10}[case]
        return t.with_(src=src), "src", dict(case=case)
    if what == "name_bytes":
        case = draw(st.sampled_from(("unterminated", "binary")))
        name = (draw(st.binary(min_size=64, max_size=64).map(lambda b: bytes(x or 1 for x in b)))
                if case == "unterminated" else draw(tensor_names(raw=True)))
        return t.with_(name=name), "name", dict(case=case)
    if what == "use_count_extreme":
        v = draw(st.sampled_from((-1, I32_MAX, I32_MIN)))
        return t.with_(use_count=v), "use_count", dict(value=v)
    raise AssertionError(what)  # pragma: no cover


def _replace_tensor(msg: Message, slot: str, index: int, t: RpcTensor) -> Message:
    if slot.endswith("[]"):
        name = slot[:-2]
        items = list(getattr(msg, name))
        items[index] = t
        return replace(msg, **{name: tuple(items)})
    return replace(msg, **{slot: t})


def _get_tensor(msg: Message, slot: str, index: int) -> RpcTensor:
    return getattr(msg, slot[:-2])[index] if slot.endswith("[]") else getattr(msg, slot)


# Chain depths for recursion probing: up to 2**17 nodes (a 38 MB frame), far beyond any real
# graph; "output_only" lists just the chain's last node, so a server that resolves sources
# recursively has to walk the whole chain from there (spec 6.2: depth not specified).
_CHAIN_DEPTHS = (64, 1024, 8192, 1 << 17)
_CHAIN_LISTINGS = ("all", "output_only")


def _deep_chain(depth: int, region: BufferRegion, listing: str = "all") -> GraphComputeRequest:
    """A chain of ``depth`` DUP nodes over one leaf, for recursion-depth probing (spec 6.2).

    ``listing``: ``"all"`` puts every node in ``nodes[]`` in execution order (what a client
    sends), ``"output_only"`` only the last one.
    """
    leaf = RpcTensor.make(id=0x1000, ne=(1,), buffer=region.handle if region.size >= 4 else 0,
                          data=region.base if region.size >= 4 else 0, name="leaf")
    tensors = [leaf]
    prev_id = leaf.id
    dup, compute, zeros9 = ggml.OP["DUP"], ggml.FLAG_COMPUTE, (0,) * 9
    for i in range(depth):
        # The constructor directly: dataclasses.replace per node would dominate deep chains.
        node_id = 0x1000 + 16 * (i + 1)
        tensors.append(RpcTensor(node_id, leaf.type, leaf.buffer, leaf.ne, leaf.nb, dup,
                                 leaf.op_params, compute, (prev_id,) + zeros9, 0, 0, leaf.data,
                                 _pad_name(b"n%d" % i), 1))
        prev_id = node_id
    nodes = tuple(t.id for t in tensors[1:]) if listing == "all" else (prev_id,)
    return GraphComputeRequest(nodes=nodes, tensors=tuple(tensors))


@st.composite
def _field(draw, d: Dialect, what: str, cmd: Cmd, buffers) -> Mutation:
    region = draw(_regions(buffers))
    msg = _draw_request(draw, d, cmd, region)
    at = "after_setup" if buffers is not None else "after_hello"

    def done(field: str, m: Message, **extra) -> Mutation:
        return Mutation(_desc("field", what, d, cmd, field, at=at, **extra), pack_request(d, m))

    if what in _TENSOR_WHATS:
        slot = draw(st.sampled_from(_tensor_slots(d, cmd)))
        index = 0
        if slot == "srcs[]":
            if _get_tensor(msg, slot, 0).id == 0:  # make sure the slot holds a real tensor
                msg = _replace_tensor(msg, slot, 0, _draw_tensor(draw, region))
        elif slot == "tensors[]":
            index = draw(st.integers(0, len(msg.tensors) - 1))
        t, attr, extra = _mutate_tensor(draw, what, _get_tensor(msg, slot, index), region)
        field = f"{slot}.{attr}"
        if slot.endswith("[]"):
            extra.setdefault("index", index)
        return done(field, _replace_tensor(msg, slot, index, t), **extra)

    if what == "offset_near_bounds":
        t = msg.tensor
        n = nbytes(t)
        rem = region.end - t.data
        case, v = draw(_near_bounds({"nbytes": n, "nbytes+1": n + 1, "buffer_end": rem,
                                     "buffer_end+1": rem + 1, "half": 1 << 63, "max": U64_MAX}))
        return done("offset", replace(msg, offset=v), value=v, case=case)
    if what == "size_near_bounds":
        if cmd is Cmd.ALLOC_BUFFER:
            v = draw(st.sampled_from((0, 1, 1 << 40, 1 << 62, 1 << 63, U64_MAX)))
            return done("size", replace(msg, size=v), value=v)
        if cmd is Cmd.SET_TENSOR:
            # Data length is the size: write k / k+1 bytes ending at the buffer end, or 0
            # bytes exactly at it (rejected by the region check's >=, spec 3.4).
            rem = region.end - msg.tensor.data
            k = draw(st.integers(0, min(rem, 64)))
            case = draw(st.sampled_from(("fits_end", "one_past_end", "empty_at_end")))
            offset = rem - k if case != "empty_at_end" else rem
            length = {"fits_end": k, "one_past_end": k + 1, "empty_at_end": 0}[case]
            m = replace(msg, offset=offset, data=draw(st.binary(min_size=length, max_size=length)))
            return done("data", m, value=length, case=case)
        t = msg.tensor
        n, rem = nbytes(t), region.end - t.data
        case, v = draw(_near_bounds({"zero": 0, "nbytes-offset": n - msg.offset,
                                     "nbytes-offset+1": n - msg.offset + 1,
                                     "buffer_end": rem - msg.offset,
                                     "buffer_end+1": rem - msg.offset + 1,
                                     "half": 1 << 63, "max": U64_MAX}))
        return done("size", replace(msg, size=v), value=v, case=case)
    if what == "device_invalid":
        v = draw(st.sampled_from((1, 7, 255, 1 << 31, U32_MAX)))
        return done("device", replace(msg, device=v), value=v)
    if what == "handle_invalid":
        case, v = draw(_near_bounds({"zero": 0, "handle+1": region.handle + 1,
                                     "handle-16": region.handle - 16, "max": U64_MAX,
                                     "base": region.base}))
        return done("remote_ptr", replace(msg, remote_ptr=v), value=v, case=case)
    if what == "uid_extreme":
        v = draw(st.sampled_from((0, 1, U64_MAX)) | st.integers(0, U64_MAX))
        return done("uid", replace(msg, uid=v), value=v)
    if what == "n_copies_extreme":
        v = draw(st.sampled_from((0, 1 << 32, U64_MAX)))
        return done("n_copies", replace(msg, n_copies=v), value=v)
    if what == "stride_extreme":
        case, v = draw(_near_bounds({"zero": 0, "size-1": msg.size - 1, "half": 1 << 63,
                                     "max": U64_MAX}))
        return done("stride", replace(msg, stride=v), value=v, case=case)
    if what == "data_length_mismatch":
        n = msg.size * msg.n_copies + draw(st.sampled_from((-1, 1)))
        return done("data", replace(msg, data=bytes(n)), value=n)
    if what == "comm_params":
        attr = draw(st.sampled_from(("world", "rank", "port", "host")))
        if attr == "host":
            return done("host", replace(msg, host=b"A" * 64), case="unterminated")
        v = draw(st.sampled_from({"world": (0, 1, 3, U32_MAX), "rank": (2, U32_MAX),
                                  "port": (0, 65536, U32_MAX)}[attr]))
        return done(attr, replace(msg, **{attr: v}), value=v)

    # graph structure: GRAPH_COMPUTE only
    layout = spec_for(d, cmd).request
    if what in ("n_nodes_mismatch", "n_tensors_mismatch"):
        frame = bytearray(pack_request(d, msg))
        if what == "n_nodes_mismatch":
            off = REQUEST_HEADER_SIZE + layout.offsets["n_nodes"]
            actual, field = len(msg.nodes), "graph.n_nodes"
        else:
            off = REQUEST_HEADER_SIZE + layout.offsets["nodes"] + 8 * len(msg.nodes)
            actual, field = len(msg.tensors), "graph.n_tensors"
        v = draw(st.sampled_from((actual + 1, U32_MAX)) | st.integers(actual + 1, actual + 1000))
        struct.pack_into("<I", frame, off, v)
        return Mutation(_desc("field", what, d, cmd, field, at=at, value=v), bytes(frame))
    if what == "node_id":
        case = draw(st.sampled_from(("zero", "unknown")))
        known = {t.id for t in msg.tensors}
        bad = 0 if case == "zero" else next(i for i in range(0x9000, 1 << 20, 16) if i not in known)
        i = draw(st.integers(0, len(msg.nodes) - 1))
        nodes = msg.nodes[:i] + (bad,) + msg.nodes[i + 1:]
        return done("graph.nodes", replace(msg, nodes=nodes), value=bad, case=case, index=i)
    if what == "graph_shape":
        shape = draw(st.sampled_from(("cycle", "duplicate_ids", "dangling")))
        g = _draw_graph(draw, d, region, shape=shape)
        return done("graph.tensors", g, case=shape)
    if what == "graph_trailing":
        trailing = draw(st.binary(min_size=1, max_size=64))
        return done("graph.trailing", replace(msg, trailing=trailing), value=len(trailing))
    if what == "graph_depth":
        depth = draw(st.sampled_from(_CHAIN_DEPTHS))
        listing = draw(st.sampled_from(_CHAIN_LISTINGS))
        g = _deep_chain(depth, region, listing)
        return done("graph.nodes", replace(g, uid=msg.uid, device=msg.device), value=depth,
                    case=listing)
    raise AssertionError(what)  # pragma: no cover


def field_mutations(dialect: Dialect | str, cmd: Cmd | str | None = None, *,
                    what: str | None = None,
                    buffers: Buffers = None,
                    ) -> st.SearchStrategy[Mutation]:
    """Field mutations of otherwise valid requests (``kind == "field"``, see
    :data:`FIELD_WHATS`). The frame stays well-framed (except the graph count mutations,
    whose counts disagree with the payload on purpose); one field takes an edge value:

    * any ``rpc_tensor`` slot (``field`` like ``"tensor.type"``, ``"srcs[].data"``,
      ``"tensors[].op"`` with ``index``): type 43/99/..., removed types 4/5/31..., ``ne``/``nb``
      extremes, ``ne[0]`` not a block multiple, ``data`` near the buffer bounds
      (``case`` e.g. ``"end-nbytes+1"``), invalid ``buffer``, ``view_src``/``view_offs``,
      op >= 101, ``op_params``, ``flags``, ``src`` ids, unterminated/binary ``name``,
      ``use_count``;
    * command fields: ``offset``/``size`` near tensor and buffer bounds, out-of-range
      ``device``, unknown ``remote_ptr``, ``uid``, 2D ``n_copies``/``stride``/data length,
      COMM_INIT parameters;
    * GRAPH_COMPUTE: ``n_nodes``/``n_tensors`` larger than the payload, node id 0 or unknown,
      hostile shapes (cycle, duplicate ids, dangling src), trailing bytes, deep chains.

    With ``buffers`` (live :class:`BufferRegion` s of the target connection) the bounds are
    relative to real buffers and ``at == "after_setup"``.
    """
    d = get_dialect(dialect)
    candidates = _field_candidates(d, Cmd(cmd) if cmd is not None else None)
    if not candidates:
        raise ValueError(f"no field mutation applies to {cmd} in dialect {d.name}")
    candidates = _only(candidates, what, "field")

    @st.composite
    def build(draw):
        w, c = draw(st.sampled_from(candidates))
        return draw(_field(d, w, c, buffers))
    return build()


def mutations(dialect: Dialect | str, *, kinds: Iterable[str] = MUTATION_KINDS,
              buffers: Buffers = None,
              ) -> st.SearchStrategy[Mutation]:
    """Any structured mutation of ``dialect``: the union of :func:`framing_mutations`,
    :func:`flag_mutations` and :func:`field_mutations` (restrict with ``kinds``)."""
    d = get_dialect(dialect)
    parts = []
    for kind in kinds:
        if kind == "framing":
            parts.append(framing_mutations(d, buffers=buffers))
        elif kind == "flag":
            if _flag_candidates(d):
                parts.append(flag_mutations(d, buffers=buffers))
        elif kind == "field":
            parts.append(field_mutations(d, buffers=buffers))
        else:
            raise ValueError(f"unknown mutation kind {kind!r}")
    return st.one_of(parts)


def mutation_catalogue(dialect: Dialect | str) -> list[dict]:
    """Every ``{"kind", "what", "cmd"}`` combination the mutation strategies can draw for
    ``dialect`` -- the denominator of a fuzz report's coverage table. ``unknown_cmd`` is listed
    once with ``cmd == "UNKNOWN"`` (its descriptions say ``"UNKNOWN_<id>"``)."""
    d = get_dialect(dialect)
    out = []
    for kind, cands in (("framing", _framing_candidates(d)), ("flag", _flag_candidates(d)),
                        ("field", _field_candidates(d))):
        for what, cmd in cands:
            out.append({"kind": kind, "what": what, "cmd": cmd.value if cmd else "UNKNOWN"})
    return out
