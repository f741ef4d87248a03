"""The systematic phase every campaign starts with: a deterministic sweep before the random
search, so what a campaign tries does not depend on how much CPU it happens to get.

Five parts, in this order, the same for a dialect on every machine:

1. **the catalogue walk**: every registered request-side mutation operator x every command it
   applies to (the coverage table's catalogue), drawn ``draws`` times from fixed seeds, each in
   a session of its own. Once the walk ran, a campaign's "not exercised" list is empty.
2. **the boundary sweep**: for every command that carries tensors and every tensor role in it
   (tensor, src, dst, srcs[0], and in GRAPH_COMPUTE the node, a source, a view and the view's
   source), every ``placement`` and ``shape_class`` of :mod:`harness.strategies.boundaries`;
   every ``field_class`` (each id, ne/nb, type, op, op_params, flags, view and use-count field
   at its edges); every ``error_path`` (the tensor one byte past its buffer, with an op past
   the enum or a name a bounds-error message would print); every ``scalar_class`` (device,
   value, copies, stride, uid, hash at theirs);
   every ``range_class`` of the commands with an offset and a size; every ``graph_class``; and
   SET_TENSOR's cache flag 0, 1, 2 and 255. Each is a one-request session after the same
   set-up: HELLO, then ALLOC_BUFFER + BUFFER_GET_BASE of two buffers (4 KiB and 8 KiB), then the
   request, then a GET_ALIGNMENT probe.
3. **the combinatorial phase** (:mod:`.interactions`): the fields of every tensor role and the
   request's scalars at their edges together, as covering arrays (every pair of classes, every
   placement triple of a tensor and of a tensor and its source);
4. **the stateful phase** (:mod:`.stateful`): every ordered pair of state-changing requests,
   then every request that uses what they changed;
5. **the scale classes** (:mod:`.scale`): graphs as large as a request may be.

Parts 1, 3 and 4 are built once per harness version and kept in the cache; the boundary and
scale cases come lazily (their deep graphs are megabytes). :func:`coverage` says what a
campaign's sent cases covered.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from functools import lru_cache, partial

from hypothesis import HealthCheck, Phase, Verbosity, given, seed as hyp_seed, settings

from ..proto import Cmd, get_dialect, ggml
from ..proto import messages as m
from ..proto.dialects import Dialect
from ..proto.tensor import RpcTensor
from . import interactions, memo, scale, stateful
from .. import strategies as rst
from .case import Case, annotate, annotate_after, step
from .generate import _PROBE, _Model, _alloc_steps, _frame, _not_comm_init
from ..strategies.boundaries import (RANGED, error_path_cases, field_cases, graph_plan,
                                    graph_request, placement_cases, range_cases, scalar_cases,
                                    shape_cases, with_range)
from ..strategies.basics import _tensor_nbytes
from ..strategies.registry import _get_tensor, _replace_tensor

SETUP = (4096, 8192)  # the two buffers every boundary session allocates first
DRAWS = 2  # draws per (operator, command) in the catalogue walk
CACHE_FLAGS = (0, 1, 2, 255)


PARTS = ("catalogue", "boundary", "combinatorial", "stateful", "scale")


@dataclass(frozen=True)
class SweepCase:
    """One case of the sweep and what it stands for (for the report)."""

    part: str  # one of PARTS
    label: str  # "field:placement:GET_TENSOR tensor buffer=own data=other:end+1"
    case: Case
    # what it covers: (command, rows of its covering array) in the combinatorial part,
    # (ordered pair, ()) in the stateful one
    covers: tuple[str, tuple[int, ...]] | None = None


# ---------------------------------------------------------------- sessions

def _setup(d: Dialect) -> tuple[list, tuple]:
    """HELLO, the ALLOC_BUFFERs, then their BUFFER_GET_BASEs: the executor pipelines what
    needs no earlier answer, so this order costs three round trips, not five."""
    model = _Model()
    allocs = [_alloc_steps(size, d, model) for size in SETUP]
    steps = [step(rst.hello_request_frame(d), Cmd.HELLO.value)]
    steps += [a[0] for a in allocs] + [a[1] for a in allocs]
    return steps, tuple(model.regions)


def _probe(d: Dialect):
    return step(_frame(d, _PROBE), Cmd.GET_ALIGNMENT.value)


def _session(d: Dialect, head: list, frame: bytes, cmd: str, desc: dict) -> Case:
    last = step(frame, cmd, desc=desc, eof=bool(desc.get("eof")))
    return annotate_after(_annotated(d.name, tuple(head)), (last, _probe(d)),
                          meta={"mutations": [desc], "sweep": True})


@lru_cache(maxsize=64)
def _annotated(dialect: str, head: tuple) -> Case:
    return annotate(dialect, head)


# ---------------------------------------------------------------- 1. the catalogue walk

def _walk_pairs(d: Dialect) -> list[tuple[rst.MutationOp, Cmd | None]]:
    return [(op, c) for kind in rst.MUTATION_KINDS for op, c in rst.candidates(d, kind)
            if op.direction == "request"]


def _drawn(strategy, n: int, seed: int) -> list:
    found = []

    @settings(database=None, max_examples=n, deadline=None, phases=(Phase.generate,),
              suppress_health_check=list(HealthCheck), verbosity=Verbosity.quiet)
    @hyp_seed(seed)
    @given(strategy)
    def collect(x):
        if len(found) < n:
            found.append(x)
    collect()
    return found


FIELD_DRAWS = 8  # candidate draws for a field the first draws of a pair did not write


def _drawn_every_field(strategy, n: int, seed: int, fields) -> list:
    """``n`` draws that write every field the operator lists when there are at most ``n``:
    a draw repeating a field gives way to one writing a field not yet written (two draws of
    `truncated` on a short frame may both cut its header). The count stays ``n``, so the
    sweep's size is what :func:`size` says."""
    found = _drawn(strategy, n, seed)
    fields = set(fields)
    wanted = fields - {m.description["field"] for m in found}
    if not wanted or len(fields) > n:
        return found
    for mut in _drawn(strategy, FIELD_DRAWS, seed ^ 0x5EED):
        field = mut.description["field"]
        if field not in wanted:
            continue
        seen = [m.description["field"] for m in found]
        spare = next((i for i, f in enumerate(seen) if seen.count(f) > 1), None)
        if spare is not None:
            found[spare] = mut
        elif len(found) < n:  # the strategy had fewer than n distinct draws
            found.append(mut)
        else:
            break
        wanted.discard(field)
        if not wanted:
            break
    return found


