"""The stateful phase: every ordered pair of state-changing requests, then a request that uses
what they changed, so a bug that needs an earlier request's state (a freed handle, a stale
base, a recomputed graph over freed memory, a cached hash of an overwritten tensor) is found
by construction.

A session: the sweep's set-up (HELLO, buffers b0 of 4 KiB and b1 of 8 KiB with their bases),
then **A** and **B**, two state changers acting on the same buffer and the tensor in it (the
*target* b0, or the *other* buffer b1), then one **use** acting on b0 and its tensor, then a
GET_ALIGNMENT probe. Every ordered (A, B) of the dialect's changers, on each of the two
buffers, is followed by every use: the uses read, write, recompute, look up or free what the
pair may have changed, in bounds and one byte past their buffer's end (a check a server drops
after some earlier request shows only there).

Nothing here knows a server bug; the changers and uses are the protocol's commands.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..proto import Cmd, fnv1a64, ggml
from ..proto import messages as m
from ..proto.dialects import Dialect
from ..proto.tensor import RpcTensor
from .case import Case, annotate, step
from .generate import _PROBE, _Model, _alloc_steps, _frame

SIZES = (4096, 8192)  # the set-up's two buffers: b0 (the use's target) and b1
AT = 512  # where each buffer's tensor lies
N = 64  # f32 elements of each tensor
PATTERN = bytes(range(256))  # what SET_TENSOR uploads (N * 4 bytes)
NEW_BUFFER = 4096  # ALLOC_BUFFER as a changer: a new buffer the size of b0 (a heap may reuse)
TARGETS = ("target", "other")  # the buffer a pair acts on: b0 (the use's) or b1


@dataclass
class _Session:
    d: Dialect
    model: _Model
    uid: int = 0x5EED

    def region(self, i: int):
        return self.model.regions[i]

    def tensor(self, i: int, *, at: int = AT, tid: int | None = None) -> RpcTensor:
        r = self.region(i)
        return RpcTensor.make(id=tid or 0x100 + i, type=ggml.TYPE_F32, ne=(N, 1, 1, 1),
                              buffer=r.handle, data=r.base + at)

    def past_end(self, i: int) -> RpcTensor:
        """Buffer ``i``'s tensor moved to end - nbytes + 1: one byte past its buffer."""
        return self.tensor(i, at=self.region(i).size - 4 * N + 1)

    def graph(self, i: int) -> m.GraphComputeRequest:
        """The node (buffer ``i``'s tensor) is the sum of two leaves in the other buffer."""
        o = 1 - i
        a = self.tensor(o, at=0, tid=0x201)
        b = self.tensor(o, at=256, tid=0x202)
        node = self.tensor(i).with_(op=ggml.OP["ADD"], src=(a.id, b.id) + (0,) * 8)
        return m.GraphComputeRequest(device=0, uid=self.uid if self.d.graph_uid else 0,
                                     nodes=(node.id,), tensors=(a, b, node))

    def frame(self, msg, *, learn=None):
        return step(_frame(self.d, msg), msg.cmd.value, learn=learn)


StepsFor = Callable[[_Session, int], list]


@dataclass(frozen=True)
class Action:
    """A changer or a use: the steps it sends against buffer ``i`` (and its tensor)."""

    name: str
    build: StepsFor
    needs: Cmd


def _alloc(s: _Session, i: int) -> list:
    return _alloc_steps(NEW_BUFFER, s.d, s.model)


def _hash(s: _Session, i: int) -> list:
    return [s.frame(m.SetTensorHashRequest(s.tensor(i), 0, fnv1a64(PATTERN)))]


CHANGERS: tuple[Action, ...] = (
    Action("ALLOC_BUFFER", _alloc, Cmd.ALLOC_BUFFER),
    Action("FREE_BUFFER", lambda s, i: [s.frame(m.FreeBufferRequest(s.region(i).handle))],
           Cmd.FREE_BUFFER),
    Action("BUFFER_CLEAR", lambda s, i: [s.frame(m.BufferClearRequest(s.region(i).handle,
                                                                       0x5A))],
           Cmd.BUFFER_CLEAR),
    Action("SET_TENSOR", lambda s, i: [s.frame(m.SetTensorRequest(s.tensor(i), 0, 0,
                                                                   PATTERN))],
           Cmd.SET_TENSOR),
    Action("SET_TENSOR_HASH", _hash, Cmd.SET_TENSOR_HASH),
    Action("SET_TENSOR_2D", lambda s, i: [s.frame(m.SetTensor2DRequest(
        s.tensor(i), 0, 64, 4, 64, PATTERN))], Cmd.SET_TENSOR_2D),
    Action("MEMSET_TENSOR", lambda s, i: [s.frame(m.MemsetTensorRequest(s.tensor(i), 0,
                                                                         4 * N, 7))],
           Cmd.MEMSET_TENSOR),
    Action("COPY_TENSOR", lambda s, i: [s.frame(m.CopyTensorRequest(s.tensor(1 - i),
                                                                     s.tensor(i)))],
           Cmd.COPY_TENSOR),
    Action("GRAPH_COMPUTE", lambda s, i: [s.frame(s.graph(i))], Cmd.GRAPH_COMPUTE),
    Action("GRAPH_RECOMPUTE", lambda s, i: [s.frame(m.GraphRecomputeRequest(
        0, s.uid if s.d.graph_uid else 0))], Cmd.GRAPH_RECOMPUTE),
    Action("INIT_TENSOR", lambda s, i: [s.frame(m.InitTensorRequest(s.tensor(i)))],
           Cmd.INIT_TENSOR),
    Action("COMM_FREE", lambda s, i: [s.frame(m.CommFreeRequest(0))], Cmd.COMM_FREE),
)

