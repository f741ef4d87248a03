"""The written-bytes tracker's ranges (harness/fuzz/written.py) against a model: a set of
byte offsets, under any sequence of writes and removals."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from harness.fuzz.case import BASE, HANDLE, annotate, sentinel, step
from harness.fuzz.written import _Ranges, unwritten_ranges
from harness.proto import get_dialect, pack_request
from harness.proto import messages as m
from harness.proto.tensor import RpcTensor
from harness import strategies as rst

span = st.tuples(st.integers(0, 64), st.integers(0, 16)).map(lambda p: (p[0], p[0] + p[1]))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.booleans(), span), max_size=30), span)
def test_ranges_agree_with_a_set_of_bytes(ops, probe):
    r, model = _Ranges(), set()
    for add, (a, b) in ops:
        (r.add if add else r.remove)(a, b)
        model = model | set(range(a, b)) if add else model - set(range(a, b))
    spans = r.spans
    assert all(e0 < s1 for (_, e0), (s1, _) in zip(spans, spans[1:]))  # sorted, merged
    assert {x for s, e in spans for x in range(s, e)} == model
    a, b = probe
    assert {x for s, e in r.covered(a, b) for x in range(s, e)} == model & set(range(a, b))
    assert {x for s, e in r.missing(a, b) for x in range(s, e)} == set(range(a, b)) - model


def test_a_2d_write_of_65536_copies_is_tracked_copy_by_copy():
    d = get_dialect("8.0.0")
    t = RpcTensor(id=1, type=0, buffer=sentinel(HANDLE, 0), ne=(256, 1, 1, 1),
                  nb=(4, 1024, 1024, 1024), data=sentinel(BASE, 0))
    head = (step(rst.hello_request_frame(d), "HELLO"),
            step(pack_request(d, m.AllocBufferRequest(0, 1 << 24)), "ALLOC_BUFFER",
                 learn=(HANDLE, 0)),
            step(pack_request(d, m.BufferGetBaseRequest(sentinel(HANDLE, 0))),
                 "BUFFER_GET_BASE", learn=(BASE, 0)))
    n = 1 << 16
    write = step(pack_request(d, m.SetTensor2DRequest(t, 0, 64, n, 128, bytes(64))),
                 "SET_TENSOR_2D")
    read = step(pack_request(d, m.GetTensor2DRequest(t, 0, 128, n, 128)), "GET_TENSOR_2D")
    gaps = unwritten_ranges(annotate(d, head + (write, read)))[4]
    # each 128-byte copy read: its first 64 bytes written, the other 64 not
    assert len(gaps) == n and gaps[:2] == [(64, 128), (192, 256)]
