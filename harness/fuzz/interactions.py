"""The combinatorial phase: every command's fields at their edges *together*, as covering
arrays (:mod:`.covering`), so a bug that lives in an interaction of fields is found by
construction, not by luck.

The boundary sweep (:mod:`.sweep`) moves one field to an edge against defaults for everything
else. A server may accept a request only when two fields of one tensor are at their edges at
once (a shape whose size wraps *and* data near a buffer's end; an op past the enum *and* a
tensor past its buffer), or when a tensor and its source are. Here every field of every tensor
role of a command is a **factor** whose values are that field's boundary classes (value 0 is
always the baseline, "as is"), and the request's scalar fields (offset, size, value, copies,
stride, uid, cache flag) are factors too. Per command:

* **pairs** (t = 2): one covering array over all factors of all roles: every pair of classes of
  any two fields appears in at least one request;
* **fields** (t = 2 again): every pair of the factors that do not move a tensor (type, op,
  flags, ids, names, view offset, the request's scalars), with every tensor's buffer, data,
  shape, ``ne`` and ``nb`` at their baseline. In the pairs block most rows also place some
  tensor outside its buffer, which every honest server refuses first: a pair such as
  (type F16, offset past the end) would be *masked* there, never tried;
* **triples** (t = 3): for each tensor role, every (buffer, data placement, shape) triple, and
  for a tensor and its source (COPY_TENSOR's src and dst, GRAPH_COMPUTE's node and source,
  and its view and view source) every triple of those six factors; in blocks of their own
  with everything else at its baseline, so no other field can mask them.

Classes a server refuses whatever the other fields say (a type past the enum, a device out of
range, a null buffer where a live one is required) stay single-field cases of the sweep: in a
row of their own they would mask every other pair of that row (PICT's "negative values").

Each request is one session after the sweep's set-up (two buffers of 4 and 8 KiB). Rows that
make a request already sent are sent once; the report counts pairs and triples covered by what
was sent.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass, replace

import numpy as np

from ..proto import Cmd, get_dialect
from ..proto.dialects import Dialect
from ..proto.tensor import RpcTensor
from . import covering, memo
from ..strategies.basics import I32_MAX, I32_MIN, U32_MAX, U64_MAX, BufferRegion, _tensor_nbytes
from ..strategies.boundaries import NAME_EDGES, UNKNOWN_HANDLE, _WRAP_SMALL, _edges, _u64
from ..strategies.registry import _get_tensor, _replace_tensor

AS_IS = "as_is"
U32_EDGES = (0, 1, 2, I32_MAX, 1 << 31, U32_MAX)
PAYLOAD_CAP = 1 << 16  # bytes of data a SET_TENSOR(_2D) of any announced size carries
MISSING_ID = 0xBAD1D

# Commands whose every tensor must name a live buffer: a null or unknown handle is refused
# whatever else the request says (spec 3.2, 5), so those classes stay single-field cases.
_LIVE_BUFFER = {Cmd.SET_TENSOR, Cmd.GET_TENSOR, Cmd.COPY_TENSOR, Cmd.MEMSET_TENSOR,
                Cmd.SET_TENSOR_2D, Cmd.GET_TENSOR_2D, Cmd.COMM_ALLREDUCE}
# A tensor and its source: every triple of their (buffer, data, shape) factors.
SOURCE_PAIRS = {Cmd.COPY_TENSOR: (("src", "dst"),),
                Cmd.GRAPH_COMPUTE: (("node", "source"), ("view", "view source"))}
TRIPLE = ("buffer", "data", "shape")
# the factors that move a tensor's bytes (kept at baseline in the fields block)
PLACEMENT = TRIPLE + tuple(f"{a}[{i}]" for a in ("ne", "nb") for i in range(4))


# ---------------------------------------------------------------- the classes of a tensor

SHAPES = (AS_IS, "zero_elements", "one_element", "dim1_huge_stride", "rows_past_buffer",
          "nbytes_wraps_to_huge", "nbytes_wraps_to_small", "transposed", "overlapping_rows",
          "misaligned_stride", "ne0_not_block_multiple")


def _shape(label: str, t: RpcTensor, types) -> tuple[tuple, tuple | None]:
    """(ne, explicit nb or None for the type's contiguous strides) of a shape class."""
    if label == AS_IS:
        return t.ne, t.nb
    if label == "zero_elements":
        return (0, 1, 1, 1), None
    if label == "one_element":
        return (1, 1, 1, 1), None
    if label == "dim1_huge_stride":
        return (t.ne[0], 1, 1, 1), (_size(types, t.type), U32_MAX, U32_MAX, U32_MAX)
    if label == "rows_past_buffer":
        return (16, 4, 1, 1), (4, 1 << 20, 1 << 22, 1 << 22)
    if label == "nbytes_wraps_to_huge":
        # a size that wraps size_t to a huge value with an element count that still fits
        # int64 (the sweep's all-U32_MAX shape fails the count check on its own)
        return (U32_MAX, 1 << 30, 1, 1), (U32_MAX,) * 4
    if label == "nbytes_wraps_to_small":
        return _WRAP_SMALL
    ne = (32, 2, 1, 1)
    nb0 = _size(types, t.type)
    if label == "transposed":  # rows before elements: a permuted view's strides
        return ne, (64 * nb0, nb0, 64 * nb0, 64 * nb0)
    if label == "overlapping_rows":  # every row at the same address
        return ne, (nb0, 0, 0, 0)
    if label == "misaligned_stride":  # elements one byte apart: each overlaps the next
        return ne, (1, 32, 64, 64)
    if label == "ne0_not_block_multiple":  # a row that is not whole blocks of its type
        return (33, 2, 1, 1), None
    raise KeyError(label)


def _size(types, type_id: int) -> int:
    t = types.type_traits(type_id)
    return t.type_size if t is not None and t.blck_size else 4


TYPES = (AS_IS, "f16", "q4_0", "last")  # a type past the enum is a single-field case


def _type_id(d: Dialect, label: str, t: RpcTensor) -> int:
    n = d.numbering
    if label == AS_IS:
        return t.type
    if label == "last":  # the enum's last id that still has a block size
        return max(i for i, tr in enumerate(n.types) if tr.blck_size)
    return next(i for i, tr in enumerate(n.types) if tr.name == label)


_EDGES = tuple(name for name, _ in _edges(BufferRegion(0, 0, 0), 0))  # the sweep's, by name
PLACEMENTS = (AS_IS,) + tuple(f"{r}:{e}" for r in ("own", "other") for e in _EDGES) + \
    ("null", "max")


def _data(label: str, t: RpcTensor, n: int, own: BufferRegion, other: BufferRegion) -> int:
    if label == AS_IS:
        return t.data
    if label == "null":
        return 0
    if label == "max":
        return U64_MAX
    region, edge = label.split(":")
    return _u64(dict(_edges(own if region == "own" else other, n))[edge])


@dataclass(frozen=True)
class Factor:
    """One parameter of a command's covering array: a field and its classes (value 0 is the
    baseline)."""

    role: str | None  # the tensor role it belongs to; None for a field of the request
    field: str
    values: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.role}.{self.field}" if self.role else self.field


