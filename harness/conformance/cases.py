"""Server conformance cases: malformed and unusual requests and what the real servers do.

Each case rebuilds one entry of a real server's recorded catalogue with the codec, against live
handles, so it runs against any server: the real binary, a user build or the reference peer.
The 7.0.0 cases below come from harness/data/vectors/errors.json (titles kept verbatim in
``vector``); ``expect`` is the recorded outcome of the real 7.0.0 server, and ``changed`` says
for which dialect rows (a predicate on their fields: :class:`Needs`) a later real build answers
differently (recorded from p8 in harness/data/vectors/conformance-8.0.0.json). The cases only
8.0.0 and later have are in ``feature_cases``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Callable

from ..errors import HarnessError
from ..proto import Cmd, get_dialect, ggml, messages as m
from ..proto.dialects import Dialect
from ..proto.tensor import RpcTensor
from ..proto.wire import request_frame
from .raw import ANSWERED, CLOSED, OPEN, RawSession


@dataclass(frozen=True)
class Needs:
    """What a dialect row must have for a case to apply (or for an outcome to change): a
    predicate on the row's fields, never on its name or version."""

    what: str
    holds: Callable[[Dialect], bool]


# Every case speaks the row's own wire (command ids, HELLO and SET_TENSOR layouts, op
# numbering), so a case applies to every row unless it needs something a row lacks.
EVERY_ROW = Needs("every row", lambda d: True)
HELLO_CAPS = Needs("HELLO carries conn_caps (>= 4.0.0)", lambda d: d.hello_caps)
EMPTY_HELLO_ROW = Needs("the row's HELLO is empty (before 4.0.0)", lambda d: not d.hello_caps)
# The server reads (validates) a SET_TENSOR_HASH tensor before its cache lookup.
HASH_CHECKS_TENSOR = Needs("SET_TENSOR_HASH validates its tensor",
                           lambda d: d.peer.server_hash_checks_tensor)
# A tensor whose data lies outside its buffer closes the connection (7.0.0 aborts instead).
TENSOR_BOUNDS_CLOSE = Needs("a tensor outside its buffer closes",
                            lambda d: d.peer.server_tensor_bounds_close)
# FREE_BUFFER drops the stored graphs (7.0.0 on). Before, the real server keeps them and a
# recompute uses freed memory, stays open and is a heap-use-after-free: no outcome the reference
# reproduces (tests/test_conformance_features.py holds the real builds to it instead).
FREE_DROPS_GRAPHS = Needs("FREE_BUFFER drops the stored graphs",
                          lambda d: d.peer.server_free_drops_graphs)
GRAPH_UID = Needs("graphs keyed by uid", lambda d: d.graph_uid)


def has_command(cmd: Cmd) -> Needs:
    return Needs(f"has {cmd.value}", lambda d: d.has(cmd))


def ids_end_at(last: int) -> Needs:
    """The dialect's command table ends at ``last`` (so ``last + 1`` is unknown to it)."""
    return Needs(f"command ids end at {last}", lambda d: max(d.ids) == last)


@dataclass(frozen=True)
class ConformanceCase:
    id: str
    vector: str  # the title of the recorded case (errors.json / state.json, or the 8.0.0 record)
    expect: str  # CLOSED | OPEN | ANSWERED, where no ``changed`` entry holds
    run: Callable  # (new_session) -> the session to observe; may raise CaseError
    command: str  # the command the case is about (for coverage tables)
    needs: Needs = EVERY_ROW  # the rows the case applies to
    changed: tuple[tuple[Needs, str], ...] = ()  # (needs, outcome): where it holds, the last wins

    def applies_to(self, dialect: Dialect | str) -> bool:
        d = get_dialect(dialect)
        return self.needs.holds(d)

    def expect_for(self, dialect: Dialect | str) -> str:
        d = get_dialect(dialect)
        outcome = self.expect
        for needs, later in self.changed:
            if needs.holds(d):
                outcome = later
        return outcome


class ConformanceError(HarnessError):
    """The root of harness.conformance's errors."""


class CaseError(ConformanceError):
    """An intermediate answer differed from what the case needs (not the outcome itself)."""


def _frame(s: RawSession, cmd: Cmd, payload: bytes = b"", **kw) -> bytes:
    """A raw request frame of ``cmd`` under the session's row's own command id."""
    return request_frame(s.dialect.id_of(cmd), payload, **kw)


def _f32(handle: int, data: int, ne=(4,), *, id: int = 1, **kw) -> RpcTensor:
    return RpcTensor.make(id=id, ne=ne, buffer=handle, data=data, **kw)


