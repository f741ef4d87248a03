"""The reference server's fixes from triaging ``--differential p7 ref-7.0.0`` and
``--differential p8 ref-8.0.0``, one minimised reproducer each.

Each reproducer runs against the reference alone (it answers every step, with the values the
real server gives) and, as a real-peer test, against the real build and the reference side by
side with no allow-list at all (every answer byte compared after pointer renaming). The
shipped allow-lists (``harness/data/differential/``) are held to the real builds by a bounded
differential campaign per dialect.
"""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from harness.data import shipped
from harness.fuzz.case import BASE, HANDLE, U64_MAX, annotate, sentinel, step
from harness.fuzz.allow_list import load_allow
from harness.fuzz.differential import run_pair
from harness.fuzz.divergence import answers
from harness.fuzz.errors import DifferentialError
from harness.fuzz.execute import CLOSED, OK, Outcome
from harness.reference.memory import HANDLE_STEP, MemoryPool
from harness.proto import get_dialect, pack_request
from harness.proto import ggml
from harness.proto import messages as m
from harness.proto.tensor import RpcTensor
from harness import strategies as rst

ALLOW = {"7.0.0": shipped("differential", "allow-7.0.0.yaml"),
         "8.0.0": shipped("differential", "allow-8.0.0.yaml")}
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
    from harness.fuzz.allow_list import _allowed
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
    from harness.fuzz.divergence import _close_causes
    d = get_dialect("7.0.0")
    read = _get(d, _f32(d, 1, 0))
    free = step(pack_request(d, m.FreeBufferRequest(H0)), "FREE_BUFFER")
    stale = annotate(d, tuple(_start(d, 4096) + [free, read]))
    fresh = annotate(d, tuple(_start(d, 4096) + [read]))
    assert "stale-base" in _close_causes(stale, 3, 4)
    assert _close_causes(fresh, 3, 3) == "valid"


# ---------------------------------------------------------------- allocator-dependent closes

def _outcome(case, answered: int, status: str):
    """A run that answered the first ``answered`` steps' expected answers (zeros), then ended
    with ``status``."""
    s2c = b"".join(n.to_bytes(8, "little") + bytes(n)
                   for s in case.steps[:answered] for n in s.expect)
    return None, Outcome(status, proven=answered, log=[("s2c", 0.0, s2c)])


def _stale_handle_session(d, relearn: int = 2, stale_at_end: bool = False):
    """ALLOC x2, FREE the first, a SET_TENSOR (heap activity), ALLOC into buffer index
    ``relearn``, then BUFFER_GET_BASE of the freed handle (and a GET_ALIGNMENT); with
    ``stale_at_end`` the stale lookup comes after an answered GET_ALIGNMENT."""
    t = _f32(d, 1, 0).with_(buffer=H1, data=sentinel(BASE, 1))
    stale = step(pack_request(d, m.BufferGetBaseRequest(H0)), "BUFFER_GET_BASE")
    align = step(pack_request(d, m.GetAlignmentRequest(0)), "GET_ALIGNMENT")
    steps = _start(d, 4096, 4096) + [
        step(pack_request(d, m.FreeBufferRequest(H0)), "FREE_BUFFER"), _set(d, t, b"\1" * 4),
        step(pack_request(d, m.AllocBufferRequest(0, 4096)), "ALLOC_BUFFER",
             learn=(HANDLE, relearn))]
    steps += [align, stale] if stale_at_end else [stale, align]
    return annotate(d, tuple(steps))


@DIALECTS
def test_a_stale_handle_close_is_allowed_and_nothing_broader(proto):
    """The real server gives a freed handle struct to the next ALLOC_BUFFER only when no
    request in between took the chunk (p8 closed on the stale BUFFER_GET_BASE after one
    session and answered it after others); the shipped entry allows a close point at a step
    naming a freed, not reallocated buffer by its handle, and no other close."""
    from harness.fuzz.divergence import compare
    d = get_dialect(proto)
    allow = load_allow(ALLOW[proto])
    labels = (REAL[proto], f"ref-{proto}")

    def diverges(case, first_unanswered: int):
        runs = [_outcome(case, first_unanswered, CLOSED), _outcome(case, len(case.steps), OK)]
        return compare(case, runs, labels, allow)

    stale = _stale_handle_session(d)
    at = next(i for i, s in enumerate(stale.steps) if s.cmd == "BUFFER_GET_BASE" and i > 6)
    assert diverges(stale, at) is None
    # the freed index allocated again: the lookup names a live buffer, not the allocator's
    # choice, so a different close point is a divergence
    relearnt = _stale_handle_session(d, relearn=0)
    assert diverges(relearnt, at) is not None
    # the early side stopped at the GET_ALIGNMENT before the stale lookup: not covered
    late = _stale_handle_session(d, stale_at_end=True)
    assert diverges(late, at) is not None


def test_a_relearnt_handle_forgets_the_old_buffers_base():
    """Evolved cases repeat ALLOC_BUFFER steps, so buffer index i can name a new buffer while
    its learned base is still the old one's: a tensor {buffer: i, data: base i + k} then
    pointed into the old buffer, and whether that lay inside the new one was the heap's
    layout (p8 answered a GET_ALLOC_SIZE after one session and closed after others). The
    executor forgets base i when it learns handle i."""
    d = get_dialect("7.0.0")
    again = step(pack_request(d, m.AllocBufferRequest(0, 4096)), "ALLOC_BUFFER",
                 learn=(HANDLE, 0))
    base = step(pack_request(d, m.BufferGetBaseRequest(H0)), "BUFFER_GET_BASE",
                learn=(BASE, 0))
    _, runs = run_pair(annotate(d, tuple(_start(d, 4096) + [again])), "ref", "ref")
    assert runs[0][1].live[HANDLE][0] and runs[0][1].live[BASE][0] == 0
    _, runs = run_pair(annotate(d, tuple(_start(d, 4096) + [again, base])), "ref", "ref")
    assert runs[0][1].live[BASE][0]