def _tensor_factors(role: str, live_buffer: bool) -> list[Factor]:
    buffers = (AS_IS, "other") if live_buffer else (AS_IS, "other", "null", "unknown")
    ids = (AS_IS, "0", "other", "max")
    u32 = (AS_IS,) + tuple(str(v) for v in U32_EDGES)
    out = [Factor(role, "buffer", buffers), Factor(role, "data", PLACEMENTS),
           Factor(role, "shape", SHAPES), Factor(role, "type", TYPES)]
    out += [Factor(role, f"ne[{i}]", u32) for i in range(4)]
    out += [Factor(role, f"nb[{i}]", u32) for i in range(4)]
    out += [Factor(role, "op", (AS_IS, "none", "add", "last", "past_enum", "255")),
            Factor(role, "op_params[0]", (AS_IS, str(I32_MIN), "-1", "1", str(I32_MAX))),
            Factor(role, "flags", (AS_IS, "-1", "1", str(I32_MAX), str(I32_MIN))),
            Factor(role, "id", ids),
            Factor(role, "src[0]", (AS_IS, "0", "self", "other", "missing", "max")),
            Factor(role, "src[1]", (AS_IS, "0", "self", "other", "missing", "max")),
            Factor(role, "view_src", (AS_IS, "0", "self", "other", "missing", "max")),
            Factor(role, "view_offs", (AS_IS, "1", "nbytes", "buffer", "max")),
            Factor(role, "use_count", (AS_IS, "-1", str(I32_MAX), str(I32_MIN))),
            Factor(role, "name", (AS_IS,) + tuple(c for c, _ in NAME_EDGES))]
    return out


