"""The reference client: a typed API over one connection, speaking one dialect.

It sends exactly what a C client of that generation would send for the same call: the hash
policy of its dialect (proto 7/8 hash every weights upload over 10 MiB; seed 000 / 9.0.0 only
when the server's HELLO carries the cache flag), SET_TENSOR as header plus the caller's buffer
(zero copy) or one staged message, and the version rule on HELLO.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..proto import (NEED_DATA, ClientConnection, EndOfMessage, Response, ResponseHead,
                     client_accepts, fnv1a64)
from ..proto import messages as m
from ..proto.codec import RESPONSE_HEADER_SIZE
from ..proto.constants import CONN_CAPS_SIZE, HASH_THRESHOLD, SERVER_FLAG_CACHE, Cmd
from ..proto.dialects import Dialect, get_dialect
from ..proto.errors import RemoteProtocolError
from ..proto.tensor import RpcTensor
from ..transport.base import Transport, TransportClosed
from ..transport.tcp import TcpTransport
from .errors import ReferencePeerError
from .knobs import Misbehaviour
from .behaviour_view import HASH_ALWAYS, HASH_IF_FLAG, BehaviourView, behaviour_view_for

RECV_CHUNK = 1 << 20
STREAM_RESPONSE_AT = 1 << 16  # GET_TENSOR answers at least this big are received in place


class VersionRejected(ReferencePeerError):
    """The server's HELLO fails this client's version rule (the C client aborts here)."""

    def __init__(self, client: tuple, server: tuple):
        self.client_version = client
        self.server_version = server
        super().__init__("RPC server version mismatch: %d.%d.%d" % server)


class ServerClosed(ReferencePeerError):
    """The server closed the connection where an answer was due (the C client aborts)."""


@dataclass
class ClientStats:
    hash_requests: int = 0
    hash_hits: int = 0
    bytes_hashed: int = 0
    set_tensor_calls: int = 0
    bytes_uploaded: int = 0
    commands: dict = field(default_factory=dict)


class RefClient:
    def __init__(self, transport: Transport, dialect: Dialect | str, *,
                 knobs: Misbehaviour | None = None, behaviour: BehaviourView | None = None):
        self.tr = transport
        self.dialect = get_dialect(dialect)
        self.behaviour = behaviour or behaviour_view_for(self.dialect)
        self.knobs = knobs or Misbehaviour()
        self.conn = ClientConnection(self.dialect, strict=not (self.knobs.skip_hello
                                                               or self.knobs.hello_twice))
        self.server_hello: m.HelloResponse | None = None
        self.stats = ClientStats()
        self._rbuf = bytearray(RECV_CHUNK)
        self._rview = memoryview(self._rbuf)
        self.closed = False
        self.rdma_active: bool | None = None  # after HELLO; None: the transport cannot switch

    @classmethod
    def connect(cls, host: str, port: int, dialect: Dialect | str, *, timeout: float = 60.0,
                hello: bool = True, **kw) -> "RefClient":
        client = cls(TcpTransport.connect(host, port, timeout=timeout), dialect, **kw)
        if hello and not client.knobs.skip_hello:
            client.hello()
        return client

    # ------------------------------------------------------------ plumbing
    def _count(self, cmd: Cmd) -> None:
        self.stats.commands[cmd.value] = self.stats.commands.get(cmd.value, 0) + 1

    def _send(self, msg: m.Message, *, stream_response: bool = False) -> None:
        self._count(msg.cmd)
        frame = self.conn.send(msg, stream_response=stream_response)
        try:
            if self.knobs.trailing_bytes:
                self.tr.sendall_parts([frame, self.knobs.trailing_bytes])
            else:
                self.tr.sendall(frame)
            self.tr.flush()
        except (TransportClosed, BrokenPipeError, ConnectionResetError) as e:
            raise ServerClosed(f"send of {msg.cmd} failed: {e}") from None

    def _fill(self, limit: int = RECV_CHUNK) -> None:
        try:
            n = self.tr.recv_into(self._rview[:limit])
        except (TransportClosed, ConnectionResetError) as e:
            raise ServerClosed(f"connection reset: {e}") from None
        self.conn.receive_data(bytes(self._rview[:n]) if n else b"")

    def _response(self, limit: int = RECV_CHUNK):
        while True:
            try:
                ev = self.conn.next_event()
            except RemoteProtocolError as e:
                if "closed" in e.reason:
                    raise ServerClosed(e.reason) from None
                raise
            if ev is NEED_DATA:
                self._fill(limit)
                continue
            return ev

    def _call(self, msg: m.Message) -> m.Message:
        self._send(msg)
        ev = self._response()
        if not isinstance(ev, Response):
            raise RemoteProtocolError(f"expected a response to {msg.cmd}, got {ev!r}")
        return ev.message

    def _post(self, msg: m.Message) -> None:
        """A command without a response (or, for <= 5.0.0 dialects, with an empty ack)."""
        self._send(msg)
        if self.conn.pending_responses:
            self._response()

    # ------------------------------------------------------------ API
    def hello(self) -> m.HelloResponse:
        caps_of = getattr(self.tr, "local_conn_caps", None)  # RDMA upgrade hook (spec 10.1)
        caps = self.knobs.client_caps if self.knobs.client_caps is not None else \
            caps_of() if caps_of is not None and self.dialect.hello_caps else bytes(CONN_CAPS_SIZE)
        req = m.HelloRequest(caps) if self.dialect.hello_caps else m.HelloRequest()
        rsp = self._call(req)
        self.server_hello = rsp
        if self.knobs.hello_twice:
            self._call(req)
        if not client_accepts(self.dialect.version, rsp.version) and not self.knobs.ignore_version:
            self.close()
            raise VersionRejected(self.dialect.version, rsp.version)
        # Spec 10.1: only a client that accepted the version switches, with the server's caps.
        upgrade = getattr(self.tr, "upgrade", None)
        if upgrade is not None and self.dialect.hello_caps:
            self.rdma_active = upgrade(rsp.conn_caps)
        return rsp

    @property
    def server_has_cache(self) -> bool:
        return bool(self.server_hello and self.server_hello.flags & SERVER_FLAG_CACHE)

    def device_count(self) -> int:
        return self._call(m.DeviceCountRequest()).device_count

    def get_alignment(self, device: int = 0) -> int:
        return self._call(m.GetAlignmentRequest(device)).alignment

    def get_max_size(self, device: int = 0) -> int:
        return self._call(m.GetMaxSizeRequest(device)).max_size

    def get_device_memory(self, device: int = 0) -> tuple[int, int]:
        r = self._call(m.GetDeviceMemoryRequest(device))
        return r.free_mem, r.total_mem

    def alloc_buffer(self, size: int, device: int = 0) -> tuple[int, int]:
        r = self._call(m.AllocBufferRequest(device, size))
        return r.remote_ptr, r.remote_size

    def buffer_get_base(self, remote_ptr: int) -> int:
        return self._call(m.BufferGetBaseRequest(remote_ptr)).base_ptr

    def free_buffer(self, remote_ptr: int) -> None:
        self._post(m.FreeBufferRequest(remote_ptr))

    def buffer_clear(self, remote_ptr: int, value: int) -> None:
        self._post(m.BufferClearRequest(remote_ptr, value))

    def init_tensor(self, tensor: RpcTensor) -> None:
        self._post(m.InitTensorRequest(tensor))

    def get_alloc_size(self, tensor: RpcTensor, srcs: Sequence[RpcTensor] = (),
                       device: int = 0) -> int:
        full = tuple(srcs) + (RpcTensor.null(),) * (10 - len(srcs))
        return self._call(m.GetAllocSizeRequest(device, tensor, full)).alloc_size

    def _should_hash(self, size: int, weights: bool) -> bool:
        policy = self.knobs.hash_policy or self.behaviour.client_hash
        if policy == "never":
            return False
        if policy == "all-sizes":
            return weights
        big = weights and size > HASH_THRESHOLD
        if policy == HASH_ALWAYS or policy == "always":
            return big
        if policy == HASH_IF_FLAG:
            return big and self.server_has_cache
        raise ValueError(f"unknown hash policy {policy!r}")

    def set_tensor(self, tensor: RpcTensor, data, offset: int = 0, *,
                   weights: bool = False) -> str:
        """Upload ``data`` at ``offset``; returns "cached" (server had it) or "sent"."""
        view = memoryview(data).cast("B") if not isinstance(data, np.ndarray) else \
            memoryview(np.ascontiguousarray(data).reshape(-1).view(np.uint8))
        size = view.nbytes
        cache_flag = 0
        if self._should_hash(size, weights):
            h = fnv1a64(view)
            self.stats.hash_requests += 1
            self.stats.bytes_hashed += size
            if self.set_tensor_hash(tensor, offset, h):
                self.stats.hash_hits += 1
                return "cached"
            cache_flag = 1  # miss: ask the server to keep a copy
        if self.knobs.cache_flag is not None:
            cache_flag = self.knobs.cache_flag
        self._send_set_tensor(m.SetTensorRequest(tensor, cache_flag if self.dialect.cache_flag
                                                 else 0, offset), view)
        return "sent"

    def _send_set_tensor(self, head: m.SetTensorRequest, view: memoryview) -> None:
        self._count(Cmd.SET_TENSOR)
        self.stats.set_tensor_calls += 1
        self.stats.bytes_uploaded += view.nbytes
        cut = self.knobs.truncate_set_tensor_at
        hdr = self.conn.send_head(head, view.nbytes)
        try:
            if cut is not None:
                self.tr.sendall_parts([hdr, view[:cut]])
                self.tr.flush()
                self.tr.shutdown_write()
                return
            if self.behaviour.client_zero_copy:
                self.tr.sendall_parts([hdr, view])  # header, then the caller's bytes
            else:
                self.tr.sendall(b"".join((hdr, view)))  # one staged message, as proto 7 did
            if self.knobs.trailing_bytes:
                self.tr.sendall(self.knobs.trailing_bytes)
            self.tr.flush()
        except (TransportClosed, BrokenPipeError, ConnectionResetError) as e:
            raise ServerClosed(f"send of SET_TENSOR failed: {e}") from None
        if self.conn.pending_responses:  # <= 5.0.0 had no SET_TENSOR response either
            self._response()

    def set_tensor_2d(self, tensor: RpcTensor, data, offset: int, size: int, n_copies: int,
                      stride: int) -> None:
        """SET_TENSOR_2D (>= 8.0.0): ``n_copies`` packed rows of ``size`` bytes, row i landing
        at offset + i*stride. No hash: the 8.0.0 client never hashes a 2D upload."""
        view = memoryview(data).cast("B")
        if view.nbytes != size * n_copies:
            raise ValueError(f"{view.nbytes} data bytes for {n_copies} x {size}")
        self._post(m.SetTensor2DRequest(tensor, offset, size, n_copies, stride, bytes(view)))
        self.stats.bytes_uploaded += view.nbytes

    def get_tensor_2d(self, tensor: RpcTensor, offset: int, size: int, n_copies: int,
                      stride: int) -> bytes:
        return self._call(m.GetTensor2DRequest(tensor, offset, size, n_copies, stride)).data

    def set_tensor_hash(self, tensor: RpcTensor, offset: int, h: int) -> bool:
        return bool(self._call(m.SetTensorHashRequest(tensor, offset, h)).result)

    def get_tensor(self, tensor: RpcTensor, offset: int, size: int, out=None):
        """Download ``size`` bytes; into ``out`` (writable buffer) when given, else bytes."""
        req = m.GetTensorRequest(tensor, offset, size)
        if size < STREAM_RESPONSE_AT and out is None:
            return self._call(req).data
        self._send(req, stream_response=True)
        dest = memoryview(out).cast("B") if out is not None else memoryview(bytearray(size))
        if dest.nbytes < size:
            raise ValueError(f"output buffer of {dest.nbytes} bytes for a {size}-byte read")
        # Only the length prefix through the reader: the payload then lands in ``dest`` in one
        # copy instead of three (socket -> chunk -> reader buffer -> dest).
        ev = self._response(limit=RESPONSE_HEADER_SIZE)
        if not isinstance(ev, ResponseHead):
            raise RemoteProtocolError(f"expected GET_TENSOR data, got {ev!r}")
        reader = self.conn.reader
        got = reader.take_payload_into(dest[:size])
        direct = 0
        while got < size:
            try:
                n = self.tr.recv_into(dest[got:size])
            except (TransportClosed, ConnectionResetError) as e:
                raise ServerClosed(f"connection reset during GET_TENSOR: {e}") from None
            if n == 0:
                raise ServerClosed(f"server closed after {got} of {size} GET_TENSOR bytes")
            got += n
            direct += n
        if direct:
            reader.payload_received(direct)
        ev = self._response()
        assert isinstance(ev, EndOfMessage), ev
        return dest[:size] if out is not None else dest.obj

    def copy_tensor(self, src: RpcTensor, dst: RpcTensor) -> bool:
        return bool(self._call(m.CopyTensorRequest(src, dst)).result)

    def memset_tensor(self, tensor: RpcTensor, offset: int, size: int, value: int) -> None:
        self._post(m.MemsetTensorRequest(tensor, offset, size, value))

    def graph_compute(self, nodes: Sequence[int], tensors: Sequence[RpcTensor], *,
                      device: int = 0, uid: int = 0) -> None:
        self._post(m.GraphComputeRequest(device, uid if self.dialect.graph_uid else 0,
                                         tuple(nodes), tuple(tensors)))

    def graph_recompute(self, device: int = 0, uid: int = 0) -> None:
        self._post(m.GraphRecomputeRequest(device, uid if self.dialect.graph_uid else 0))

    def send_comm_init(self, rank: int, world: int, port: int, host: str = "127.0.0.1",
                       device: int = 0) -> None:
        """COMM_INIT, sent only: a rank-0 server answers once its peer has connected, so every
        rank's init goes out before any answer is read (comm_init_result)."""
        self._send(m.CommInitRequest(device, rank, world, port, host.encode().ljust(64, b"\0")))

    def comm_init_result(self) -> bool:
        ev = self._response()
        if not isinstance(ev, Response):
            raise RemoteProtocolError(f"expected the COMM_INIT answer, got {ev!r}")
        return bool(ev.message.ok)

    def comm_allreduce(self, tensor: RpcTensor, device: int = 0) -> None:
        self._post(m.CommAllreduceRequest(device, tensor))

    def comm_free(self, device: int = 0) -> None:
        self._post(m.CommFreeRequest(device))

    def raw(self, frame: bytes, *, expect_response_of: m.Message | None = None):
        """Send bytes as they are (fuzzing, misbehaviour); optionally read one response."""
        self.tr.sendall(frame)
        self.tr.flush()
        if expect_response_of is not None:
            self.conn.reader.expect(expect_response_of)
            return self._response()
        return None

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.tr.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
