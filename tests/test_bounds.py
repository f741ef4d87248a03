"""The accepted-out-of-bounds oracle (harness/fuzz/bounds.py): what a processed request names
outside its buffer, by ggml's rules; and its converse, a plain in-bounds request refused.

Each rule is shown both ways: a server that accepted every step (the planted fault: an
outcome in which every step was answered) is flagged; the honest reference, run in process
on the same case, refuses and is not."""

from __future__ import annotations

from dataclasses import replace

from harness.fuzz import bounds
from harness.fuzz.case import BASE, HANDLE, SIZE, annotate
from harness.fuzz.execute import CLOSED, OK, Outcome
from harness.fuzz.generate import _Model, _alloc_steps, _frame
from harness.fuzz.inprocess import InProcessReference
from harness.fuzz.stateful import _Session, cases as stateful_cases
from harness.strategies.boundaries import _WRAP_SMALL
from harness.fuzz.sweep import _session, _setup
from harness.proto import get_dialect, ggml
from harness.proto import messages as m
from harness.proto.tensor import RpcTensor

D = get_dialect("8.0.0")
HEAD, REGIONS = _setup(D)  # HELLO, buffers of 4 and 8 KiB (sentinel handles and bases)


def _live(n: int) -> dict:
    """What an accepting server hands out for ``n`` buffers (b0 4 KiB, the others 8 KiB)."""
    return {HANDLE: [0x5A00_0000_0000 + (i << 20) for i in range(n)],
            BASE: [0x7A00_0000_0000 + (i << 28) for i in range(n)],
            SIZE: [4096 if i == 0 else 8192 for i in range(n)]}


def _t(i: int, at: int = 512, n: int = 64, **kw) -> RpcTensor:
    r = REGIONS[i]
    return RpcTensor.make(id=0x100 + i, ne=(n, 1, 1, 1), buffer=r.handle, data=r.base + at,
                          **kw)


def _case(msg):
    return _session(D, HEAD, _frame(D, msg), msg.cmd.value, {"kind": "field"})


def accepted(case, answers: dict | None = None) -> Outcome:
    """The outcome of a server that answered every step of ``case`` (ALLOC_BUFFER and
    BUFFER_GET_BASE with LIVE's handles, sizes and bases; every result byte 1)."""
    live = _live(case.n_buffers)
    ans = {i: 1 for i, s in enumerate(case.steps) if s.expect}
    for i, s in enumerate(case.steps):
        if s.learn:
            ans[i] = live[s.learn[0]][s.learn[1]]
    ans.update(answers or {})
    sizes = {i: live[SIZE][s.learn[1]] for i, s in enumerate(case.steps)
             if s.learn and s.learn[0] == HANDLE}
    return Outcome(OK, progress=len(case.steps), proven=len(case.steps), live=live,
                   answers=ans, sizes=sizes)


def lines(case, out) -> list[str]:
    return [v.line for v in bounds.judge(case, out)]


def honest(case) -> Outcome:
    return InProcessReference(D.name).run(case)


def test_in_bounds_requests_accepted_are_nothing():
    for msg in (m.SetTensorRequest(_t(0), 0, 0, bytes(256)), m.GetTensorRequest(_t(0), 0, 256),
                m.MemsetTensorRequest(_t(0), 0, 256, 7), m.CopyTensorRequest(_t(0), _t(1)),
                m.SetTensor2DRequest(_t(0), 0, 64, 4, 64, bytes(256))):
        case = _case(msg)
        assert lines(case, accepted(case)) == [], msg.cmd
        assert honest(case).status == OK and lines(case, honest(case)) == []


def test_a_tensor_one_byte_past_its_buffer_accepted_is_a_write_out_of_bounds():
    case = _case(m.SetTensorRequest(_t(0, at=4096 - 256 + 1), 0, 0, bytes(16)))
    assert lines(case, accepted(case)) == [
        "write out of bounds accepted: SET_TENSOR tensor past its buffer's end"]
    ref = honest(case)
    assert ref.status == CLOSED and lines(case, ref) == []  # refused: judged no further
    refused = replace(accepted(case), status=CLOSED, proven=5)
    assert lines(case, refused) == []