USES: tuple[Action, ...] = (
    Action("GET_TENSOR", lambda s, i: [s.frame(m.GetTensorRequest(s.tensor(i), 0, 4 * N))],
           Cmd.GET_TENSOR),
    Action("GET_TENSOR past end", lambda s, i: [s.frame(m.GetTensorRequest(s.past_end(i), 0,
                                                                           4 * N))],
           Cmd.GET_TENSOR),
    Action("SET_TENSOR", lambda s, i: [s.frame(m.SetTensorRequest(s.tensor(i), 0, 0,
                                                                   PATTERN))],
           Cmd.SET_TENSOR),
    Action("SET_TENSOR past end", lambda s, i: [s.frame(m.SetTensorRequest(
        s.past_end(i), 0, 0, PATTERN))], Cmd.SET_TENSOR),
    Action("COPY_TENSOR", lambda s, i: [s.frame(m.CopyTensorRequest(s.tensor(i),
                                                                     s.tensor(1 - i)))],
           Cmd.COPY_TENSOR),
    Action("GRAPH_COMPUTE", lambda s, i: [s.frame(s.graph(i))], Cmd.GRAPH_COMPUTE),
    Action("GRAPH_RECOMPUTE", lambda s, i: [s.frame(m.GraphRecomputeRequest(
        0, s.uid if s.d.graph_uid else 0))], Cmd.GRAPH_RECOMPUTE),
    Action("BUFFER_GET_BASE", lambda s, i: [s.frame(m.BufferGetBaseRequest(
        s.region(i).handle))], Cmd.BUFFER_GET_BASE),
    Action("FREE_BUFFER", lambda s, i: [s.frame(m.FreeBufferRequest(s.region(i).handle))],
           Cmd.FREE_BUFFER),
    Action("SET_TENSOR_HASH", _hash, Cmd.SET_TENSOR_HASH),
)


def changers(d: Dialect) -> list[Action]:
    return [r for r in CHANGERS if d.has(r.needs)]


def uses(d: Dialect) -> list[Action]:
    return [r for r in USES if d.has(r.needs)]


def pair_label(a: Action, b: Action, target: str) -> str:
    return f"{a.name} -> {b.name} on {target}"


@dataclass(frozen=True)
class StatefulCase:
    pair: str  # "FREE_BUFFER -> ALLOC_BUFFER on target"
    use: str
    case: Case


def cases(d: Dialect) -> Iterator[StatefulCase]:
    """Every (A, B) on each target, each followed by every use, one session each."""
    hello = step(_frame(d, m.HelloRequest()), Cmd.HELLO.value)
    for target in TARGETS:
        i = 0 if target == "target" else 1
        for a in changers(d):
            for b in changers(d):
                for use in uses(d):
                    s = _Session(d, _Model())
                    allocs = [_alloc_steps(size, d, s.model) for size in SIZES]
                    head = [hello] + [a[0] for a in allocs] + [a[1] for a in allocs]
                    desc = {"kind": "stateful", "what": "pair", "cmd": use.needs.value,
                            "cmd_id": d.id_of(use.needs), "field": "state",
                            "dialect": d.name, "direction": "request", "at": "after_setup",
                            "case": f"{pair_label(a, b, target)}, then {use.name}"}
                    body = a.build(s, i) + b.build(s, i)
                    last = use.build(s, 0)
                    last[-1] = step(last[-1].frame, last[-1].cmd, learn=last[-1].learn,
                                    desc=desc)
                    steps = tuple(head + body + last + [step(_frame(d, _PROBE),
                                                             Cmd.GET_ALIGNMENT.value)])
                    yield StatefulCase(pair_label(a, b, target), use.name,
                                       annotate(d, steps, meta={"mutations": [desc],
                                                                "sweep": True}))


def size(d: Dialect) -> int:
    return len(TARGETS) * len(changers(d)) ** 2 * len(uses(d))


def pairs_possible(d: Dialect) -> list[str]:
    return [pair_label(a, b, t) for t in TARGETS for a in changers(d) for b in changers(d)]