# the request's scalar fields and their classes (offset/size relative to the tensor's nbytes)
_OFFSETS = (AS_IS, "1", "nbytes-1", "nbytes", "nbytes+1", "buffer", "2^63", "max")
_SIZES = (AS_IS, "0", "1", "nbytes-1", "nbytes", "nbytes+1", "buffer", "max")
SCALARS: dict[str, tuple[str, ...]] = {
    "offset": _OFFSETS, "size": _SIZES, "value": (AS_IS, "0", "255"),
    "n_copies": (AS_IS, "0", "1", "65536", "max"), "stride": (AS_IS, "0", "1", "max"),
    "uid": (AS_IS, "0", "1", "max"), "hash": (AS_IS, "0", "max"),
    "cache_flag": (AS_IS, "1", "2", "255"),
}


def _scalar_factors(d: Dialect, cmd: Cmd, msg) -> list[Factor]:
    def carried(name: str) -> bool:
        if name == "size" and cmd is Cmd.SET_TENSOR:
            return True  # the payload's length
        if name == "cache_flag":
            return cmd is Cmd.SET_TENSOR and d.cache_flag
        if name == "uid":
            return d.graph_uid and hasattr(msg, "uid")
        return hasattr(msg, name)
    return [Factor(None, name, values) for name, values in SCALARS.items() if carried(name)]


# ---------------------------------------------------------------- designs

@dataclass(frozen=True)
class CoveringDesign:
    """A command's factors, the tuples its array must cover, and the array's rows (each row:
    one value index per factor), in blocks: "pairs" (t = 2 over everything), then the pure
    t = 3 blocks."""

    cmd: Cmd
    factors: tuple[Factor, ...]
    pairs: tuple[tuple[int, ...], ...]
    triples: tuple[tuple[int, ...], ...]
    blocks: tuple[tuple[str, np.ndarray], ...]

    @property
    def sizes(self) -> list[int]:
        return [len(f.values) for f in self.factors]

    @property
    def rows(self) -> int:
        return sum(len(r) for _, r in self.blocks)

    def index(self, role: str | None, field: str) -> int:
        return next(i for i, f in enumerate(self.factors) if f.role == role and f.field == field)


def _triple_groups(cmd: Cmd, roles: list[str]) -> list[list[tuple[str, str]]]:
    """Groups of (role, field) factors whose every triple must appear, each a block of its
    own: a tensor and its source (six factors), then every other role alone."""
    groups, paired = [], set()
    for pair in SOURCE_PAIRS.get(cmd, ()):
        if all(r in roles for r in pair):
            groups.append([(r, f) for r in pair for f in TRIPLE])
            paired |= set(pair)
    groups += [[(r, f) for f in TRIPLE] for r in roles if r not in paired]
    return groups


def counts_fit(ne) -> bool:
    """ggml's element-count check when it makes a tensor (INT64_MAX / ne[i] > elements so
    far, for each dimension after the first): a count past it is refused by the reference and
    aborts 8.0.0 whatever the other fields say."""
    current = ne[0]
    for n in ne[1:]:
        if n and INT64_MAX // n <= current:
            return False
        current *= n
    return True


INT64_MAX = (1 << 63) - 1


