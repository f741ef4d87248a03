"""Conformance cases of the features a row may have beyond the 7.0.0 catalogue (each gated by
``needs=``, a predicate on the row): 2D transfers, graphs keyed by uid, the graph cache limit,
communicator commands without a communicator, and tensor validation. 8.0.0 brought them all.

Outcomes were recorded from the real 8.0.0 build (pin p8,
harness/data/vectors/conformance-8.0.0.json, written by ``python -m
harness.conformance.record``); tests/test_conformance_features.py holds the
expectations here to that recording, the real build to the expectations and the reference server
to the real build. 9.0.0 is built on 8.0.0, so its reference server is held to the same cases.
"""

from __future__ import annotations

import struct

from ..proto import Cmd, ggml, messages as m
from ..proto.constants import GRAPH_CACHE_MAX
from ..proto.wire import request_frame
from .cases import (GRAPH_UID, HASH_CHECKS_TENSOR, TENSOR_BOUNDS_CLOSE, CaseError, _check,
                    _f32, _frame, _op, case, has_command, ids_end_at)
from .raw import CLOSED, OPEN, RawSession

def _opened(new) -> tuple[RawSession, int, int]:
    s = new()
    s.hello()
    h, base = s.alloc(256)
    return s, h, base


def _add_graph(s: RawSession, h: int, base: int, uid: int, *, a_id: int = 0x10,
               c_id: int = 0x20):
    a = _f32(h, base, id=a_id)
    c = _f32(h, base + 64, id=c_id, op=_op(s, "ADD"), flags=ggml.FLAG_COMPUTE,
             src=(a_id, a_id))
    return m.GraphComputeRequest(0, uid, (c_id,), (a, c)), a, c


def _floats(s: RawSession, t, n: int = 4) -> tuple[float, ...]:
    return struct.unpack(f"<{n}f", s.call(m.GetTensorRequest(t, 0, 4 * n)).data)


def _set_floats(s: RawSession, t, *values: float) -> None:
    s.request(m.SetTensorRequest(t, 0, 0, struct.pack(f"<{len(values)}f", *values)))


# ---------------------------------------------------------------- tensor validation
@case("set-tensor-tensor-outside-buffer", "SET_TENSOR tensor with elements past its buffer, "
      "write inside the buffer", CLOSED, "SET_TENSOR", needs=TENSOR_BOUNDS_CLOSE)
def _(new):
    s, h, base = _opened(new)
    s.request(m.SetTensorRequest(_f32(h, base + 240, ne=(16,)), 0, 0, bytes(4)))
    return s


@case("init-tensor-outside-buffer", "INIT_TENSOR tensor with elements past its buffer", CLOSED,
      "INIT_TENSOR", needs=TENSOR_BOUNDS_CLOSE)
def _(new):
    s, h, base = _opened(new)
    s.request(m.InitTensorRequest(_f32(h, base + 240, ne=(16,))))
    return s


@case("hash-valid-tensor-no-cache", "SET_TENSOR_HASH valid tensor (no-cache server)", OPEN,
      "SET_TENSOR_HASH", needs=HASH_CHECKS_TENSOR)
def _(new):
    s, h, base = _opened(new)
    r = s.call(m.SetTensorHashRequest(_f32(h, base), 0, 0x7B))
    _check(r.result == 0, f"expected a miss, got {r.result}")
    return s


def _hash_case(cid: str, title: str, make_tensor):
    @case(cid, f"SET_TENSOR_HASH {title} (no-cache server)", CLOSED, "SET_TENSOR_HASH", needs=HASH_CHECKS_TENSOR)
    def _(new):
        s, h, base = _opened(new)
        s.request(m.SetTensorHashRequest(make_tensor(h, base), 0, 0x7B))
        return s


_hash_case("hash-buffer-0", "buffer=0", lambda h, base: _f32(0, base))
_hash_case("hash-unknown-buffer", "unknown buffer handle", lambda h, base: _f32(h + 8, base))
_hash_case("hash-type-43", "type=43", lambda h, base: _f32(h, base).with_(type=43))
_hash_case("hash-tensor-outside-buffer", "tensor past its buffer",
           lambda h, base: _f32(h, base + 240, ne=(16,)))


