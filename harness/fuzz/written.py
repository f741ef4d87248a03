"""Which bytes of a session's GET_TENSOR answers the session itself wrote.

A fresh buffer holds whatever its allocator left there (the reference zeroes, malloc does not),
so the differential may not compare answer bytes nobody wrote. It may compare every other byte:
this module walks a case's steps in order and keeps, per buffer (by its index in the case, as
the sentinels name it), the ranges written so far by SET_TENSOR, SET_TENSOR_2D, MEMSET_TENSOR
and BUFFER_CLEAR, and moved by COPY_TENSOR (a copy of never-written bytes is never-written).
What GRAPH_COMPUTE writes counts as never written too: the reference computes with numpy,
ggml-cpu with its own kernels (f16 activations for MUL_MAT), so computed bytes differ by design.
So does the destination of a COPY_TENSOR whose source overlaps it: the real server copies
with memcpy, whose result for overlapping ranges depends on the buffers' alignment (on heap
state: such divergences did not replay on fresh servers); the ASan-instrumented server reports
it as memcpy-param-overlap, a finding of the in-process engine.
A data pointer that is no sentinel base (a mutated field) says nothing about where it reads.
"""

from __future__ import annotations

from ..proto import Cmd, get_dialect
from ..proto import ggml
from ..proto.codec import REQUEST_HEADER_SIZE, unpack_request_payload
from ..proto.errors import ProtocolError
from ..proto.tensor import RpcTensor, nbytes
from .case import BASE, BUFFER_SPACING, HANDLE, RELOC_WINDOW, SENTINEL, Case

_UNBOUNDED = 1 << 62  # BUFFER_CLEAR writes the whole buffer, whatever its size