def _set(s: RawSession, t: RpcTensor, data: bytes, offset: int = 0, cache_flag: int = 0):
    s.request(m.SetTensorRequest(t, cache_flag, offset, data))


def _graph(nodes, tensors, trailing=b"") -> m.GraphComputeRequest:
    return m.GraphComputeRequest(0, 0, tuple(nodes), tuple(tensors), trailing)


def _check(cond: bool, what: str) -> None:
    if not cond:
        raise CaseError(what)


CASES: list[ConformanceCase] = []


def case(id: str, vector: str, expect: str, command: str, *, needs: Needs = EVERY_ROW,
         changed: tuple[tuple[Needs, str], ...] = ()):
    def deco(fn):
        CASES.append(ConformanceCase(id, vector, expect, fn, command, needs, changed))
        return fn
    return deco


# ---------------------------------------------------------------- HELLO and framing
@case("no-hello", "first cmd DEVICE_COUNT (no HELLO)", CLOSED, "HELLO")
def _(new):
    s = new()
    s.send(_frame(s, Cmd.DEVICE_COUNT))
    return s


@case("hello-len-0", "HELLO with size 0 (pre-v4 style)", CLOSED, "HELLO",
      changed=((EMPTY_HELLO_ROW, ANSWERED),))
def _(new):
    s = new()
    s.send(_frame(s, Cmd.HELLO))
    return s


@case("hello-len-28", "HELLO with size 28", CLOSED, "HELLO")
def _(new):
    s = new()
    s.send(_frame(s, Cmd.HELLO, bytes(28)))
    return s


@case("hello-twice", "HELLO twice", CLOSED, "HELLO")
def _(new):
    s = new()
    s.hello()
    s.request(m.HelloRequest())  # the row's own HELLO, again
    return s


for _cid in (18, 19, 255):
    @case(f"cmd-{_cid}", f"cmd {_cid}" + (" (RPC_CMD_NONE)" if _cid == 18 else ""), CLOSED,
          f"cmd {_cid}")
    def _(new, _cid=_cid):
        s = new()
        s.hello()
        s.send(request_frame(_cid))
        return s


@case("get-alignment-len-8", "GET_ALIGNMENT size 8 (expects 4)", CLOSED, "GET_ALIGNMENT")
def _(new):
    s = new()
    s.hello()
    s.send(_frame(s, Cmd.GET_ALIGNMENT, bytes(8)))
    return s


@case("device-count-len-4", "DEVICE_COUNT size 4 (expects 0)", CLOSED, "DEVICE_COUNT")
def _(new):
    s = new()
    s.hello()
    s.send(_frame(s, Cmd.DEVICE_COUNT, bytes(4)))
    return s


@case("get-alignment-device-7", "GET_ALIGNMENT device=7", CLOSED, "GET_ALIGNMENT")
def _(new):
    s = new()
    s.hello()
    s.request(m.GetAlignmentRequest(7))
    return s


@case("get-device-memory-device-1", "GET_DEVICE_MEMORY device=1", CLOSED, "GET_DEVICE_MEMORY")
def _(new):
    s = new()
    s.hello()
    s.request(m.GetDeviceMemoryRequest(1))
    return s


# ---------------------------------------------------------------- buffers
@case("alloc-2p62", "ALLOC_BUFFER 2^62 bytes", OPEN, "ALLOC_BUFFER")
def _(new):
    s = new()
    s.hello()
    r = s.call(m.AllocBufferRequest(0, 1 << 62))
    _check(r.remote_ptr == 0 and r.remote_size == 0, f"expected a zero answer, got {r}")
    return s


@case("alloc-0", "ALLOC_BUFFER size 0", OPEN, "ALLOC_BUFFER")
def _(new):
    s = new()
    s.hello()
    handle, base = s.alloc(0)
    _check(handle != 0 and base == 0, f"expected a live handle with base 0, got {handle:x}/{base:x}")
    return s


@case("get-base-unknown", "BUFFER_GET_BASE unknown handle", CLOSED, "BUFFER_GET_BASE")
def _(new):
    s = new()
    s.hello()
    s.request(m.BufferGetBaseRequest(0xEFBEADDE))
    return s


@case("free-unknown", "FREE_BUFFER unknown handle", CLOSED, "FREE_BUFFER")
def _(new):
    s = new()
    s.hello()
    s.request(m.FreeBufferRequest(0xEFBEADDE))
    return s


