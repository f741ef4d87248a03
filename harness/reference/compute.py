"""Graph execution with numpy for the ops the reference server supports.

ggml tensors are strided views of buffer memory: ne[] counts elements per dimension (ne[0]
fastest) and nb[] gives byte strides, so a tensor maps onto numpy with shape ne[::-1] and
strides nb[::-1]. Results are written through the destination's own view, exactly where the
CPU backend would write them.

Outcome rules mirror the real CPU backend where it is well defined and stay safe elsewhere:
nodes without the COMPUTE flag are skipped (as the CPU backend does); a supported op whose
shapes ggml would reject is skipped with a warning (the real server computes garbage there);
an op the reference cannot compute raises UnsupportedGraph, which closes the connection.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

from ..proto import ggml
from ..proto.tensor import RpcTensor, element_extent, nbytes
from .errors import ReferencePeerError
from .memory import Buffer

# By name: ids come from the numbering of the dialect the graph was sent in.
NUMPY_TYPES = {"f32": np.float32, "f16": np.float16, "i32": np.int32}
NO_OPS = frozenset({"NONE", "RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE"})
BINARY_OPS = {"ADD": np.add, "SUB": np.subtract, "MUL": np.multiply, "DIV": np.divide}
UNARY_OPS = {"SQR": np.square, "SQRT": np.sqrt}
SUPPORTED_OPS = NO_OPS | set(BINARY_OPS) | set(UNARY_OPS) | {"SCALE", "CPY", "DUP", "CONT",
                                                             "MUL_MAT", "GET_ROWS"}
MAX_ELEMENTS = 1 << 28  # per operand: keeps a hostile graph from making numpy allocate GiBs


def supports_op(op_id: int, numbering: ggml.Numbering = ggml.GGML_7) -> bool:
    return numbering.op_name(op_id) in SUPPORTED_OPS


class UnsupportedGraph(ReferencePeerError):
    """The graph cannot be executed safely; the server closes the connection."""


@dataclass(eq=False)
class ServerTensor:
    rec: RpcTensor
    buffer: Buffer | None
    numbering: ggml.Numbering = ggml.GGML_7
    src: list = field(default_factory=lambda: [None] * ggml.MAX_SRC)
    view_src: "ServerTensor | None" = None

    @property
    def op(self) -> str:
        return self.numbering.op_name(self.rec.op)

    @property
    def type_name(self) -> str:
        """The name of the tensor's type."""
        return self.numbering.types[self.rec.type].name

    @property
    def label(self) -> str:
        name = self.rec.name_str
        return f"0x{self.rec.id:x}" + (f" '{name}'" if name else "")


def tensor_array(t: ServerTensor) -> np.ndarray:
    """A numpy view of the tensor's bytes in its buffer (no copy)."""
    rec = t.rec
    dtype = NUMPY_TYPES.get(t.type_name)
    if dtype is None:
        raise UnsupportedGraph(f"tensor {t.label}: type {t.type_name} is not "
                               "computed by the reference server")
    if t.buffer is None:
        raise UnsupportedGraph(f"tensor {t.label} has no buffer on this server")
    count = rec.ne[0] * rec.ne[1] * rec.ne[2] * rec.ne[3]
    if count > MAX_ELEMENTS:
        raise UnsupportedGraph(f"tensor {t.label} has {count} elements, over the compute bound")
    extent = nbytes(rec)
    if not t.buffer.contains(rec.data, extent):
        raise UnsupportedGraph(f"tensor {t.label} extends outside its buffer")
    # ndarray over the buffer memory itself: writes land where the CPU backend writes
    return np.ndarray(shape=tuple(rec.ne[::-1]), dtype=dtype, buffer=t.buffer.mem,
                      offset=rec.data - t.buffer.base, strides=tuple(rec.nb[::-1]))


def _f32_param(rec: RpcTensor, i: int) -> float:
    return struct.unpack("<f", struct.pack("<i", rec.op_params[i]))[0]


def _can_repeat(small: tuple, big: tuple) -> bool:
    """ggml_can_repeat: every dimension of ``big`` is a multiple of ``small``'s."""
    return all(s != 0 and b % s == 0 for s, b in zip(small, big))


