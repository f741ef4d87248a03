"""Step executor over a real llama.cpp build's client library (libggml-rpc.so), via ctypes.

usage: python -m harness.impls.ctypes_agent --lib-dir DIR [--proto X.Y.Z]

Reads one JSON step per line on stdin (the vocabulary of ``harness.impls.driver``), runs it
with the real C API and writes one JSON event per line on stdout. Each ggml call maps to the
RPC commands the real client sends, so the wire trace of a session is the library's own.

The library aborts the process on protocol errors (version mismatch, malformed response,
lost server): exit by SIGABRT with the reason on stderr. That is behaviour under test, left
for the parent (``real_client.CtypesClientDriver``) to classify; run with
GGML_NO_BACKTRACE=1 so ggml does not attach gdb first. Steps that would trip one of the
library's *client-side* asserts (bounds, layouts, unknown names) are refused here with
``ok: false`` instead, unless the step says ``"unchecked": true``.

Events: {"i", "op", "ok", "result", "error", "t0", "t1"}. Before the first step the agent
sends {"i": -1, "op": "ready", ...} with what it loaded.
"""

from __future__ import annotations

import argparse
import ctypes as C
import json
import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from .driver import USAGES, fingerprint, make_fill
from .errors import ImplError
from ..proto.fnv import fnv1a64
from ..proto.constants import Cmd
from ..proto.dialects import first_with
from ..proto.ggml import GGML_7, TYPES

vp, sz, i64 = C.c_void_p, C.c_size_t, C.c_int64

MAX_TENSORS = 8192  # objects in the agent's no_alloc ggml context
GRAPH_MIN_SIZE = 2048  # GGML_DEFAULT_GRAPH_SIZE
# MEMSET_TENSOR's first proto (5): older RPC buffers leave the interface slot NULL
MEMSET_PROTO_MAJOR = first_with(Cmd.MEMSET_TENSOR, primary_only=False).version[0]
IFACE_MEMSET_SLOT = 3  # ggml_backend_buffer_i: free_buffer, get_base, init_tensor, memset_tensor
TYPES_IN_ALL_VERSIONS = 39  # GGML_TYPE_COUNT from late 2024 on; every supported library has these
# the proto whose type enum harness.proto.ggml.TYPES is
TYPES_TABLE_PROTO = tuple(int(x) for x in GGML_7.name.split("."))
# struct ggml_cgraph (ggml-impl.h, 7.0.0 tree): size, n_nodes, n_leafs, five pointers, a hash
# set of three words, the eval order, then the uid the RPC client compares to reuse a graph.
# Private, so the agent checks the head it can see (size, n_nodes) before writing the uid; the
# wire then shows whether the library read it (tests compare the uid sent with this one).
CGRAPH_SIZE_OFFSET, CGRAPH_N_NODES_OFFSET, CGRAPH_UID_OFFSET = 0, 4, 88


class ggml_init_params(C.Structure):
    _fields_ = [("mem_size", sz), ("mem_buffer", vp), ("no_alloc", C.c_bool)]


class TensorHead(C.Structure):
    """The leading fields of struct ggml_tensor, unchanged from proto 3 to 8."""

    _fields_ = [("type", C.c_int), ("buffer", vp), ("ne", i64 * 4), ("nb", sz * 4)]


class StepError(ImplError):
    """A step the agent refuses (bad arguments, or it would trip a library assert)."""


@dataclass
class AgentBuffer:
    name: str
    ptr: int
    base: int
    size: int
    usage: str
    alive: bool = True


@dataclass
class Tensor:
    name: str
    ptr: int
    buffer: AgentBuffer | None  # where its bytes live (a view's or cpy's: its source's)
    deps: list[str] = field(default_factory=list)  # tensors it is computed or viewed from


