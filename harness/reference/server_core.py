"""What the reference server does with each request: the 7.0.0 validation rules (spec 3, 5,
6, 7) and their 8.0.0 additions, with no sockets.

Every rule that makes the real server close the connection raises ``Close`` here with the
real server's log text where it has one. Where the real server aborts or its behaviour is
not specified (spec 1.6), the reference closes with a reason instead: it never crashes, never
allocates without a bound and never blocks.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..proto import messages as m
from ..proto.constants import GRAPH_CACHE_MAX, SERVER_FLAG_CACHE, Cmd
from ..proto.dialects import Dialect
from ..proto.ggml import TYPE_F16
from ..proto.tensor import RpcTensor, nbytes
from ..proto.wire import I64_MAX, U64_MAX
from .behaviour_view import BehaviourView, behaviour_view_for
from .cache import CacheWriter, HashCache
from .comm import LinkError, PeerLink, is_loopback
from .compute import ServerTensor, UnsupportedGraph, execute, supports_op
from .errors import ReferencePeerError
from .knobs import Misbehaviour
from .memory import ALIGNMENT, Buffer, MemoryPool, OutOfMemory

# Knob amplify_set_tensor: at most this much per connection, so the planted bug shows as
# amplification and stays below the fuzzer's memory bound (1 GiB by default).
HOARD_CAP = 256 << 20


class Close(ReferencePeerError):
    """Close this connection; ``reason`` is logged. The server keeps serving others."""

    def __init__(self, reason: str, command: str | None = None):
        self.reason = reason
        self.command = command
        super().__init__(reason)


@dataclass
class ServerConfig:
    dialect: Dialect
    devices: int = 1
    cache_dir: Path | None = None
    memory_budget: int = 8 << 30  # all buffers of all connections together
    max_payload: int = 256 << 20  # whole (non-streamed) payloads, i.e. GRAPH_COMPUTE
    max_graph_tensors: int = 1 << 16
    knobs: Misbehaviour = field(default_factory=Misbehaviour)
    # Server-to-server link (COMM_*): the real server waits without end; the reference gives
    # up after this many seconds on any accept / peer read, and tries rank 0 this often.
    comm_timeout: float = 30.0
    comm_connect_tries: int = 100
    comm_connect_interval: float = 0.05


class ServerState:
    """Process-wide state: devices, the memory budget and the cache directory."""

    def __init__(self, config: ServerConfig, log: Callable[[str], None] = lambda s: None):
        self.config = config
        self.dialect = config.dialect
        self.pool = MemoryPool(config.memory_budget)
        self.cache = HashCache(config.cache_dir) if config.cache_dir else None
        self.log = log
        self.lock = threading.Lock()
        self.frame_lock = threading.Lock()  # knob freeze_mid_frame: held while mid-frame

    def hello(self, local_caps: bytes | None = None) -> m.HelloResponse:
        """``local_caps``: what the connection's transport offers (RDMA upgrade hook)."""
        k = self.config.knobs
        major, minor, patch = k.hello_version or self.dialect.version
        flags = 0
        if self.dialect.server_flags and self.cache is not None:
            flags |= SERVER_FLAG_CACHE
        if k.hello_flags is not None:
            flags = k.hello_flags
        caps = k.hello_caps if k.hello_caps is not None else (local_caps or bytes(24))
        if not self.dialect.hello_caps:
            return m.HelloResponse(major, minor, patch)
        return m.HelloResponse(major, minor, patch, flags, caps)


@dataclass
class SetTensorSink:
    """Where an accepted SET_TENSOR payload goes: straight into the buffer's memory (or, for a
    region a planted knob let through unchecked, a scratch copy written back clamped)."""

    dest: memoryview
    cache_writer: CacheWriter | None = None
    clamped: tuple[Buffer, int] | None = None  # (buffer, address) of an unchecked region

    def finish(self) -> str | None:
        """Payload complete: file it in the cache if asked. Returns the cache entry name."""
        if self.clamped is not None:
            buf, addr = self.clamped
            buf.write_clamped(addr, self.dest)
        if self.cache_writer is None:
            return None
        self.cache_writer.update(self.dest)
        return self.cache_writer.commit()

    def abort(self) -> None:
        if self.cache_writer is not None:
            self.cache_writer.abort()