def catalogue_walk(dialect: str, *, draws: int = DRAWS, local_only: bool = True
                   ) -> Iterator[SweepCase]:
    d = get_dialect(dialect)
    head, regions = _setup(d)
    hello = [step(rst.hello_request_frame(d), Cmd.HELLO.value)]
    for op, cmd in _walk_pairs(d):
        name = cmd.value if cmd is not None else "UNKNOWN"
        seed = zlib.crc32(f"{d.name}|{op.kind}|{op.what}|{name}".encode())
        buffers = None if op.kind == "framing" else regions
        strategy = rst.strategy_of(d, op.kind, cmd, what=op.what, buffers=buffers)
        for mut in _drawn_every_field(strategy, draws, seed, op.fields_for(d, cmd)):
            if local_only and not _not_comm_init(mut):
                continue
            desc = mut.description
            at = desc["at"]
            before = [] if at == "connect" else hello if at == "after_hello" else head
            if at == "connect" and not op.opening:
                # the server must refuse this connection: only the probe follows
                case = annotate(d, (step(mut.data, desc["cmd"], desc=desc,
                                         eof=bool(desc.get("eof"))), _probe(d)),
                                meta={"mutations": [desc], "sweep": True})
            else:
                case = _session(d, before, mut.data, desc["cmd"], desc)
            yield SweepCase("catalogue", f"{op.kind}:{op.what}:{name}", case)