class _CountsFit:
    """The validity of a row (see :mod:`.covering`): every role's element count fits."""

    def __init__(self, d: Dialect, factors: list[Factor], msg, roles):
        self.roles = []
        for role, (slot, i) in roles.items():
            t = _get_tensor(msg, slot, i)
            shape = next((k for k, f in enumerate(factors)
                          if f.role == role and f.field == "shape"), None)
            shape_ne = [_shape(v, t, d.numbering)[0] for v in factors[shape].values] \
                if shape is not None else None
            dims = []
            for j in range(4):
                k = next((k for k, f in enumerate(factors)
                          if f.role == role and f.field == f"ne[{j}]"), None)
                values = [None if v == AS_IS else int(v) for v in factors[k].values] \
                    if k is not None else None
                dims.append((k, values))
            self.roles.append((t.ne, shape, shape_ne, dims))
        # what decides the constraint, for the arrays' cache (the same in every dialect)
        self.key = repr([(ne, shape, tuple(map(tuple, sn or ())), tuple(
            (k, tuple(v or ())) for k, v in dims)) for ne, shape, sn, dims in self.roles])

    def __call__(self, row) -> bool:
        for base_ne, shape, shape_ne, dims in self.roles:
            ne = list(shape_ne[max(int(row[shape]), 0)] if shape is not None else base_ne)
            for j, (k, values) in enumerate(dims):
                if k is not None and row[k] > 0:
                    ne[j] = values[int(row[k])]
            if not counts_fit(ne):
                return False
        return True


def design(d: Dialect, cmd: Cmd, msg, roles: dict[str, tuple[str, int]]) -> CoveringDesign:
    live = cmd in _LIVE_BUFFER or (cmd is Cmd.SET_TENSOR_HASH
                                   and d.peer.server_hash_checks_tensor)
    factors = [f for role in roles for f in _tensor_factors(role, live)]
    factors += _scalar_factors(d, cmd, msg)
    sizes = [len(f.values) for f in factors]
    pairs = covering.all_pairs(len(factors))
    valid = _CountsFit(d, factors, msg, roles)
    blocks = [("pairs", _cached(tuple(sizes), tuple(pairs), valid))]
    fields = [i for i, f in enumerate(factors) if f.field not in PLACEMENT]
    sub = _cached(tuple(sizes[c] for c in fields),
                  tuple(covering.all_pairs(len(fields))), None)
    block = np.zeros((len(sub), len(factors)), dtype=np.int64)
    block[:, fields] = sub
    blocks.append(("fields", block))
    triples: list[tuple[int, ...]] = []
    for group in _triple_groups(cmd, list(roles)):
        cols = [next(i for i, f in enumerate(factors) if (f.role, f.field) == g) for g in group]
        local = list(itertools.combinations(range(len(cols)), 3))
        sub = _cached(tuple(sizes[c] for c in cols), tuple(local), None)
        block = np.zeros((len(sub), len(factors)), dtype=np.int64)
        block[:, cols] = sub
        blocks.append((" + ".join(dict.fromkeys(r for r, _ in group)), block))
        triples += [tuple(cols[i] for i in t) for t in local]
    return CoveringDesign(cmd, tuple(factors), tuple(pairs), tuple(triples), tuple(blocks))


_ARRAYS: dict[tuple, np.ndarray] = {}


def _cached(sizes: tuple[int, ...], tuples: tuple[tuple[int, ...], ...], valid
            ) -> np.ndarray:
    """The covering array of a design, built once per process: most commands of most
    dialects share their designs (the same factors and constraint), so nine dialects cost
    little more than one."""
    key = (sizes, tuples, valid.key if valid is not None else None)
    rows = _ARRAYS.get(key)
    if rows is None:
        # on disk too, by the design and the generator's code only: another harness version
        # builds the same arrays
        digest = hashlib.sha256(repr(key).encode()).hexdigest()[:16]
        rows = memo.cached("array", digest, memo.source_digest("fuzz/covering.py"),
                           lambda: covering.build(sizes, tuples, valid))
        rows.setflags(write=False)
        _ARRAYS[key] = rows
    return rows


# ---------------------------------------------------------------- rows -> requests

