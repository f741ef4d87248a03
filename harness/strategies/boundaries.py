"""Boundary classes as tables: the values the systematic sweep walks exhaustively
(:mod:`harness.fuzz.sweep`) and the random phase draws from (the operators registered here).

One definition for both, so what the sweep covers and what a long campaign keeps drawing are
the same classes:

* ``placement``: where a tensor says it lives. Its ``buffer`` is its own buffer, the other
  buffer of the session, null or a handle nobody allocated; its ``data`` is at and around the
  base and the end of *each* buffer (``base-1 .. base+1``, ``end-nbytes-1 .. end-nbytes+1``,
  ``end-1 .. end+1``), or null, or the largest address. A tensor whose buffer field names one
  buffer while its data lies in the other is a case here; the per-buffer operators of
  :mod:`.fields` never draw it;
* ``shape_class``: zero elements, one element, a dimension of 1 with a huge stride, rows past
  the buffer, ``ne x nb`` products that overflow 64 bits (to a huge and to a tiny nbytes),
  types at and past the end of the enum;
* ``range_class``: ``offset`` / ``size`` at and around 0, the tensor's end, the buffer's end,
  and values whose sum wraps;
* ``field_class``: every other field of a tensor (ids, sources, ne/nb, type, op, op_params,
  flags, view offset, use count, name) at its edges, one at a time;
* ``error_path`` (sweep only): a tensor one byte past its buffer's end with an op past the
  enum or an unterminated / printf-like name: what a bounds-error message prints;
* ``graph_class``: node id 0, repeated and missing nodes, dangling sources, chains and fan-ins
  of 2^k tensors up to exactly the reference's graph bound and one chain past it, many more
  nodes than tensors, op ids at and past the enum.

Nothing here names a known bug: these are the edges of the fields the protocol defines.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from functools import partial
from typing import Callable

from hypothesis import strategies as st

from ..proto import ggml
from ..proto.constants import Cmd
from ..proto.messages import GraphComputeRequest
from ..proto.tensor import RpcTensor
from ..reference.server_core import ServerConfig
from .basics import I32_MAX, I32_MIN, U32_MAX, U64_MAX, BufferRegion, _tensor_nbytes
from .registry import _get_tensor, _replace_tensor, mutation, request_fields, tensor_slots

# A heap-like address no ALLOC_BUFFER returned (far from the sentinels of harness.fuzz.case).
UNKNOWN_HANDLE = 0x0000_7F3D_0EAD_B000
MAX_GRAPH_TENSORS = ServerConfig.max_graph_tensors  # the reference server's graph bound
CHAIN_EXPONENTS = (1, 4, 8, 12, 16)
FANIN_EXPONENTS = (1, 4, 8, 12, 15)  # a binary tree of 2^k leaves: 2^(k+1) - 1 tensors
SMALL_GRAPH_TENSORS = 4096  # graph cases the random phase draws; deeper ones are the sweep's


def _u64(v: int) -> int:
    return v & U64_MAX


def _edges(r: BufferRegion, n: int) -> list[tuple[str, int]]:
    base, end = r.base, r.end
    return [("base-1", base - 1), ("base", base), ("base+1", base + 1),
            ("end-nbytes-1", end - n - 1), ("end-nbytes", end - n), ("end-nbytes+1", end - n + 1),
            ("end-1", end - 1), ("end", end), ("end+1", end + 1)]


def placement_cases(regions: tuple[BufferRegion, ...], own: int, nbytes: int
                    ) -> list[tuple[str, int, int]]:
    """(case, buffer field, data pointer) for a tensor of ``nbytes`` whose buffer is
    ``regions[own]``: every buffer value x data at and around each buffer's edges."""
    own_r = regions[own]
    other_r = regions[1 - own] if len(regions) > 1 and own < 2 else own_r
    handles = {"own": own_r.handle, "other": other_r.handle, "null": 0,
               "unknown": UNKNOWN_HANDLE}
    out = []
    for hname, h in handles.items():
        for rname, r in (("own", own_r), ("other", other_r)):
            out += [(f"buffer={hname} data={rname}:{p}", h, _u64(v)) for p, v in _edges(r, nbytes)]
        out += [(f"buffer={hname} data=null", h, 0), (f"buffer={hname} data=max", h, U64_MAX)]
    return out