class Lib:
    """ctypes bindings, looked up across the loaded libraries (symbols moved between them)."""

    SIGNATURES = {
        "ggml_init": (vp, ggml_init_params),
        "ggml_free": (None, vp),
        "ggml_tensor_overhead": (sz,),
        "ggml_graph_overhead_custom": (sz, sz, C.c_bool),
        "ggml_new_graph_custom": (vp, vp, sz, C.c_bool),
        "ggml_build_forward_expand": (None, vp, vp),
        "ggml_new_tensor": (vp, vp, C.c_int, C.c_int, C.POINTER(i64)),
        "ggml_set_name": (vp, vp, C.c_char_p),
        "ggml_nbytes": (sz, vp),
        "ggml_get_data": (vp, vp),
        "ggml_type_name": (C.c_char_p, C.c_int),
        "ggml_type_size": (sz, C.c_int),
        "ggml_blck_size": (i64, C.c_int),
        "ggml_view_4d": (vp, vp, vp, i64, i64, i64, i64, sz, sz, sz, sz),
        "ggml_add": (vp, vp, vp, vp),
        "ggml_mul": (vp, vp, vp, vp),
        "ggml_cpy": (vp, vp, vp, vp),
        "ggml_mul_mat": (vp, vp, vp, vp),
        "ggml_get_rows": (vp, vp, vp, vp),
        "ggml_scale": (vp, vp, vp, C.c_float),
        "ggml_backend_view_init": (C.c_int, vp),
        "ggml_backend_tensor_alloc": (C.c_int, vp, vp, vp),
        "ggml_backend_tensor_set": (None, vp, vp, sz, sz),
        "ggml_backend_tensor_get": (None, vp, vp, sz, sz),
        "ggml_backend_tensor_memset": (None, vp, C.c_uint8, sz, sz),
        "ggml_backend_tensor_copy": (None, vp, vp),
        "ggml_backend_buffer_clear": (None, vp, C.c_uint8),
        "ggml_backend_buffer_free": (None, vp),
        "ggml_backend_buffer_set_usage": (None, vp, C.c_int),
        "ggml_backend_buffer_get_base": (vp, vp),
        "ggml_backend_buffer_get_size": (sz, vp),
        "ggml_backend_buffer_get_alloc_size": (sz, vp, vp),
        "ggml_backend_alloc_buffer": (vp, vp, sz),
        "ggml_backend_buft_alloc_buffer": (vp, vp, sz),
        "ggml_backend_buft_get_alignment": (sz, vp),
        "ggml_backend_buft_get_max_size": (sz, vp),
        "ggml_backend_graph_compute": (C.c_int, vp, vp),
        "ggml_graph_n_nodes": (C.c_int, vp),
        "ggml_graph_next_uid": (C.c_uint64,),
        "ggml_backend_tensor_set_2d": (None, vp, vp, sz, sz, sz, sz, sz),
        "ggml_backend_tensor_get_2d": (None, vp, vp, sz, sz, sz, sz, sz),
        "ggml_backend_free": (None, vp),
        "ggml_backend_reg_dev_count": (sz, vp),
        "ggml_backend_rpc_init": (vp, C.c_char_p, C.c_uint32),
        "ggml_backend_rpc_buffer_type": (vp, C.c_char_p, C.c_uint32),
        "ggml_backend_rpc_get_device_memory": (None, C.c_char_p, C.c_uint32, C.POINTER(sz),
                                               C.POINTER(sz)),
        "ggml_backend_rpc_add_server": (vp, C.c_char_p),
    }
    # Symbols only some versions have: add_server (>= 3.0), 2D transfers and the exported uid
    # counter (8.0.0).
    OPTIONAL = {"ggml_backend_rpc_add_server", "ggml_graph_next_uid",
                "ggml_backend_tensor_set_2d", "ggml_backend_tensor_get_2d"}

    def __init__(self, lib_dir: str):
        self.lib_dir = lib_dir
        self.loaded: list[str] = []
        libs = []
        # Dependencies first; RTLD_GLOBAL so they resolve each other, RUNPATH finds the rest.
        for name, required in (("libggml-base.so", True), ("libggml-cpu.so", False),
                               ("libggml.so", True), ("libggml-rpc.so", True)):
            lib = self._load(name, required)
            if lib is not None:
                libs.append(lib)
        self.missing: list[str] = []
        for sym, (res, *args) in self.SIGNATURES.items():
            fn = None
            for lib in reversed(libs):
                try:
                    fn = getattr(lib, sym)
                    break
                except AttributeError:
                    continue
            if fn is None:
                if sym not in self.OPTIONAL:
                    raise RuntimeError(f"symbol {sym} not found in {lib_dir}")
                self.missing.append(sym)
                setattr(self, sym, None)
                continue
            fn.restype, fn.argtypes = res, list(args)
            setattr(self, sym, fn)

    def _load(self, name: str, required: bool):
        for cand in (name, name + ".0"):
            path = os.path.join(self.lib_dir, cand)
            if os.path.exists(path):
                self.loaded.append(cand)
                return C.CDLL(path, mode=C.RTLD_GLOBAL)
        if required:
            raise FileNotFoundError(f"{name} not found in {self.lib_dir}")
        return None