def _repeat_to(arr: np.ndarray, shape: tuple) -> np.ndarray:
    reps = tuple(b // s for s, b in zip(arr.shape, shape))
    return np.tile(arr, reps) if any(r != 1 for r in reps) else arr


def _store(dst: ServerTensor, value: np.ndarray) -> None:
    out = tensor_array(dst)
    out[...] = value.reshape(out.shape).astype(out.dtype, copy=False)


def _src(node: ServerTensor, i: int) -> ServerTensor:
    s = node.src[i]
    if s is None:
        raise UnsupportedGraph(f"node {node.label}: op {node.op} needs src[{i}]")
    return s


def execute(nodes: list[ServerTensor]) -> list[str]:
    """Run the graph's nodes in order. Returns warnings for nodes it skipped."""
    warnings: list[str] = []
    for node in nodes:
        if node is None:
            continue
        rec = node.rec
        if not rec.flags & ggml.FLAG_COMPUTE:
            continue  # the CPU backend only computes nodes that carry the COMPUTE flag
        op = node.op
        if op not in SUPPORTED_OPS:
            raise UnsupportedGraph(f"node {node.label}: op {op} is not supported by the "
                                   "reference server")
        if op in NO_OPS:
            continue
        for t in (node, *(s for s in node.src if s is not None)):
            _require_elements_inside(node, t)
        skipped = _execute_node(node, op)
        if skipped:
            warnings.append(f"node {node.label} ({op}) skipped: {skipped}")
    return warnings


def _require_elements_inside(node: ServerTensor, t: ServerTensor) -> None:
    """A computed node and its sources, before the op's own checks: a node skipped for its
    shapes is still answered with success, and a success answer to elements outside their
    buffer is what the accepted-out-of-bounds oracle flags (harness/fuzz/bounds.py)."""
    n = element_extent(t.rec, t.numbering)  # None: a type the op refuses anyway
    if n and (t.buffer is None or not t.buffer.contains(t.rec.data, n)):
        where = "has no buffer on this server" if t.buffer is None else \
            f"reaches outside its buffer ({n} bytes from 0x{t.rec.data:x})"
        raise UnsupportedGraph(f"node {node.label}: tensor {t.label} {where}")


def _execute_node(node: ServerTensor, op: str) -> str | None:
    dst_ne = node.rec.ne
    if op in BINARY_OPS:
        a, b = _src(node, 0), _src(node, 1)
        if a.rec.ne != dst_ne or not _can_repeat(b.rec.ne, a.rec.ne):
            return "shapes do not broadcast"
        x = tensor_array(a).astype(np.float32)
        y = _repeat_to(tensor_array(b).astype(np.float32), x.shape)
        with np.errstate(all="ignore"):  # x/0 and sqrt(-1) give inf / NaN, as in C
            _store(node, BINARY_OPS[op](x, y))
    elif op in UNARY_OPS:
        a = _src(node, 0)
        if a.rec.ne != dst_ne:
            return "shape differs from its source"
        with np.errstate(all="ignore"):
            _store(node, UNARY_OPS[op](tensor_array(a).astype(np.float32)))
    elif op == "SCALE":
        a = _src(node, 0)
        if a.rec.ne != dst_ne:
            return "shape differs from its source"
        s, bias = _f32_param(node.rec, 0), _f32_param(node.rec, 1)
        _store(node, tensor_array(a).astype(np.float32) * np.float32(s) + np.float32(bias))
    elif op in ("CPY", "DUP", "CONT"):
        a = _src(node, 0)
        x = tensor_array(a)
        if x.size != dst_ne[0] * dst_ne[1] * dst_ne[2] * dst_ne[3]:
            return "element counts differ"
        # ggml copies in logical row-major element order, converting the type
        _store(node, np.ascontiguousarray(x).reshape(-1))
    elif op == "MUL_MAT":
        a, b = _src(node, 0), _src(node, 1)
        ka, m, a2, a3 = a.rec.ne
        kb, n, b2, b3 = b.rec.ne
        if ka != kb or tuple(dst_ne) != (m, n, b2, b3) or b2 % a2 or b3 % a3:
            return "inconsistent shapes"
        x = tensor_array(a).astype(np.float32)  # (a3, a2, m, k)
        y = tensor_array(b)  # (b3, b2, n, k)
        if a.type_name == "f16":
            # the CPU backend converts src1 to src0's dot type (f16) before the dot products
            y = y.astype(np.float16)
        y = y.astype(np.float32)
        x = np.repeat(np.repeat(x, b3 // a3, axis=0), b2 // a2, axis=1)
        _store(node, np.matmul(y, np.swapaxes(x, -1, -2)))  # (b3, b2, n, m)
    elif op == "GET_ROWS":
        a, idx = _src(node, 0), _src(node, 1)
        if idx.type_name != "i32":
            return "row indices are not i32"
        ne00, ne01, ne02, ne03 = a.rec.ne
        n, ne11, ne12, _ = idx.rec.ne
        if tuple(dst_ne[:3]) != (ne00, n, ne11) or ne02 != ne11 or ne03 != ne12:
            return "inconsistent shapes"
        if ne12 != 1:
            return "4-D row gathers are not computed by the reference server"
        rows = tensor_array(idx)[0, 0]  # (ne11, n)
        if rows.size and (rows.min() < 0 or rows.max() >= ne01):
            raise UnsupportedGraph(f"node {node.label}: row index out of range [0, {ne01})")
        src = tensor_array(a).astype(np.float32)[0]  # (ne02, ne01, ne00)
        out = np.stack([src[i2][rows[i2]] for i2 in range(ne02)])  # (ne11, n, ne00)
        _store(node, out)
    return None
