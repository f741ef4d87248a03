"""Field mutations (``kind == "field"``) of otherwise valid requests. The frame stays
well-framed (except the graph count mutations, whose counts disagree with the payload on
purpose); one field takes an edge value:

* any ``rpc_tensor`` slot (``field`` like ``"tensor.type"``, ``"srcs[].data"``,
  ``"tensors[].op"`` with ``index``): type 43/99/..., removed types 4/5/31..., ``ne``/``nb``
  extremes, ``ne[0]`` not a block multiple, ``data`` near the buffer bounds (``case`` e.g.
  ``"end-nbytes+1"``), invalid ``buffer``, ``view_src``/``view_offs``, op >= 101,
  ``op_params``, ``flags``, ``src`` ids, unterminated/binary ``name``, ``use_count``;
* command fields: ``offset``/``size`` near tensor and buffer bounds, out-of-range ``device``,
  unknown ``remote_ptr``, ``uid``, 2D ``n_copies``/``stride``/data length, COMM_INIT
  parameters;
* GRAPH_COMPUTE: ``n_nodes``/``n_tensors`` larger than the payload, node id 0 or unknown,
  hostile shapes (cycle, duplicate ids, dangling src), trailing bytes, deep chains.

With ``buffers`` (live :class:`BufferRegion` s of the target connection) the bounds are
relative to real buffers and ``at == "after_setup"``.
"""

from __future__ import annotations

import struct
from dataclasses import replace

from hypothesis import strategies as st

from ..proto import ggml
from ..proto.codec import REQUEST_HEADER_SIZE, pack_request
from ..proto.constants import Cmd
from ..proto.messages import spec_for
from ..proto.tensor import nbytes
from .basics import (I32_MAX, I32_MIN, INVALID_TYPE_IDS, REMOVED_TYPE_IDS, U32_MAX, U64_MAX,
                     VALID_TYPE_IDS, _tensor_nbytes, tensor_names)
from .graphs import _CHAIN_DEPTHS, _CHAIN_LISTINGS, _deep_chain, _draw_graph
from .registry import mutation, request_fields, tensor_mutation


def _near_bounds(candidates: dict[str, int]) -> st.SearchStrategy[tuple[str, int]]:
    return st.sampled_from(sorted((k, v) for k, v in candidates.items() if 0 <= v <= U64_MAX))


def _handle_cases(region) -> dict[str, int]:
    return {"zero": 0, "handle+1": region.handle + 1, "handle-16": region.handle - 16,
            "max": U64_MAX, "base": region.base}


# ---------------------------------------------------------------- one rpc_tensor
# Each: (draw, tensor, region) -> (mutated tensor, attribute, extra description).

@tensor_mutation("type_out_of_range", fields=("type",))
def _(draw, t, region):
    v = draw(st.sampled_from(INVALID_TYPE_IDS))
    return t.with_(type=v), "type", dict(value=v)


@tensor_mutation("type_removed", fields=("type",))
def _(draw, t, region):
    v = draw(st.sampled_from(REMOVED_TYPE_IDS))
    return t.with_(type=v), "type", dict(value=v)


@tensor_mutation("ne_extreme", fields=("ne",))
def _(draw, t, region):
    if draw(st.booleans()):
        ne = (U32_MAX,) * 4  # element count far beyond int64 (spec 3.2 step 3)
        return t.with_(ne=ne), "ne", dict(value=U32_MAX, case="all_dims_max")
    i = draw(st.integers(0, 3))
    v = draw(st.sampled_from((0, I32_MAX, 1 << 31, U32_MAX)))
    ne = list(t.ne)
    ne[i] = v
    return t.with_(ne=tuple(ne)), "ne", dict(value=v, index=i)


@tensor_mutation("ne_unaligned", fields=("ne",))
def _(draw, t, region):
    # ne[0] not a multiple of the block size: release builds accept it [V q4_0 ne0=33].
    type_id = draw(st.sampled_from([i for i in VALID_TYPE_IDS if ggml.TYPES[i].blck_size > 1]))
    blck = ggml.TYPES[type_id].blck_size
    ne0 = blck * draw(st.integers(0, 3)) + draw(st.integers(1, blck - 1))
    return (t.with_(type=type_id, ne=(ne0,) + t.ne[1:]), "ne",
            dict(value=ne0, index=0, case=ggml.TYPES[type_id].name))


@tensor_mutation("nb_extreme", fields=("nb",))
def _(draw, t, region):
    i = draw(st.integers(0, 3))
    v = draw(st.sampled_from((0, 1, 1 << 31, U32_MAX)))
    nb = list(t.nb)
    nb[i] = v
    return t.with_(nb=tuple(nb)), "nb", dict(value=v, index=i)


