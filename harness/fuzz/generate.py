"""Hypothesis strategy for whole fuzz cases: a model-based session with mutated steps mixed in.

A case is one connection. Its shape follows a small model of the server's per-connection
state (spec 8) -- the buffers it allocated and freed, the tensors it wrote, whether a graph is
stored -- so later steps use real handles, real bases (learned on the wire, see
:mod:`harness.fuzz.case`) and tensors that lie inside them:

    HELLO, ALLOC_BUFFER + BUFFER_GET_BASE per buffer, then a body of rules
    (set/get/memset/copy/init tensors, clear/alloc/free buffers, compute/recompute graphs,
    device queries) interleaved with structured mutations from :mod:`harness.strategies`
    (framing, flag and field mutations relative to the live buffers), then a probe.

Every decision is a hypothesis draw, so a failing case shrinks: fewer steps, simpler rules,
simpler values. Choices are ordered so that shrinking moves towards "valid" (a mutation is the
*last* value of its choice, rule 0 is the cheapest query). Valid steps are packed directly
from two draws each (rule, then one integer decoded into all sub-choices) because a
hypothesis draw costs ~30 us and a generic message strategy ~0.4 ms; mutations use the
shared strategies, whose descriptions feed the coverage table.

The only knowledge of the server in here is the protocol itself; nothing targets known bugs.
"""

from __future__ import annotations

import random
from functools import lru_cache

from hypothesis import strategies as st

from .errors import FuzzError
from ..proto import Cmd, RpcTensor, get_dialect, ggml, nbytes, pack_request
from ..proto import messages as m
from ..proto.dialects import DEFAULT, Dialect
from ..proto.wire import U64_MAX
from .. import strategies as rst
from .case import BASE, HANDLE, Case, annotate, sentinel, step

MAX_BUFFERS = 6
MIN_TENSOR_BUFFER = 256  # valid tensors go into buffers at least this big (tiny ones: mutations)
BUFFER_SIZES = (256, 1024, 4096, 32, 65536, 0)  # shrinks towards 256
# Types whose blocks are small enough for the buffers above; f32 first (the simplest).
_TYPES = (ggml.TYPE_F32, ggml.TYPE_F16, 2, 8, 26, 24, 30, 10, 12)  # q4_0 q8_0 i32 i8 bf16 q2_K q4_K
_ALIGN = 32
_PROBE = m.GetAlignmentRequest(0)


@lru_cache(maxsize=1024)
def _ints(lo: int, hi: int) -> st.SearchStrategy[int]:
    """st.integers, built once per range: building a strategy costs as much as drawing it."""
    return st.integers(lo, hi)


@lru_cache(maxsize=4096)
def _pick(items: tuple) -> st.SearchStrategy:
    return st.sampled_from(items)


def _region(i: int, size: int) -> rst.BufferRegion:
    return rst.BufferRegion(sentinel(HANDLE, i), sentinel(BASE, i), size)


class _Model:
    """What the client believes the server holds on this connection."""

    def __init__(self):
        self.regions: list[rst.BufferRegion] = []
        self.alive: list[bool] = []
        self.tensors: list[RpcTensor] = []  # written tensors (in live buffers when written)
        self.graph_stored = False
        self.next_id = 0x1000

    def new_id(self) -> int:
        self.next_id += 0x10
        return self.next_id

    def live(self) -> tuple[int, ...]:
        return tuple(i for i, a in enumerate(self.alive) if a)