@case("free-twice", "FREE_BUFFER twice", CLOSED, "FREE_BUFFER")
def _(new):
    s = new()
    s.hello()
    handle = s.call(m.AllocBufferRequest(0, 64)).remote_ptr
    s.request(m.FreeBufferRequest(handle))
    s.request(m.FreeBufferRequest(handle))
    return s


# ---------------------------------------------------------------- SET_TENSOR / GET_TENSOR
@case("set-tensor-null-tensor", "SET_TENSOR 312-byte all-zero payload (header length ok; zero "
      "tensor has buffer=0 -> rejected)", CLOSED, "SET_TENSOR")
def _(new):
    s = new()
    s.hello()
    s.alloc(256)
    s.send(_frame(s, Cmd.SET_TENSOR, bytes(312)))
    return s


@case("set-tensor-header-only", "SET_TENSOR header only, 0 data bytes", OPEN, "SET_TENSOR")
def _(new):
    s = new()
    s.hello()
    h, base = s.alloc(256)
    _set(s, _f32(h, base), b"")
    _check(s.still_serving(), "server stopped answering after a header-only SET_TENSOR")
    return s


@case("set-tensor-buffer-0", "SET_TENSOR buffer=0", CLOSED, "SET_TENSOR")
def _(new):
    s = new()
    s.hello()
    h, base = s.alloc(256)
    _set(s, _f32(0, base), bytes(16))
    return s


@case("set-tensor-unknown-buffer", "SET_TENSOR unknown buffer handle", CLOSED, "SET_TENSOR")
def _(new):
    s = new()
    s.hello()
    h, base = s.alloc(256)
    _set(s, _f32(h + 8, base), bytes(16))
    return s


@case("set-tensor-type-43", "SET_TENSOR type=43 (>= GGML_TYPE_COUNT)", CLOSED, "SET_TENSOR")
def _(new):
    s = new()
    s.hello()
    h, base = s.alloc(256)
    _set(s, _f32(h, base).with_(type=43), bytes(16))
    return s


@case("set-tensor-type-4", "SET_TENSOR type=4 (removed, blck_size 0)", CLOSED, "SET_TENSOR")
def _(new):
    s = new()
    s.hello()
    h, base = s.alloc(256)
    _set(s, _f32(h, base).with_(type=4), bytes(16))
    return s


@case("set-tensor-past-end", "SET_TENSOR offset+size past buffer end", CLOSED, "SET_TENSOR")
def _(new):
    s = new()
    s.hello()
    h, base = s.alloc(256)
    _set(s, _f32(h, base), bytes(16), offset=250)
    return s


@case("get-tensor-257", "GET_TENSOR size 257 on 256-byte buffer", CLOSED, "GET_TENSOR")
def _(new):
    s = new()
    s.hello()
    h, base = s.alloc(256)
    s.request(m.GetTensorRequest(_f32(h, base), 0, 257))
    return s


@case("get-tensor-size-0", "GET_TENSOR size 0", OPEN, "GET_TENSOR")
def _(new):
    s = new()
    s.hello()
    h, base = s.alloc(256)
    r = s.call(m.GetTensorRequest(_f32(h, base + 64), 0, 0))
    _check(r.data == b"", "expected an empty answer")
    return s


@case("get-tensor-at-end-size-0", "GET_TENSOR offset==buffer size, size 0", CLOSED, "GET_TENSOR")
def _(new):
    s = new()
    s.hello()
    h, base = s.alloc(256)
    s.request(m.GetTensorRequest(_f32(h, base), 256, 0))
    return s


@case("get-tensor-q4_0-33", "GET_TENSOR q4_0 ne[0]=33 (not multiple of block)", ANSWERED,
      "GET_TENSOR")
def _(new):
    s = new()
    s.hello()
    h, base = s.alloc(256)
    t = RpcTensor.make(id=1, type=ggml.TYPE_Q4_0, ne=(33,), nb=(18, 18, 18, 18), buffer=h,
                       data=base)
    s.request(m.GetTensorRequest(t, 0, 18))
    return s


@case("set-tensor-len-2p62", "SET_TENSOR size prefix 2^62", CLOSED, "SET_TENSOR")
def _(new):
    s = new()
    s.hello()
    s.send(_frame(s, Cmd.SET_TENSOR, length=1 << 62))
    return s


# 7.0.0 looks the hash up before it reads the tensor; 8.0.0 reads (and validates) it first.
@case("set-tensor-hash-null", "SET_TENSOR_HASH all-zero tensor (no-cache server)", OPEN,
      "SET_TENSOR_HASH", changed=((HASH_CHECKS_TENSOR, CLOSED),))