@tensor_mutation("data_near_bounds", fields=("data",))
def _(draw, t, region):
    n = _tensor_nbytes(t)
    base, end = region.base, region.end
    case, v = draw(_near_bounds({
        "base-1": base - 1, "base": base, "end-nbytes": end - n, "end-nbytes+1": end - n + 1,
        "end-1": end - 1, "end": end, "end+1": end + 1, "zero": 0, "max": U64_MAX,
        "wrap": (1 << 64) - max(n, 1)}))
    return t.with_(buffer=region.handle, data=v), "data", dict(value=v, case=case)


@tensor_mutation("buffer_invalid", fields=("buffer",))
def _(draw, t, region):
    case, v = draw(_near_bounds(_handle_cases(region)))
    return t.with_(buffer=v), "buffer", dict(value=v, case=case)


@tensor_mutation("view_extreme", fields=("view_src", "view_offs"))
def _(draw, t, region):
    case = draw(st.sampled_from(("self", "unknown", "offs_max", "offs_past_end")))
    if case == "self":
        return t.with_(view_src=t.id), "view_src", dict(case=case)
    if case == "unknown":
        return t.with_(view_src=t.id ^ 0x10_0000), "view_src", dict(case=case)
    v = U64_MAX if case == "offs_max" else region.size + 1
    return t.with_(view_src=t.id ^ 0x20_0000, view_offs=v), "view_offs", dict(value=v, case=case)


@tensor_mutation("op_invalid", fields=("op",))
def _(draw, t, region):
    v = draw(st.sampled_from((ggml.OP_COUNT, ggml.OP_COUNT + 1, 255, 1 << 31, U32_MAX)))
    return t.with_(op=v), "op", dict(value=v)


@tensor_mutation("op_params_extreme", fields=("op_params",))
def _(draw, t, region):
    case = draw(st.sampled_from(("all_min", "all_max", "all_minus_one", "random")))
    params = {"all_min": (I32_MIN,) * 16, "all_max": (I32_MAX,) * 16,
              "all_minus_one": (-1,) * 16}.get(case)
    if params is None:
        params = tuple(draw(st.lists(st.integers(I32_MIN, I32_MAX), min_size=16, max_size=16)))
    return t.with_(op_params=params), "op_params", dict(case=case)


@tensor_mutation("flags_extreme", fields=("flags",))
def _(draw, t, region):
    v = draw(st.sampled_from((0, -1, I32_MAX, I32_MIN, 0x1F, 0x20)))
    return t.with_(flags=v), "flags", dict(value=v)


@tensor_mutation("src_ids", fields=("src",))
def _(draw, t, region):
    case = draw(st.sampled_from(("self", "dangling", "all_ten", "max")))
    src = {"self": (t.id,) + (0,) * 9, "dangling": (t.id ^ 0x40_0000,) + (0,) * 9,
           "all_ten": tuple(t.id + 16 * (i + 1) for i in range(10)),
           "max": (U64_MAX,) * 10}[case]
    return t.with_(src=src), "src", dict(case=case)


@tensor_mutation("name_bytes", fields=("name",))
def _(draw, t, region):
    case = draw(st.sampled_from(("unterminated", "binary")))
    name = (draw(st.binary(min_size=64, max_size=64).map(lambda b: bytes(x or 1 for x in b)))
            if case == "unterminated" else draw(tensor_names(raw=True)))
    return t.with_(name=name), "name", dict(case=case)


@tensor_mutation("use_count_extreme", fields=("use_count",))
def _(draw, t, region):
    v = draw(st.sampled_from((-1, I32_MAX, I32_MIN)))
    return t.with_(use_count=v), "use_count", dict(value=v)


# ---------------------------------------------------------------- command fields

_TENSOR_CMDS_WITH_OFFSET = (Cmd.SET_TENSOR, Cmd.SET_TENSOR_HASH, Cmd.GET_TENSOR, Cmd.MEMSET_TENSOR,
                            Cmd.SET_TENSOR_2D, Cmd.GET_TENSOR_2D)
# Commands with a size (SET_TENSOR's is its data length; ALLOC_BUFFER sizes a buffer).
_TENSOR_CMDS_WITH_SIZE = (Cmd.SET_TENSOR, Cmd.GET_TENSOR, Cmd.MEMSET_TENSOR, Cmd.SET_TENSOR_2D,
                          Cmd.GET_TENSOR_2D, Cmd.ALLOC_BUFFER)
_2D = (Cmd.SET_TENSOR_2D, Cmd.GET_TENSOR_2D)


def _has(field: str):
    return lambda d, c: field in request_fields(d, c)


@mutation("field", "offset_near_bounds", fields=("offset",),
          applies=lambda d, c: c in _TENSOR_CMDS_WITH_OFFSET)
