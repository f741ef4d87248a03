"""The reference server's fixes from triaging ``--differential p7 ref-7.0.0`` and
``--differential p8 ref-8.0.0``, one minimised reproducer each.

Each reproducer runs against the reference alone (it answers every step, with the values the
real server gives) and, as a real-peer test, against the real build and the reference side by
side with no allow-list at all (every answer byte compared after pointer renaming). The
shipped allow-lists (``fixtures/differential/``) are held to the real builds by a bounded
differential campaign per dialect.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from harness.fuzz.case import BASE, HANDLE, U64_MAX, annotate, sentinel, step
from harness.fuzz.differential import (answers, load_allow, run_pair)
from harness.fuzz.execute import OK
from harness.reference.memory import HANDLE_STEP, MemoryPool
from harness.proto import get_dialect, pack_request
from harness.proto import ggml
from harness.proto import messages as m
from harness.proto.tensor import RpcTensor
from harness import strategies as rst

ROOT = Path(__file__).resolve().parents[1]
ALLOW = {"7.0.0": ROOT / "fixtures/differential/allow-7.0.0.yaml",
         "8.0.0": ROOT / "fixtures/differential/allow-8.0.0.yaml"}
REAL = {"7.0.0": "p7", "8.0.0": "p8"}
DIALECTS = pytest.mark.parametrize("proto", sorted(REAL))
NO_ALLOW: list[dict] = []  # compare every answer byte

H0, H1 = sentinel(HANDLE, 0), sentinel(HANDLE, 1)
B0 = sentinel(BASE, 0)
A_VALUES = np.array([1.5, 4.0, 9.0, 2.0], np.float32)
B_VALUES = np.array([0.5, -2.0, 3.0, 7.0], np.float32)


def _f32(d, tid: int, at: int, op: str = "NONE", srcs=(), handle=H0) -> RpcTensor:
    ne = (4, 1, 1, 1)
    return RpcTensor(id=tid, type=ggml.TYPE_F32, buffer=handle, ne=ne,
                     nb=d.numbering.contiguous_strides(ggml.TYPE_F32, ne),
                     op=d.numbering.op[op], flags=ggml.FLAG_COMPUTE if srcs else 0,
                     src=tuple(srcs) + (0,) * (10 - len(srcs)), data=B0 + at)


def _start(d, *sizes: int) -> list:
    steps = [step(rst.hello_request_frame(d), "HELLO")]
    for i, size in enumerate(sizes):
        steps += [step(pack_request(d, m.AllocBufferRequest(0, size)), "ALLOC_BUFFER",
                       learn=(HANDLE, i)),
                  step(pack_request(d, m.BufferGetBaseRequest(sentinel(HANDLE, i))),
                       "BUFFER_GET_BASE", learn=(BASE, i))]
    return steps


def _set(d, t: RpcTensor, data: bytes, offset: int = 0):
    return step(pack_request(d, m.SetTensorRequest(t, 0, offset, data)), "SET_TENSOR")


def _get(d, t: RpcTensor, size: int = 16):
    return step(pack_request(d, m.GetTensorRequest(t, 0, size)), "GET_TENSOR")


ELEMENTWISE = {"SUB": A_VALUES - B_VALUES, "DIV": A_VALUES / B_VALUES,
               "SQR": A_VALUES * A_VALUES, "SQRT": np.sqrt(A_VALUES)}


def elementwise_case(proto: str):
    """GRAPH_COMPUTE of the generator's elementwise ops the reference refused (``op SQRT is
    not supported by the reference server``) while p7 and p8 computed them; each result is
    read back."""
    d = get_dialect(proto)
    a, b = _f32(d, 1, 0), _f32(d, 2, 64)
    nodes = [_f32(d, 10 + i, 128 + 64 * i, op, (1, 2) if op in ("SUB", "DIV") else (1,))
             for i, op in enumerate(ELEMENTWISE)]
    graph = m.GraphComputeRequest(0, 7 if d.graph_uid else 0, tuple(n.id for n in nodes),
                                  (a, b, *nodes))
    steps = _start(d, 4096) + [_set(d, a, A_VALUES.tobytes()), _set(d, b, B_VALUES.tobytes()),
                               step(pack_request(d, graph), "GRAPH_COMPUTE")]
    return annotate(d, tuple(steps + [_get(d, n) for n in nodes]))


def wrapping_offset_case(proto: str):
    """SET_TENSOR whose ``offset`` wraps ``data + offset`` back inside the buffer: the real
    server's checks are size_t arithmetic (offset + size wraps to 0 <= nbytes), so it writes 16
    bytes at data - 16; the reference refused (``beyond tensor nbytes``). A GET_TENSOR reads
    them back."""
    d = get_dialect(proto)
    t = _f32(d, 1, 64)
    steps = _start(d, 4096) + [_set(d, t, b"\x11" * 16, offset=U64_MAX - 15),
                               _get(d, _f32(d, 2, 48))]
    return annotate(d, tuple(steps))


def stale_handle_case(proto: str):
    """ALLOC, FREE, ALLOC, then the freed handle again: the real server's malloc gives the
    second buffer the first one's struct, so the stale handle is live (its memory is fresh);
    the reference's handles were never reused. And a handle plus a small offset names no
    buffer there (it closes); the reference's handles were 0x100 apart, so it answered."""
    d = get_dialect(proto)
    B1 = sentinel(BASE, 1)
    tensor = _f32(d, 1, 0).with_(data=B1)
    steps = _start(d, 4096) + [
        step(pack_request(d, m.FreeBufferRequest(H0)), "FREE_BUFFER"),
        step(pack_request(d, m.AllocBufferRequest(0, 4096)), "ALLOC_BUFFER", learn=(HANDLE, 1)),
        step(pack_request(d, m.BufferGetBaseRequest(H0)), "BUFFER_GET_BASE", learn=(BASE, 1)),
        _set(d, tensor, b"\x22" * 16), _get(d, tensor),
        step(pack_request(d, m.AllocBufferRequest(0, 4096)), "ALLOC_BUFFER", learn=(HANDLE, 2)),
        step(pack_request(d, m.BufferGetBaseRequest(H1 + 0x100)), "BUFFER_GET_BASE")]
    return annotate(d, tuple(steps))