def test_a_slot_allocated_again_later_does_not_move_the_earlier_requests_buffer():
    """The live table keeps each slot's last value; a request is judged against the buffer
    its slot named when it was sent (a shrunk case re-allocates slots)."""
    case = _case(m.SetTensorRequest(_t(1, at=6000), 0, 0, bytes(16)))  # inside b1's 8 KiB
    assert case.steps[5].cmd == "SET_TENSOR"
    again = next(s for s in case.steps if s.learn == (HANDLE, 1))
    base = next(s for s in case.steps if s.learn == (BASE, 1))

    def smaller_again(steps) -> tuple[object, Outcome]:
        c = replace(case, steps=steps)
        out = accepted(c)
        at = max(i for i, s in enumerate(c.steps) if s is again)
        out.answers[at], out.sizes[at] = 0x5B00_0000_0000, 4096  # 4 KiB in the same slot
        out.answers[at + 1] = 0x7B00_0000_0000
        # as the executor leaves it: each slot's last value
        out.live[HANDLE][1], out.live[SIZE][1], out.live[BASE][1] = (
            0x5B00_0000_0000, 4096, 0x7B00_0000_0000)
        return c, out

    assert lines(*smaller_again(case.steps + (again, base))) == []
    # the same slot allocated smaller before the request: now it is past the end
    assert lines(*smaller_again(case.steps[:5] + (again, base) + case.steps[5:])) == [
        "write out of bounds accepted: SET_TENSOR tensor past its buffer's end",
        "write out of bounds accepted: SET_TENSOR region past its buffer's end"]


def test_regions_reads_copies_and_the_address_wrapping():
    region = _case(m.SetTensorRequest(_t(0), offset=4096 - 512, data=bytes(8)))
    assert lines(region, accepted(region)) == [
        "write out of bounds accepted: SET_TENSOR region past its buffer's end"]
    read = _case(m.GetTensorRequest(_t(0), 3584, 8))
    assert lines(read, accepted(read)) == [
        "read out of bounds accepted: GET_TENSOR region past its buffer's end"]
    wraps = _case(m.GetTensorRequest(_t(0).with_(data=(1 << 64) - 4), 0, 8))
    assert "read out of bounds accepted: GET_TENSOR tensor wrapping the address space" in \
        lines(wraps, accepted(wraps))
    below = _case(m.CopyTensorRequest(_t(0), _t(1, n=0).with_(
        data=REGIONS[1].base - 1)))
    assert lines(below, accepted(below, {5: 0})) == []  # answered 0: nothing was copied
    assert lines(below, accepted(below)) == [
        "write out of bounds accepted: COPY_TENSOR dst room for src before its buffer's base"]
    for case in (region, read, wraps, below):
        assert lines(case, honest(case)) == []


def test_a_tensor_with_no_elements_names_nothing():
    empty = _t(0, n=0).with_(data=REGIONS[0].base + (1 << 40))
    case = _case(m.GetTensorRequest(empty, 0, 0))
    assert lines(case, accepted(case)) == []


def test_init_tensor_without_a_live_buffer_is_skipped_by_every_server():
    case = _case(m.InitTensorRequest(_t(0).with_(buffer=0x7F3D_0EAD_B000, data=1 << 40)))
    assert lines(case, accepted(case)) == []
    live = _case(m.InitTensorRequest(_t(0, at=4095)))
    assert lines(live, accepted(live)) == [
        "write out of bounds accepted: INIT_TENSOR tensor past its buffer's end"]


def _graph(node_flags: int = 0, source: RpcTensor | None = None, shape=None):
    a = source or _t(1, at=0).with_(id=1)
    b = _t(1, at=256).with_(id=2)
    node = _t(0).with_(id=3, op=ggml.OP["ADD"], src=(1, 2) + (0,) * 8, flags=node_flags)
    if shape is not None:
        node = node.with_(ne=shape[0], nb=shape[1])
    return m.GraphComputeRequest(device=0, uid=1, nodes=(3,), tensors=(a, b, node))


def test_a_graph_names_every_tensor_with_memory_and_a_computed_node_its_extents():
    unknown = _t(1).with_(id=1, buffer=0x7F3D_0EAD_B000, data=0)
    past = _t(1, at=8192 - 255).with_(id=1)
    for flags, source, want in (
            (0, past, ["read out of bounds accepted: GRAPH_COMPUTE source past its buffer's "
                       "end"]),
            (0, unknown, []),  # no buffer and no data: names no memory, and is not computed
            (ggml.FLAG_COMPUTE, unknown, ["read out of bounds accepted: GRAPH_COMPUTE "
                                          "computed source in no live buffer"])):
        case = _case(_graph(flags, source))
        assert lines(case, accepted(case)) == want, (flags, source)
    # a size that wraps size_t: within its buffer by ggml_nbytes, past every buffer by what a
    # kernel walks, which matters only for a node that is computed
    wraps = dict(shape=_WRAP_SMALL)
    quiet = _case(_graph(0, **wraps))
    assert lines(quiet, accepted(quiet)) == []
    computed = _case(_graph(ggml.FLAG_COMPUTE, **wraps))
    assert "write out of bounds accepted: GRAPH_COMPUTE computed node wrapping the address " \
        "space" in lines(computed, accepted(computed))