def _(draw, site):
    msg, region = site.request, site.region
    n = nbytes(msg.tensor)
    rem = region.end - msg.tensor.data
    case, v = draw(_near_bounds({"nbytes": n, "nbytes+1": n + 1, "buffer_end": rem,
                                 "buffer_end+1": rem + 1, "half": 1 << 63, "max": U64_MAX}))
    return site.mutation("offset", replace(msg, offset=v), value=v, case=case)


@mutation("field", "size_near_bounds",
          fields=lambda d, c: ("data",) if c is Cmd.SET_TENSOR else ("size",),
          applies=lambda d, c: c in _TENSOR_CMDS_WITH_SIZE)
def _(draw, site):
    msg, region = site.request, site.region
    if site.cmd is Cmd.ALLOC_BUFFER:
        v = draw(st.sampled_from((0, 1, 1 << 40, 1 << 62, 1 << 63, U64_MAX)))
        return site.mutation("size", replace(msg, size=v), value=v)
    if site.cmd is Cmd.SET_TENSOR:
        # Data length is the size: write k / k+1 bytes ending at the buffer end, or 0 bytes
        # exactly at it (rejected by the region check's >=, spec 3.4).
        rem = region.end - msg.tensor.data
        k = draw(st.integers(0, min(rem, 64)))
        case = draw(st.sampled_from(("fits_end", "one_past_end", "empty_at_end")))
        offset = rem - k if case != "empty_at_end" else rem
        length = {"fits_end": k, "one_past_end": k + 1, "empty_at_end": 0}[case]
        m = replace(msg, offset=offset, data=draw(st.binary(min_size=length, max_size=length)))
        return site.mutation("data", m, value=length, case=case)
    n, rem = nbytes(msg.tensor), region.end - msg.tensor.data
    case, v = draw(_near_bounds({"zero": 0, "nbytes-offset": n - msg.offset,
                                 "nbytes-offset+1": n - msg.offset + 1,
                                 "buffer_end": rem - msg.offset,
                                 "buffer_end+1": rem - msg.offset + 1,
                                 "half": 1 << 63, "max": U64_MAX}))
    return site.mutation("size", replace(msg, size=v), value=v, case=case)


@mutation("field", "device_invalid", fields=("device",), applies=_has("device"))
def _(draw, site):
    v = draw(st.sampled_from((1, 7, 255, 1 << 31, U32_MAX)))
    return site.mutation("device", replace(site.request, device=v), value=v)


@mutation("field", "handle_invalid", fields=("remote_ptr",), applies=_has("remote_ptr"))
def _(draw, site):
    msg = site.request
    case, v = draw(_near_bounds(_handle_cases(site.region)))
    return site.mutation("remote_ptr", replace(msg, remote_ptr=v), value=v, case=case)


@mutation("field", "uid_extreme", fields=("uid",),
          applies=lambda d, c: d.graph_uid and "uid" in request_fields(d, c))
def _(draw, site):
    msg = site.request
    v = draw(st.sampled_from((0, 1, U64_MAX)) | st.integers(0, U64_MAX))
    return site.mutation("uid", replace(msg, uid=v), value=v)


@mutation("field", "n_copies_extreme", fields=("n_copies",), applies=lambda d, c: c in _2D)
def _(draw, site):
    msg = site.request
    v = draw(st.sampled_from((0, 1 << 32, U64_MAX)))
    return site.mutation("n_copies", replace(msg, n_copies=v), value=v)


@mutation("field", "stride_extreme", fields=("stride",), applies=lambda d, c: c in _2D)
def _(draw, site):
    msg = site.request
    case, v = draw(_near_bounds({"zero": 0, "size-1": msg.size - 1, "half": 1 << 63,
                                 "max": U64_MAX}))
    return site.mutation("stride", replace(msg, stride=v), value=v, case=case)


@mutation("field", "data_length_mismatch", fields=("data",),
          applies=lambda d, c: c is Cmd.SET_TENSOR_2D)
def _(draw, site):
    msg = site.request
    n = msg.size * msg.n_copies + draw(st.sampled_from((-1, 1)))
    return site.mutation("data", replace(msg, data=bytes(n)), value=n)


@mutation("field", "comm_params", fields=("world", "rank", "port", "host"),
          applies=lambda d, c: c is Cmd.COMM_INIT)
def _(draw, site):
    msg = site.request
    attr = draw(st.sampled_from(("world", "rank", "port", "host")))
    if attr == "host":
        return site.mutation("host", replace(msg, host=b"A" * 64), case="unterminated")
    v = draw(st.sampled_from({"world": (0, 1, 3, U32_MAX), "rank": (2, U32_MAX),
                              "port": (0, 65536, U32_MAX)}[attr]))
    return site.mutation(attr, replace(msg, **{attr: v}), value=v)