@case("hash-offset-past-end", "SET_TENSOR_HASH offset past the buffer (no-cache server)", OPEN,
      "SET_TENSOR_HASH", needs=HASH_CHECKS_TENSOR)
def _(new):
    s, h, base = _opened(new)
    r = s.call(m.SetTensorHashRequest(_f32(h, base), 1000, 0x7B))
    _check(r.result == 0, f"expected a miss, got {r.result}")
    return s


# ---------------------------------------------------------------- SET_TENSOR_2D / GET_TENSOR_2D
@case("2d-roundtrip", "SET_TENSOR_2D 2 copies of 8 bytes, stride 16, read back", OPEN,
      "SET_TENSOR_2D", needs=has_command(Cmd.SET_TENSOR_2D))
def _(new):
    s, h, base = _opened(new)
    t = _f32(h, base, ne=(64,))
    s.request(m.SetTensor2DRequest(t, 0, 8, 2, 16, bytes(range(16))))
    packed = s.call(m.GetTensor2DRequest(t, 0, 8, 2, 16)).data
    _check(packed == bytes(range(16)), f"GET_TENSOR_2D gave {packed.hex()}")
    flat = s.call(m.GetTensorRequest(t, 0, 24)).data
    _check(flat[:8] == bytes(range(8)) and flat[16:24] == bytes(range(8, 16)),
           f"copies not at offset + i*stride: {flat.hex()}")
    return s


@case("2d-overlapping-stride", "SET_TENSOR_2D stride 4 < size 8 (copies overlap, later wins)",
      OPEN, "SET_TENSOR_2D", needs=has_command(Cmd.SET_TENSOR_2D))
def _(new):
    s, h, base = _opened(new)
    t = _f32(h, base, ne=(64,))
    s.request(m.SetTensor2DRequest(t, 0, 8, 2, 4, bytes(range(16))))
    flat = s.call(m.GetTensorRequest(t, 0, 12)).data
    _check(flat == bytes([0, 1, 2, 3]) + bytes(range(8, 16)), f"got {flat.hex()}")
    return s


def _bad_2d(cid: str, title: str, offset: int, size: int, n: int, stride: int, data: bytes,
            ne: int = 64):
    @case(cid, f"SET_TENSOR_2D {title}", CLOSED, "SET_TENSOR_2D", needs=has_command(Cmd.SET_TENSOR_2D))
    def _(new):
        s, h, base = _opened(new)
        s.request(m.SetTensor2DRequest(_f32(h, base, ne=(ne,)), offset, size, n, stride, data))
        return s


_bad_2d("2d-n-copies-0", "n_copies 0", 0, 8, 0, 16, b"")
_bad_2d("2d-size-0", "size 0", 0, 0, 2, 16, b"")
_bad_2d("2d-length-mismatch", "15 data bytes for 2 x 8", 0, 8, 2, 16, bytes(15))
_bad_2d("2d-span-outside-buffer", "second copy past the buffer", 0, 8, 2, 250, bytes(16))
_bad_2d("2d-span-outside-tensor", "second copy past the tensor, inside the buffer", 0, 8, 2, 64,
        bytes(16), ne=8)


@case("2d-short-header", "SET_TENSOR_2D 327-byte payload (header is 328)", CLOSED,
      "SET_TENSOR_2D", needs=has_command(Cmd.SET_TENSOR_2D))
def _(new):
    s, _h, _base = _opened(new)
    s.send(_frame(s, Cmd.SET_TENSOR_2D, bytes(327)))
    return s


def _bad_get_2d(cid: str, title: str, size: int, n: int, stride: int):
    @case(cid, f"GET_TENSOR_2D {title}", CLOSED, "GET_TENSOR_2D", needs=has_command(Cmd.GET_TENSOR_2D))
    def _(new):
        s, h, base = _opened(new)
        s.request(m.GetTensor2DRequest(_f32(h, base, ne=(64,)), 0, size, n, stride))
        return s