# ---------------------------------------------------------------- 2. the boundary sweep

def _t(tid: int, r, at: int = 512, n: int = 64, **kw) -> RpcTensor:
    return RpcTensor(id=tid, type=ggml.TYPE_F32, buffer=r.handle, ne=(n, 1, 1, 1),
                     nb=(4, 4 * n, 4 * n, 4 * n), data=r.base + at, **kw)


def baselines(d: Dialect, regions) -> dict[Cmd, tuple[object, dict[str, tuple[str, int]]]]:
    """Per tensor command of ``d``: a valid request over the two buffers, and its tensor roles
    (role -> (message slot, index))."""
    r0, r1 = regions
    t0 = _t(1, r0)
    n = _tensor_nbytes(t0)
    null10 = (RpcTensor(),) * 10
    add = ggml.OP["ADD"]
    out: dict[Cmd, tuple[object, dict]] = {
        Cmd.SET_TENSOR: (m.SetTensorRequest(t0, 0, 0, bytes(n)), {"tensor": ("tensor", 0)}),
        Cmd.SET_TENSOR_HASH: (m.SetTensorHashRequest(t0, 0, 0x1234_5678_9ABC_DEF0),
                              {"tensor": ("tensor", 0)}),
        Cmd.GET_TENSOR: (m.GetTensorRequest(t0, 0, n), {"tensor": ("tensor", 0)}),
        Cmd.MEMSET_TENSOR: (m.MemsetTensorRequest(t0, 0, n, 7), {"tensor": ("tensor", 0)}),
        Cmd.SET_TENSOR_2D: (m.SetTensor2DRequest(t0, 0, 64, 4, 64, bytes(256)),
                            {"tensor": ("tensor", 0)}),
        Cmd.GET_TENSOR_2D: (m.GetTensor2DRequest(t0, 0, 64, 4, 64), {"tensor": ("tensor", 0)}),
        Cmd.INIT_TENSOR: (m.InitTensorRequest(t0), {"tensor": ("tensor", 0)}),
        Cmd.COPY_TENSOR: (m.CopyTensorRequest(t0, _t(2, r1)), {"src": ("src", 0),
                                                              "dst": ("dst", 0)}),
        Cmd.GET_ALLOC_SIZE: (m.GetAllocSizeRequest(0, t0, (_t(2, r1),) + null10[1:]),
                             {"tensor": ("tensor", 0), "srcs[0]": ("srcs[]", 0)}),
        Cmd.GET_DEVICE_SUPPORTS_OP: (
            m.SupportsOpRequest(0, _t(3, r1, op=add, src=(1, 2) + (0,) * 8),
                                (t0, _t(2, r0, 1024)) + null10[2:]),
            {"op": ("op", 0), "srcs[0]": ("srcs[]", 0)}),
        Cmd.COMM_ALLREDUCE: (m.CommAllreduceRequest(0, t0), {"tensor": ("tensor", 0)}),
    }
    # a, b in buffer 0; v a view of a; the node out = v + b in buffer 1
    a, b = _t(1, r0, 0), _t(2, r0, 256)
    v = _t(4, r0, 0, view_src=1, view_offs=0)
    node = _t(3, r1, 0, op=add, src=(4, 2) + (0,) * 8)
    out[Cmd.GRAPH_COMPUTE] = (graph_request(d, (3,), (a, b, v, node)),
                              {"node": ("tensors[]", 3), "source": ("tensors[]", 1),
                               "view": ("tensors[]", 2), "view source": ("tensors[]", 0)})
    return {c: v for c, v in out.items() if d.has(c)}


def _own(regions, t: RpcTensor) -> int:
    return next((i for i, r in enumerate(regions) if r.base <= t.data < r.end), 0)