# ne x nb that overflows 64 bits back to a tiny total: 4 + (2^32-2)(2^32-1) + 6 * 2^31 = 2^64 + 6
_WRAP_SMALL = ((1, U32_MAX, 7, 1), (4, U32_MAX, 1 << 31, 4))


def shape_cases(t: RpcTensor) -> list[tuple[str, tuple, tuple, int]]:
    """(case, ne, nb, type) at the edges of a tensor's shape and type."""
    f32 = ggml.TYPE_F32
    return [
        ("zero_elements", (0, 1, 1, 1), (4, 0, 0, 0), f32),
        ("one_element", (1, 1, 1, 1), (4, 4, 4, 4), f32),
        ("dim1_huge_stride", (t.ne[0], 1, 1, 1), (4, U32_MAX, U32_MAX, U32_MAX), f32),
        ("rows_past_buffer", (16, 4, 1, 1), (4, 1 << 20, 1 << 22, 1 << 22), f32),
        ("nbytes_wraps_to_huge", (U32_MAX,) * 4, (U32_MAX,) * 4, f32),
        ("nbytes_wraps_to_small", *_WRAP_SMALL, f32),
        ("type_last", t.ne, t.nb, len(ggml.TYPES) - 1),
        ("type_past_enum", t.ne, t.nb, len(ggml.TYPES)),
    ]


def range_cases(nbytes: int, buffer_size: int) -> list[tuple[str, int, int]]:
    """(case, offset, size) at the edges of a tensor of ``nbytes`` in a buffer."""
    out = [(f"offset={name}", _u64(v), 1) for name, v in (
        ("0", 0), ("1", 1), ("nbytes-1", nbytes - 1), ("nbytes", nbytes),
        ("nbytes+1", nbytes + 1), ("buffer", buffer_size), ("2^63", 1 << 63), ("max", U64_MAX))]
    out += [(f"size={name}", 0, _u64(v)) for name, v in (
        ("0", 0), ("1", 1), ("nbytes-1", nbytes - 1), ("nbytes", nbytes), ("nbytes+1", nbytes + 1),
        ("buffer", buffer_size), ("max", U64_MAX))]
    out += [("sum_wraps", U64_MAX, 2), ("sum_ends_at_nbytes+1", _u64(nbytes - 1), 2)]
    return out


def _t(tid: int, r: BufferRegion, at: int = 0, n: int = 16, **kw) -> RpcTensor:
    return RpcTensor(id=tid, type=ggml.TYPE_F32, buffer=r.handle, ne=(n, 1, 1, 1),
                     nb=(4, 4 * n, 4 * n, 4 * n), data=r.base + at, **kw)


def _chain(r: BufferRegion, count: int) -> tuple[tuple[int, ...], tuple[RpcTensor, ...]]:
    """``count`` tensors: a leaf, then each node adds its predecessor to itself."""
    add = ggml.OP["ADD"]
    first = _t(1, r)
    tensors = [first]
    for i in range(2, count + 1):
        tensors.append(_t(i, r, op=add, src=(i - 1, i - 1) + (0,) * 8))
    return tuple(t.id for t in tensors[1:]), tuple(tensors)


def _fanin(r: BufferRegion, k: int) -> tuple[tuple[int, ...], tuple[RpcTensor, ...]]:
    add = ggml.OP["ADD"]
    leaves = 1 << k
    tensors = [_t(i + 1, r) for i in range(leaves)]
    level = [t.id for t in tensors]
    nodes = []
    next_id = leaves + 1
    while len(level) > 1:
        up = []
        for a, b in zip(level[::2], level[1::2]):
            tensors.append(_t(next_id, r, op=add, src=(a, b) + (0,) * 8))
            nodes.append(next_id)
            up.append(next_id)
            next_id += 1
        level = up
    return tuple(nodes), tuple(tensors)


GraphTensors = tuple[tuple[int, ...], tuple[RpcTensor, ...]]  # (node ids, tensors)