# ---------------------------------------------------------------- graph structure

def _graph(d, c) -> bool:
    return c is Cmd.GRAPH_COMPUTE


def _count_mismatch(draw, site, count: str, actual: int, offset: int):
    frame = bytearray(pack_request(site.d, site.request))
    v = draw(st.sampled_from((actual + 1, U32_MAX)) | st.integers(actual + 1, actual + 1000))
    struct.pack_into("<I", frame, REQUEST_HEADER_SIZE + offset, v)
    return site.mutation(f"graph.{count}", bytes(frame), value=v)


@mutation("field", "n_nodes_mismatch", fields=("graph.n_nodes",), applies=_graph)
def _(draw, site):
    msg = site.request
    offsets = spec_for(site.d, site.cmd).request.offsets
    return _count_mismatch(draw, site, "n_nodes", len(msg.nodes), offsets["n_nodes"])


@mutation("field", "n_tensors_mismatch", fields=("graph.n_tensors",), applies=_graph)
def _(draw, site):
    msg = site.request
    offsets = spec_for(site.d, site.cmd).request.offsets
    return _count_mismatch(draw, site, "n_tensors", len(msg.tensors),
                           offsets["nodes"] + 8 * len(msg.nodes))


@mutation("field", "node_id", fields=("graph.nodes",), applies=_graph)
def _(draw, site):
    msg = site.request
    case = draw(st.sampled_from(("zero", "unknown")))
    known = {t.id for t in msg.tensors}
    bad = 0 if case == "zero" else next(i for i in range(0x9000, 1 << 20, 16) if i not in known)
    i = draw(st.integers(0, len(msg.nodes) - 1))
    nodes = msg.nodes[:i] + (bad,) + msg.nodes[i + 1:]
    return site.mutation("graph.nodes", replace(msg, nodes=nodes), value=bad, case=case, index=i)


@mutation("field", "graph_shape", fields=("graph.tensors",), applies=_graph)
def _(draw, site):
    shape = draw(st.sampled_from(("cycle", "duplicate_ids", "dangling")))
    return site.mutation("graph.tensors", _draw_graph(draw, site.d, site.region, shape=shape),
                         case=shape)


@mutation("field", "graph_trailing", fields=("graph.trailing",), applies=_graph)
def _(draw, site):
    trailing = draw(st.binary(min_size=1, max_size=64))
    return site.mutation("graph.trailing", replace(site.request, trailing=trailing),
                         value=len(trailing))


@mutation("field", "graph_depth", fields=("graph.nodes",), applies=_graph)
def _(draw, site):
    msg = site.request
    depth = draw(st.sampled_from(_CHAIN_DEPTHS))
    listing = draw(st.sampled_from(_CHAIN_LISTINGS))
    g = _deep_chain(depth, site.region, listing)
    return site.mutation("graph.nodes", replace(g, uid=msg.uid, device=msg.device), value=depth,
                         case=listing)


# ---------------------------------------------------------------- any field, by offset

#: Edge values per width (bytes): what AFL calls "interesting values", as unsigned.
INTERESTING_VALUES = {
    4: (0, 1, 0x7F, 0x80, 0xFF, 0x100, 0xFFFF, 0x1_0000, 0x7FFF_FFFF, 0x8000_0000, U32_MAX - 1,
        U32_MAX),
    8: (0, 1, 0xFF, 0xFFFF_FFFF, 0x1_0000_0000, 1 << 40, 0x7FFF_FFFF_FFFF_FFFF, 1 << 63,
        U64_MAX - 1, U64_MAX),
}


def overwrite(frame: bytes, offset: int, width: int, value: int) -> bytes:
    """``frame`` with the little-endian ``width``-byte integer at payload ``offset`` set."""
    at = REQUEST_HEADER_SIZE + offset
    return frame[:at] + value.to_bytes(width, "little") + frame[at + width:]


def _payload_at_least_4(d, c) -> bool:
    layout = spec_for(d, c).request
    return c is not Cmd.HELLO and (layout.variable or layout.fixed_size >= 4)


@mutation("field", "interesting_value", fields=("payload",), applies=_payload_at_least_4)
def _(draw, site):
    """Any 4-aligned u32/u64 of a valid request's payload set to an edge value: fields the
    structured operators do not name (and the evolving corpus applies it to any step)."""
    frame = site.frame()
    room = len(frame) - REQUEST_HEADER_SIZE
    width = draw(st.sampled_from((4, 8) if room >= 8 else (4,)))
    offset = draw(st.integers(0, (room - width) // 4)) * 4
    value = draw(st.sampled_from(INTERESTING_VALUES[width]))
    return site.mutation("payload", overwrite(frame, offset, width, value), value=value,
                         index=offset)