_bad_get_2d("get-2d-n-copies-0", "n_copies 0", 8, 0, 16)
_bad_get_2d("get-2d-size-0", "size 0", 0, 2, 16)
_bad_get_2d("get-2d-outside-buffer", "second copy past the buffer", 8, 2, 250)


@case("get-2d-len-329", "GET_TENSOR_2D 329-byte payload (expects 328)", CLOSED,
      "GET_TENSOR_2D", needs=has_command(Cmd.GET_TENSOR_2D))
def _(new):
    s, _h, _base = _opened(new)
    s.send(_frame(s, Cmd.GET_TENSOR_2D, bytes(329)))
    return s


# ---------------------------------------------------------------- graphs by uid
@case("recompute-unknown-uid", "GRAPH_RECOMPUTE uid never computed", CLOSED, "GRAPH_RECOMPUTE",
      needs=GRAPH_UID)
def _(new):
    s = new()
    s.hello()
    s.request(m.GraphRecomputeRequest(0, 0x55))
    return s


@case("recompute-known-uid", "GRAPH_RECOMPUTE of a computed uid reruns it on new inputs", OPEN,
      "GRAPH_RECOMPUTE", needs=GRAPH_UID)
def _(new):
    s, h, base = _opened(new)
    graph, a, c = _add_graph(s, h, base, 5)
    _set_floats(s, a, 1, 2, 3, 4)
    s.request(graph)
    _set_floats(s, a, 10, 20, 30, 40)
    s.request(m.GraphRecomputeRequest(0, 5))
    got = _floats(s, c)
    _check(got == (20, 40, 60, 80), f"recompute gave {got}")
    return s


@case("recompute-uid-0", "GRAPH_RECOMPUTE uid 0 after computing uid 0 (uid 0 is never cached)",
      CLOSED, "GRAPH_RECOMPUTE", needs=GRAPH_UID)
def _(new):
    s, h, base = _opened(new)
    s.request(_add_graph(s, h, base, 0)[0])
    s.request(m.GraphRecomputeRequest(0, 0))
    return s


@case("recompute-after-free-8", "GRAPH_RECOMPUTE of a known uid after FREE_BUFFER of its buffer",
      CLOSED, "GRAPH_RECOMPUTE", needs=GRAPH_UID)
def _(new):
    s, h, base = _opened(new)
    s.request(_add_graph(s, h, base, 5)[0])
    s.request(m.FreeBufferRequest(h))
    s.request(m.GraphRecomputeRequest(0, 5))
    return s


@case("recompute-after-free-other", "GRAPH_RECOMPUTE of a known uid after FREE_BUFFER of another "
      "buffer (every cached graph is dropped)", CLOSED, "GRAPH_RECOMPUTE", needs=GRAPH_UID)
def _(new):
    s, h, base = _opened(new)
    other = s.call(m.AllocBufferRequest(0, 64)).remote_ptr
    s.request(_add_graph(s, h, base, 5)[0])
    s.request(m.FreeBufferRequest(other))
    s.request(m.GraphRecomputeRequest(0, 5))
    return s


@case("uid-reuse", "GRAPH_COMPUTE of another graph under a cached uid replaces it", OPEN,
      "GRAPH_COMPUTE", needs=GRAPH_UID)
def _(new):
    s = new()
    s.hello()
    h, base = s.alloc(512)
    first, a, c = _add_graph(s, h, base, 5)
    _set_floats(s, a, 1, 2, 3, 4)
    s.request(first)
    second, a2, c2 = _add_graph(s, h, base + 256, 5, a_id=0x30, c_id=0x40)
    _set_floats(s, a2, 5, 5, 5, 5)
    s.request(second)
    _set_floats(s, a2, 6, 6, 6, 6)
    s.request(m.GraphRecomputeRequest(0, 5))
    _check(_floats(s, c2) == (12,) * 4, "the recompute did not run the second graph")
    _check(_floats(s, c) == (2, 4, 6, 8), "the recompute ran the first graph too")
    return s