def _desc(d: Dialect, kind: str, what: str, cmd: Cmd, field: str, case: str, **extra) -> dict:
    desc = {"kind": kind, "what": what, "cmd": cmd.value, "cmd_id": d.id_of(cmd), "field": field,
            "dialect": d.name, "direction": "request", "at": "after_setup", "case": case}
    desc.update({k: v for k, v in extra.items() if v is not None})
    return desc


def _other_id(msg, roles, t: RpcTensor) -> int:
    ids = (_get_tensor(msg, slot, index).id for slot, index in roles.values())
    return next((i for i in ids if i not in (t.id, 0)), t.id ^ 0x10)


def _built_graph(d: Dialect, build, template) -> m.GraphComputeRequest:
    return graph_request(d, *build(), template)


def _boundary_requests(d: Dialect, regions, *, build: bool = True
                       ) -> Iterator[tuple[str, Cmd, dict, object]]:
    """(label, command, description, request) of every distinct boundary case, unframed.
    An edge that equals another case's request (a field whose baseline value is the edge, a
    size the command does not carry) is sent once, under the first label. The graph cases
    come as builders (``partial``): each differs from every other by construction, and
    building the 2^16-tensor ones is what costs, so ``size`` (``build=False``) builds none."""
    sent: set = set()
    for label, cmd, desc, req in _all_boundary_requests(d, regions):
        lazy = isinstance(req, partial)
        key = (cmd, label) if lazy else (cmd, req)
        if key not in sent:
            sent.add(key)
            yield label, cmd, desc, (req() if lazy and build else req)


def _all_boundary_requests(d: Dialect, regions) -> Iterator[tuple[str, Cmd, dict, object]]:
    for cmd, (msg, roles) in baselines(d, regions).items():
        for role, (slot, index) in roles.items():
            t = _get_tensor(msg, slot, index)
            own = _own(regions, t)
            index_extra = {"index": index} if slot.endswith("[]") else {}
            for case, handle, data in placement_cases(regions, own, _tensor_nbytes(t)):
                # the field credited is the one the case is about: the buffer when it names
                # another (or no) buffer, else the data pointer
                written = "buffer" if handle != t.buffer else "data"
                yield (f"placement:{cmd.value} {role} {case}", cmd,
                       _desc(d, "field", "placement", cmd, f"{slot}.{written}", f"{role}: {case}",
                             value=data, **index_extra),
                       _replace_tensor(msg, slot, index, replace(t, buffer=handle, data=data)))
            for case, ne, nb, type_ in shape_cases(t):
                yield (f"shape_class:{cmd.value} {role} {case}", cmd,
                       _desc(d, "field", "shape_class", cmd, f"{slot}.ne", f"{role}: {case}",
                             **index_extra),
                       _replace_tensor(msg, slot, index, replace(t, ne=ne, nb=nb, type=type_)))
            for case, field, changed in field_cases(t, _other_id(msg, roles, t), regions[own]):
                yield (f"field_class:{cmd.value} {role} {case}", cmd,
                       _desc(d, "field", "field_class", cmd, f"{slot}.{field}",
                             f"{role}: {case}", **index_extra),
                       _replace_tensor(msg, slot, index, changed))
            for case, changed in error_path_cases(t, regions[own]):
                yield (f"error_path:{cmd.value} {role} {case}", cmd,
                       _desc(d, "field", "error_path", cmd, f"{slot}.data", f"{role}: {case}",
                             **index_extra),
                       _replace_tensor(msg, slot, index, changed))
        for case, field, changed in scalar_cases(msg):
            if field == "uid" and not d.graph_uid:  # a field of the message, not of the wire
                continue
            yield (f"scalar_class:{cmd.value} {case}", cmd,
                   _desc(d, "field", "scalar_class", cmd, field, case), changed)
        if cmd in RANGED:
            n = _tensor_nbytes(msg.tensor)
            for case, offset, size in range_cases(n, SETUP[0]):
                field = "size" if case.startswith("size") and hasattr(msg, "size") else "offset"
                yield (f"range_class:{cmd.value} {case}", cmd,
                       _desc(d, "field", "range_class", cmd, field, case,
                             value=size if field == "size" else offset),
                       with_range(msg, cmd, offset, size))
        if cmd is Cmd.GRAPH_COMPUTE:
            for case, _, build in graph_plan(regions):
                # built when framed: counting the sweep builds none of the 2^16-tensor graphs
                yield (f"graph_class:GRAPH_COMPUTE {case}", cmd,
                       _desc(d, "field", "graph_class", cmd, "tensors", case),
                       partial(_built_graph, d, build, msg))
        if cmd is Cmd.SET_TENSOR and d.cache_flag:
            for flag in CACHE_FLAGS:
                yield (f"cache_flag:SET_TENSOR {flag}", cmd,
                       _desc(d, "flag", "cache_flag", cmd, "cache_flag", f"cache_flag={flag}",
                             value=flag),
                       replace(msg, cache_flag=flag))