def graph_plan(regions: tuple[BufferRegion, ...]
               ) -> list[tuple[str, int, Callable[[], GraphTensors]]]:
    """(case, tensor count, build) of GRAPH_COMPUTE at the edges of the graph fields. The
    deep cases hold 2^16 tensors: counting the sweep or drawing a small case builds none."""
    r = regions[0]
    add = ggml.OP["ADD"]
    a, b = _t(1, r, 0), _t(2, r, 64)
    out = _t(3, regions[-1], 128 if len(regions) == 1 else 0, op=add, src=(1, 2) + (0,) * 8)
    base = (a, b, out)

    def fixed(nodes: tuple[int, ...], tensors: tuple[RpcTensor, ...]):
        return len(tensors), lambda: (nodes, tensors)

    plan = [
        ("node_id_zero", *fixed((0,), base)),
        ("node_repeated", *fixed((3, 3), base)),
        ("node_missing", *fixed((77,), base)),
        ("source_missing", *fixed((3,), (a, b, replace(out, src=(99, 2) + (0,) * 8)))),
        ("source_is_node", *fixed((3,), (a, b, replace(out, src=(3, 2) + (0,) * 8)))),
        ("nodes_far_above_tensors", *fixed((3,) * 1024, base)),
        ("no_nodes", *fixed((), base)),
        ("op_last", *fixed((3,), (a, b, replace(out, op=ggml.OP_COUNT - 1)))),
        ("op_past_enum", *fixed((3,), (a, b, replace(out, op=ggml.OP_COUNT)))),
        ("op_255", *fixed((3,), (a, b, replace(out, op=255)))),
    ]
    for k in CHAIN_EXPONENTS:  # 2^k tensors, up to exactly the bound
        if 1 << k <= MAX_GRAPH_TENSORS:
            plan.append((f"chain_2^{k}", 1 << k, partial(_chain, r, 1 << k)))
    for k in FANIN_EXPONENTS:
        if (2 << k) - 1 <= MAX_GRAPH_TENSORS:
            plan.append((f"fanin_2^{k}", (2 << k) - 1, partial(_fanin, r, k)))
    # one past it: the reference refuses by design, the real server has no such bound
    plan.append(("tensors_past_bound", MAX_GRAPH_TENSORS + 1,
                 partial(_chain, r, MAX_GRAPH_TENSORS + 1)))
    return plan


def graph_cases(regions: tuple[BufferRegion, ...]
                ) -> list[tuple[str, tuple[int, ...], tuple[RpcTensor, ...]]]:
    """(case, node ids, tensors) of every graph case, built."""
    return [(case, *build()) for case, _, build in graph_plan(regions)]


@functools.lru_cache(maxsize=16)
def _small_graph_cases(regions: tuple[BufferRegion, ...]
                       ) -> tuple[tuple[str, tuple[int, ...], tuple[RpcTensor, ...]], ...]:
    # the random phase's share (the deep ones are the sweep's): built once per buffer layout,
    # not on every draw
    return tuple((case, *build()) for case, n, build in graph_plan(regions)
                 if n <= SMALL_GRAPH_TENSORS)


# ---------------------------------------------------------------- the random phase

def _own_index(site, t: RpcTensor) -> int:
    regions = site.buffers or (site.region,)
    for i, r in enumerate(regions):
        if r.base <= t.data < r.end:
            return i
    return 0


def _slot(draw, site):
    msg = site.request
    slot = draw(st.sampled_from(tensor_slots(site.d, site.cmd)))
    index = 0
    if slot == "tensors[]":
        index = draw(st.integers(0, max(len(msg.tensors) - 1, 0)))
    return msg, slot, index


def _tensor_cmds(d, c) -> bool:
    return bool(tensor_slots(d, c))


@mutation("field", "placement", applies=_tensor_cmds,
          fields=lambda d, c: tuple(f"{s}.{f}" for s in tensor_slots(d, c)
                                    for f in ("buffer", "data")))
def _(draw, site):
    msg, slot, index = _slot(draw, site)
    if slot == "tensors[]" and not msg.tensors:
        return site.mutation("tensors[].data", msg)
    t = _get_tensor(msg, slot, index)
    regions = tuple(site.buffers or (site.region,))
    case, handle, data = draw(st.sampled_from(placement_cases(regions, _own_index(site, t),
                                                              _tensor_nbytes(t))))
    extra = {"index": index} if slot.endswith("[]") else {}
    return site.mutation(f"{slot}.data", _replace_tensor(msg, slot, index,
                                                         replace(t, buffer=handle, data=data)),
                         case=case, value=data, **extra)