class _Choices:
    """Sub-choices of one valid step, decoded from a single drawn integer (mixed radix).

    One hypothesis draw costs ~30 us, so a valid step draws twice (rule, choices) instead of
    once per field. Shrinking still works: the integer shrinks towards 0, and digit 0 is the
    simplest option of every sub-choice (first type, offset 0, empty span...).
    """

    __slots__ = ("v",)

    def __init__(self, v: int):
        self.v = v

    def int(self, lo: int, hi: int) -> int:
        n = hi - lo + 1
        if n <= 1:
            return lo
        r = self.v % n
        self.v //= n
        return lo + r

    def pick(self, items):
        return items[self.int(0, len(items) - 1)]

    def bool(self) -> bool:
        return bool(self.int(0, 1))

    def blob(self, n: int) -> bytes:
        """``n`` bytes from the remaining digits (a byte pattern, repeated)."""
        if n == 0:
            return b""
        seed = self.v.to_bytes(8, "little") if self.v else b"\0"
        self.v = 0
        return (seed * (n // len(seed) + 1))[:n]


_CHOICES = st.integers(0, U64_MAX)


# ---------------------------------------------------------------- tensors

def _tensor_in(c: _Choices, model: _Model, i: int) -> RpcTensor:
    """A fresh tensor lying inside buffer ``i`` (contiguous, aligned offset)."""
    region = model.regions[i]
    type_id = c.pick(_TYPES)
    t = ggml.TYPES[type_id]
    ne = (t.blck_size * c.int(1, 8), c.int(1, 4), 1, 1)
    rec = RpcTensor.make(id=model.new_id(), type=type_id, ne=ne)
    n = nbytes(rec)
    if n > region.size:  # shrink to one row, then to nothing
        ne = (t.blck_size, 1, 1, 1)
        rec = rec.with_(ne=ne, nb=ggml.contiguous_strides(type_id, ne))
        n = nbytes(rec)
        if n > region.size:
            ne = (0, 1, 1, 1)
            rec = rec.with_(ne=ne, nb=ggml.contiguous_strides(type_id, ne))
            n = 0
    slots = (region.size - n) // _ALIGN
    return rec.with_(buffer=region.handle, data=region.base + c.int(0, slots) * _ALIGN)


class _NeedBuffer(FuzzError):
    """A rule needs a live buffer big enough for its tensors: allocate one first."""


def _roomy(model: _Model, need: int = MIN_TENSOR_BUFFER) -> tuple[int, ...]:
    found = tuple(i for i in model.live() if model.regions[i].size >= need)
    if not found:
        raise _NeedBuffer()
    return found


def _pick_tensor(c: _Choices, model: _Model) -> RpcTensor:
    """A tensor written earlier (still in a live buffer), or a fresh one in a roomy buffer."""
    roomy = _roomy(model)
    if model.tensors and c.bool():
        known = [t for t in model.tensors if _owner(model, t) in roomy]
        if known:
            return c.pick(known)
    return _tensor_in(c, model, c.pick(roomy))


def _owner(model: _Model, t: RpcTensor) -> int:
    for i, r in enumerate(model.regions):
        if r.handle == t.buffer:
            return i
    return -1


def _span(c: _Choices, n: int, cap: int = 4096) -> tuple[int, int]:
    offset = c.int(0, n)
    return offset, c.int(0, min(n - offset, cap))


# ---------------------------------------------------------------- rules
# Each rule: (choices, draw, dialect, model) -> steps. ``draw`` is only for the few parts that
# come from shared strategies (rich graphs, dialect extras).

def _frame(d: Dialect, msg) -> bytes:
    return pack_request(d, msg)


_QUERIES = (Cmd.GET_ALIGNMENT, Cmd.GET_MAX_SIZE, Cmd.GET_DEVICE_MEMORY, Cmd.DEVICE_COUNT)
_DEVICE_REQUESTS = {Cmd.GET_ALIGNMENT: m.GetAlignmentRequest, Cmd.GET_MAX_SIZE: m.GetMaxSizeRequest,
                    Cmd.GET_DEVICE_MEMORY: m.GetDeviceMemoryRequest}


def _rule_query(c, draw, d, model):
    cmd = c.pick(_QUERIES)
    msg = m.DeviceCountRequest() if cmd is Cmd.DEVICE_COUNT else _DEVICE_REQUESTS[cmd](0)
    return [step(_frame(d, msg), cmd.value)]


def _rule_alloc(c, draw, d, model):
    if len(model.regions) >= MAX_BUFFERS:
        return _rule_query(c, draw, d, model)
    return _alloc_steps(c.pick(BUFFER_SIZES), d, model)


def _alloc_steps(size: int, d, model) -> list:
    i = len(model.regions)
    model.regions.append(_region(i, size))
    model.alive.append(True)
    return [step(_frame(d, m.AllocBufferRequest(0, size)), Cmd.ALLOC_BUFFER.value,
                 learn=(HANDLE, i)),
            step(_frame(d, m.BufferGetBaseRequest(model.regions[i].handle)),
                 Cmd.BUFFER_GET_BASE.value, learn=(BASE, i))]


def _rule_free(c, draw, d, model):
    live = model.live()
    if len(live) < 2:  # keep one buffer for the other rules
        return _rule_clear(c, draw, d, model)
    i = c.pick(live)
    model.alive[i] = False
    model.graph_stored = False  # FREE_BUFFER forgets stored graphs (spec 5.4)
    return [step(_frame(d, m.FreeBufferRequest(model.regions[i].handle)), Cmd.FREE_BUFFER.value)]


def _rule_clear(c, draw, d, model):
    i = c.pick(model.live() or _roomy(model))
    return [step(_frame(d, m.BufferClearRequest(model.regions[i].handle, c.int(0, 255))),
                 Cmd.BUFFER_CLEAR.value)]


def _rule_set(c, draw, d, model):
    t = _pick_tensor(c, model)
    offset, size = _span(c, nbytes(t))
    if t not in model.tensors:
        model.tensors.append(t)
    msg = m.SetTensorRequest(tensor=t, offset=offset, data=c.blob(size))
    return [step(_frame(d, msg), Cmd.SET_TENSOR.value)]


def _rule_get(c, draw, d, model):
    t = _pick_tensor(c, model)
    offset, size = _span(c, nbytes(t))
    return [step(_frame(d, m.GetTensorRequest(t, offset, size)), Cmd.GET_TENSOR.value)]


def _rule_memset(c, draw, d, model):
    if not d.has(Cmd.MEMSET_TENSOR):
        return _rule_get(c, draw, d, model)
    t = _pick_tensor(c, model)
    offset, size = _span(c, nbytes(t), 1 << 20)
    msg = m.MemsetTensorRequest(t, offset, size, c.int(0, 255))
    return [step(_frame(d, msg), Cmd.MEMSET_TENSOR.value)]


def _rule_copy(c, draw, d, model):
    src = _pick_tensor(c, model)
    n = nbytes(src)
    j = c.pick(_roomy(model, max(n, MIN_TENSOR_BUFFER)))
    region = model.regions[j]
    # Same type and shape, at an aligned offset where all of it fits.
    slots = (region.size - n) // _ALIGN
    dst = src.with_(id=model.new_id(), buffer=region.handle,
                    data=region.base + c.int(0, slots) * _ALIGN)
    return [step(_frame(d, m.CopyTensorRequest(src, dst)), Cmd.COPY_TENSOR.value)]


def _rule_init(c, draw, d, model):
    t = _pick_tensor(c, model)
    if c.bool():
        t = t.with_(buffer=0, data=0)  # the "null buffer" path
    return [step(_frame(d, m.InitTensorRequest(t)), Cmd.INIT_TENSOR.value)]


_ALLOC_SIZE_OPS = (0, ggml.OP["ADD"], ggml.OP["MUL_MAT"], ggml.OP["CPY"])


def _rule_alloc_size(c, draw, d, model):
    t = _pick_tensor(c, model)
    if c.bool():
        t = t.with_(buffer=0, data=0)  # asked before allocation
    msg = m.GetAllocSizeRequest(0, t.with_(op=c.pick(_ALLOC_SIZE_OPS)), (RpcTensor.null(),) * 10)
    return [step(_frame(d, msg), Cmd.GET_ALLOC_SIZE.value)]


def _rule_hash(c, draw, d, model):
    t = _pick_tensor(c, model)
    msg = m.SetTensorHashRequest(t, 0, c.int(0, (1 << 32) - 1))
    return [step(_frame(d, msg), Cmd.SET_TENSOR_HASH.value)]


_ELEMENTWISE = (ggml.OP["ADD"], ggml.OP["MUL"])  # computed by every server, the reference too


def _rule_graph(c, draw, d, model):
    rich = c.int(0, 7) == 7
    # Valid graphs live in a buffer that holds them (a real client never computes tensors
    # without memory); no such buffer yet: allocate one first.
    need = 4096 if rich else 16 * 4 * 6
    region = model.regions[c.pick(_roomy(model, need))]
    model.graph_stored = True
    if rich:
        # The shared strategy's graphs: DAGs with views, any dialect's uid rules.
        g = draw(_graphs(d.name, region))
        return [step(_frame(d, g), Cmd.GRAPH_COMPUTE.value)]
    # A chain of same-shape elementwise f32 nodes over two leaves, all inside the buffer:
    # what a real client sends for a small model graph, at a fraction of the strategy's cost.
    n_nodes = c.int(1, 4)
    ne0 = c.int(1, 16)
    per = ne0 * 4
    leaves = [RpcTensor.make(id=model.new_id(), ne=(ne0,), name=f"leaf_{k}",
                             buffer=region.handle, data=region.base + k * per) for k in range(2)]
    prev, nodes = leaves[0], []
    for k in range(n_nodes):
        node = RpcTensor.make(id=model.new_id(), ne=(ne0,), op=c.pick(_ELEMENTWISE),
                              flags=ggml.FLAG_COMPUTE, src=(prev.id, leaves[1].id),
                              buffer=region.handle, name=f"node_{k}",
                              data=region.base + (k + 2) * per, use_count=1)
        nodes.append(node)
        prev = node
    g = m.GraphComputeRequest(device=0, nodes=tuple(n.id for n in nodes),
                              tensors=tuple(leaves + nodes))
    return [step(_frame(d, g), Cmd.GRAPH_COMPUTE.value)]


@lru_cache(maxsize=1024)
def _graphs(dialect: str, region: rst.BufferRegion) -> st.SearchStrategy:
    return rst.graphs(dialect, shape="valid", buffers=[region], max_nodes=4)


def _rule_recompute(c, draw, d, model):
    if not model.graph_stored or d.graph_uid:  # uids are the graph strategy's business
        return _rule_graph(c, draw, d, model)
    return [step(_frame(d, m.GraphRecomputeRequest(0)), Cmd.GRAPH_RECOMPUTE.value)]


def _rule_other(c, draw, d, model):
    """A valid request of a command the rules above do not model (dialect extras)."""
    extra = _extra_cmds(d)
    if not extra:
        return _rule_query(c, draw, d, model)
    cmd = c.pick(extra)
    live = tuple(model.regions[i] for i in model.live())
    msg = draw(_messages(d.name, cmd, live))
    return [step(_frame(d, msg), cmd.value)]


_RULES = (_rule_query, _rule_set, _rule_get, _rule_memset, _rule_clear, _rule_copy,
          _rule_init, _rule_alloc_size, _rule_hash, _rule_graph, _rule_recompute, _rule_alloc,
          _rule_free, _rule_other)
_MODELLED = {Cmd.HELLO, Cmd.DEVICE_COUNT, Cmd.GET_ALIGNMENT, Cmd.GET_MAX_SIZE,
             Cmd.GET_DEVICE_MEMORY, Cmd.ALLOC_BUFFER, Cmd.BUFFER_GET_BASE, Cmd.FREE_BUFFER,
             Cmd.BUFFER_CLEAR, Cmd.SET_TENSOR, Cmd.SET_TENSOR_HASH, Cmd.GET_TENSOR,
             Cmd.COPY_TENSOR, Cmd.GRAPH_COMPUTE, Cmd.INIT_TENSOR, Cmd.GET_ALLOC_SIZE,
             Cmd.GRAPH_RECOMPUTE, Cmd.MEMSET_TENSOR}


def _extra_cmds(d: Dialect) -> tuple[Cmd, ...]:
    return _extra_cmds_of(d.name)


@lru_cache(maxsize=None)  # keyed by name: Dialect objects are not hashable
def _extra_cmds_of(name: str) -> tuple[Cmd, ...]:
    d = get_dialect(name)
    # COMM_INIT makes a real 8.0.0 server listen/connect on other ports: not from a fuzzer.
    return tuple(c for _, c in sorted(d.ids.items())
                 if c not in _MODELLED and c is not Cmd.COMM_INIT)


@lru_cache(maxsize=4096)
def _messages(dialect: str, cmd: Cmd, regions: tuple) -> st.SearchStrategy:
    return rst.messages(dialect, cmd, buffers=regions or None)


# ---------------------------------------------------------------- mutations

def _in_body(op: rst.MutationOp, cmd) -> bool:
    """Request-side operators that make sense after HELLO (not the first-frame-only ones)."""
    return op.direction == "request" and not op.opening


def _opener(op: rst.MutationOp, cmd) -> bool:
    return op.direction == "request" and op.opening


@lru_cache(maxsize=4096)
def _body_mutations(dialect: str, regions: tuple, local_only: bool = False,
                    ) -> st.SearchStrategy[rst.Mutation]:
    """Request-side mutations placed after HELLO, relative to ``regions`` (sentinels): every
    registered operator of every kind that applies there.

    ``local_only`` drops well-formed COMM_INIT requests: a real 8.0.0+ server acts on them by
    listening on 0.0.0.0 or connecting out to the host named in the request (spec 12.2),
    which a fuzzer must not make it do on somebody's network.
    """
    d = get_dialect(dialect)
    both = rst.mutations(d, buffers=regions or None, where=_in_body)
    if local_only and d.has(Cmd.COMM_INIT):
        return both.filter(_not_comm_init)
    return both


def _not_comm_init(mut: rst.Mutation) -> bool:
    d = mut.description
    # A COMM_INIT mutation the server never runs (refused at its length, or cut short) stays;
    # every other one is a complete request the server would act on.
    return d["cmd"] != Cmd.COMM_INIT.value or rst.MUTATIONS[(d["kind"], d["what"])].never_runs


@lru_cache(maxsize=None)
def _opening_mutations(dialect: str) -> st.SearchStrategy[rst.Mutation]:
    """Mutations that replace the connection's first frame (HELLO framing, HELLO missing,
    operators registered as ``opening``, e.g. the client's conn_caps)."""
    d = get_dialect(dialect)
    parts = [rst.framing_mutations(d, cmd=Cmd.HELLO),
             rst.framing_mutations(d, cmd=Cmd.GET_ALIGNMENT, what="hello_missing")]
    if any(rst.candidates(d, kind, where=_opener) for kind in rst.MUTATION_KINDS):
        parts.append(rst.mutations(d, where=_opener))
    return st.one_of(parts)


def _mutation_step(mut: rst.Mutation):
    desc = mut.description
    return step(mut.data, desc["cmd"], desc=desc, eof=bool(desc.get("eof")))


# ---------------------------------------------------------------- cases

@st.composite
def cases(draw, dialect: Dialect | str = DEFAULT, *, max_steps: int = 32,
          max_mutations: int = 3, mutation_odds: int = 8, local_only: bool = False) -> Case:
    """One connection's worth of steps (see the module docstring).

    ``mutation_odds``: each body step is a mutation with probability 1/``mutation_odds``
    (at most ``max_mutations``); 0 gives valid sessions only. ``local_only``: no request
    that makes a real server open network connections (COMM_INIT).
    """
    d = get_dialect(dialect)
    model = _Model()
    steps = []
    opening = draw(_ints(0, 9)) == 9 if mutation_odds else False
    if opening:
        mut = draw(_opening_mutations(d.name))
        steps.append(_mutation_step(mut))
        if not _opener(rst.MUTATIONS[(mut.description["kind"], mut.description["what"])], None):
            # The server must refuse this connection: nothing after it would be read.
            steps.append(step(_frame(d, _PROBE), Cmd.GET_ALIGNMENT.value))
            return annotate(d, tuple(steps), meta={"mutations": [mut.description]})
    else:
        steps.append(step(rst.hello_request_frame(d), Cmd.HELLO.value))
    for _ in range(draw(_ints(1, 3))):
        steps += _alloc_steps(draw(_pick(BUFFER_SIZES)), d, model)
    mutations = []
    n_body = draw(_ints(0, max_steps))
    for _ in range(n_body):
        if mutation_odds and len(mutations) < max_mutations and \
                draw(_ints(0, mutation_odds - 1)) == mutation_odds - 1:
            regions = tuple(model.regions)
            mut = draw(_body_mutations(d.name, regions, local_only))
            mutations.append(mut.description)
            steps.append(_mutation_step(mut))
            continue
        rule = _RULES[draw(_ints(0, len(_RULES) - 1))]
        try:
            steps += rule(_Choices(draw(_CHOICES)), draw, d, model)
        except _NeedBuffer:
            if len(model.regions) < MAX_BUFFERS:
                steps += _alloc_steps(4096, d, model)
    steps.append(step(_frame(d, _PROBE), Cmd.GET_ALIGNMENT.value))
    return annotate(d, tuple(steps), meta={"mutations": mutations})


# Rules that keep a connection's buffers as they are: steady traffic for throughput runs.
_STEADY_RULES = (_rule_query, _rule_set, _rule_get, _rule_memset, _rule_clear, _rule_copy,
                 _rule_init, _rule_alloc_size, _rule_hash, _rule_graph, _rule_recompute)


def steady_session(dialect: Dialect | str, sizes: tuple[int, ...], n_steps: int,
                   seed: int = 0) -> tuple[list, list]:
    """Valid steps for one long-lived connection, without hypothesis (plain PRNG choices):
    the prologue (HELLO, ALLOC_BUFFER + BUFFER_GET_BASE of ``sizes``) and ``n_steps`` body
    steps that use those buffers and never free them. For throughput measurements."""
    d = get_dialect(dialect)
    rng = random.Random(seed)
    model = _Model()
    prologue = [step(rst.hello_request_frame(d), Cmd.HELLO.value)]
    for size in sizes:
        prologue += _alloc_steps(size, d, model)

    def no_strategies(_strategy):
        raise _NeedBuffer()  # skip the strategy-drawn variants: only hand-packed steps here
    body = []
    while len(body) < n_steps:
        rule = _STEADY_RULES[rng.randrange(len(_STEADY_RULES))]
        try:
            body += rule(_Choices(rng.getrandbits(64)), no_strategies, d, model)
        except _NeedBuffer:
            continue
    return prologue, body[:n_steps]