def _fill_graph_cache(s: RawSession, h: int, base: int, count: int) -> None:
    for uid in range(1, count + 1):
        s.request(_add_graph(s, h, base, uid)[0])
    if not s.still_serving():
        raise CaseError(f"server stopped answering after {count} graphs")


@case("graph-cache-full-keeps", f"GRAPH_RECOMPUTE uid 1 after {GRAPH_CACHE_MAX} graphs (cache "
      "full, not yet cleared)", OPEN, "GRAPH_RECOMPUTE", needs=GRAPH_UID)
def _(new):
    s, h, base = _opened(new)
    _fill_graph_cache(s, h, base, GRAPH_CACHE_MAX)
    s.request(m.GraphRecomputeRequest(0, 1))
    return s


@case("graph-cache-cleared", f"GRAPH_RECOMPUTE uid 1 after {GRAPH_CACHE_MAX + 1} graphs (the "
      "insert past the limit cleared the cache)", CLOSED, "GRAPH_RECOMPUTE", needs=GRAPH_UID)
def _(new):
    s, h, base = _opened(new)
    _fill_graph_cache(s, h, base, GRAPH_CACHE_MAX + 1)
    s.request(m.GraphRecomputeRequest(0, 1))
    return s


@case("graph-cache-newest-survives", f"GRAPH_RECOMPUTE of graph {GRAPH_CACHE_MAX + 1} after the "
      "cache was cleared for it", OPEN, "GRAPH_RECOMPUTE", needs=GRAPH_UID)
def _(new):
    s, h, base = _opened(new)
    _fill_graph_cache(s, h, base, GRAPH_CACHE_MAX + 1)
    s.request(m.GraphRecomputeRequest(0, GRAPH_CACHE_MAX + 1))
    return s


@case("recompute-len-4", "GRAPH_RECOMPUTE 4-byte payload (7.0.0 layout; 8.0.0 expects 12)",
      CLOSED, "GRAPH_RECOMPUTE", needs=GRAPH_UID)
def _(new):
    s = new()
    s.hello()
    s.send(_frame(s, Cmd.GRAPH_RECOMPUTE, bytes(4)))
    return s


@case("recompute-device-1", "GRAPH_RECOMPUTE device=1", CLOSED, "GRAPH_RECOMPUTE", needs=GRAPH_UID)
def _(new):
    s = new()
    s.hello()
    s.request(m.GraphRecomputeRequest(1, 5))
    return s


@case("graph-7-layout", "GRAPH_COMPUTE in the 7.0.0 layout (no uid) to an 8.0.0 server", CLOSED,
      "GRAPH_COMPUTE", needs=GRAPH_UID)
def _(new):
    s = new()
    s.hello()
    s.send(_frame(s, Cmd.GRAPH_COMPUTE, struct.pack("<III", 0, 0, 0)))
    return s


# ---------------------------------------------------------------- communicator (no COMM_INIT:
# a rank-0 COMM_INIT makes the real server listen on every interface, spec 15.15)
@case("comm-free-without-init", "COMM_FREE without a communicator", OPEN, "COMM_FREE", needs=has_command(Cmd.COMM_FREE))
def _(new):
    s = new()
    s.hello()
    s.request(m.CommFreeRequest(0))
    _check(s.still_serving(), "server stopped answering after COMM_FREE")
    return s


@case("comm-free-device-1", "COMM_FREE device=1", CLOSED, "COMM_FREE", needs=has_command(Cmd.COMM_FREE))
def _(new):
    s = new()
    s.hello()
    s.request(m.CommFreeRequest(1))
    return s


@case("comm-allreduce-without-init", "COMM_ALLREDUCE without a communicator", CLOSED,
      "COMM_ALLREDUCE", needs=has_command(Cmd.COMM_ALLREDUCE))
def _(new):
    s, h, base = _opened(new)
    s.request(m.CommAllreduceRequest(0, _f32(h, base)))
    return s


@case("cmd-23", "cmd 23 (RPC_CMD_NONE in 8.0.0)", CLOSED, "cmd 23", needs=ids_end_at(22))
def _(new):
    s = new()
    s.hello()
    s.send(request_frame(23))
    return s