def _(new):
    s = new()
    s.hello()
    r = s.call(m.SetTensorHashRequest(RpcTensor.null(), 0, 0x7B))
    _check(r.result == 0, f"expected a miss, got {r.result}")
    return s


# ---------------------------------------------------------------- other writes
@case("memset-past-nbytes", "MEMSET_TENSOR past tensor nbytes", CLOSED, "MEMSET_TENSOR",
      needs=has_command(Cmd.MEMSET_TENSOR))
def _(new):
    s = new()
    s.hello()
    h, base = s.alloc(256)
    s.request(m.MemsetTensorRequest(_f32(h, base), 8, 16, 0))
    return s


@case("copy-overflow", "COPY_TENSOR src nbytes overflows dst buffer", CLOSED, "COPY_TENSOR")
def _(new):
    s = new()
    s.hello()
    h, base = s.alloc(256)
    src = _f32(h, base, ne=(16,), id=1)
    dst = _f32(h, base + 240, id=2)
    s.request(m.CopyTensorRequest(src, dst))
    return s


@case("init-tensor-buffer-0", "INIT_TENSOR buffer=0 (logs error, continues)", OPEN, "INIT_TENSOR")
def _(new):
    s = new()
    s.hello()
    s.request(m.InitTensorRequest(RpcTensor.make(id=1, type=ggml.TYPE_Q4_0, ne=(32,),
                                                 nb=(18, 18, 18, 18))))
    _check(s.still_serving(), "server stopped answering after INIT_TENSOR without a buffer")
    return s


@case("alloc-size-q4_0", "GET_ALLOC_SIZE q4_0 [32] no buffer", OPEN, "GET_ALLOC_SIZE")
def _(new):
    s = new()
    s.hello()
    t = RpcTensor.make(id=1, type=ggml.TYPE_Q4_0, ne=(32,), nb=(18, 18, 18, 18))
    r = s.call(m.GetAllocSizeRequest(0, t, (RpcTensor.null(),) * 10))
    _check(r.alloc_size == 18, f"expected 18, got {r.alloc_size}")
    return s


@case("alloc-size-type-99", "GET_ALLOC_SIZE type=99", CLOSED, "GET_ALLOC_SIZE")
def _(new):
    s = new()
    s.hello()
    t = RpcTensor.make(id=1, type=ggml.TYPE_Q4_0, ne=(32,), nb=(18, 18, 18, 18)).with_(type=99)
    s.request(m.GetAllocSizeRequest(0, t, (RpcTensor.null(),) * 10))
    return s


# ---------------------------------------------------------------- graphs
def _op(s: RawSession, name: str) -> int:
    """The op's id in the session's row (the numbering moved between releases)."""
    return s.dialect.numbering.op[name]


@case("recompute-without-compute", "GRAPH_RECOMPUTE without prior GRAPH_COMPUTE", CLOSED,
      "GRAPH_RECOMPUTE")
def _(new):
    s = new()
    s.hello()
    s.request(m.GraphRecomputeRequest(0))
    return s


@case("graph-nodes-without-array", "GRAPH_COMPUTE n_nodes=5 but no node data", CLOSED,
      "GRAPH_COMPUTE")
def _(new):
    s = new()
    s.hello()
    s.send(_frame(s, Cmd.GRAPH_COMPUTE, struct.pack("<II", 0, 5)))
    return s


@case("graph-unknown-node", "GRAPH_COMPUTE node id not among tensors", CLOSED, "GRAPH_COMPUTE")
def _(new):
    s = new()
    s.hello()
    s.request(_graph([0x77], []))
    return s


@case("graph-empty", "GRAPH_COMPUTE n_nodes 0 n_tensors 0", OPEN, "GRAPH_COMPUTE")
def _(new):
    s = new()
    s.hello()
    s.request(_graph([], []))
    _check(s.still_serving(), "server stopped answering after an empty graph")
    return s


@case("graph-device-3", "GRAPH_COMPUTE device=3", CLOSED, "GRAPH_COMPUTE")
def _(new):
    s = new()
    s.hello()
    s.request(m.GraphComputeRequest(3))
    return s


