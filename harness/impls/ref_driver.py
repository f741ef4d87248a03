"""ClientDriver for the reference client: ggml-style steps turned into RefClient calls.

Tensors are described the way ggml builds them (ggml_new_tensor, ggml_add, ggml_cpy, ...) and
graphs are serialised the way ggml-rpc's serialize_graph walks them, so for the same steps the
reference client puts the same records on the wire as the C client (pointer values aside).
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass, replace

from ..reference.client import RefClient, ServerClosed, VersionRejected
from ..reference.knobs import Misbehaviour
from ..proto import Cmd, ggml
from ..proto.constants import GRAPH_CACHE_MAX
from ..proto.errors import ProtocolError
from ..proto.tensor import RpcTensor, nbytes
from .driver import (NODE_KINDS, USAGES, ClientAborted, ClientDriver, ExitInfo, StepFailed,
                     StepResult, fingerprint, make_fill)

TYPE_IDS = {t.name: i for i, t in enumerate(ggml.TYPES) if t.blck_size}
ID_BASE = 0x7E00_0000_0000  # synthetic client-side tensor addresses (the C client uses pointers)
ABORT_TEXT = "Remote RPC server crashed or returned malformed response"
# ggml_op_alloc_size_may_expand: ops whose alloc size the client asks the server for
ALLOC_SIZE_MAY_EXPAND = {ggml.OP[n] for n in ("FLASH_ATTN_EXT", "MUL_MAT", "MUL_MAT_ID", "CUMSUM",
                                               "ARGSORT", "TOP_K")}


@dataclass
class _Buffer:
    ptr: int
    size: int
    base: int
    usage: str


def _f32_bits(x: float) -> int:
    return struct.unpack("<i", struct.pack("<f", x))[0]


class RefClientDriver(ClientDriver):
    name = "ref"

    def __init__(self, dialect: str, *, knobs: Misbehaviour | None = None, timeout: float = 60.0,
                 transport_factory=None):
        self.dialect = dialect
        self.knobs = knobs
        self.timeout = timeout
        # (host, port) -> Transport; None means plain TCP (the emulated RDMA cells pass one)
        self.transport_factory = transport_factory
        self.client: RefClient | None = None
        self.buffers: dict[str, _Buffer] = {}
        self.tensors: dict[str, RpcTensor] = {}
        self.usage_of: dict[str, str] = {}  # tensor name -> usage of its buffer
        self._next_id = ID_BASE
        self._device_count = 0
        self._bufts: dict[int, dict] = {}
        self._by_id: dict[int, RpcTensor] = {}
        self._alloc_sizes: dict[tuple, int] = {}
        self._graphs: dict[str, tuple[int, list, list]] = {}  # name -> (uid, nodes, tensors)
        self._next_uid = 0
        self._known_uids: dict[int, list[int]] = {}  # device -> uids the server holds
        self._i = 0
        self._log: list[str] = []
        self.exit_info: ExitInfo | None = None

    # ------------------------------------------------------------ driver protocol
    def run(self, step: dict) -> StepResult:
        op = step.get("op", "")
        res = StepResult(self._i, op, True, t0=time.monotonic())
        self._i += 1
        fn = getattr(self, "_op_" + op, None)
        try:
            if fn is None:
                raise ValueError(f"unknown step {op!r}")
            res.result = fn(**{k: v for k, v in step.items() if k != "op"}) or {}
        except VersionRejected as e:
            self._die(str(e))
            raise ClientAborted(self.exit_info, step) from None
        except (ServerClosed, ProtocolError, OSError) as e:
            self._log.append(f"{op}: {e}")
            self._die(ABORT_TEXT)
            raise ClientAborted(self.exit_info, step) from None
        except (ValueError, KeyError, TypeError) as e:
            res.ok, res.error = False, f"{type(e).__name__}: {e}"
        res.t1 = time.monotonic()
        if not res.ok:
            raise StepFailed(res)
        return res

    def _die(self, message: str) -> None:
        # The C client aborts the process here; the in-process reference ends its session.
        self._log.append(message)
        self.exit_info = ExitInfo(returncode=None, aborted=True, message=message,
                                  log_tail=self._log[-20:])
        if self.client is not None:
            self.client.close()

    def close(self) -> ExitInfo | None:
        if self.client is not None:
            self.client.close()
        return self.exit_info or ExitInfo(returncode=0)

    def log_tail(self, n: int = 20) -> list[str]:
        return self._log[-n:]

    # ------------------------------------------------------------ steps
    def _op_connect(self, endpoint: str, device: int = 0):
        host, _, port = endpoint.partition(":")
        if self.transport_factory is None:
            self.client = RefClient.connect(host, int(port), self.dialect, timeout=self.timeout,
                                            knobs=self.knobs)
        else:
            self.client = RefClient(self.transport_factory(host, int(port)), self.dialect,
                                    knobs=self.knobs)
            if not (self.knobs and self.knobs.skip_hello):
                self.client.hello()
        # ggml_backend_rpc_init registers the server, which asks for its device count once
        self._device_count = self.client.device_count()
        h = self.client.server_hello
        return {"server_version": "%d.%d.%d" % h.version if h else None,
                "server_flags": h.flags if h else None}

    def _op_device_count(self):
        return {"count": self._device_count}  # known since connect, like the C registry

    def _op_buffer_type(self, device: int = 0):
        return self._buffer_type(device)

    def _buffer_type(self, device: int) -> dict:
        """ggml_backend_rpc_buffer_type asks for alignment and max size once per device."""
        if device not in self._bufts:
            self._bufts[device] = {"alignment": self.client.get_alignment(device),
                                   "max_size": self.client.get_max_size(device)}
        return self._bufts[device]

    def _op_device_memory(self, device: int = 0):
        free, total = self.client.get_device_memory(device)
        return {"free": free, "total": total}

    def _op_alloc_buffer(self, name: str, size: int, usage: str = "any", device: int = 0):
        if usage not in USAGES:
            raise ValueError(f"unknown usage {usage!r}")
        self._buffer_type(device)
        ptr, rsize = self.client.alloc_buffer(size, device)
        if ptr == 0:
            raise ValueError(f"server could not allocate {size} bytes")
        base = self.client.buffer_get_base(ptr)
        self.buffers[name] = _Buffer(ptr, rsize, base, usage)
        return {"base": base, "size": rsize}

    def _new_id(self) -> int:
        self._next_id += 0x200
        return self._next_id

    def _place(self, name: str, rec: RpcTensor, buffer: str) -> dict:
        """Register a tensor and make the calls ggml_backend_tensor_alloc makes on an RPC buffer."""
        self.tensors[name] = rec
        self._by_id[rec.id] = rec
        self.usage_of[name] = self.buffers[buffer].usage if buffer in self.buffers else "any"
        padded = ggml.TYPES[rec.type].blck_size > 1 and rec.ne[0] % 512 and not rec.view_src
        size = nbytes(rec)
        if padded or rec.op in ALLOC_SIZE_MAY_EXPAND:
            # asked before the tensor is placed: no buffer or data yet
            size = max(size, self._alloc_size(rec.with_(buffer=0, data=0)))
        if padded:
            self.client.init_tensor(rec)  # the server pads quantised rows (CUDA)
        return {"nbytes": nbytes(rec), "data": rec.data, "alloc_size": size}

    def _alloc_size(self, rec: RpcTensor) -> int:
        """GET_ALLOC_SIZE, cached like the C client: per process, by type, op and shape."""
        key = (rec.type, rec.op, rec.op_params, rec.ne, rec.nb)
        if key not in self._alloc_sizes:
            srcs = [self._by_id.get(i, RpcTensor.null()) if i else RpcTensor.null()
                    for i in rec.src]
            self._alloc_sizes[key] = self.client.get_alloc_size(rec, srcs)
        return self._alloc_sizes[key]

    def _op_tensor(self, name: str, buffer: str, offset: int = 0, type: str = "f32", ne=(1,)):
        b = self.buffers[buffer]
        rec = RpcTensor.make(id=self._new_id(), type=TYPE_IDS[type], ne=tuple(ne), buffer=b.ptr,
                             data=b.base + offset, name=name)
        return self._place(name, rec, buffer)

    def _buffer_of(self, rec: RpcTensor) -> str:
        return next(n for n, b in self.buffers.items() if b.ptr == rec.buffer)

    def _op_view(self, name: str, src: str, ne, offset: int = 0, nb=None):
        s = self.tensors[src]
        k = len(ne)
        ne = tuple(ne) + (1,) * (4 - k)
        if nb is None:
            # ggml_view_kd: element size, the source's strides for the view's own dimensions,
            # packed above them
            strides = [ggml.TYPES[s.type].type_size] + [s.nb[i] for i in range(1, k)]
            for i in range(len(strides), 4):
                strides.append(strides[i - 1] * ne[i - 1])
            nb = tuple(strides)
        root = self._by_id.get(s.view_src) if s.view_src else None
        view_src, view_offs = (root.id, s.view_offs + offset) if root else (s.id, offset)
        rec = RpcTensor.make(id=self._new_id(), type=s.type, ne=ne, nb=tuple(nb),
                             buffer=s.buffer, data=s.data + offset, name=name,
                             op=ggml.OP["VIEW"], op_params=(offset & 0xFFFFFFFF, offset >> 32),
                             src=(s.id,), view_src=view_src, view_offs=view_offs)
        return self._place(name, rec, self._buffer_of(s))

    def _op_set(self, tensor: str, offset: int = 0, size: int | None = None, fill=None):
        rec = self.tensors[tensor]
        size = nbytes(rec) - offset if size is None else size
        data = make_fill(fill or {}, size)
        weights = self.usage_of.get(tensor) == "weights"
        how = self.client.set_tensor(rec, data, offset, weights=weights)
        return {"fnv": fingerprint(data)["fnv"], "how": how}

    def _op_get(self, tensor: str, offset: int = 0, size: int | None = None):
        rec = self.tensors[tensor]
        size = nbytes(rec) - offset if size is None else size
        return fingerprint(self.client.get_tensor(rec, offset, size))

    def _op_node(self, name: str, kind: str, inputs=(), buffer: str | None = None,
                 offset: int = 0, params=None):
        if kind not in NODE_KINDS:
            raise ValueError(f"unknown node kind {kind!r}")
        params = params or {}
        ins = [self.tensors[i] for i in inputs]
        a = ins[0]
        b = ins[1] if len(ins) > 1 else None
        op_params: tuple = ()
        view_src = 0
        if kind in ("add", "mul"):
            typ, ne = a.type, a.ne
        elif kind == "scale":
            typ, ne = a.type, a.ne
            op_params = (_f32_bits(params.get("s", 1.0)), _f32_bits(params.get("b", 0.0)))
        elif kind == "cpy":
            typ, ne = b.type, b.ne
            view_src = b.id
        elif kind == "mul_mat":
            typ, ne = ggml.TYPE_F32, (a.ne[1], b.ne[1], b.ne[2], b.ne[3])
        else:  # get_rows
            typ, ne = ggml.TYPE_F32, (a.ne[0], b.ne[0], b.ne[1], b.ne[2])
        op = ggml.OP[kind.upper()]
        if view_src:
            buf_name, rec = self._buffer_of(b), RpcTensor.make(
                id=self._new_id(), type=typ, ne=ne, nb=b.nb, buffer=b.buffer, data=b.data,
                name=name, op=op, src=tuple(t.id for t in ins), view_src=view_src)
        else:
            buf = self.buffers[buffer]
            buf_name, rec = buffer, RpcTensor.make(
                id=self._new_id(), type=typ, ne=ne, buffer=buf.ptr, data=buf.base + offset,
                name=name, op=op, op_params=op_params, src=tuple(t.id for t in ins))
        return self._place(name, rec, buf_name)

    def _op_compute(self, outputs=(), graph: str | None = None, device: int = 0):
        if graph is not None and graph in self._graphs:
            uid, node_ids, tensors = self._graphs[graph]
        else:
            nodes, tensors = serialize_graph([self.tensors[o] for o in outputs],
                                             {t.id: t for t in self.tensors.values()})
            # ggml_build_forward_expand sets the COMPUTE flag on the tensors themselves, so
            # later requests about them carry it too
            flagged = {n.id: n for n in nodes}
            for name, rec in list(self.tensors.items()):
                if rec.id in flagged:
                    self.tensors[name] = self._by_id[rec.id] = rec.with_(flags=flagged[rec.id].flags)
            node_ids = [n.id for n in nodes]
            uid = 0  # a graph made fresh for one compute has uid 0, as ggml_new_graph gives
            if graph is not None:  # a kept graph gets a uid, as the C client's counter gives
                self._next_uid += 1
                uid = self._next_uid
                self._graphs[graph] = (uid, node_ids, tensors)
        if self._server_has_graph(device, uid):
            self.client.graph_recompute(device, uid)
        else:
            self.client.graph_compute(node_ids, tensors, device=device, uid=uid)
        return {"status": 0, "uid": uid}

    def _server_has_graph(self, device: int, uid: int) -> bool:
        """The C client's reuse rule: 7.x remembers the last uid per device; 8.0.0 keeps up
        to GRAPH_CACHE_MAX uids per device and clears them all when full (spec 6.3, 12.2)."""
        known = self._known_uids.setdefault(device, [])
        if not self.client.dialect.graph_uid:
            hit = uid != 0 and known == [uid]
            known[:] = [uid]  # a uid-0 graph resets the last uid too
            return hit
        if not uid:
            return False
        if uid in known:
            return True
        if len(known) >= GRAPH_CACHE_MAX:
            known.clear()
        known.append(uid)
        return False

    def _op_forget_graph(self, graph: str):
        return {"uid": self._graphs.pop(graph)[0]}

    def _rows_2d(self, rec: RpcTensor, offset: int, size: int, n_copies: int, stride: int):
        if min(offset, size, n_copies, stride) < 0 or (
                n_copies and offset + (n_copies - 1) * stride + size > nbytes(rec)):
            raise ValueError("2D span outside the tensor")
        return [offset + i * stride for i in range(n_copies)]

    def _op_set_2d(self, tensor: str, size: int, n_copies: int, stride: int, offset: int = 0,
                   fill=None):
        rec = self.tensors[tensor]
        rows = self._rows_2d(rec, offset, size, n_copies, stride)
        data = make_fill(fill or {}, size * n_copies)
        weights = self.usage_of.get(tensor) == "weights"
        if self.client.dialect.has(Cmd.SET_TENSOR_2D) and n_copies > 1:
            self.client.set_tensor_2d(rec, data, offset, size, n_copies, stride)
        else:  # one copy is a plain upload (hashed like one); < 8.0.0: row by row
            for i, row in enumerate(rows):
                self.client.set_tensor(rec, data[i * size:(i + 1) * size], row, weights=weights)
        return {"fnv": fingerprint(data)["fnv"]}

    def _op_get_2d(self, tensor: str, size: int, n_copies: int, stride: int, offset: int = 0):
        rec = self.tensors[tensor]
        rows = self._rows_2d(rec, offset, size, n_copies, stride)
        if self.client.dialect.has(Cmd.GET_TENSOR_2D) and n_copies > 1:
            return fingerprint(self.client.get_tensor_2d(rec, offset, size, n_copies, stride))
        return fingerprint(b"".join(bytes(self.client.get_tensor(rec, row, size)) for row in rows))

    def _op_copy(self, src: str, dst: str):
        return {"ok": self.client.copy_tensor(self.tensors[src], self.tensors[dst])}

    def _op_memset(self, tensor: str, offset: int = 0, size: int | None = None, value: int = 0):
        rec = self.tensors[tensor]
        size = nbytes(rec) - offset if size is None else size
        self.client.memset_tensor(rec, offset, size, value)
        return {}

    def _op_clear(self, buffer: str, value: int = 0):
        self.client.buffer_clear(self.buffers[buffer].ptr, value)
        return {}

    def _op_free_buffer(self, buffer: str):
        self.client.free_buffer(self.buffers.pop(buffer).ptr)
        return {}

    def _op_close(self):
        if self.client is not None:
            self.client.close()
        return {}


def serialize_graph(outputs: list[RpcTensor], by_id: dict[int, RpcTensor]):
    """ggml_build_forward_expand + ggml-rpc serialize_graph, on records.

    Nodes are the non-leaf tensors in post-order of a depth-first walk over src[0..9]; every
    node gets the COMPUTE flag; ``use_count`` counts uses as a source. The tensor list is the
    walk serialize_graph makes per node: sources, then view_src, then the tensor itself.
    """
    order: list[int] = []
    seen: set[int] = set()
    use: dict[int, int] = {}

    def visit(tid: int) -> None:
        stack = [(tid, 0)]
        while stack:
            cur, i = stack.pop()
            rec = by_id[cur]
            if i == 0:
                if cur in seen:
                    continue
                seen.add(cur)
                use.setdefault(cur, 0)
            srcs = [s for s in rec.src if s]
            if i < len(srcs):
                stack.append((cur, i + 1))
                use[srcs[i]] = use.get(srcs[i], 0) + 1
                if srcs[i] not in seen:
                    stack.append((srcs[i], 0))
                continue
            order.append(cur)

    for out in outputs:
        visit(out.id)
    node_ids = [t for t in order if by_id[t].op != 0]
    records = {t: replace(by_id[t], flags=by_id[t].flags | (ggml.FLAG_COMPUTE
                                                              if by_id[t].op != 0 else 0))
               for t in order}

    tensors: list[RpcTensor] = []
    added: set[int] = set()

    def add(tid: int) -> None:
        if not tid or tid in added:
            return
        added.add(tid)
        rec = records.get(tid) or by_id[tid]
        for s in rec.src:
            add(s)
        add(rec.view_src)
        tensors.append(replace(rec, use_count=use.get(tid, 0)))

    for nid in node_ids:
        add(nid)
    return [records[n] for n in node_ids], tensors
