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

from bisect import bisect_left, bisect_right

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
    """Sorted, merged half-open ranges, found by bisection: a SET_TENSOR_2D of 65,536 copies
    is 65,536 ranges, which a linear merge per range made minutes of work."""

    def __init__(self):
        self.starts: list[int] = []
        self.ends: list[int] = []

    @property
    def spans(self) -> list[tuple[int, int]]:
        return list(zip(self.starts, self.ends))

    def add(self, a: int, b: int) -> None:
        if b <= a:
            return
        i = bisect_left(self.ends, a)  # the first range ending at or after a (touching merges)
        j = bisect_right(self.starts, b)  # past the last range starting at or before b
        if i < j:
            a, b = min(a, self.starts[i]), max(b, self.ends[j - 1])
        self.starts[i:j], self.ends[i:j] = [a], [b]

    def remove(self, a: int, b: int) -> None:
        if b <= a:
            return
        i = bisect_right(self.ends, a)  # the first range ending after a
        j = bisect_left(self.starts, b)  # past the last range starting before b
        if i >= j:
            return
        starts, ends = [], []
        if self.starts[i] < a:
            starts.append(self.starts[i])
            ends.append(a)
        if self.ends[j - 1] > b:
            starts.append(b)
            ends.append(self.ends[j - 1])
        self.starts[i:j], self.ends[i:j] = starts, ends

    def covered(self, a: int, b: int) -> list[tuple[int, int]]:
        i, j = bisect_right(self.ends, a), bisect_left(self.starts, b)
        return [(max(a, self.starts[k]), min(b, self.ends[k])) for k in range(i, j)]

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
    """nbytes of a tensor, or None for a type without a size (outside the enum, removed)."""
    if not 0 <= t.type < len(ggml.TYPES) or ggml.TYPES[t.type].blck_size <= 0:
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
        try:
            last_graph = _apply(step.cmd, msg, buf, out, at, last_graph)
        except (ArithmeticError, ValueError, IndexError):
            continue  # a step whose fields cannot be placed writes nothing we can name
    return out


def _apply(cmd: str, msg, buf, out: dict, at: int, last_graph):
    """One step's effect on what is written; returns the last graph computed."""
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
                return last_graph
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
    return last_graph


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