def zero_size_buffer_case(proto: str):
    """A zero-size ALLOC_BUFFER is ggml's dummy buffer (NULL base, no buffer methods): a
    COPY_TENSOR of empty tensors into it answers 0 (ggml_backend_buffer_copy_tensor has no
    cpy_tensor to call) and a MEMSET_TENSOR closes (no memset_tensor); the reference answered
    1 and accepted the memset."""
    d = get_dialect(proto)
    empty = _f32(d, 1, 0).with_(ne=(0, 1, 1, 1))
    steps = _start(d, 0) + [
        step(pack_request(d, m.CopyTensorRequest(empty, empty.with_(id=2))), "COPY_TENSOR"),
        step(pack_request(d, m.MemsetTensorRequest(empty, 0, 0, 7)), "MEMSET_TENSOR"),
        step(pack_request(d, m.GetAlignmentRequest(0)), "GET_ALIGNMENT")]
    return annotate(d, tuple(steps))


def empty_copy_case(proto: str):
    """COPY_TENSOR of empty tensors (ne[0] = 0) with data 0 in a live buffer: the real
    server bounds only the end of the destination (data + nbytes <= base + size) and copies
    nothing, answering 1; the reference also required data >= base and closed."""
    d = get_dialect(proto)
    empty = _f32(d, 1, 0).with_(ne=(0, 1, 1, 1), data=0)
    steps = _start(d, 4096) + [
        step(pack_request(d, m.CopyTensorRequest(empty, empty.with_(id=2))), "COPY_TENSOR"),
        step(pack_request(d, m.GetAlignmentRequest(0)), "GET_ALIGNMENT")]
    return annotate(d, tuple(steps))


REPRODUCERS = {"zero_size_buffer": zero_size_buffer_case, "empty_copy": empty_copy_case,
               "elementwise": elementwise_case, "wrapping_offset": wrapping_offset_case,
               "stale_handle": stale_handle_case}


def _payloads(case, run, cmd: str) -> list[bytes]:
    return [p for _, c, p in answers(case, run[1]) if c == cmd]