class ServerSession:
    """One client connection: its buffers and stored graphs."""

    def __init__(self, state: ServerState, behaviour: BehaviourView | None = None):
        self.state = state
        self.dialect = state.dialect
        # what this peer does beyond the message formats: the row's, or a test's override
        self.behaviour = behaviour or behaviour_view_for(state.dialect)
        self.buffers: dict[int, Buffer] = {}
        # 7.x: one stored graph per device; 8.x: per (device, uid), up to GRAPH_CACHE_MAX
        self.graphs: dict[tuple[int, int], list] = {}
        self.cache_hits = 0
        self.cache_saves: list[str] = []
        self.hoard: list[bytes] = []  # knob amplify_set_tensor: freed with the connection
        self.local_conn_caps: bytes | None = None  # set by the server loop from its transport
        self.comms: dict[int, PeerLink] = {}  # device -> link; the real build drops it at close
        self.freed: set[int] = set()  # handles freed on this connection (knob skip_bounds_after_free)

    def close(self) -> None:
        """Disconnect: every buffer and communicator of this connection is freed (spec 8)."""
        for link in self.comms.values():
            link.close()
        self.comms.clear()
        for buf in self.buffers.values():
            self.state.pool.release(buf)
        self.buffers.clear()
        self.graphs.clear()
        self.hoard.clear()

    # ------------------------------------------------------------ helpers
    def _device(self, device: int, cmd: Cmd) -> None:
        if device >= self.state.config.devices:
            raise Close(f"[{cmd.value.lower()}] device {device} out of range "
                        f"(have {self.state.config.devices})", cmd.value)

    def _buffer(self, handle: int, cmd: Cmd) -> Buffer:
        buf = self.buffers.get(handle)
        if buf is None:
            raise Close(f"[{cmd.value.lower()}] buffer not found: 0x{handle:x}", cmd.value)
        return buf

    def _unchecked_after_free(self, rec: RpcTensor) -> bool:
        """Knob skip_bounds_after_free: a tensor of a buffer other than one freed earlier."""
        return bool(self.state.config.knobs.skip_bounds_after_free and self.freed
                    and rec.buffer not in self.freed)

    def deserialize(self, rec: RpcTensor, cmd: Cmd, *, unchecked: bool = False
                    ) -> ServerTensor:
        """deserialize_tensor (spec 3.2). ``unchecked``: a planted knob skips the bounds check."""
        where = f"[{cmd.value.lower()}]"
        traits = self.dialect.numbering.type_traits(rec.type)
        if traits is None:
            raise Close(f"{where} invalid tensor type received: {rec.type}", cmd.value)
        if traits.blck_size == 0:
            raise Close(f"{where} invalid tensor type received (blck_size is 0): {rec.type}",
                        cmd.value)
        count = rec.ne[0] * rec.ne[1] * rec.ne[2] * rec.ne[3]
        if count > I64_MAX:
            raise Close(f"{where} element count {count} overflows int64", cmd.value)
        buf = self.buffers.get(rec.buffer) if rec.buffer else None
        unchecked = unchecked or self._unchecked_after_free(rec)
        if buf is not None and count and not unchecked:
            size = nbytes(rec)
            slack = self.state.config.knobs.tensor_bounds_slack
            if rec.data + size > U64_MAX or not buf.contains(rec.data, max(size - slack, 0)):
                # 7.0.0 aborts on this GGML_ASSERT; 8.0.0 closes; the reference closes.
                raise Close(f"{where} tensor data [0x{rec.data:x}, +{size}) outside its buffer "
                            f"[0x{buf.base:x}, +{buf.size})", cmd.value)
        return ServerTensor(rec, buf, self.dialect.numbering)

    def _allocated_after(self, handle: int, other: int) -> bool:
        """Is ``handle`` a live buffer of this connection allocated after ``other`` (also
        live)? (Knob skip_view_bounds_cross_buffer.)"""
        order = list(self.buffers)  # insertion order: the order ALLOC_BUFFER made them
        return handle in self.buffers and other in self.buffers and \
            order.index(handle) > order.index(other)

    def _live_tensor(self, rec: RpcTensor, cmd: Cmd) -> ServerTensor:
        t = self.deserialize(rec, cmd)
        if t.buffer is None:
            raise Close(f"[{cmd.value.lower()}] error deserializing tensor", cmd.value)
        return t

    def _region(self, t: ServerTensor, offset: int, n: int, cmd: Cmd) -> tuple[int, bool]:
        """The buffer region check of SET_TENSOR / SET_TENSOR_HASH / GET_TENSOR (spec 3.4),
        in the C code's wrapping u64 arithmetic. Returns the absolute start address, and
        whether a planted knob let the region through unchecked (access it clamped)."""
        buf = t.buffer
        p0, p1 = buf.base, buf.base + buf.size
        start = (t.rec.data + offset) & U64_MAX
        if self._region_unchecked(t, offset, n, cmd):
            return start, True
        if start < p0 or start >= p1 or n > ((p1 - start) & U64_MAX):
            raise Close(f"[{cmd.value.lower()}] tensor data region (data=0x{t.rec.data:x}, "
                        f"offset={offset}, size={n}) out of buffer bounds "
                        f"[0x{p0:x}, 0x{p1:x})", cmd.value)
        # ggml_backend_tensor_set/get then assert offset + size <= nbytes (7.0.0 aborts there),
        # in size_t: an offset that wraps the address back into the buffer passes it and the
        # real server writes / reads at the wrapped address (p7 and p8 both do)
        if n and (offset + n) & U64_MAX > nbytes(t.rec):
            raise Close(f"[{cmd.value.lower()}] region offset={offset} size={n} beyond tensor "
                        f"nbytes {nbytes(t.rec)}", cmd.value)
        return start, False

    def _region_unchecked(self, t: ServerTensor, offset: int, n: int, cmd: Cmd) -> bool:
        """Do the planted interaction knobs skip this region's checks? Bounded by the
        payload limit: an unchecked region is copied, not viewed."""
        k = self.state.config.knobs
        if n > self.state.config.max_payload:
            return False
        return bool((k.skip_region_f16_offset and t.rec.type == TYPE_F16 and offset)
                    or (k.skip_region_size_nbytes_minus_1 and cmd is Cmd.GET_TENSOR
                        and n == nbytes(t.rec) - 1)
                    or self._unchecked_after_free(t.rec))

    # ------------------------------------------------------------ SET_TENSOR streaming
    def begin_set_tensor(self, msg: m.SetTensorRequest, size: int) -> SetTensorSink:
        """Validate a SET_TENSOR header; the ``size`` payload bytes then go to the sink."""
        t = self._live_tensor(msg.tensor, Cmd.SET_TENSOR)
        start, unchecked = self._region(t, msg.offset, size, Cmd.SET_TENSOR)
        writer = None
        knobs = self.state.config.knobs
        if self.state.cache is not None and (msg.cache_flag or knobs.cache_every_upload):
            writer = self.state.cache.writer()
        if unchecked:
            return SetTensorSink(memoryview(bytearray(size)), writer, (t.buffer, start))
        return SetTensorSink(t.buffer.view(start, size), writer)

    def end_set_tensor(self, sink: SetTensorSink) -> None:
        factor = self.state.config.knobs.amplify_set_tensor
        held = sum(map(len, self.hoard))
        if factor > 0 and held < HOARD_CAP:  # touched bytes (not calloc's zero pages): RSS
            self.hoard.append(b"\xa5" * min(factor * len(sink.dest), HOARD_CAP - held))
        name = sink.finish()
        if name:
            self.cache_saves.append(name)
            self.state.log(f"[set_tensor] saved to cache entry {name}")

    # ------------------------------------------------------------ requests
    def handle(self, msg: m.Message) -> m.Message | None:
        """Apply a whole request. Returns the response (None if the command has none)."""
        handler = _HANDLERS.get(type(msg))
        if handler is None:
            raise Close(f"{msg.cmd} is not supported by the reference server", msg.cmd.value)
        rsp = handler(self, msg)
        if rsp is None and msg.cmd in self.dialect.acked:
            return m.EmptyResponse(msg.cmd)
        return rsp

    def _hello(self, msg):
        return self.state.hello(self.local_conn_caps)

    def _device_count(self, msg):
        return m.DeviceCountResponse(self.state.config.devices)

    def _alloc_buffer(self, msg):
        self._device(msg.device, Cmd.ALLOC_BUFFER)
        try:
            buf = self.state.pool.allocate(msg.size)
        except OutOfMemory as e:
            self.state.log(f"[alloc_buffer] size {msg.size} -> failed: {e}")
            return m.AllocBufferResponse(0, 0)  # the real server answers zeros on failure
        self.buffers[buf.handle] = buf
        return m.AllocBufferResponse(buf.handle, buf.size)

    def _get_alignment(self, msg):
        self._device(msg.device, Cmd.GET_ALIGNMENT)
        return m.GetAlignmentResponse(ALIGNMENT)

    def _get_max_size(self, msg):
        self._device(msg.device, Cmd.GET_MAX_SIZE)
        return m.GetMaxSizeResponse(U64_MAX)  # the CPU backend has no limit

    def _get_device_memory(self, msg):
        self._device(msg.device, Cmd.GET_DEVICE_MEMORY)
        pool = self.state.pool
        return m.GetDeviceMemoryResponse(pool.free, pool.budget)

    def _buffer_get_base(self, msg):
        return m.BufferGetBaseResponse(self._buffer(msg.remote_ptr, Cmd.BUFFER_GET_BASE).base)

    def _free_buffer(self, msg):
        buf = self._buffer(msg.remote_ptr, Cmd.FREE_BUFFER)
        self.freed.add(buf.handle)
        # stored graphs may point into the freed buffer: dropped in every dialect (before
        # 7.0.0 the real server keeps them and a recompute uses freed memory; the reference
        # does not reproduce the use-after-free, see PeerBehaviour.server_free_drops_graphs)
        self.graphs.clear()
        del self.buffers[buf.handle]
        self.state.pool.release(buf)

    def _buffer_clear(self, msg):
        buf = self._buffer(msg.remote_ptr, Cmd.BUFFER_CLEAR)
        buf.mem.fill(msg.value)

    def _set_tensor(self, msg):
        sink = self.begin_set_tensor(msg, len(msg.data))
        sink.dest[:] = msg.data
        self.end_set_tensor(sink)

    def _set_tensor_hash(self, msg):
        cache = self.state.cache
        if self.state.config.knobs.claim_cache_hit:
            return m.SetTensorHashResponse(1)
        t = None
        if self.behaviour.server_hash_checks_tensor:
            t = self._live_tensor(msg.tensor, Cmd.SET_TENSOR_HASH)
        size = cache.size(msg.hash) if cache is not None else None
        if size is None:
            return m.SetTensorHashResponse(0)  # a lookup-first server validates nothing here
        t = t or self._live_tensor(msg.tensor, Cmd.SET_TENSOR_HASH)
        start, unchecked = self._region(t, msg.offset, size, Cmd.SET_TENSOR_HASH)
        if unchecked:
            scratch = memoryview(bytearray(size))
            cache.read_into(msg.hash, scratch)
            t.buffer.write_clamped(start, scratch)
        else:
            cache.read_into(msg.hash, t.buffer.view(start, size))
        self.cache_hits += 1
        return m.SetTensorHashResponse(1)

    def _get_tensor(self, msg):
        t = self._live_tensor(msg.tensor, Cmd.GET_TENSOR)
        start, unchecked = self._region(t, msg.offset, msg.size, Cmd.GET_TENSOR)
        if unchecked:
            return m.GetTensorResponse(t.buffer.read_clamped(start, msg.size))
        return m.GetTensorResponse(t.buffer.view(start, msg.size))

    def _copy_tensor(self, msg):
        src = self.deserialize(msg.src, Cmd.COPY_TENSOR)
        dst = self.deserialize(msg.dst, Cmd.COPY_TENSOR)
        if src.buffer is None or dst.buffer is None:
            raise Close("[copy_tensor] error deserializing tensors", Cmd.COPY_TENSOR.value)
        n = nbytes(src.rec)
        # the real check bounds the end only, in u64 (an empty src anywhere below passes)
        if (dst.rec.data + n) & U64_MAX > dst.buffer.base + dst.buffer.size or \
                (n and not dst.buffer.contains(dst.rec.data, n)):
            raise Close("[copy_tensor] out-of-bounds write in rpc_server::copy_tensor",
                        Cmd.COPY_TENSOR.value)
        if dst.buffer.size == 0:
            # ggml gives a zero-size allocation a dummy buffer without a cpy_tensor method:
            # ggml_backend_buffer_copy_tensor answers false (p7 and p8 answer 0)
            return m.CopyTensorResponse(0)
        if n:
            data = bytes(src.buffer.view(src.rec.data, n))
            dst.buffer.view(dst.rec.data, n)[:] = data
        return m.CopyTensorResponse(1)

    def _init_tensor(self, msg):
        t = self.deserialize(msg.tensor, Cmd.INIT_TENSOR)
        if t.buffer is None:
            self.state.log("[init_tensor] tensor with null buffer passed to init_tensor function")

    def _get_alloc_size(self, msg):
        self._device(msg.device, Cmd.GET_ALLOC_SIZE)
        t = self.deserialize(msg.tensor, Cmd.GET_ALLOC_SIZE)
        for s in msg.srcs:
            if s.id:
                try:  # failures of the srcs are ignored by the real server
                    self.deserialize(s, Cmd.GET_ALLOC_SIZE)
                except Close:
                    pass
        return m.GetAllocSizeResponse(nbytes(t.rec))

    def _memset_tensor(self, msg):
        t = self._live_tensor(msg.tensor, Cmd.MEMSET_TENSOR)
        if self._region_unchecked(t, msg.offset, msg.size, Cmd.MEMSET_TENSOR):
            t.buffer.write_clamped((msg.tensor.data + msg.offset) & U64_MAX,
                                   bytes([msg.value]) * msg.size)
            return
        size = nbytes(t.rec)
        if msg.offset > size or msg.size > size - msg.offset:
            raise Close(f"[memset_tensor] tensor region (offset={msg.offset}, size={msg.size}) "
                        f"out of tensor bounds [0, {size})", Cmd.MEMSET_TENSOR.value)
        buf = t.buffer
        if msg.tensor.data < buf.base:
            raise Close("[memset_tensor] tensor data before buffer start", Cmd.MEMSET_TENSOR.value)
        data_off = msg.tensor.data - buf.base
        if data_off > buf.size or msg.offset > buf.size - data_off or \
                msg.size > buf.size - data_off - msg.offset:
            raise Close("[memset_tensor] tensor region out of buffer bounds",
                        Cmd.MEMSET_TENSOR.value)
        if buf.size == 0:
            # a zero-size allocation is ggml's dummy buffer, whose type has no memset_tensor
            # (spec 5: "the buffer type must implement memset"; p7 and p8 close here)
            raise Close("[memset_tensor] buffer type does not implement memset",
                        Cmd.MEMSET_TENSOR.value)
        start = data_off + msg.offset
        buf.mem[start:start + msg.size] = msg.value

    def _graph_compute(self, msg):
        self._device(msg.device, Cmd.GRAPH_COMPUTE)
        limit = self.state.config.max_graph_tensors
        if len(msg.nodes) > limit or len(msg.tensors) > limit:
            raise Close(f"[graph_compute] graph of {len(msg.nodes)} nodes / {len(msg.tensors)} "
                        f"tensors exceeds the reference bound {limit}", Cmd.GRAPH_COMPUTE.value)
        nodes = self._build_graph(msg)
        self._run(nodes)
        if self.dialect.graph_uid:
            if msg.uid:
                if len([k for k in self.graphs if k[0] == msg.device]) >= GRAPH_CACHE_MAX:
                    for k in [k for k in self.graphs if k[0] == msg.device]:
                        del self.graphs[k]  # full: both sides clear the device's cache
                self.graphs[(msg.device, msg.uid)] = nodes
        else:
            self.graphs[(msg.device, 0)] = nodes

    def _graph_recompute(self, msg):
        self._device(msg.device, Cmd.GRAPH_RECOMPUTE)
        nodes = self.graphs.get((msg.device, msg.uid if self.dialect.graph_uid else 0))
        if nodes is None:
            raise Close(f"[graph_recompute] no stored graph for device {msg.device}"
                        + (f" uid 0x{msg.uid:x}" if self.dialect.graph_uid else ""),
                        Cmd.GRAPH_RECOMPUTE.value)
        self._run(nodes)

    def _run(self, nodes) -> None:
        try:
            for w in execute(nodes):
                self.state.log(f"[graph_compute] {w}")
        except UnsupportedGraph as e:
            raise Close(f"[graph_compute] {e}", Cmd.GRAPH_COMPUTE.value) from None

    def _build_graph(self, msg: m.GraphComputeRequest) -> list:
        """create_node for every node id, iteratively (no recursion depth to exhaust)."""
        records: dict[int, RpcTensor] = {}
        for rec in msg.tensors:
            records.setdefault(rec.id, rec)  # duplicate ids: the first record wins
        built: dict[int, ServerTensor] = {}
        knobs = self.state.config.knobs

        def make(tid: int) -> ServerTensor:
            rec = records.get(tid)
            if rec is None:
                raise Close(f"[graph_compute] tensor id 0x{tid:x} not among the graph's tensors",
                            Cmd.GRAPH_COMPUTE.value)
            view_src = records.get(rec.view_src) if rec.view_src else None
            cross = bool(knobs.skip_view_bounds_cross_buffer and view_src is not None
                         and self._allocated_after(view_src.buffer, rec.buffer))
            t = self.deserialize(rec, Cmd.GRAPH_COMPUTE, unchecked=cross)
            if t.buffer is None and rec.data:
                raise Close("[create_node] invalid data ptr", Cmd.GRAPH_COMPUTE.value)
            built[tid] = t  # registered before its sources, so cycles resolve to it
            return t

        nodes, linked = [], set()
        for nid in msg.nodes:
            if nid == 0:
                raise Close("[graph_compute] null node id", Cmd.GRAPH_COMPUTE.value)
            root = built.get(nid) or make(nid)
            stack = [root]
            while stack:
                t = stack.pop()
                if id(t) in linked:
                    continue
                linked.add(id(t))
                for i, sid in enumerate(t.rec.src):
                    if sid:
                        s = built.get(sid) or make(sid)
                        t.src[i] = s
                        stack.append(s)
                if t.rec.view_src:
                    t.view_src = built.get(t.rec.view_src) or make(t.rec.view_src)
                    stack.append(t.view_src)
            nodes.append(root)
        return nodes

    def _supports_op(self, msg):
        self._device(msg.device, Cmd.GET_DEVICE_SUPPORTS_OP)
        self.deserialize(msg.op, Cmd.GET_DEVICE_SUPPORTS_OP)
        for s in msg.srcs:
            if s.id:
                self.deserialize(s, Cmd.GET_DEVICE_SUPPORTS_OP)
        return m.SupportsOpResponse(int(supports_op(msg.op.op, self.dialect.numbering)))

    def _span_2d(self, msg, cmd: Cmd, data_len: int | None):
        """SET/GET_TENSOR_2D checks (spec 12.2); returns (buffer, first absolute address)."""
        where = f"[{cmd.value.lower()}]"
        if msg.n_copies == 0 or msg.size == 0:
            raise Close(f"{where} n_copies and size must be non-zero", cmd.value)
        total = msg.size * msg.n_copies
        if data_len is not None and data_len != total:
            raise Close(f"{where} payload of {data_len} bytes, expected {total}", cmd.value)
        t = self._live_tensor(msg.tensor, cmd)
        span = msg.offset + (msg.n_copies - 1) * msg.stride + msg.size
        if span > U64_MAX or msg.stride > U64_MAX:
            raise Close(f"{where} span overflows", cmd.value)
        start = t.rec.data + msg.offset
        if not t.buffer.contains(start, span - msg.offset):
            raise Close(f"{where} span outside the buffer", cmd.value)
        if span > nbytes(t.rec):
            raise Close(f"{where} span outside the tensor", cmd.value)
        return t.buffer, start

    def _set_tensor_2d(self, msg):
        buf, start = self._span_2d(msg, Cmd.SET_TENSOR_2D, len(msg.data))
        for i in range(msg.n_copies):
            a = start + i * msg.stride
            buf.view(a, msg.size)[:] = msg.data[i * msg.size:(i + 1) * msg.size]

    def _get_tensor_2d(self, msg):
        buf, start = self._span_2d(msg, Cmd.GET_TENSOR_2D, None)
        total = msg.size * msg.n_copies
        if total > self.state.config.max_payload:
            # stride 0 repeats one region: the answer can be far larger than the buffer. The
            # real server fails to allocate it (bad_alloc) and closes; so does the reference,
            # at its payload bound, instead of building it.
            raise Close(f"[get_tensor_2d] failed to allocate a {total}-byte answer",
                        Cmd.GET_TENSOR_2D.value)
        return m.GetTensor2DResponse(b"".join(
            bytes(buf.view(start + i * msg.stride, msg.size)) for i in range(msg.n_copies)))

    def _comm_init(self, msg):
        """Answers 0 for a bad device, world or rank and for a failed link, 1 when linked or
        already linked (p8: no close, no second listen); blocks until the peer arrives."""
        cfg = self.state.config
        if msg.device >= cfg.devices or msg.world != 2 or msg.rank >= msg.world:
            return m.CommInitResponse(0)
        if msg.device in self.comms:
            return m.CommInitResponse(1)
        host = msg.host.split(b"\0", 1)[0].decode("latin-1")
        try:
            port = msg.port & 0xFFFF  # a sockaddr port is 16 bits [INF]
            if msg.rank == 0:
                self.state.log(f"[comm_init] rank 0 listening on 127.0.0.1:{port}")
                link = PeerLink.listen(port, cfg.comm_timeout)
            elif not is_loopback(host):  # network rule: the reference talks to loopback only
                self.state.log(f"[comm_init] peer {host} is not a loopback address: refused")
                return m.CommInitResponse(0)
            else:
                link = PeerLink.connect(host, port, cfg.comm_timeout,
                                        cfg.comm_connect_tries, cfg.comm_connect_interval)
        except (LinkError, OSError) as e:
            what = (f"failed to listen on comm port {msg.port}" if msg.rank == 0
                    else f"failed to connect to peer {host}:{msg.port}")
            self.state.log(f"[comm_init] {what}: {e}")
            return m.CommInitResponse(0)
        self.comms[msg.device] = link
        self.state.log(f"[comm_init] device {msg.device} joined pairwise comm as rank {msg.rank}")
        return m.CommInitResponse(1)

    def _comm_allreduce(self, msg):
        link = self.comms.get(msg.device)
        if link is None:
            raise Close(f"[comm_allreduce] no communicator for device {msg.device}",
                        Cmd.COMM_ALLREDUCE.value)
        t = self._live_tensor(msg.tensor, Cmd.COMM_ALLREDUCE)
        try:
            link.allreduce(t.rec, t.buffer.view(t.rec.data, nbytes(t.rec)))
        except LinkError as e:
            raise Close(f"[comm_allreduce] {e}", Cmd.COMM_ALLREDUCE.value) from None

    def _comm_free(self, msg):
        self._device(msg.device, Cmd.COMM_FREE)
        link = self.comms.pop(msg.device, None)
        if link is not None:
            link.close()