@mutation("field", "shape_class", applies=_tensor_cmds,
          fields=lambda d, c: tuple(f"{s}.ne" for s in tensor_slots(d, c)))
def _(draw, site):
    msg, slot, index = _slot(draw, site)
    if slot == "tensors[]" and not msg.tensors:
        return site.mutation("tensors[].ne", msg)
    t = _get_tensor(msg, slot, index)
    case, ne, nb, type_ = draw(st.sampled_from(shape_cases(t)))
    extra = {"index": index} if slot.endswith("[]") else {}
    return site.mutation(f"{slot}.ne", _replace_tensor(msg, slot, index,
                                                       replace(t, ne=ne, nb=nb, type=type_)),
                         case=case, **extra)


RANGED = (Cmd.SET_TENSOR, Cmd.GET_TENSOR, Cmd.MEMSET_TENSOR, Cmd.SET_TENSOR_HASH,
          Cmd.SET_TENSOR_2D, Cmd.GET_TENSOR_2D)


def with_range(msg, cmd: Cmd, offset: int, size: int):
    """``msg`` with offset and size (SET_TENSOR: its data length, at most 64 KiB of it)."""
    if cmd is Cmd.SET_TENSOR:
        return replace(msg, offset=offset, data=bytes(min(size, 1 << 16)))
    if cmd is Cmd.SET_TENSOR_HASH:
        return replace(msg, offset=offset)
    if cmd is Cmd.SET_TENSOR_2D:  # the data length stays what size x n_copies says
        return replace(msg, offset=offset, size=size,
                       data=bytes(min(size * max(msg.n_copies, 1), 1 << 16)))
    return replace(msg, offset=offset, size=size)


@mutation("field", "range_class", applies=lambda d, c: c in RANGED,
          fields=lambda d, c: tuple(f for f in ("offset", "size") if f in request_fields(d, c)))
def _(draw, site):
    msg = site.request
    n = _tensor_nbytes(msg.tensor)
    case, offset, size = draw(st.sampled_from(range_cases(n, site.region.size)))
    field = "size" if case.startswith("size") else "offset"
    if field not in request_fields(site.d, site.cmd):
        field = "offset"
    return site.mutation(field, with_range(msg, site.cmd, offset, size), case=case,
                         value=size if field == "size" else offset)


@mutation("field", "graph_class", applies=lambda d, c: c is Cmd.GRAPH_COMPUTE,
          fields=("tensors",))
def _(draw, site):
    regions = tuple(site.buffers or (site.region,))
    case, nodes, tensors = draw(st.sampled_from(_small_graph_cases(regions)))
    return site.mutation("tensors", graph_request(site.d, nodes, tensors, site.request),
                         case=case)


def graph_request(d, nodes, tensors, template: GraphComputeRequest | None = None
                  ) -> GraphComputeRequest:
    """A GRAPH_COMPUTE of ``d`` (with the uid field where the dialect has one)."""
    uid = (template.uid if template is not None else 1) if d.graph_uid else 0
    return GraphComputeRequest(device=0, uid=uid, nodes=tuple(nodes), tensors=tuple(tensors))


# ---------------------------------------------------------------- every field of a tensor

_U32_EDGES = (0, 1, 2, I32_MAX, 1 << 31, U32_MAX)