@DIALECTS
@pytest.mark.parametrize("name", sorted(REPRODUCERS))
def test_reference_alone_answers_like_the_real_server(proto, name):
    case = REPRODUCERS[name](proto)
    div, (ref, _) = run_pair(case, f"ref-{proto}", f"ref-{proto}", allow=NO_ALLOW)
    assert div is None and ref[0] is None
    out = ref[1]
    got = _payloads(case, ref, "GET_TENSOR")
    if name == "empty_copy":
        assert out.status == OK and _payloads(case, ref, "COPY_TENSOR") == [b"\1"], out
        return
    if name == "zero_size_buffer":
        assert _payloads(case, ref, "COPY_TENSOR") == [b"\0"]
        assert out.proven == len(case.steps) - 2, out  # closed at the MEMSET_TENSOR
        return
    if name == "stale_handle":
        # answered up to the handle+0x100 lookup, which closes (no such buffer)
        assert out.proven == len(case.steps) - 1, out
        assert got == [b"\x22" * 16]
        return
    assert out.status == OK and out.proven == len(case.steps), out
    if name == "elementwise":
        assert [np.frombuffer(g, np.float32).tolist() for g in got] == \
            [v.tolist() for v in ELEMENTWISE.values()]
    else:
        assert got == [b"\x11" * 16]


def test_freed_handles_are_reused_last_freed_first_and_memory_never():
    pool = MemoryPool(1 << 20)
    a, b = pool.allocate(4096), pool.allocate(4096)
    assert b.handle - a.handle == HANDLE_STEP
    pool.release(a)
    pool.release(b)
    c, d = pool.allocate(4096), pool.allocate(4096)
    assert (c.handle, d.handle) == (b.handle, a.handle)
    assert not {c.base, d.base} & {a.base, b.base}


@pytest.mark.realpeer
@DIALECTS
@pytest.mark.parametrize("name", sorted(REPRODUCERS))
def test_real_server_and_reference_agree_on_the_reproducer(proto, name):
    case = REPRODUCERS[name](proto)
    if (name, proto) == ("empty_copy", "7.0.0"):
        # 7.0.0's deserialize_tensor asserts on data below the buffer even for an empty
        # tensor: a real-server crash, named in the shipped allow-list
        div, runs = run_pair(case, REAL[proto], f"ref-{proto}", allow=load_allow(ALLOW[proto]))
        assert div is None and runs[0][0] is not None and runs[1][0] is None
        return
    div, runs = run_pair(case, REAL[proto], f"ref-{proto}", allow=NO_ALLOW)
    assert div is None, div
    assert all(v is None for v, _ in runs)


@DIALECTS
def test_shipped_allow_lists_load_and_name_why(proto):
    entries = load_allow(ALLOW[proto], defaults=False)
    assert entries and all(e.get("reason") for e in entries)


def test_an_allow_entry_covers_only_what_its_match_names():
    from harness.fuzz.differential import _allowed
    entries = load_allow(ALLOW["7.0.0"], defaults=False)
    death = ("p7 broke: crash SIGABRT ggml-backend.cpp:360: GGML_ASSERT(offset + size <= "
             'ggml_nbytes(tensor) && "tensor read out of bounds") failed / survived')
    assert _allowed(entries, "death", "GET_TENSOR", death)
    # the reference dying the same way, or another assert, is not covered
    assert not _allowed(entries, "death", "GET_TENSOR",
                        "ref-7.0.0 broke: survived / " + death[len("p7 broke: "):-len(" / survived")])
    assert not _allowed(entries, "death", "GET_TENSOR",
                        "p7 broke: crash SIGABRT ggml.c:1: GGML_ASSERT(x) failed / survived")
    assert _allowed(entries, "close", "SET_TENSOR",
                    "close point: p7 ok, ref-7.0.0 closed <- field:ne_extreme framing:len_large"
                    " same-step")
    assert _allowed(entries, "close", "GET_TENSOR",
                    "close point: p7 closed, ref-7.0.0 closed <- valid stale-base")
    assert not _allowed(entries, "close", "SET_TENSOR",
                        "close point: p7 ok, ref-7.0.0 closed <- valid same-step")
    assert not _allowed(entries, "close", "SET_TENSOR",  # one side answered more
                        "close point: p7 ok, ref-7.0.0 closed <- framing:len_large")


def test_a_close_after_a_freed_buffer_is_tagged_stale_base_only_then():
    from harness.fuzz.differential import _close_causes
    d = get_dialect("7.0.0")
    read = _get(d, _f32(d, 1, 0))
    free = step(pack_request(d, m.FreeBufferRequest(H0)), "FREE_BUFFER")
    stale = annotate(d, tuple(_start(d, 4096) + [free, read]))
    fresh = annotate(d, tuple(_start(d, 4096) + [read]))
    assert "stale-base" in _close_causes(stale, 3, 4)
    assert _close_causes(fresh, 3, 3) == "valid"