def boundary_sweep(dialect: str, keep: Callable[[int], bool] | None = None
                   ) -> Iterator[SweepCase | None]:
    """The boundary part in order: its small cases from the cache (framing and annotating
    them cost seconds in every process that sweeps), its graph cases built as they come (the
    2^16-tensor ones are megabytes each). ``keep(j)`` False: None in the j-th case's place,
    nothing built (another worker's shard)."""
    d = get_dialect(dialect)
    head, regions = _setup(d)
    planned = _cached("boundary", d.name, partial(_build_boundary, dialect))
    if not isinstance(planned, list):
        planned = _build_boundary(dialect)
    lazy = None
    for j, item in enumerate(planned):
        if keep is not None and not keep(j):
            yield None
            continue
        if isinstance(item, SweepCase):
            yield item
            continue
        if lazy is None:
            lazy = {label: (cmd, desc, req) for label, cmd, desc, req
                    in _boundary_requests(d, regions, build=False) if isinstance(req, partial)}
        cmd, desc, build = lazy[item]
        yield SweepCase("boundary", item, _session(d, head, _frame(d, build()), cmd.value, desc))


def _build_boundary(dialect: str) -> list:
    """Each boundary case in order: a SweepCase, or the label of a graph case to build."""
    d = get_dialect(dialect)
    head, regions = _setup(d)
    return [label if isinstance(req, partial) else
            SweepCase("boundary", label, _session(d, head, _frame(d, req), cmd.value, desc))
            for label, cmd, desc, req in _boundary_requests(d, regions, build=False)]


def _cached(kind: str, key: str, build):
    """``build()``, once per version of the code the sweep can import (harness/fuzz/memo.py)."""
    return memo.cached(kind, key, memo.closure_digest(__name__), build)


def cached_walk(dialect: str, *, draws: int = DRAWS, local_only: bool = True
                ) -> list[SweepCase]:
    """The catalogue walk (drawing it costs seconds of hypothesis generation)."""
    key = f"{get_dialect(dialect).name}-{draws}-{int(local_only)}"
    cases = _cached("walk", key, lambda: list(catalogue_walk(dialect, draws=draws,
                                                               local_only=local_only)))
    if isinstance(cases, list) and all(isinstance(c, SweepCase) for c in cases):
        return cases
    return list(catalogue_walk(dialect, draws=draws, local_only=local_only))


# ---------------------------------------------------------------- 3. the combinatorial phase

@dataclass(frozen=True)
class Combinatorial:
    """The combinatorial part of a dialect: its cases and each command's design."""

    cases: list[SweepCase]
    designs: dict[str, "interactions.CoveringDesign"]