def _int(label: str, n: int, buffer_size: int) -> int:
    named = {"nbytes": n, "nbytes-1": n - 1, "nbytes+1": n + 1, "buffer": buffer_size,
             "2^63": 1 << 63, "max": U64_MAX}
    return _u64(named[label] if label in named else int(label))


def _apply_tensor(d: Dialect, t: RpcTensor, choice: dict[str, str], *, own: BufferRegion,
                  other: BufferRegion, other_id: int) -> RpcTensor:
    """``t`` with the classes ``choice`` names (field -> label), in an order where each class
    is relative to the tensor the earlier ones made (a placement at the end of a buffer is at
    the end for *this* tensor's size)."""
    types = d.numbering
    type_id = _type_id(d, choice.get("type", AS_IS), t)
    ne, nb = _shape(choice.get("shape", AS_IS), t, types)
    if nb is None or choice.get("shape", AS_IS) == AS_IS and type_id != t.type:
        traits = types.type_traits(type_id)
        nb = types.contiguous_strides(type_id, ne) if traits is not None and traits.blck_size \
            else nb or t.nb
    ne, nb = list(ne), list(nb)
    for i in range(4):
        if choice.get(f"ne[{i}]", AS_IS) != AS_IS:
            ne[i] = int(choice[f"ne[{i}]"])
        if choice.get(f"nb[{i}]", AS_IS) != AS_IS:
            nb[i] = int(choice[f"nb[{i}]"])
    t = replace(t, type=type_id, ne=tuple(ne), nb=tuple(nb))
    ids = {"0": 0, "self": t.id, "other": other_id, "missing": MISSING_ID, "max": U64_MAX}
    ops = {"none": 0, "add": types.op["ADD"], "last": types.op_count - 1,
           "past_enum": types.op_count, "255": 255}
    changes: dict = {}
    if choice.get("id", AS_IS) != AS_IS:
        changes["id"] = ids[choice["id"]]
    src = list(t.src)
    for i in (0, 1):
        if choice.get(f"src[{i}]", AS_IS) != AS_IS:
            src[i] = ids[choice[f"src[{i}]"]]
    changes["src"] = tuple(src)
    if choice.get("view_src", AS_IS) != AS_IS:
        changes["view_src"] = ids[choice["view_src"]]
    if choice.get("op", AS_IS) != AS_IS:
        changes["op"] = ops[choice["op"]]
    if choice.get("op_params[0]", AS_IS) != AS_IS:
        changes["op_params"] = (int(choice["op_params[0]"]),) + tuple(t.op_params[1:])
    if choice.get("flags", AS_IS) != AS_IS:
        changes["flags"] = int(choice["flags"])
    if choice.get("use_count", AS_IS) != AS_IS:
        changes["use_count"] = int(choice["use_count"])
    if choice.get("name", AS_IS) != AS_IS:
        changes["name"] = dict(NAME_EDGES)[choice["name"]]
    t = replace(t, **changes)
    n = _tensor_nbytes(t)
    if choice.get("view_offs", AS_IS) != AS_IS:
        t = replace(t, view_offs=_int(choice["view_offs"], n, own.size))
    buffer = choice.get("buffer", AS_IS)
    handle = {AS_IS: own.handle, "other": other.handle, "null": 0,
              "unknown": UNKNOWN_HANDLE}[buffer]
    return replace(t, buffer=handle, data=_data(choice.get("data", AS_IS), t, n, own, other))


def _with_scalars(cmd: Cmd, msg, choice: dict[str, str], buffer_size: int):
    """``msg`` with its scalar classes; offsets and sizes are relative to its tensor's
    nbytes (after the tensor classes were applied)."""
    if not choice:
        return msg
    n = _tensor_nbytes(msg.tensor) if hasattr(msg, "tensor") else 0
    changes: dict = {}
    for name, label in choice.items():
        if label == AS_IS:
            continue
        if name in ("offset", "size"):
            changes[name] = _int(label, n, buffer_size)
        elif name in ("n_copies", "stride", "uid", "hash", "value", "cache_flag"):
            v = _int(label, n, buffer_size)
            changes[name] = v & 0xFF if name in ("value", "cache_flag") else v
    if cmd is Cmd.SET_TENSOR:
        size = changes.pop("size", None)
        if size is not None:
            changes["data"] = bytes(min(size, PAYLOAD_CAP))
    elif cmd is Cmd.SET_TENSOR_2D:
        size = changes.get("size", msg.size)
        copies = changes.get("n_copies", msg.n_copies)
        changes["data"] = bytes(min(size * max(copies, 1), PAYLOAD_CAP))
    return replace(msg, **changes)