@case("graph-self-add", "GRAPH_COMPUTE node ADD whose srcs are itself", OPEN, "GRAPH_COMPUTE")
def _(new):
    s = new()
    s.hello()
    h, base = s.alloc(256)
    t = _f32(h, base, id=0x10, op=_op(s, "ADD"), flags=ggml.FLAG_COMPUTE, src=(0x10, 0x10))
    s.request(_graph([0x10], [t]))
    _check(s.still_serving(), "server stopped answering after a self-referencing node")
    return s


def _add_graph(s: RawSession, h: int, base: int, *, flags: int = ggml.FLAG_COMPUTE):
    a = _f32(h, base, id=0x10)
    c = _f32(h, base + 64, id=0x20, op=_op(s, "ADD"), flags=flags, src=(0x10, 0x10))
    return a, c


@case("graph-duplicate-ids", "GRAPH_COMPUTE duplicate tensor ids (first wins)", OPEN,
      "GRAPH_COMPUTE")
def _(new):
    s = new()
    s.hello()
    h, base = s.alloc(256)
    a, c = _add_graph(s, h, base)
    s.request(_graph([0x20], [a, a.with_(data=base + 128), c]))
    _check(s.still_serving(), "server stopped answering after duplicate ids")
    return s


@case("recompute-after-free", "GRAPH_RECOMPUTE after FREE_BUFFER (stored graph dropped)", CLOSED,
      "GRAPH_RECOMPUTE", needs=FREE_DROPS_GRAPHS)
def _(new):
    s = new()
    s.hello()
    h, base = s.alloc(256)
    s.request(_graph([0x20], list(_add_graph(s, h, base))))
    s.request(m.FreeBufferRequest(h))
    s.request(m.GraphRecomputeRequest(0))
    return s


@case("graph-no-compute-flag", "GRAPH_COMPUTE node without GGML_TENSOR_FLAG_COMPUTE", OPEN,
      "GRAPH_COMPUTE")
def _(new):
    s = new()
    s.hello()
    h, base = s.alloc(256)
    a, c = _add_graph(s, h, base, flags=0)
    s.request(m.SetTensorRequest(a, 0, 0, struct.pack("<4f", 1, 2, 3, 4)))
    s.request(m.SetTensorRequest(c, 0, 0, struct.pack("<4f", 7, 7, 7, 7)))
    s.request(_graph([0x20], [a, c]))
    got = s.call(m.GetTensorRequest(c, 0, 16)).data
    _check(got == struct.pack("<4f", 7, 7, 7, 7), "a node without the COMPUTE flag was computed")
    return s


@case("graph-trailing-bytes", "GRAPH_COMPUTE with 8 trailing garbage bytes", OPEN, "GRAPH_COMPUTE")
def _(new):
    s = new()
    s.hello()
    s.request(_graph([], [], trailing=bytes(range(8))))
    _check(s.still_serving(), "server stopped answering after trailing graph bytes")
    return s


@case("graph-mul-mat-bad-shapes", "GRAPH_COMPUTE MUL_MAT with inconsistent shapes", OPEN,
      "GRAPH_COMPUTE")
def _(new):
    s = new()
    s.hello()
    h, base = s.alloc(1024)
    a = _f32(h, base, ne=(4, 4), id=0x10)
    b = _f32(h, base + 64, ne=(8, 2), id=0x11)
    c = _f32(h, base + 256, ne=(4, 2), id=0x20, op=_op(s, "MUL_MAT"), flags=ggml.FLAG_COMPUTE,
             src=(0x10, 0x11))
    s.request(_graph([0x20], [a, b, c]))
    _check(s.still_serving(), "server stopped answering after MUL_MAT with bad shapes")
    return s


# ---------------------------------------------------------------- connection state (state.json)
@case("stale-handle", "stale_handle_from_prev_conn", CLOSED, "BUFFER_GET_BASE")
def _(new):
    first = new()
    first.hello()
    handle, _ = first.alloc(64)
    first.close()
    s = new()  # the real server serves one client at a time: connect after the first left
    s.hello()
    s.request(m.BufferGetBaseRequest(handle))
    return s


@case("nonzero-caps", "hello_nonzero_caps_rsp", OPEN, "HELLO", needs=HELLO_CAPS)
def _(new):
    s = new()
    r = s.call(m.HelloRequest(bytes(range(1, 25))))
    _check(r.conn_caps == bytes(24), "a TCP-only server answered non-zero caps")
    _check(s.call(m.DeviceCountRequest()).device_count >= 1, "no devices after non-zero caps")
    return s


def by_id(case_id: str) -> ConformanceCase:
    for c in CASES:
        if c.id == case_id:
            return c
    raise KeyError(case_id)