def field_cases(t: RpcTensor, other_id: int, region: BufferRegion
                ) -> list[tuple[str, str, RpcTensor]]:
    """(case, field, tensor) with one field of ``t`` at one of its edges: every id field, each
    ne[i] and nb[i], type, op, op_params[0], flags, view_offs, use_count."""
    n = _tensor_nbytes(t)
    out: list[tuple[str, str, RpcTensor]] = []
    for name in ("id", "view_src"):
        for case, v in (("0", 0), ("1", 1), ("self", t.id), ("other", other_id), ("max", U64_MAX)):
            out.append((f"{name}={case}", name, replace(t, **{name: v})))
    for i in (0, 1):
        for case, v in (("0", 0), ("self", t.id), ("other", other_id), ("missing", 0xBAD1D),
                        ("max", U64_MAX)):
            src = list(t.src)
            src[i] = v
            out.append((f"src[{i}]={case}", "src", replace(t, src=tuple(src))))
    for attr in ("ne", "nb"):
        for i in range(4):
            for v in _U32_EDGES:
                values = list(getattr(t, attr))
                values[i] = v
                out.append((f"{attr}[{i}]={v}", attr, replace(t, **{attr: tuple(values)})))
    count = len(ggml.TYPES)
    for case, v in (("0", 0), ("last", count - 1), ("count", count), ("255", 255),
                    ("u32max", U32_MAX)):
        out.append((f"type={case}", "type", replace(t, type=v)))
    for case, v in (("none", 0), ("last", ggml.OP_COUNT - 1), ("count", ggml.OP_COUNT),
                    ("255", 255), ("u32max", U32_MAX)):
        out.append((f"op={case}", "op", replace(t, op=v)))
    for v in (I32_MIN, -1, 0, 1, I32_MAX):
        out.append((f"op_params[0]={v}", "op_params",
                    replace(t, op_params=(v,) + tuple(t.op_params[1:]))))
    for v in (-1, 1, I32_MAX, I32_MIN):
        out.append((f"flags={v}", "flags", replace(t, flags=v)))
    for case, v in (("1", 1), ("nbytes", n), ("buffer", region.size), ("max", U64_MAX)):
        out.append((f"view_offs={case}", "view_offs", replace(t, view_offs=v)))
    for v in (-1, I32_MAX, I32_MIN):
        out.append((f"use_count={v}", "use_count", replace(t, use_count=v)))
    for case, v in NAME_EDGES:
        out.append((f"name={case}", "name", replace(t, name=v)))
    return out


# names a server may print: all 64 bytes without a terminator, and printf conversions
NAME_EDGES = (("unterminated", b"A" * 64), ("format", b"%s%s%s%s%n%n".ljust(64, b"\0")))


def error_path_cases(t: RpcTensor, region: BufferRegion) -> list[tuple[str, RpcTensor]]:
    """(case, tensor): ``t`` one byte past the end of its buffer, so a server takes its
    bounds-error path, with each field that path may print at an edge: an op past the enum
    (a name table indexed with it), an unterminated or printf-like name. One field at a
    time finds neither: a valid placement never prints, an invalid op alone is not read."""
    n = _tensor_nbytes(t)
    past = replace(t, data=_u64(region.end - n + 1))
    out = [("past_end", past)]
    for case, v in (("count", ggml.OP_COUNT), ("255", 255), ("u32max", U32_MAX)):
        out.append((f"past_end op={case}", replace(past, op=v)))
    for case, v in NAME_EDGES:
        out.append((f"past_end name={case}", replace(past, name=v)))
    return out


# scalar request fields a command has, and their edges (offset/size: range_class)
SCALAR_EDGES = {"device": (1, 255, U32_MAX), "value": (0, 1, 255),
                "n_copies": (0, 1, 1 << 16, U64_MAX), "stride": (0, 1, U64_MAX),
                "uid": (0, 1, U64_MAX), "hash": (0, U64_MAX)}


def scalar_cases(msg) -> list[tuple[str, str, object]]:
    """(case, field, request) with one scalar field of ``msg`` at one of its edges."""
    out = []
    for name, values in SCALAR_EDGES.items():
        if not hasattr(msg, name):
            continue
        for v in values:
            try:
                out.append((f"{name}={v}", name, replace(msg, **{name: v})))
            except (TypeError, ValueError):
                continue
    return out


@mutation("field", "field_class", applies=_tensor_cmds,
          fields=lambda d, c: tuple(f"{s}.{f}" for s in tensor_slots(d, c)
                                    for f in ("id", "src", "view_src", "ne", "nb", "type", "op",
                                              "op_params", "flags", "view_offs", "use_count",
                                              "name")))
def _(draw, site):
    msg, slot, index = _slot(draw, site)
    if slot == "tensors[]" and not msg.tensors:
        return site.mutation("tensors[].id", msg)
    t = _get_tensor(msg, slot, index)
    case, field, changed = draw(st.sampled_from(field_cases(t, t.id ^ 0x10, site.region)))
    extra = {"index": index} if slot.endswith("[]") else {}
    return site.mutation(f"{slot}.{field}", _replace_tensor(msg, slot, index, changed),
                         case=case, **extra)
