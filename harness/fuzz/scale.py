"""Scale classes: graphs at the size a request may reach, not at the reference's bound.

The boundary sweep's graphs stop at the reference server's own bound (65,536 tensors); a real
server has none: it recurses once per link of a chain while it builds the graph
(``create_node``), sizes its context by the node and tensor counts, and computes every node id
it is given. Here, up to :data:`SCALE_FRAME_LIMIT` bytes per request:

* a **chain** as long as the limit allows (each tensor the source of the next), and one just
  past twice the reference's bound;
* a **fan-in** (a binary tree of sums) as wide as the limit allows;
* **node ids**: millions of ids over a handful of tensors (a context sized by the node count,
  an ADD computed that many times).

What judges them are the live oracles for a stack (a crash in the recursion), memory (the
amplification and RSS bounds) and time (hang, spin). Frames are packed with numpy: a
200,000-tensor graph is 60 MB, too many for a record per tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from ..proto import Cmd, ggml
from ..proto.dialects import Dialect
from ..proto.tensor import TENSOR_FIELD_OFFSETS, TENSOR_SIZE
from ..proto.wire import REQUEST_HEADER_SIZE, request_header
from .case import Case, annotate, step
from ..strategies.basics import BufferRegion

SCALE_FRAME_LIMIT = 64 << 20  # the largest request a deterministic case sends
REFERENCE_BOUND = 1 << 16  # the reference server's graph bound (ServerConfig)

_FIELDS = {"id": ("<u8", None), "type": ("<u4", None), "buffer": ("<u8", None),
           "ne": ("<u4", (4,)), "nb": ("<u4", (4,)), "op": ("<u4", None),
           "src": ("<u8", (10,)), "data": ("<u8", None)}
TENSOR_DTYPE = np.dtype({
    "names": list(_FIELDS),
    "formats": [(f, s) if s else f for f, s in _FIELDS.values()],
    "offsets": [TENSOR_FIELD_OFFSETS[n] for n in _FIELDS],
    "itemsize": TENSOR_SIZE,
})


def _graph_frame(d: Dialect, nodes: np.ndarray, tensors: np.ndarray, uid: int = 1) -> bytes:
    """A GRAPH_COMPUTE frame: device 0, [uid], the node ids, the tensor records."""
    head = np.array([0], "<u4").tobytes()
    if d.graph_uid:
        head += np.array([uid], "<u8").tobytes()
    payload = b"".join((head, np.array([len(nodes)], "<u4").tobytes(),
                        nodes.astype("<u8").tobytes(),
                        np.array([len(tensors)], "<u4").tobytes(), tensors.tobytes()))
    return request_header(d.id_of(Cmd.GRAPH_COMPUTE), len(payload)) + payload


def _tensors(n: int, r: BufferRegion, numbering) -> np.ndarray:
    """``n`` f32 records of 16 elements, ids 1..n, all at the buffer's base (a node
    overwrites what it reads: the values do not matter, the addresses stay in bounds)."""
    t = np.zeros(n, TENSOR_DTYPE)
    t["id"] = np.arange(1, n + 1)
    t["type"] = ggml.TYPE_F32
    t["buffer"] = r.handle
    t["ne"] = (16, 1, 1, 1)
    t["nb"] = (4, 64, 64, 64)
    t["data"] = r.base
    return t


def _graph_bytes(d: Dialect, n_nodes: int, n_tensors: int) -> int:
    return REQUEST_HEADER_SIZE + 4 + (8 if d.graph_uid else 0) + 4 + 8 * n_nodes + 4 + TENSOR_SIZE * n_tensors


def chain(d: Dialect, r: BufferRegion, n: int) -> bytes:
    """Tensor i + 1 = tensor i + tensor i: building node n recurses n deep."""
    t = _tensors(n, r, d.numbering)
    t["op"][1:] = d.numbering.op["ADD"]
    t["src"][1:, 0] = t["id"][:-1]
    t["src"][1:, 1] = t["id"][:-1]
    return _graph_frame(d, np.array([n]), t)


def fanin(d: Dialect, r: BufferRegion, leaves: int) -> bytes:
    """A binary tree of sums over ``leaves`` leaves (2 * leaves - 1 tensors)."""
    total = 2 * leaves - 1
    t = _tensors(total, r, d.numbering)
    inner = np.arange(leaves, total)  # records of the sums, level by level
    t["op"][inner] = d.numbering.op["ADD"]
    # sum k (k = 0 ..) adds the two records 2k and 2k + 1 of the array before it
    t["src"][inner, 0] = t["id"][2 * (inner - leaves)]
    t["src"][inner, 1] = t["id"][2 * (inner - leaves) + 1]
    return _graph_frame(d, t["id"][inner], t)


def node_ids(d: Dialect, r: BufferRegion, n_nodes: int) -> bytes:
    """``n_nodes`` ids over three tensors: the same ADD, that many times."""
    t = _tensors(3, r, d.numbering)
    t["op"][2] = d.numbering.op["ADD"]
    t["src"][2, :2] = (1, 2)
    return _graph_frame(d, np.full(n_nodes, 3), t)


def _largest(d: Dialect, per: int, fixed: int = 0) -> int:
    return (SCALE_FRAME_LIMIT - _graph_bytes(d, 0, 0) - fixed) // per


def plan(d: Dialect, r: BufferRegion) -> list[tuple[str, int, Callable[[], bytes]]]:
    """(case, frame bytes, build) of every scale case."""
    longest = _largest(d, TENSOR_SIZE, 8)
    widest = 1 << (_largest(d, 2 * TENSOR_SIZE + 8).bit_length() - 1)
    most_ids = _largest(d, 8, 3 * TENSOR_SIZE)
    out = [
        ("chain_2^17", 1 << 17, lambda: chain(d, r, 1 << 17)),
        (f"chain_{longest}", longest, lambda: chain(d, r, longest)),
        (f"fanin_{widest}_leaves", widest, lambda: fanin(d, r, widest)),
        ("node_ids_2^20", 1 << 20, lambda: node_ids(d, r, 1 << 20)),
        (f"node_ids_{most_ids}", most_ids, lambda: node_ids(d, r, most_ids)),
    ]
    return out


def cases(d: Dialect, head: list, region: BufferRegion, probe,
          keep: Callable[[int], bool] | None = None) -> Iterator[tuple[str, Case] | None]:
    """The scale sessions after the sweep's set-up (``head``, whose first buffer is
    ``region``), each built when reached (``keep(j)`` False: None, not built). Annotated
    without decoding the graph (no answer is due for it; decoding 200,000 records to learn
    that costs seconds)."""
    plain_head = annotate(d, tuple(head))  # the set-up's expected answers
    for j, (label, _, build) in enumerate(plan(d, region)):
        if keep is not None and not keep(j):
            yield None
            continue
        desc = {"kind": "field", "what": "scale_class", "cmd": Cmd.GRAPH_COMPUTE.value,
                "cmd_id": d.id_of(Cmd.GRAPH_COMPUTE), "field": "tensors", "dialect": d.name,
                "direction": "request", "at": "after_setup", "case": label}
        frame = build()
        # the probe after a HELLO (decoded alone it would count as a connection without one,
        # and expect no answer: the client would hang up before the server writes it)
        steps = plain_head.steps + (step(frame, Cmd.GRAPH_COMPUTE.value, desc=desc),
                                    annotate(d, (probe,), hello_seen=True).steps[0])
        yield label, Case(d.name, steps, meta={"mutations": [desc], "sweep": True})