def _build_combinatorial(dialect: str) -> Combinatorial:
    d = get_dialect(dialect)
    head, regions = _setup(d)
    cases, designs = [], {}
    for cmd, (dsg, msg, roles) in interactions.command_designs(dialect, regions,
                                                      baselines(d, regions)).items():
        designs[cmd.value] = dsg
        by_request: dict = {}  # rows that make the same request are one case
        for row in interactions.rows_of(d, regions, cmd, msg, roles, dsg):
            by_request.setdefault(row.request, []).append(row)
        for req, rows in by_request.items():
            first = rows[0]
            desc = _desc(d, "field", "combinatorial", cmd, first.first, first.label,
                         block=first.block)
            cases.append(SweepCase("combinatorial", f"combinatorial:{cmd.value} {first.label}",
                                   _session(d, head, _frame(d, req), cmd.value, desc),
                                   (cmd.value, tuple(r.index for r in rows))))
    return Combinatorial(cases, designs)


def combinatorial(dialect: str) -> Combinatorial:
    value = _cached("combinatorial", get_dialect(dialect).name,
                    partial(_build_combinatorial, dialect))
    return value if isinstance(value, Combinatorial) else _build_combinatorial(dialect)


def _build_stateful(dialect: str) -> list[SweepCase]:
    d = get_dialect(dialect)
    return [SweepCase("stateful", f"stateful:{c.pair}, then {c.use}", c.case, (c.pair, ()))
            for c in stateful.cases(d)]


def stateful_cases(dialect: str) -> list[SweepCase]:
    value = _cached("stateful", get_dialect(dialect).name, partial(_build_stateful, dialect))
    return value if isinstance(value, list) else _build_stateful(dialect)


def scale_sweep(dialect: str, keep: Callable[[int], bool] | None = None
                ) -> Iterator[SweepCase | None]:
    """The scale part (graphs of up to 60 MB, each built when reached); ``keep`` as for
    :func:`boundary_sweep`."""
    d = get_dialect(dialect)
    head, regions = _setup(d)
    for built in scale.cases(d, head, regions[0], _probe(d), keep):
        yield built and SweepCase("scale", f"scale_class:GRAPH_COMPUTE {built[0]}", built[1])


# ---------------------------------------------------------------- the whole sweep

@dataclass(frozen=True)
class Prepared:
    """What the sweep of a dialect needs before it runs: the cached parts and the counts of
    the lazy ones."""

    walk: list[SweepCase]
    combinatorial: Combinatorial
    stateful: list[SweepCase]
    boundary_count: int
    scale_count: int


def prepare(dialect: str, *, draws: int = DRAWS, local_only: bool = True) -> Prepared:
    """Build (or read from the cache) every part of the sweep, once per process and cache
    directory. Campaigns call it before their clock starts: a first campaign after an upgrade
    builds the covering arrays then, which is set-up, not fuzzing."""
    from ..impls.cache import cache_root
    return _prepare(get_dialect(dialect).name, draws, local_only, str(cache_root()))


@lru_cache(maxsize=16)
def _prepare(dialect: str, draws: int, local_only: bool, cache: str) -> Prepared:
    d = get_dialect(dialect)
    _, regions = _setup(d)
    return Prepared(cached_walk(dialect, draws=draws, local_only=local_only),
                    combinatorial(dialect), stateful_cases(dialect),
                    sum(1 for _ in _boundary_requests(d, regions, build=False)),
                    len(scale.plan(d, regions[0])))


@lru_cache(maxsize=16)
def designs(dialect: str) -> dict[Cmd, tuple["interactions.CoveringDesign", object, dict]]:
    """Per tensor command: (its covering-array design, baseline request, tensor roles), the
    designs from the prepared (cached) combinatorial part."""
    d = get_dialect(dialect)
    _, regions = _setup(d)
    built = prepare(dialect).combinatorial.designs
    return {cmd: (built[cmd.value], msg, roles)
            for cmd, (msg, roles) in baselines(d, regions).items()}


def parts(dialect: str, *, draws: int = DRAWS, local_only: bool = True
          ) -> list[tuple[str, Iterable[SweepCase], int]]:
    """(part, its cases, how many) in sweep order; the lazy parts are counted without
    building their graphs."""
    p = prepare(dialect, draws=draws, local_only=local_only)
    return [("catalogue", p.walk, len(p.walk)),
            ("boundary", partial(boundary_sweep, dialect), p.boundary_count),
            ("combinatorial", p.combinatorial.cases, len(p.combinatorial.cases)),
            ("stateful", p.stateful, len(p.stateful)),
            ("scale", partial(scale_sweep, dialect), p.scale_count)]