_HANDLERS = {
    m.HelloRequest: ServerSession._hello,
    m.DeviceCountRequest: ServerSession._device_count,
    m.AllocBufferRequest: ServerSession._alloc_buffer,
    m.GetAlignmentRequest: ServerSession._get_alignment,
    m.GetMaxSizeRequest: ServerSession._get_max_size,
    m.GetDeviceMemoryRequest: ServerSession._get_device_memory,
    m.BufferGetBaseRequest: ServerSession._buffer_get_base,
    m.FreeBufferRequest: ServerSession._free_buffer,
    m.BufferClearRequest: ServerSession._buffer_clear,
    m.SetTensorRequest: ServerSession._set_tensor,
    m.SetTensorHashRequest: ServerSession._set_tensor_hash,
    m.GetTensorRequest: ServerSession._get_tensor,
    m.CopyTensorRequest: ServerSession._copy_tensor,
    m.InitTensorRequest: ServerSession._init_tensor,
    m.GetAllocSizeRequest: ServerSession._get_alloc_size,
    m.MemsetTensorRequest: ServerSession._memset_tensor,
    m.GraphComputeRequest: ServerSession._graph_compute,
    m.GraphRecomputeRequest: ServerSession._graph_recompute,
    m.SupportsOpRequest: ServerSession._supports_op,
    m.SetTensor2DRequest: ServerSession._set_tensor_2d,
    m.GetTensor2DRequest: ServerSession._get_tensor_2d,
    m.CommInitRequest: ServerSession._comm_init,
    m.CommAllreduceRequest: ServerSession._comm_allreduce,
    m.CommFreeRequest: ServerSession._comm_free,
}