def test_the_reference_refuses_a_computed_node_it_would_skip_whose_elements_leave_its_buffer():
    """Found by the p7 differential of 2026-12-05 (an evolved session): a SQRT node whose
    shape wraps size_t, so ggml_nbytes puts it inside its buffer, and whose source has another
    shape. The reference skipped the node (shapes differ) and answered success, which the
    oracle rightly flags: the CPU backend walks the node's elements, not its nbytes. Every
    computed node and source is now held to its extent before the op's own checks."""
    wraps = _case(_graph(ggml.FLAG_COMPUTE, shape=_WRAP_SMALL))  # ADD over (64,) sources
    assert lines(wraps, accepted(wraps))  # the oracle flags it on an accepting server
    out = honest(wraps)
    assert out.status == CLOSED and lines(wraps, out) == [], (out.status, out.detail)
    assert "outside its buffer" in out.detail, out.detail
    # and the same node in bounds with sources of another shape is still skipped, answered
    skipped = _case(_graph(ggml.FLAG_COMPUTE, source=_t(1, at=0, n=32).with_(id=1)))
    assert honest(skipped).status == OK and lines(skipped, honest(skipped)) == []


def test_a_freed_buffer_is_no_longer_live_and_a_recompute_touches_the_stored_graph():
    sess = _Session(D, _Model())
    head = [HEAD[0]]
    for size in (4096, 8192):
        head += _alloc_steps(size, D, sess.model)
    graph = sess.graph(0)
    graph = replace(graph, tensors=graph.tensors[:2] + (
        graph.tensors[2].with_(flags=ggml.FLAG_COMPUTE),))
    body = [sess.frame(graph), sess.frame(m.FreeBufferRequest(sess.region(0).handle)),
            sess.frame(m.GraphRecomputeRequest(0, sess.uid)),
            sess.frame(m.GetTensorRequest(sess.tensor(0), 0, 4))]
    case = annotate(D, tuple(head + body))
    got = lines(case, accepted(case))
    assert "write out of bounds accepted: GRAPH_RECOMPUTE computed node in no live buffer" in got
    assert "read out of bounds accepted: GET_TENSOR tensor in no live buffer" in got
    assert not any("GRAPH_COMPUTE" in line for line in got)  # computed while b0 was live
    assert lines(case, honest(case)) == []


def test_a_framing_mutation_ends_the_judging():
    case = _case(m.SetTensorRequest(_t(0, at=4095), 0, 0, bytes(16)))
    bad = case.steps[5]
    cut = replace(bad, frame=bad.frame[:-3])
    broken = annotate(D, case.steps[:5] + (cut,) + case.steps[6:])
    assert lines(broken, accepted(broken)) == []


def test_the_converse_a_plain_in_bounds_request_refused_is_a_compatibility_finding():
    plain = _case(m.GetTensorRequest(_t(0), 0, 256))
    refused = replace(accepted(plain), status=CLOSED, proven=5, at=5)
    sig = bounds.refused_in_bounds(plain, refused, 5)
    assert sig is not None and sig.kind == bounds.REFUSED_IN_BOUNDS
    past = _case(m.GetTensorRequest(_t(0), 4000, 256))  # beyond the tensor: must be refused
    assert bounds.refused_in_bounds(past, replace(accepted(past), proven=5), 5) is None
    odd = _case(m.GetTensorRequest(_t(0).with_(op=ggml.OP["ADD"]), 0, 256))  # not plain
    assert bounds.refused_in_bounds(odd, replace(accepted(odd), proven=5), 5) is None
    end = _case(m.GetTensorRequest(_t(0, at=4096 - 256), 256, 0))  # zero bytes at the end
    assert bounds.refused_in_bounds(end, replace(accepted(end), proven=5), 5) is None


def test_the_stateful_phase_judges_a_freed_handle_on_an_accepting_server():
    case = next(c.case for c in stateful_cases(D)
                if c.pair == "FREE_BUFFER -> ALLOC_BUFFER on target" and c.use == "SET_TENSOR")
    got = lines(case, accepted(case))
    assert got and all("in no live buffer" in line for line in got), got