@dataclass(frozen=True)
class DesignRow:
    """One row of a design, made into a request."""

    cmd: Cmd
    block: str
    index: int  # the row's index in the design, over all blocks
    label: str  # the non-baseline classes, "src.data=own:end+1 src.shape=zero_elements ..."
    first: str  # the factor the row is credited to (the first non-baseline one)
    request: object


def rows_of(d: Dialect, regions: tuple[BufferRegion, ...], cmd: Cmd, msg,
            roles: dict[str, tuple[str, int]], dsg: CoveringDesign):
    """Every row of ``dsg`` as a :class:`DesignRow`."""
    index = 0
    own_of = {role: _region_index(regions, _get_tensor(msg, slot, i))
              for role, (slot, i) in roles.items()}
    ids = {role: _get_tensor(msg, slot, i).id for role, (slot, i) in roles.items()}
    for block, array in dsg.blocks:
        for row in array:
            yield _row(d, regions, cmd, msg, roles, dsg, row, block, index, own_of, ids)
            index += 1


def _region_index(regions, t: RpcTensor) -> int:
    return next((i for i, r in enumerate(regions) if r.base <= t.data < r.end), 0)


def _row(d, regions, cmd, msg, roles, dsg, row, block, index, own_of, ids) -> DesignRow:
    chosen: dict[str | None, dict[str, str]] = {}
    parts = []
    for f, v in zip(dsg.factors, row):
        label = f.values[int(v)]
        chosen.setdefault(f.role, {})[f.field] = label
        if label != AS_IS:
            parts.append(f"{f.name}={label}")
    out = msg
    for role, (slot, i) in roles.items():
        choice = chosen.get(role, {})
        if all(v == AS_IS for v in choice.values()):
            continue
        own = regions[own_of[role]]
        other = regions[1 - own_of[role]] if len(regions) > 1 else own
        other_id = next((v for r, v in ids.items() if r != role and v), ids[role] ^ 0x10)
        t = _get_tensor(msg, slot, i)
        out = _replace_tensor(out, slot, i, _apply_tensor(d, t, choice, own=own, other=other,
                                                          other_id=other_id))
    own_size = regions[own_of[next(iter(roles))]].size if roles else 0
    out = _with_scalars(cmd, out, chosen.get(None, {}), own_size)
    first = parts[0].split("=", 1)[0] if parts else "baseline"
    return DesignRow(cmd, block, index, " ".join(parts) or "baseline", first, out)


# ---------------------------------------------------------------- coverage

def command_designs(dialect: str, regions, baselines
                    ) -> dict[Cmd, tuple[CoveringDesign, object, dict]]:
    """Per tensor command of ``dialect``: (design, baseline request, roles)."""
    d = get_dialect(dialect)
    return {cmd: (design(d, cmd, msg, roles), msg, roles)
            for cmd, (msg, roles) in baselines.items()}


def coverage(dsg: CoveringDesign, sent_rows) -> dict:
    """Pairs and triples of ``dsg`` covered by the rows ``sent_rows`` (indices over all
    blocks): the interaction coverage a campaign reached."""
    whole = np.concatenate([r for _, r in dsg.blocks]) if dsg.blocks else np.zeros((0, 0))
    picked = whole[sorted(set(sent_rows))] if len(sent_rows) else whole[:0]
    pc, pn = covering.coverage(picked, dsg.sizes, dsg.pairs)
    tc, tn = covering.coverage(picked, dsg.sizes, dsg.triples) if dsg.triples else (0, 0)
    return {"rows": dsg.rows, "sent": len(set(sent_rows)), "pairs": [pc, pn],
            "triples": [tc, tn], "factors": len(dsg.factors)}