def _parse_proto(s: str | None) -> tuple[int, int, int] | None:
    if not s:
        return None
    parts = [int(p) for p in s.split(".")]
    return tuple((parts + [0, 0, 0])[:3])


def _ne4(ne) -> list[int]:
    ne = [int(x) for x in ne]
    if not 1 <= len(ne) <= 4 or any(x < 0 for x in ne):
        raise StepError(f"ne must be 1 to 4 non-negative sizes, got {ne}")
    return ne + [1] * (4 - len(ne))


class Agent:
    def __init__(self, lib: Lib, proto: tuple[int, int, int] | None):
        self.lib = lib
        self.proto = proto
        self.types = self._type_table()
        self.ctx = lib.ggml_init(ggml_init_params(lib.ggml_tensor_overhead() * MAX_TENSORS,
                                                  None, True))
        self.n_objects = 0
        self.endpoint: str | None = None
        self.device = 0
        self.backends: dict[tuple[str, int], int] = {}
        self.dev_counts: dict[str, int] = {}
        self.buffers: dict[str, AgentBuffer] = {}
        self.tensors: dict[str, Tensor] = {}
        self.graphs: dict[str, tuple[int, int, int]] = {}  # name -> (ggml ctx, cgraph, uid)
        self.next_uid = 1  # where the library does not export its uid counter
        self.unchecked = False

    # -- helpers ---------------------------------------------------------------------------

    def _type_table(self) -> dict[str, int]:
        """Type names usable with this library.

        Ids are positional and never renumbered, so the harness's table applies to older
        libraries as far as they go. ggml_type_name does not bound-check, so the library is
        only asked about ids every supported version has; newer ones need a known proto.
        """
        table = {}
        for tid, traits in enumerate(TYPES):
            if traits.blck_size == 0:
                continue
            if tid < TYPES_IN_ALL_VERSIONS:
                if (self.lib.ggml_type_name(tid) or b"").decode().lower() != traits.name.lower():
                    continue
            elif self.proto is None or self.proto < TYPES_TABLE_PROTO:
                continue
            table[traits.name.lower()] = tid
        return table

    def check(self, cond: bool, msg: str) -> None:
        if not cond and not self.unchecked:
            raise StepError(msg)

    def type_id(self, t) -> int:
        if isinstance(t, int):
            self.check(t in self.types.values(), f"unknown ggml type id {t}")
            return t
        tid = self.types.get(str(t).lower())
        if tid is None:
            raise StepError(f"unknown ggml type {t!r}")
        return tid

    def head(self, ptr: int) -> TensorHead:
        return TensorHead.from_address(ptr)

    def shape(self, ptr: int) -> tuple[int, list[int], list[int]]:
        h = self.head(ptr)
        return h.type, list(h.ne), list(h.nb)

    def tensor(self, name) -> Tensor:
        t = self.tensors.get(name)
        if t is None:
            raise StepError(f"unknown tensor {name!r}")
        if t.buffer is not None and not t.buffer.alive:
            self.check(False, f"tensor {name!r} lives in freed buffer {t.buffer.name!r}")
        return t

    def buffer(self, name) -> AgentBuffer:
        b = self.buffers.get(name)
        if b is None:
            raise StepError(f"unknown buffer {name!r}")
        self.check(b.alive, f"buffer {name!r} was freed")
        return b

    def new_name(self, name) -> str:
        if not isinstance(name, str) or not name:
            raise StepError("name must be a non-empty string")
        if name in self.tensors:
            raise StepError(f"tensor {name!r} already exists")
        return name

    def room(self, n: int = 1) -> None:
        # Running out of context memory is a GGML_ABORT, never worth triggering.
        if self.n_objects + n > MAX_TENSORS:
            raise StepError(f"agent context full ({MAX_TENSORS} tensors)")
        self.n_objects += n

    def target(self, step) -> tuple[str, int]:
        ep = step.get("endpoint", self.endpoint)
        if not ep:
            raise StepError("not connected (no endpoint)")
        return str(ep), int(step.get("device", self.device if ep == self.endpoint else 0))

    def backend(self, step) -> int:
        key = self.target(step)
        be = self.backends.get(key)
        if not be:
            raise StepError(f"no backend for {key[0]} device {key[1]} (connect first)")
        return be

    def check_device(self, ep: str, device: int) -> None:
        count = self.dev_counts.get(ep)
        if count is not None:
            self.check(0 <= device < count, f"device {device} out of range ({count} devices)")

    def place(self, ptr: int, buf: AgentBuffer, offset: int) -> int:
        """ggml_backend_tensor_alloc at base+offset, refusing what its asserts would reject."""
        L = self.lib
        self.check(offset >= 0, "offset must be >= 0")
        nbytes = L.ggml_nbytes(ptr)
        self.check(offset + nbytes <= buf.size,
                   f"offset {offset} + nbytes {nbytes} > buffer size {buf.size}")
        # The library checks its alloc size (possibly asked of the server, cached after); ask
        # first so an oversized answer is a refusal here and not an assert in tensor_alloc.
        alloc = L.ggml_backend_buffer_get_alloc_size(buf.ptr, ptr)
        self.check(offset + alloc <= buf.size,
                   f"offset {offset} + alloc size {alloc} > buffer size {buf.size}")
        st = L.ggml_backend_tensor_alloc(buf.ptr, ptr, C.c_void_p(buf.base + offset))
        if st != 0:
            raise StepError(f"ggml_backend_tensor_alloc returned status {st}")
        return alloc

    def region(self, t: Tensor, step) -> tuple[int, int, int]:
        nbytes = self.lib.ggml_nbytes(t.ptr)
        offset = int(step.get("offset", 0))
        size = step.get("size")
        size = nbytes - offset if size is None else int(size)
        self.check(offset >= 0 and size >= 0 and offset + size <= nbytes,
                   f"offset {offset} + size {size} outside tensor of {nbytes} bytes")
        return nbytes, offset, size

    def memset_supported(self, buf: AgentBuffer) -> bool:
        if self.proto is not None and self.proto[0] < MEMSET_PROTO_MAJOR:
            return False
        # The same NULL test ggml_backend_tensor_memset asserts on.
        slot = C.c_void_p.from_address(buf.ptr + IFACE_MEMSET_SLOT * C.sizeof(C.c_void_p))
        return bool(slot.value)

    # -- steps -----------------------------------------------------------------------------

    def op_connect(self, s):
        ep = str(s["endpoint"])
        device = int(s.get("device", 0))
        L = self.lib
        if device != 0 and ep not in self.dev_counts and L.ggml_backend_rpc_add_server is not None:
            # rpc_init asserts on a device index beyond the server's count. Learning the count
            # first costs a connection of its own (the client drops an unused connection at
            # once), as llama's --rpc path does; device 0 always exists, so it skips this.
            reg = L.ggml_backend_rpc_add_server(ep.encode())
            if not reg:
                raise StepError(f"ggml_backend_rpc_add_server({ep}) returned NULL")
            self.dev_counts[ep] = L.ggml_backend_reg_dev_count(reg)
            self.check_device(ep, device)
        be = L.ggml_backend_rpc_init(ep.encode(), device)
        if not be:
            raise StepError(f"ggml_backend_rpc_init({ep}, {device}) returned NULL")
        self.backends[(ep, device)] = be
        if self.endpoint is None:
            self.endpoint, self.device = ep, device
        return {}

    def op_device_count(self, s):
        ep, _ = self.target(s)
        if self.lib.ggml_backend_rpc_add_server is None:
            raise StepError("ggml_backend_rpc_add_server: unsupported by this client library")
        reg = self.lib.ggml_backend_rpc_add_server(ep.encode())
        if not reg:
            raise StepError(f"ggml_backend_rpc_add_server({ep}) returned NULL")
        count = self.lib.ggml_backend_reg_dev_count(reg)
        self.dev_counts[ep] = count
        return {"count": count}

    def op_buffer_type(self, s):
        ep, device = self.target(s)
        self.check_device(ep, device)
        buft = self.lib.ggml_backend_rpc_buffer_type(ep.encode(), device)
        if not buft:
            raise StepError("ggml_backend_rpc_buffer_type returned NULL")
        return {"alignment": self.lib.ggml_backend_buft_get_alignment(buft),
                "max_size": self.lib.ggml_backend_buft_get_max_size(buft)}

    def op_device_memory(self, s):
        ep, device = self.target(s)
        self.check_device(ep, device)
        free, total = sz(), sz()
        self.lib.ggml_backend_rpc_get_device_memory(ep.encode(), device, C.byref(free),
                                                    C.byref(total))
        return {"free": free.value, "total": total.value}

    def op_alloc_buffer(self, s):
        name = s["name"]
        if name in self.buffers and self.buffers[name].alive:
            raise StepError(f"buffer {name!r} already exists")
        size = int(s["size"])
        self.check(size >= 0, "size must be >= 0")
        usage = s.get("usage", "any")
        if usage not in USAGES:
            raise StepError(f"usage must be one of {sorted(USAGES)}")
        L = self.lib
        if "device" in s or "endpoint" in s:
            ep, device = self.target(s)
            self.check_device(ep, device)
            buft = L.ggml_backend_rpc_buffer_type(ep.encode(), device)
            ptr = L.ggml_backend_buft_alloc_buffer(buft, size)
        else:
            ptr = L.ggml_backend_alloc_buffer(self.backend(s), size)
        if not ptr:
            raise StepError(f"allocation of {size} bytes failed (NULL buffer)")
        # Local only, but WEIGHTS is what turns on the client's SET_TENSOR_HASH path.
        L.ggml_backend_buffer_set_usage(ptr, USAGES[usage])
        base = L.ggml_backend_buffer_get_base(ptr) or 0
        real = L.ggml_backend_buffer_get_size(ptr)
        self.buffers[name] = AgentBuffer(name, ptr, base, real, usage)
        return {"base": base, "size": real}

    def op_tensor(self, s):
        name = self.new_name(s["name"])
        buf = self.buffer(s["buffer"])
        tid = self.type_id(s.get("type", "f32"))
        ne = _ne4(s["ne"])
        blck = self.lib.ggml_blck_size(tid)
        self.check(ne[0] % blck == 0, f"ne[0]={ne[0]} is not a multiple of the block size {blck}")
        self.room()
        arr = (i64 * 4)(*ne)
        ptr = self.lib.ggml_new_tensor(self.ctx, tid, len(s["ne"]), arr)
        self.lib.ggml_set_name(ptr, name.encode())
        alloc = self.place(ptr, buf, int(s.get("offset", 0)))
        self.tensors[name] = Tensor(name, ptr, buf)
        return {"nbytes": self.lib.ggml_nbytes(ptr), "data": self.lib.ggml_get_data(ptr) or 0,
                "alloc_size": alloc}

    def op_view(self, s):
        name = self.new_name(s["name"])
        src = self.tensor(s["src"])
        L = self.lib
        stype, sne, snb = self.shape(src.ptr)
        ne = _ne4(s["ne"])
        offset = int(s.get("offset", 0))
        blck = max(1, L.ggml_blck_size(stype))
        self.check(ne[0] % blck == 0, f"ne[0]={ne[0]} is not a multiple of the block size {blck}")
        row = ne[0] // blck * L.ggml_type_size(stype)
        if "nb" in s:  # explicit nb1..nb3, as ggml_view_4d takes them
            nb1, nb2, nb3 = ([int(x) for x in s["nb"]] + [0, 0, 0])[:3]
        else:
            # ggml_view_<k>d(src, ne[:k], src->nb[1:k], offset), the usual call: the source's
            # strides for the view's own dimensions, the rest packed (a 1-D view is all packed).
            k = len(s["ne"])
            nb = [snb[0], row, 0, 0]
            for d in range(1, 4):
                nb[d] = snb[d] if d < k else nb[d - 1] * ne[d - 1]
            nb1, nb2, nb3 = nb[1:]
        self.check(min(nb1, nb2, nb3) >= 0, "strides must be >= 0")
        # ggml_view_impl asserts on the packed size; the strides must stay inside too.
        packed = row * ne[1] * ne[2] * ne[3]
        extent = 0 if 0 in ne else row + (ne[1] - 1) * nb1 + (ne[2] - 1) * nb2 + (ne[3] - 1) * nb3
        src_nbytes = L.ggml_nbytes(src.ptr)
        self.check(offset >= 0 and offset + max(packed, extent) <= src_nbytes,
                   f"view of {max(packed, extent)} bytes at offset {offset} outside "
                   f"{src_nbytes}-byte source")
        self.room()
        ptr = L.ggml_view_4d(self.ctx, src.ptr, *ne, nb1, nb2, nb3, offset)
        L.ggml_set_name(ptr, name.encode())
        st = L.ggml_backend_view_init(ptr)
        if st != 0:
            raise StepError(f"ggml_backend_view_init returned status {st}")
        self.tensors[name] = Tensor(name, ptr, src.buffer, [src.name])
        return {"nbytes": L.ggml_nbytes(ptr), "data": L.ggml_get_data(ptr) or 0}

    def op_node(self, s):
        name = self.new_name(s["name"])
        kind = s.get("kind")
        inputs = [self.tensor(n) for n in s.get("inputs", [])]
        params = s.get("params") or {}
        L = self.lib
        need = {"scale": 1}.get(kind, 2)
        if kind not in ("add", "mul", "scale", "cpy", "mul_mat", "get_rows"):
            raise StepError(f"unknown node kind {kind!r}")
        if len(inputs) != need:
            raise StepError(f"{kind} takes {need} inputs, got {len(inputs)}")
        shapes = [self.shape(t.ptr) for t in inputs]
        self._check_op(kind, shapes)
        self.room()
        a = inputs[0].ptr
        if kind == "scale":
            ptr = L.ggml_scale(self.ctx, a, float(params.get("s", 1.0)))
        else:
            ptr = getattr(L, "ggml_" + kind)(self.ctx, a, inputs[1].ptr)
        L.ggml_set_name(ptr, name.encode())
        deps = [t.name for t in inputs]
        result = {}
        if kind == "cpy":
            # ggml_cpy returns a view of its destination: it lives where the destination does.
            st = L.ggml_backend_view_init(ptr)
            if st != 0:
                raise StepError(f"ggml_backend_view_init returned status {st}")
            buf = inputs[1].buffer
        else:
            buf = self.buffer(s["buffer"])
            result["alloc_size"] = self.place(ptr, buf, int(s.get("offset", 0)))
        self.tensors[name] = Tensor(name, ptr, buf, deps)
        result.update(nbytes=L.ggml_nbytes(ptr), data=L.ggml_get_data(ptr) or 0)
        return result

    def _check_op(self, kind, shapes) -> None:
        """The shape asserts of the ggml op constructors, as refusals."""
        if self.unchecked:
            return
        (ta, na, ba) = shapes[0]
        if kind in ("add", "mul"):
            (_, nb_, _) = shapes[1]
            self.check(all(y > 0 and x % y == 0 for x, y in zip(na, nb_)),
                       f"{kind}: {nb_} cannot be broadcast to {na}")
        elif kind == "scale":
            ts = self.lib.ggml_type_size(ta)
            self.check(ba[0] == ts and ba[2] == ba[1] * na[1] and ba[3] == ba[2] * na[2],
                       "scale: input must be contiguous in dims 1-3")
        elif kind == "cpy":
            (_, nb_, _) = shapes[1]
            self.check(int(np.prod(na)) == int(np.prod(nb_)),
                       f"cpy: element counts differ ({na} vs {nb_})")
        elif kind == "mul_mat":
            (_, nb_, _) = shapes[1]
            self.check(na[0] == nb_[0] and na[2] > 0 and na[3] > 0
                       and nb_[2] % na[2] == 0 and nb_[3] % na[3] == 0,
                       f"mul_mat: shapes {na} and {nb_} do not match")
            self.check(not ba[0] > ba[1], "mul_mat: first input is transposed")
        elif kind == "get_rows":
            (tb, nb_, _) = shapes[1]
            self.check(tb == self.types.get("i32"), "get_rows: indices must be i32")
            self.check(na[2] == nb_[1] and na[3] == nb_[2] and nb_[3] == 1,
                       f"get_rows: shapes {na} and {nb_} do not match")

    def op_set(self, s):
        t = self.tensor(s["tensor"])
        _, offset, size = self.region(t, s)
        data = make_fill(s.get("fill") or {}, size)
        self.lib.ggml_backend_tensor_set(t.ptr, data.ctypes.data, offset, size)
        return {"fnv": f"{fnv1a64(data):016x}"}

    def op_get(self, s):
        t = self.tensor(s["tensor"])
        _, offset, size = self.region(t, s)
        out = np.zeros(size, dtype=np.uint8)
        self.lib.ggml_backend_tensor_get(t.ptr, out.ctypes.data, offset, size)
        return fingerprint(out)

    def op_compute(self, s):
        """Compute the graph of ``outputs``. With ``graph`` NAME the graph object is kept and
        given a uid, as a program that reuses its graphs does: computing the same NAME again
        lets the library reuse it (GRAPH_RECOMPUTE instead of the graph)."""
        name = s.get("graph")
        if name is not None and name in self.graphs:
            _, gf, uid = self.graphs[name]
            return {"status": self.lib.ggml_backend_graph_compute(self.backend(s), gf), "uid": uid}
        outs = [self.tensor(n) for n in s.get("outputs", [])]
        if not outs:
            raise StepError("compute needs at least one output")
        # Every tensor the graph reaches must be alive, or the server reads freed memory.
        seen, stack = set(), [t.name for t in outs]
        while stack:
            n = stack.pop()
            if n not in seen:
                seen.add(n)
                stack.extend(self.tensor(n).deps)
        L = self.lib
        size = max(GRAPH_MIN_SIZE, 2 * len(seen))
        gctx = L.ggml_init(ggml_init_params(L.ggml_graph_overhead_custom(size, False), None, True))
        keep = False
        try:
            gf = L.ggml_new_graph_custom(gctx, size, False)
            for t in outs:
                L.ggml_build_forward_expand(gf, t.ptr)
            uid = 0
            if name is not None:
                uid = self._give_uid(gf, size)
                self.graphs[name] = (gctx, gf, uid)
                keep = True
            status = L.ggml_backend_graph_compute(self.backend(s), gf)
        finally:
            if not keep:
                L.ggml_free(gctx)
        return {"status": status, "uid": uid}

    def _give_uid(self, gf: int, size: int) -> int:
        head_size = C.c_int.from_address(gf + CGRAPH_SIZE_OFFSET).value
        head_nodes = C.c_int.from_address(gf + CGRAPH_N_NODES_OFFSET).value
        slot = C.c_uint64.from_address(gf + CGRAPH_UID_OFFSET)
        if head_size != size or head_nodes != self.lib.ggml_graph_n_nodes(gf) or slot.value:
            raise StepError("this library's ggml_cgraph does not have the expected layout; "
                            "graph uids are not supported with it")
        if self.lib.ggml_graph_next_uid is not None:
            uid = self.lib.ggml_graph_next_uid()
        else:
            uid, self.next_uid = self.next_uid, self.next_uid + 1
        slot.value = uid
        return uid

    def op_forget_graph(self, s):
        gctx, _, uid = self.graphs.pop(str(s["graph"]))
        self.lib.ggml_free(gctx)
        return {"uid": uid}

    def _region_2d(self, t: Tensor, s) -> tuple[int, int, int, int]:
        if self.lib.ggml_backend_tensor_set_2d is None:
            raise StepError("2D transfers: this client library has none (proto < 8)")
        offset, size = int(s.get("offset", 0)), int(s["size"])
        n_copies, stride = int(s["n_copies"]), int(s["stride"])
        nbytes = self.lib.ggml_nbytes(t.ptr)
        # ggml_backend_tensor_set_2d asserts on the span; refuse instead
        self.check(min(offset, size, n_copies, stride) >= 0, "negative 2D argument")
        self.check(n_copies == 0 or offset + (n_copies - 1) * stride + size <= nbytes,
                   f"2D span outside the {nbytes}-byte tensor")
        return offset, size, n_copies, stride

    def op_set_2d(self, s):
        """``n_copies`` rows of ``size`` bytes at offset + i*stride, from packed data."""
        t = self.tensor(s["tensor"])
        offset, size, n, stride = self._region_2d(t, s)
        data = make_fill(s.get("fill") or {}, size * n)
        self.lib.ggml_backend_tensor_set_2d(t.ptr, data.ctypes.data, offset, size, n, stride, size)
        return {"fnv": f"{fnv1a64(data):016x}"}

    def op_get_2d(self, s):
        t = self.tensor(s["tensor"])
        offset, size, n, stride = self._region_2d(t, s)
        out = np.zeros(size * n, dtype=np.uint8)
        self.lib.ggml_backend_tensor_get_2d(t.ptr, out.ctypes.data, offset, size, n, stride, size)
        return fingerprint(out)

    def op_copy(self, s):
        src, dst = self.tensor(s["src"]), self.tensor(s["dst"])
        self.check(self.shape(src.ptr) == self.shape(dst.ptr),
                   "copy: src and dst differ in type, ne or nb")
        self.lib.ggml_backend_tensor_copy(src.ptr, dst.ptr)
        return {"ok": True}

    def op_memset(self, s):
        t = self.tensor(s["tensor"])
        if t.buffer is not None and not self.memset_supported(t.buffer):
            raise StepError("memset: unsupported by this client library")
        _, offset, size = self.region(t, s)
        value = int(s.get("value", 0))
        self.check(0 <= value <= 255, "value must be a byte")
        self.lib.ggml_backend_tensor_memset(t.ptr, value & 0xFF, offset, size)
        return {}

    def op_clear(self, s):
        b = self.buffer(s["buffer"])
        value = int(s.get("value", 0))
        self.check(0 <= value <= 255, "value must be a byte")
        self.lib.ggml_backend_buffer_clear(b.ptr, value & 0xFF)
        return {}

    def op_free_buffer(self, s):
        b = self.buffer(s["buffer"])
        self.lib.ggml_backend_buffer_free(b.ptr)
        b.alive = False
        return {}

    def op_close(self, s):
        # Buffers hold the connection too; like a real program, freeing is the scenario's call.
        for be in self.backends.values():
            self.lib.ggml_backend_free(be)
        self.backends.clear()
        return {}

    def run(self, step: dict) -> dict:
        op = step.get("op")
        handler = getattr(self, f"op_{op}", None) if isinstance(op, str) else None
        if handler is None:
            raise StepError(f"unknown op {op!r}")
        self.unchecked = bool(step.get("unchecked", False))
        try:
            return handler(step)
        except KeyError as e:
            raise StepError(f"{op}: missing argument {e.args[0]!r}") from None
        except (TypeError, ValueError) as e:
            raise StepError(f"{op}: bad argument: {e}") from None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.impls.ctypes_agent")
    ap.add_argument("--lib-dir", required=True)
    ap.add_argument("--proto", help="the library's RPC proto X.Y.Z, if known")
    a = ap.parse_args(argv)

    # Events get a private copy of stdout; fd 1 then points at stderr, so anything the C
    # libraries print cannot corrupt the event stream.
    events = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def emit(ev):
        events.write(json.dumps(ev) + "\n")
        events.flush()

    t0 = time.monotonic()
    try:
        lib = Lib(a.lib_dir)
        agent = Agent(lib, _parse_proto(a.proto))
    except Exception as e:  # noqa: BLE001 - reported, then a clean non-zero exit
        emit({"i": -1, "op": "ready", "ok": False, "result": {},
              "error": f"{type(e).__name__}: {e}", "t0": t0, "t1": time.monotonic()})
        return 2
    emit({"i": -1, "op": "ready", "ok": True, "error": "", "t0": t0, "t1": time.monotonic(),
          "result": {"pid": os.getpid(), "lib_dir": a.lib_dir, "loaded": lib.loaded,
                     "missing": lib.missing, "proto": a.proto, "types": len(agent.types)}})

    n = 0
    while True:
        line = sys.stdin.readline()
        if not line:
            break  # parent went away
        if not line.strip():
            continue
        t0 = time.monotonic()
        ev = {"i": n, "op": "?", "ok": False, "result": {}, "error": ""}
        try:
            step = json.loads(line)
            if not isinstance(step, dict):
                raise StepError("a step must be a JSON object")
            ev["i"] = step.get("i", n)
            ev["op"] = str(step.get("op"))
            ev["result"] = agent.run(step)
            ev["ok"] = True
        except json.JSONDecodeError as e:
            ev["error"] = f"bad JSON: {e}"
        except StepError as e:
            ev["error"] = str(e)
        except Exception as e:  # noqa: BLE001 - an agent bug must not look like a client abort
            ev["error"] = f"internal error: {type(e).__name__}: {e}"
        ev["t0"], ev["t1"] = t0, time.monotonic()
        emit(ev)
        n += 1
        if ev["op"] == "close" and ev["ok"]:
            break
    events.flush()
    sys.stderr.flush()
    # Skip interpreter and C++ static teardown: RPC buffers may still own a connection thread.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