def _place(value: int, kind: str = BASE) -> tuple[int, int] | None:
    """(buffer index, offset) of a sentinel-relative address, or None."""
    index = (value - SENTINEL[kind] + BUFFER_SPACING // 2) // BUFFER_SPACING
    addend = value - SENTINEL[kind] - index * BUFFER_SPACING
    if index < 0 or abs(addend) >= RELOC_WINDOW:
        return None
    return index, addend


class _Ranges:
    """Sorted, merged half-open ranges."""

    def __init__(self):
        self.spans: list[tuple[int, int]] = []

    def add(self, a: int, b: int) -> None:
        if b <= a:
            return
        keep = []
        for s, e in self.spans:
            if e < a or s > b:
                keep.append((s, e))
            else:
                a, b = min(a, s), max(b, e)
        keep.append((a, b))
        self.spans = sorted(keep)

    def remove(self, a: int, b: int) -> None:
        if b <= a:
            return
        keep = []
        for s, e in self.spans:
            if e <= a or s >= b:
                keep.append((s, e))
                continue
            if s < a:
                keep.append((s, a))
            if e > b:
                keep.append((b, e))
        self.spans = sorted(keep)

    def covered(self, a: int, b: int) -> list[tuple[int, int]]:
        return [(max(a, s), min(b, e)) for s, e in self.spans if s < b and e > a]

    def missing(self, a: int, b: int) -> list[tuple[int, int]]:
        out, pos = [], a
        for s, e in self.covered(a, b):
            if s > pos:
                out.append((pos, s))
            pos = max(pos, e)
        if pos < b:
            out.append((pos, b))
        return out


def _size(t: RpcTensor) -> int | None:
    if not 0 <= t.type < len(ggml.TYPES):
        return None
    return nbytes(t)


def unwritten_ranges(case: Case) -> dict[int, list[tuple[int, int]]]:
    """step index -> the byte ranges of that GET_TENSOR / GET_TENSOR_2D answer (offsets in
    its payload) the session did not write before; a step whose read cannot be placed has
    its whole answer there."""
    dialect = get_dialect(case.dialect)
    written: dict[int, _Ranges] = {}
    out: dict[int, list[tuple[int, int]]] = {}
    last_graph = None

    def buf(i: int) -> _Ranges:
        return written.setdefault(i, _Ranges())

    for at, step in enumerate(case.steps):
        if step.learn is not None and step.learn[0] == HANDLE:
            written[step.learn[1]] = _Ranges()  # a new buffer under this index: unwritten
        msg = _decode(dialect, step)
        if msg is None:
            continue
        cmd = step.cmd
        if cmd in ("SET_TENSOR", "MEMSET_TENSOR"):
            size = len(msg.data) if cmd == "SET_TENSOR" else msg.size
            where = _place(msg.tensor.data + msg.offset)
            if where:
                buf(where[0]).add(where[1], where[1] + size)
        elif cmd == "SET_TENSOR_2D":
            where = _place(msg.tensor.data + msg.offset)
            if where:
                for k in range(min(msg.n_copies, 1 << 16)):
                    buf(where[0]).add(where[1] + k * msg.stride,
                                      where[1] + k * msg.stride + msg.size)
        elif cmd == "BUFFER_CLEAR":
            where = _place(msg.remote_ptr, HANDLE)
            if where:
                buf(where[0]).add(0, _UNBOUNDED)
        elif cmd == "COPY_TENSOR":
            src, dst = _place(msg.src.data), _place(msg.dst.data)
            n = _size(msg.src)
            if src and dst and n is not None:
                if src[0] == dst[0] and src[1] < dst[1] + n and dst[1] < src[1] + n:
                    # overlapping: the real server's memcpy leaves the destination undefined
                    buf(dst[0]).remove(dst[1], dst[1] + n)
                    continue
                moved = [(s - src[1], e - src[1]) for s, e in
                         buf(src[0]).covered(src[1], src[1] + n)]
                buf(dst[0]).remove(dst[1], dst[1] + n)
                for s, e in moved:
                    buf(dst[0]).add(dst[1] + s, dst[1] + e)
        elif cmd in ("GRAPH_COMPUTE", "GRAPH_RECOMPUTE"):
            # what the nodes compute is no longer what the session wrote (numerics differ)
            for t in _graph_nodes(msg, last_graph):
                where, n = _place(t.data), _size(t)
                if where and n is not None:
                    buf(where[0]).remove(where[1], where[1] + n)
            if cmd == "GRAPH_COMPUTE":
                last_graph = msg
        elif cmd in ("GET_TENSOR", "GET_TENSOR_2D"):
            out[at] = _read_gaps(buf, msg, cmd)
    return out


def _graph_nodes(msg, last_graph) -> list[RpcTensor]:
    """The node tensors a GRAPH_COMPUTE (or the GRAPH_RECOMPUTE of the last graph) writes."""
    graph = msg if hasattr(msg, "tensors") else last_graph
    if graph is None:
        return []
    nodes = set(graph.nodes)
    return [t for t in graph.tensors if t.id in nodes]


def _read_gaps(buf, msg, cmd: str) -> list[tuple[int, int]]:
    copies = 1 if cmd == "GET_TENSOR" else min(msg.n_copies, 1 << 16)
    stride = 0 if cmd == "GET_TENSOR" else msg.stride
    where = _place(msg.tensor.data + msg.offset)
    if where is None:
        return [(0, msg.size * copies)]
    gaps = []
    for k in range(copies):
        start = where[1] + k * stride
        gaps += [(k * msg.size + s - start, k * msg.size + e - start)
                 for s, e in buf(where[0]).missing(start, start + msg.size)]
    return gaps


def _decode(dialect, step):
    frame = step.frame
    if len(frame) < REQUEST_HEADER_SIZE or step.cmd not in Cmd.__members__:
        return None
    try:
        return unpack_request_payload(dialect, Cmd[step.cmd], frame[REQUEST_HEADER_SIZE:])
    except (ProtocolError, ValueError, KeyError, IndexError):
        return None  # a mutated frame that does not decode writes nothing we can place