def test_allow_lists_include_others_and_refuse_cycles(tmp_path):
    flags = load_allow(shipped("differential", "allow-7.0.0+flags.yaml"), defaults=False)
    base = load_allow(ALLOW["7.0.0"], defaults=False)
    assert flags[:len(base)] == base and len(flags) > len(base)
    (tmp_path / "a.yaml").write_text("- include: b.yaml\n")
    (tmp_path / "b.yaml").write_text("- include: a.yaml\n")
    with pytest.raises(DifferentialError, match="cycle"):
        load_allow(tmp_path / "a.yaml")


def test_an_allow_list_entry_that_repeats_an_included_one_is_refused(tmp_path):
    # p7f's list repeated the graph-bound entry the 7.0.0 list had taken in: the copy could
    # never let a session pass (the first match does) and showed as an entry of 0 sessions
    import shutil
    shutil.copy(ALLOW["7.0.0"], tmp_path / "base.yaml")
    entry = next(e for e in load_allow(ALLOW["7.0.0"], defaults=False) if e.get("match"))
    (tmp_path / "top.yaml").write_text(
        "- include: base.yaml\n" + yaml.safe_dump([entry]))
    with pytest.raises(DifferentialError, match="repeats one in .*base.yaml"):
        load_allow(tmp_path / "top.yaml")
    (tmp_path / "top.yaml").write_text(
        "- include: base.yaml\n" + yaml.safe_dump([{**entry, "match": entry["match"] + "x"}]))
    assert len(load_allow(tmp_path / "top.yaml")) == len(load_allow(ALLOW["7.0.0"])) + 1


def test_the_p7f_direct_receive_assert_is_allowed_for_p7f_only():
    from harness.fuzz.allow_list import _allowed
    flags = load_allow(shipped("differential", "allow-7.0.0+flags.yaml"), defaults=False)
    assertion = ('crash SIGABRT ggml-rpc.cpp:1773: GGML_ASSERT(header.offset + size <= '
                 'ggml_nbytes(tensor) && "tensor write out of bounds") failed')
    assert _allowed(flags, "death", "SET_TENSOR", f"p7f broke: {assertion} / survived")
    # the reference dying there, or the 7.0.0 list without the patch's entry, is not covered
    assert not _allowed(flags, "death", "SET_TENSOR",
                        f"ref-7.0.0+flags broke: survived / {assertion}")
    assert not _allowed(load_allow(ALLOW["7.0.0"], defaults=False), "death", "SET_TENSOR",
                        f"p7f broke: {assertion} / survived")


# ---------------------------------------------------------------- cross-buffer pointers

def _cross_session(d, at: int, named=H1):
    """Buffers of 1 KiB and 64 KiB, then an INIT_TENSOR naming ``named`` with data at buffer
    0's base + ``at``, then a GET_ALIGNMENT that shows whether the server went on."""
    t = _f32(d, 1, at, handle=named)
    return annotate(d, tuple(_start(d, 1024, 65536) + [
        step(pack_request(d, m.InitTensorRequest(t)), "INIT_TENSOR"),
        step(pack_request(d, m.GetAlignmentRequest(0)), "GET_ALIGNMENT")]))


def _ran(status: str, proven: int, bases: tuple[int, ...]) -> Outcome:
    return Outcome(status, proven=proven, live={HANDLE: [1, 2], BASE: list(bases)})


def test_cross_base_names_a_pointer_past_another_buffer_and_only_that():
    from harness.fuzz.divergence import _close_causes
    d = get_dialect("8.0.0")
    p8_like = _ran(OK, 7, (0x1000, 0x1000 + 0x480))  # buffer 1 right after buffer 0
    spaced = _ran(CLOSED, 5, (0x7a0000000000, 0x7a0000101000))  # the reference's layout
    cross = _cross_session(d, 2048)
    assert "cross-base" in _close_causes(cross, 5, 5)  # no bases learned: as symbols
    assert "cross-base" in _close_causes(cross, 5, 5, (p8_like, spaced))  # the layout decided
    # both learned, the pointer outside buffer 1 on both sides: a server that accepted it
    # accepted a bad pointer, which the layout does not excuse
    far = _ran(OK, 7, (0x1000, 0x9000_0000))
    assert "cross-base" not in _close_causes(cross, 5, 5, (far, spaced))
    assert "cross-base" not in _close_causes(_cross_session(d, 100), 5, 5)  # inside buffer 0
    # past its own buffer's end: out of bounds wherever the buffers lie
    assert "cross-base" not in _close_causes(_cross_session(d, 2048, named=H0), 5, 5)


@pytest.mark.realpeer
@DIALECTS
def test_a_pointer_past_one_buffer_into_the_next_is_the_allocators_and_allowed(proto):
    """Found by a 10-minute `--differential p8 ref-8.0.0 --no-allow` (evolved sessions): a
    tensor naming the 64 KiB buffer with data at the 1 KiB buffer's base + 65519 is inside
    the named buffer on p8 and p7 (where malloc put it right after) and not on the
    reference. The shipped list allows that close and nothing else about the session."""
    case = _cross_session(get_dialect(proto), 65519)
    div, _ = run_pair(case, REAL[proto], f"ref-{proto}", allow=NO_ALLOW)
    assert div is not None and "ok" in div.signature.line, div
    used: list[dict] = []
    div, _ = run_pair(case, REAL[proto], f"ref-{proto}", allow=load_allow(ALLOW[proto]),
                      used=used)
    assert div is None and any("cross-base" in e.get("match", "") for e in used), used