def sweep(dialect: str, *, draws: int = DRAWS, local_only: bool = True,
          shard: tuple[int, int] = (1, 1), only: Iterable[str] | None = None
          ) -> Iterator[SweepCase]:
    """The whole sweep, part by part (the catalogue walk first: it is what the coverage
    table counts); ``shard`` (i, n): every n-th case from the i-th, for one of n workers;
    ``only``: these parts (the others are not built: the lazy ones cost seconds)."""
    i, n = shard
    k = 0
    wanted = set(only) if only is not None else set(PARTS)
    for part, cases, count in parts(dialect, draws=draws, local_only=local_only):
        if part not in wanted:
            k += count
            continue
        if callable(cases):  # a lazy part builds only this shard's cases
            cases = cases(lambda j, start=k: (start + j) % n == i - 1)
        for c in cases:
            if k % n == i - 1:
                yield c
            k += 1


def size(dialect: str, *, draws: int = DRAWS, shard: tuple[int, int] = (1, 1),
         local_only: bool = True, only: Iterable[str] | None = None) -> int:
    """How many cases ``sweep`` gives this shard (of the parts ``only`` names)."""
    wanted = set(only) if only is not None else set(PARTS)
    i, n = shard
    k = count = 0
    for part, _, total in parts(dialect, draws=draws, local_only=local_only):
        if part in wanted:  # the shard's cases among global indices k .. k + total - 1
            count += len(range(k + (i - 1 - k) % n, k + total, n))
        k += total
    return count


def sent(dialect: str, shards: Iterable[tuple[tuple[int, int], int]],
         only: Iterable[str] | None = None) -> set[int]:
    """Indices (over the whole sweep) of the cases sent, from each worker's shard and how
    many of its cases it ran (a worker runs its shard of the parts ``only`` names, in
    order)."""
    wanted = set(only) if only is not None else set(PARTS)
    spans, k = [], 0
    for part, _, total in parts(dialect):
        if part in wanted:
            spans.append(range(k, k + total))
        k += total
    out: set[int] = set()
    for (i, n), done in shards:
        mine = (x for span in spans for x in span[(i - 1 - span.start) % n::n])
        out.update(itertools.islice(mine, done))
    return out


def coverage(dialect: str, indices: set[int], *, draws: int = DRAWS,
             local_only: bool = True) -> dict:
    """What the sent cases (``indices`` over the whole sweep) covered: per part, cases sent of
    cases; per command, the rows of its covering array and the pairs and triples they cover;
    the stateful phase's ordered pairs whose every use was sent."""
    out: dict = {"parts": {}, "commands": {}, "stateful": {}}
    d = get_dialect(dialect)
    start = 0
    combo = prepare(dialect, draws=draws, local_only=local_only).combinatorial
    for part, cases, n in parts(dialect, draws=draws, local_only=local_only):
        mine = [k - start for k in indices if start <= k < start + n]
        out["parts"][part] = [len(mine), n]
        if part == "combinatorial":
            rows: dict[str, list[int]] = {}
            for k in mine:
                cmd, covered = combo.cases[k].covers
                rows.setdefault(cmd, []).extend(covered)
            for cmd, dsg in combo.designs.items():
                out["commands"][cmd] = interactions.coverage(dsg, rows.get(cmd, []))
        elif part == "stateful":
            per_pair: dict[str, list[int]] = {}
            for k, c in enumerate(cases):
                per_pair.setdefault(c.covers[0], []).append(k)
            done = set(mine)
            complete = [p for p, ks in per_pair.items() if all(k in done for k in ks)]
            out["stateful"] = {"pairs": [len(complete), len(stateful.pairs_possible(d))],
                               "uses": len(stateful.uses(d))}
        start += n
    return out
