"""Emulated ggml-rpc RDMA transport: both generations of the data path as parameters.

No machine here has an RDMA device, so this models the semantics of spec 10 faithfully enough
to run the reference peers over it and to fuzz the receive path:

* **Connection**: TCP until HELLO; then each side decides on its own whether to switch
  (:mod:`harness.transport.caps`). After the switch every RPC byte travels as RDMA SENDs and
  the TCP socket only signals that the peer hung up.
* **Send**: every ``send_data`` call is cut into pieces of at most ``chunk`` bytes (256 KiB),
  each one SEND and one completion at the receiver. ``send_slots`` SENDs may be in flight:
  1 = proto 7 stop-and-wait (wait for every SEND's completion), 8 = seed 000's ring (wait only
  when the ring is full, and drain at ``flush``, which marks every message boundary).
* **Receive**: ``recv_depth`` (24) receive buffers are posted at activation and each is
  reposted only once consumed, so a sender never has more unconsumed completions outstanding
  than that; past it, its SENDs wait (RNR, retried forever as ``rnr_retry = 7`` does).
  Policy ``whole-completion`` (proto 7) copies each completion whole into the current
  ``recv_data`` call; one larger than what that call still expects is an **overrun**, raised
  as :class:`RdmaOverrun` with the details instead of corrupting memory (or, with
  ``on_oversize="drop"``, clamped and the rest lost: the "frame loss" variant). Policy
  ``partial`` (seed 000, 9.0.0) serves reads of any size from a cursor.
* **Which calls**: what a C peer passes to ``send_data`` / ``recv_data`` is not what the
  Python peers' ``sendall`` / ``recv_into`` calls look like, so the framing is chosen
  explicitly: ``c-old`` cuts the stream like a proto-7 C peer (request ``[cmd 1][len 8]
  [payload]``, response ``[len 8][payload]``), ``c-new`` like seed 000 / 9.0.0 (the client's
  SET_TENSOR as ``[1][8][305-byte header][data]``), ``writes`` / ``app`` take the caller's
  own write and read boundaries (what the fuzzer varies).

The sans-IO core (:class:`CallCutter`, :class:`SendFramer`, :class:`CompletionReader`,
:func:`simulate_transfer`) is shared by the endpoints and the property tests. Endpoints come
in pairs over an in-memory fabric or over a socketpair (one length-prefixed record per SEND,
so record boundaries are completions). Every blocking wait has a deadline.
"""

from __future__ import annotations

import itertools
import select
import socket
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass, replace
from typing import Callable, Iterator, Sequence

from ..capture.transcript import C2S, S2C, Transcript
from ..proto.constants import (
    RDMA_CHUNK,
    RDMA_RX_RING,
    RDMA_TX_SLOTS_NEW,
    RDMA_TX_SLOTS_OLD,
    SERVER_STREAM_CHUNK_9,
    SET_TENSOR_HEADER_SIZE,
    Cmd,
)
from ..proto.dialects import D700, Dialect, get_dialect
from .base import TransportClosed
from .caps import (
    ADVERTISE,
    LINUX,
    MACOS,
    WITHHOLD,
    LinuxCaps,
    MacCaps,
    activates,
    advertised_caps,
    gid_for_ipv4,
    pack_linux,
    pack_macos,
    probe_ok,
    supports_rdma,
    unpack,
)
from .tcp import TcpTransport

WHOLE_COMPLETION, PARTIAL = "whole-completion", "partial"
RECV_POLICIES = (WHOLE_COMPLETION, PARTIAL)
C_OLD, C_NEW, WRITES, APP = "c-old", "c-new", "writes", "app"
SEND_FRAMINGS = (C_OLD, C_NEW, WRITES)
READ_CALLS = (C_OLD, C_NEW, APP)
REQUEST, RESPONSE = "request", "response"
CLIENT, SERVER = "client", "server"
MEMORY, SOCKET = "memory", "socket"

LIVENESS_INTERVAL = 0.05  # how often a waiting receiver looks at the TCP socket


# ---------------------------------------------------------------- errors

class RdmaError(OSError):
    """Base of the emulator's errors (an OSError, so peers treat it as a broken connection)."""


class RdmaOverrun(RdmaError):
    """A whole-completion receiver got a completion larger than its current read expects.

    The proto-7 C receiver copies all ``byte_len`` bytes into the caller's buffer (writing
    past it) and its remaining count wraps around; the emulator stops here instead.
    """

    def __init__(self, *, completion_index: int, byte_len: int, call_kind: str,
                 call_size: int, call_remaining: int, stream_offset: int):
        self.completion_index = completion_index
        self.byte_len = byte_len
        self.call_kind = call_kind
        self.call_size = call_size
        self.call_remaining = call_remaining
        self.stream_offset = stream_offset
        self.excess = byte_len - call_remaining
        super().__init__(
            f"RDMA overrun: completion #{completion_index} carries {byte_len} bytes but the "
            f"receiver's {call_kind} read (recv_data of {call_size} bytes) expects only "
            f"{call_remaining} more, at stream offset {stream_offset}: a whole-completion "
            f"receiver would write {self.excess} bytes past its buffer")

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("completion_index", "byte_len", "call_kind",
                                              "call_size", "call_remaining", "stream_offset",
                                              "excess")}


class RdmaHang(RdmaError, TimeoutError):
    """A wait ran out: nothing arrived, or the peer never made room. ``reason`` says why."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(reason)


# ---------------------------------------------------------------- configuration

@dataclass(frozen=True)
class RdmaConfig:
    """One side's RDMA data path. The presets below are the generations of spec 10."""

    name: str = "custom"
    chunk: int = RDMA_CHUNK  # largest SEND
    send_slots: int = RDMA_TX_SLOTS_OLD  # SENDs in flight (1 = stop-and-wait)
    recv_depth: int = RDMA_RX_RING  # receive buffers posted at activation
    recv_policy: str = WHOLE_COMPLETION
    send_framing: str = C_OLD  # how outgoing bytes become send_data calls
    read_calls: str = C_OLD  # which recv_data calls a whole-completion receiver checks against
    on_oversize: str = "raise"  # whole-completion only: "raise" (detect) or "drop" (clamp)
    data_read_piece: int | None = None  # c-new reads: SET_TENSOR data read in such pieces
    timeout: float = 30.0  # every wait
    platform: str = LINUX  # conn_caps layout

    def __post_init__(self):
        if self.recv_policy not in RECV_POLICIES:
            raise ValueError(f"recv_policy must be one of {RECV_POLICIES}")
        if self.send_framing not in SEND_FRAMINGS:
            raise ValueError(f"send_framing must be one of {SEND_FRAMINGS}")
        if self.read_calls not in READ_CALLS:
            raise ValueError(f"read_calls must be one of {READ_CALLS}")
        if self.on_oversize not in ("raise", "drop"):
            raise ValueError("on_oversize must be 'raise' or 'drop'")
        if self.platform not in (LINUX, MACOS):
            raise ValueError(f"platform must be {LINUX} or {MACOS}")
        if min(self.chunk, self.send_slots, self.recv_depth) < 1:
            raise ValueError("chunk, send_slots and recv_depth must be >= 1")

    def with_(self, **kw) -> "RdmaConfig":
        return replace(self, **kw)


# proto 7 (and 8): stop-and-wait, whole-completion receive, C framing of proto 7
OLD = RdmaConfig(name="proto-7")
# seed 000 branch: 8-slot send ring drained at flush, partial receive, split SET_TENSOR
SEED000 = RdmaConfig(name="seed-000", send_slots=RDMA_TX_SLOTS_NEW, recv_policy=PARTIAL,
                     send_framing=C_NEW, read_calls=C_NEW)
# upstream 9.0.0: partial receive only (no send pipelining described), split SET_TENSOR,
# server reads SET_TENSOR data through a 16 MiB buffer
V9 = RdmaConfig(name="9.0.0", recv_policy=PARTIAL, send_framing=C_NEW, read_calls=C_NEW,
                data_read_piece=SERVER_STREAM_CHUNK_9)
GENERATIONS = {"old": OLD, "seed-000": SEED000, "9.0.0": V9}


def config_for_dialect(dialect: Dialect | str) -> RdmaConfig:
    """The RDMA generation a peer of ``dialect`` has. GGML_RPC_LOAD_OPT=0 on a seed-000 build
    sends like OLD but keeps the partial receive (docs/RDMA.md, section 1)."""
    name = get_dialect(dialect).name
    if name == "7.0.0+flags":
        return SEED000
    if name == "9.0.0":
        return V9
    return OLD


# ---------------------------------------------------------------- sans-IO core

class CallCutter:
    """Where a C peer's ``send_data`` / ``recv_data`` calls begin and end in one direction.

    Requests are ``[cmd 1][len 8][payload len]`` (no payload call when len is 0); the new
    generation splits SET_TENSOR's payload into ``[header 305][data]``, the data optionally in
    pieces (9.0.0 reads it through a 16 MiB buffer). Responses are ``[len 8][payload]``. The
    cutter only parses the cmd byte and the length, so it follows garbage as a C peer would.
    """

    def __init__(self, direction: str, *, split_set_tensor: bool = False,
                 data_piece: int | None = None, dialect: Dialect | str = D700):
        if direction not in (REQUEST, RESPONSE):
            raise ValueError(f"direction must be {REQUEST!r} or {RESPONSE!r}")
        self.direction = direction
        self.split_set_tensor = split_set_tensor
        self.data_piece = data_piece
        self.set_tensor_id = get_dialect(dialect).id_of(Cmd.SET_TENSOR)
        self.calls = 0  # calls completed so far
        self._cmd: int | None = None
        self._len = bytearray()
        self._data_left = 0
        self._kind, self._size, self._left = "", 0, 0
        self._start_frame()

    @property
    def kind(self) -> str:
        """The current call: cmd, len, payload, set_tensor header, set_tensor data."""
        return self._kind

    @property
    def size(self) -> int:
        return self._size

    @property
    def remaining(self) -> int:
        return self._left

    def _set(self, kind: str, size: int) -> None:
        self._kind, self._size, self._left = kind, size, size

    def _start_frame(self) -> None:
        if self.direction == REQUEST:
            self._set("cmd", 1)
        else:
            self._set("len", 8)

    def advance(self, data) -> list[tuple[int, bool]]:
        """Consume ``data``; returns its segments as ``(length, ends_a_call)``."""
        view = memoryview(data).cast("B") if not isinstance(data, (bytes, bytearray)) else data
        segs = []
        i, n = 0, len(view)
        while i < n:
            k = min(self._left, n - i)
            if self._kind == "cmd":
                self._cmd = view[i]
            elif self._kind == "len":
                self._len += view[i:i + k]
            self._left -= k
            i += k
            ends = self._left == 0
            segs.append((k, ends))
            if ends:
                self.calls += 1
                self._next_call()
        return segs

    def _next_call(self) -> None:
        kind = self._kind
        if kind == "cmd":
            self._set("len", 8)
        elif kind == "len":
            (length,) = struct.unpack("<Q", self._len)
            self._len.clear()
            if length == 0:
                self._start_frame()
            elif (self.direction == REQUEST and self.split_set_tensor
                  and self._cmd == self.set_tensor_id and length > SET_TENSOR_HEADER_SIZE):
                self._data_left = length - SET_TENSOR_HEADER_SIZE
                self._set("set_tensor header", SET_TENSOR_HEADER_SIZE)
            else:
                self._set("payload", length)
        elif kind in ("set_tensor header", "set_tensor data") and self._data_left:
            piece = min(self._data_left, self.data_piece or self._data_left)
            self._data_left -= piece
            self._set("set_tensor data", piece)
        else:
            self._start_frame()


def make_cutter(calls: str, direction: str, *, data_piece: int | None = None,
                dialect: Dialect | str = D700) -> CallCutter | None:
    """The C call plan for ``calls`` (c-old, c-new), or None for the caller's own boundaries."""
    if calls in (WRITES, APP):
        return None
    return CallCutter(direction, split_set_tensor=calls == C_NEW,
                      data_piece=data_piece if calls == C_NEW else None, dialect=dialect)


class SendFramer:
    """Application writes -> ``send_data`` calls -> SEND pieces of at most ``chunk`` bytes.

    Without a cutter every write is one call. With one, the call boundaries come from the
    stream itself and pieces are cut from each call's start; bytes of an unfinished call wait
    (at most one chunk) until the call completes or ``flush``.
    """

    def __init__(self, chunk: int, cutter: CallCutter | None = None):
        self.chunk = chunk
        self.cutter = cutter
        self._pending = bytearray()

    def write(self, data) -> Iterator[bytes]:
        view = memoryview(data).cast("B")
        chunk = self.chunk
        if self.cutter is None:
            for i in range(0, len(view), chunk):
                yield bytes(view[i:i + chunk])
            return
        pos = 0
        for k, ends in self.cutter.advance(view):
            seg = view[pos:pos + k]
            pos += k
            j = 0
            while j < k:
                take = min(chunk - len(self._pending), k - j)
                if not self._pending and take == chunk:
                    yield bytes(seg[j:j + take])  # whole chunk straight from the caller
                else:
                    self._pending += seg[j:j + take]
                    if len(self._pending) == chunk:
                        yield bytes(self._pending)
                        self._pending.clear()
                j += take
            if ends and self._pending:
                yield bytes(self._pending)
                self._pending.clear()

    def flush(self) -> list[bytes]:
        """Bytes of an unfinished call (a misbehaving or truncating sender) go out now."""
        out = [bytes(self._pending)] if self._pending else []
        self._pending.clear()
        return out


class CompletionReader:
    """Receive completions in order and serve the application's reads under a policy.

    ``partial``: a cursor over the current completion serves reads of any size; the slot is
    released (reposted) when the completion is consumed. ``whole-completion``: each completion
    goes whole into the current ``recv_data`` call; with a cutter, the calls are the C peer's
    (checked when the completion arrives, then served to the application from the copy), else
    every ``read_into`` is a call (checked against the caller's buffer).
    """

    def __init__(self, policy: str, *, cutter: CallCutter | None = None,
                 on_oversize: str = "raise"):
        if policy not in RECV_POLICIES:
            raise ValueError(f"policy must be one of {RECV_POLICIES}")
        self.policy = policy
        self.cutter = cutter if policy == WHOLE_COMPLETION else None
        self.on_oversize = on_oversize
        self.completions = 0
        self.delivered = 0  # bytes handed to the application
        self.dropped = 0  # bytes lost to oversize completions (on_oversize="drop")
        self._cur: memoryview | None = None
        self._off = 0
        self._received = 0  # bytes of all completions so far (stream offset)

    def wants_completion(self) -> bool:
        return self._cur is None

    def give(self, completion) -> None:
        assert self._cur is None, "previous completion not consumed"
        data = memoryview(completion).cast("B")
        index = self.completions
        self.completions += 1
        offset = self._received
        self._received += len(data)
        cut = self.cutter
        if cut is not None and len(data) > cut.remaining:
            if self.on_oversize == "raise":
                raise RdmaOverrun(completion_index=index, byte_len=len(data),
                                  call_kind=cut.kind, call_size=cut.size,
                                  call_remaining=cut.remaining, stream_offset=offset)
            self.dropped += len(data) - cut.remaining
            data = data[:cut.remaining]
        if cut is not None:
            cut.advance(data)
        self._cur, self._off = data, 0

    def read_into(self, buf: memoryview) -> tuple[int, int]:
        """Copy into ``buf``; returns (bytes copied, receive slots released: 0 or 1)."""
        cur = self._cur
        assert cur is not None, "no completion to read from"
        left = len(cur) - self._off
        if self.policy == WHOLE_COMPLETION and self.cutter is None and left > len(buf):
            if self.on_oversize == "raise":
                raise RdmaOverrun(completion_index=self.completions - 1, byte_len=len(cur),
                                  call_kind="recv_into", call_size=len(buf),
                                  call_remaining=len(buf),
                                  stream_offset=self._received - len(cur))
            self.dropped += left - len(buf)
            left = len(buf)  # clamp: the rest of the completion is lost with its slot
            buf[:left] = cur[self._off:self._off + left]
            self.delivered += left
            self._cur = None
            return left, 1
        n = min(len(buf), left)
        buf[:n] = cur[self._off:self._off + n]
        self._off += n
        self.delivered += n
        if self._off == len(cur):
            self._cur = None
            return n, 1
        return n, 0


@dataclass
class TransferResult:
    received: bytes
    completions: list[int]  # byte_len of every SEND, in order
    error: RdmaOverrun | None = None
    dropped: int = 0
    reads: int = 0

    @property
    def intact(self) -> bool:
        return self.error is None and not self.dropped


def cut_writes(stream: bytes, write_sizes: Sequence[int] | None) -> list[bytes]:
    """``stream`` cut into writes of the given sizes (the remainder is one last write)."""
    out, pos = [], 0
    for n in write_sizes or ():
        if pos >= len(stream):
            break
        out.append(stream[pos:pos + n])
        pos += n
    if pos < len(stream):
        out.append(stream[pos:])
    return out


def simulate_transfer(stream: bytes, *, write_sizes: Sequence[int] | None = None,
                      read_sizes: Sequence[int] | None = None, chunk: int = RDMA_CHUNK,
                      recv_policy: str = PARTIAL, send_framing: str = WRITES,
                      read_calls: str = APP, direction: str = REQUEST,
                      on_oversize: str = "raise", data_read_piece: int | None = None,
                      dialect: Dialect | str = D700) -> TransferResult:
    """One direction of the data path without threads: the fuzzing model.

    The sender writes ``stream`` in ``write_sizes`` pieces (each a send_data call when
    ``send_framing`` is ``writes``); the receiver reads with ``read_sizes`` in turn (cycled;
    default: everything at once). Content does not depend on flow control, so there is none.
    """
    framer = SendFramer(chunk, make_cutter(send_framing, direction, dialect=dialect))
    completions: list[bytes] = []
    for w in cut_writes(stream, write_sizes):
        completions.extend(framer.write(w))
    completions.extend(framer.flush())
    reader = CompletionReader(recv_policy, on_oversize=on_oversize,
                              cutter=make_cutter(read_calls, direction,
                                                 data_piece=data_read_piece, dialect=dialect))
    sizes = list(read_sizes or [max(1, len(stream))])
    out = bytearray()
    res = TransferResult(b"", [len(c) for c in completions])
    queue = deque(completions)
    i = 0
    try:
        while True:
            if reader.wants_completion():
                if not queue:
                    break
                reader.give(queue.popleft())
                continue
            buf = memoryview(bytearray(sizes[i % len(sizes)]))
            i += 1
            n, _ = reader.read_into(buf)
            res.reads += 1
            out += buf[:n]
    except RdmaOverrun as e:
        res.error = e
    res.received = bytes(out)
    res.dropped = reader.dropped
    return res


# ---------------------------------------------------------------- fabrics

class _Eof:
    def __repr__(self) -> str:
        return "EOF"


EOF = _Eof()


def _wait(cond: threading.Condition, deadline: float) -> bool:
    """One bounded wait on ``cond`` (held); False once the deadline has passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        return False
    cond.wait(min(left, 0.5))
    return True


@dataclass
class WireStats:
    sends: int = 0
    rnr_waits: int = 0  # SENDs posted while the receiver had no free receive posted
    max_in_flight: int = 0
    max_landed: int = 0  # most unconsumed completions this side's receive ring ever held


class _Wire:
    """This endpoint's view of one emulated RC connection (both directions).

    Sending: ``send`` posts one SEND (waits while ``slots`` are in flight), ``wait_sends``
    waits until every SEND completed. Receiving: ``post_receives`` (re)posts buffers,
    ``poll`` returns one completion, EOF or None.
    """

    stats: WireStats
    local_qpn: int
    peer_qpn: int
    gid: bytes | None = None  # the device GID to advertise (None: the TCP address's)

    def activate(self, peer: LinuxCaps | MacCaps, recv_depth: int) -> None:
        """Connect to the peer's QP and post the receive ring (QP INIT, receives, RTR, RTS)."""
        self.connect(peer.qpn)
        self.post_receives(recv_depth)

    def connect(self, remote_qpn: int) -> None: ...
    def send(self, piece: bytes, slots: int, deadline: float, hang: Callable[[str], Exception]) -> None: ...
    def wait_sends(self, deadline: float, hang: Callable[[str], Exception]) -> None: ...
    def post_receives(self, n: int) -> None: ...
    def poll(self, timeout: float): ...
    def finish_sending(self) -> None: ...
    def close(self, fin: bool = True) -> None: ...
    def peer_active(self) -> bool: ...
    def reachable(self) -> bool: ...
    def in_flight(self) -> int: ...


class _Link:
    """One direction in memory: the sender's SENDs in flight, the receiver's posted buffers
    and its completion queue. A SEND lands only into a posted buffer (RNR otherwise)."""

    def __init__(self):
        self.cond = threading.Condition()
        self.in_flight: deque[bytes] = deque()
        self.posted = 0
        self.landed: deque[bytes] = deque()
        self.reachable = True
        self.sender_done = False
        self.receiver_gone = False
        self.receiver_active = False
        self.stats = WireStats()  # sender-side numbers of this direction
        self.max_landed = 0  # receiver-side

    def deliver(self) -> None:  # cond held
        moved = False
        while self.reachable and self.in_flight and self.posted:
            self.posted -= 1
            self.landed.append(self.in_flight.popleft())
            moved = True
        self.max_landed = max(self.max_landed, len(self.landed))
        if moved:
            self.cond.notify_all()


class _MemoryWire(_Wire):
    def __init__(self, tx: _Link, rx: _Link, local_qpn: int, peer_qpn: int):
        self.tx, self.rx = tx, rx
        self.local_qpn, self.peer_qpn = local_qpn, peer_qpn

    @property
    def stats(self) -> WireStats:
        """This endpoint's view: its sends, and its own receive ring."""
        return replace(self.tx.stats, max_landed=self.rx.max_landed)

    def connect(self, remote_qpn: int) -> None:
        with self.tx.cond:
            self.tx.reachable = remote_qpn == self.peer_qpn  # a lie names no QP: nothing lands
            self.tx.deliver()

    def send(self, piece, slots, deadline, hang) -> None:
        tx = self.tx
        with tx.cond:
            while len(tx.in_flight) >= slots and not tx.receiver_gone:
                if not _wait(tx.cond, deadline):
                    raise hang(f"send ring full ({len(tx.in_flight)} of {slots} SENDs in flight)")
            if tx.receiver_gone:
                raise TransportClosed("the peer closed its end of the RDMA connection")
            tx.in_flight.append(piece)
            tx.stats.sends += 1
            if not (tx.posted and tx.reachable):
                tx.stats.rnr_waits += 1
            tx.stats.max_in_flight = max(tx.stats.max_in_flight, len(tx.in_flight))
            tx.deliver()

    def wait_sends(self, deadline, hang) -> None:
        tx = self.tx
        with tx.cond:
            while tx.in_flight and not tx.receiver_gone:
                if not _wait(tx.cond, deadline):
                    raise hang(f"{len(tx.in_flight)} SENDs never completed")

    def post_receives(self, n: int) -> None:
        rx = self.rx
        with rx.cond:
            rx.posted += n
            rx.receiver_active = True
            rx.deliver()

    def poll(self, timeout: float):
        rx = self.rx
        deadline = time.monotonic() + timeout
        with rx.cond:
            while not rx.landed and not (rx.sender_done and not rx.in_flight):
                if not _wait(rx.cond, deadline):
                    return None
            if rx.landed:
                piece = rx.landed.popleft()
                rx.cond.notify_all()
                return piece
            return EOF

    def finish_sending(self) -> None:
        with self.tx.cond:
            self.tx.sender_done = True
            self.tx.cond.notify_all()

    def close(self, fin: bool = True) -> None:
        # A destroyed QP tells the peer nothing: it learns from TCP. ``fin`` (an active side
        # closing) only orders "no more data" after the last SEND, as the TCP check would.
        if fin:
            self.finish_sending()
        with self.rx.cond:
            self.rx.receiver_gone = True
            self.rx.landed.clear()  # bounded memory: nobody will read these
            self.rx.in_flight.clear()
            self.rx.cond.notify_all()

    def peer_active(self) -> bool:
        return self.tx.receiver_active

    def reachable(self) -> bool:
        return self.tx.reachable

    def in_flight(self) -> int:
        return len(self.tx.in_flight)


_DATA, _POST, _FIN = 1, 2, 3
_RECORD = struct.Struct("<BI")  # kind, then DATA length or POST count


class _SocketWire(_Wire):
    """The connection over a stream socket. Each SEND is one DATA record, so record
    boundaries are completions; receives posted by the peer come back as POST records
    (credits), the end of sending as FIN. A writer thread plays the NIC (it sends queued
    SENDs whenever the peer has buffers posted), a reader thread the receive side."""

    def __init__(self, sock: socket.socket, local_qpn: int, peer_qpn: int, name: str = "rdma"):
        self.sock = sock
        sock.setblocking(True)
        self.local_qpn, self.peer_qpn = local_qpn, peer_qpn
        self.stats = WireStats()
        self.cond = threading.Condition()
        # sending half
        self._in_flight: deque[bytes] = deque()
        self._credits = 0
        self._reachable = True
        self._peer_gone = False
        self._fin_pending = False
        self._control: deque[bytes] = deque()
        self._peer_active = False
        # receiving half
        self._landed: deque[bytes] = deque()
        self._eof = False
        self._closed = False
        self._writer = threading.Thread(target=self._write_loop, name=f"{name}-nic", daemon=True)
        self._reader = threading.Thread(target=self._read_loop, name=f"{name}-rx", daemon=True)
        self._writer.start()
        self._reader.start()

    # -- threads
    def _write_loop(self) -> None:
        while True:
            with self.cond:
                while not self._closed:
                    if self._control:
                        record, is_data = self._control.popleft(), False
                        break
                    if self._in_flight and self._credits and self._reachable:
                        self._credits -= 1
                        piece = self._in_flight[0]
                        record, is_data = _RECORD.pack(_DATA, len(piece)) + piece, True
                        break
                    if self._fin_pending and not self._in_flight:
                        self._fin_pending = False
                        record, is_data = _RECORD.pack(_FIN, 0), False
                        break
                    self.cond.wait(0.2)
                else:
                    return
            try:
                self.sock.sendall(record)
            except OSError:
                with self.cond:
                    self._peer_gone = True
                    self.cond.notify_all()
                return
            if is_data:
                with self.cond:
                    self._in_flight.popleft()
                    self.cond.notify_all()

    def _recv_exact(self, n: int) -> bytes | None:
        buf = bytearray()
        while len(buf) < n:
            try:
                chunk = self.sock.recv(n - len(buf))
            except OSError:
                return None
            if not chunk:
                return None
            buf += chunk
        return bytes(buf)

    def _read_loop(self) -> None:
        while True:
            with self.cond:
                if self._closed:
                    return
            try:
                ready, _, _ = select.select([self.sock], [], [], 0.2)
            except (OSError, ValueError):
                ready = None
            if ready == []:
                continue
            head = self._recv_exact(_RECORD.size) if ready else None
            kind, n = _RECORD.unpack(head) if head else (None, 0)
            data = self._recv_exact(n) if kind == _DATA else b""
            with self.cond:
                if head is None or (kind == _DATA and data is None):
                    self._peer_gone = True  # like a destroyed QP: the receiver learns via TCP
                elif kind == _DATA:
                    self._landed.append(data)
                    self.stats.max_landed = max(self.stats.max_landed, len(self._landed))
                elif kind == _POST:
                    self._credits += n
                    self._peer_active = True
                elif kind == _FIN:
                    self._eof = True
                self.cond.notify_all()
                if self._peer_gone:
                    return

    # -- sending
    def connect(self, remote_qpn: int) -> None:
        with self.cond:
            self._reachable = remote_qpn == self.peer_qpn
            self.cond.notify_all()

    def send(self, piece, slots, deadline, hang) -> None:
        with self.cond:
            while len(self._in_flight) >= slots and not self._peer_gone:
                if not _wait(self.cond, deadline):
                    raise hang(f"send ring full ({len(self._in_flight)} of {slots} SENDs in flight)")
            if self._peer_gone:
                raise TransportClosed("the peer closed its end of the RDMA connection")
            self._in_flight.append(piece)
            self.stats.sends += 1
            if not (self._credits and self._reachable):
                self.stats.rnr_waits += 1
            self.stats.max_in_flight = max(self.stats.max_in_flight, len(self._in_flight))
            self.cond.notify_all()

    def wait_sends(self, deadline, hang) -> None:
        with self.cond:
            while self._in_flight and not self._peer_gone:
                if not _wait(self.cond, deadline):
                    raise hang(f"{len(self._in_flight)} SENDs never completed")

    def finish_sending(self) -> None:
        with self.cond:
            self._fin_pending = True
            self.cond.notify_all()

    # -- receiving
    def post_receives(self, n: int) -> None:
        with self.cond:
            self._control.append(_RECORD.pack(_POST, n))
            self.cond.notify_all()

    def poll(self, timeout: float):
        deadline = time.monotonic() + timeout
        with self.cond:
            while not self._landed and not self._eof:
                if not _wait(self.cond, deadline):
                    return None
            if self._landed:
                return self._landed.popleft()
            return EOF

    def close(self, fin: bool = True) -> None:
        if fin:  # let the NIC thread put FIN after the last DATA record (bounded wait)
            self.finish_sending()
            deadline = time.monotonic() + 1.0
            with self.cond:
                while (self._fin_pending or self._in_flight) and not self._peer_gone:
                    if not _wait(self.cond, deadline):
                        break
        with self.cond:
            if self._closed:
                return
            self._closed = True
            self._landed.clear()
            self.cond.notify_all()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes a reader blocked in recv
        except OSError:
            pass
        for t in (self._writer, self._reader):
            if t is not threading.current_thread():
                t.join(2.0)
        self.sock.close()

    def peer_active(self) -> bool:
        with self.cond:
            return self._peer_active

    def reachable(self) -> bool:
        return self._reachable

    def in_flight(self) -> int:
        return len(self._in_flight)


class _NullWire(_Wire):
    """No emulated peer behind the TCP connection (e.g. a real C client): nothing ever lands."""

    def __init__(self, local_qpn: int):
        self.local_qpn, self.peer_qpn = local_qpn, 0
        self.stats = WireStats()

    def connect(self, remote_qpn): pass

    def send(self, piece, slots, deadline, hang):
        raise hang("no emulated RDMA peer behind this connection: the SEND cannot complete")

    def wait_sends(self, deadline, hang): pass

    def post_receives(self, n): pass

    def poll(self, timeout):
        time.sleep(min(timeout, 0.05))

    def finish_sending(self): pass

    def close(self, fin=True): pass

    def peer_active(self): return False

    def reachable(self): return False

    def in_flight(self): return 0


_qpn_lock = threading.Lock()
_qpns = itertools.count(0x000100)


def _next_qpn() -> int:
    with _qpn_lock:
        return next(_qpns) & 0xFFFFFF or next(_qpns)


def _make_wires(fabric: str, client_qpn: int, server_qpn: int) -> tuple[_Wire, _Wire]:
    if fabric == MEMORY:
        c2s, s2c = _Link(), _Link()
        return (_MemoryWire(c2s, s2c, client_qpn, server_qpn),
                _MemoryWire(s2c, c2s, server_qpn, client_qpn))
    if fabric == SOCKET:
        a, b = socket.socketpair()
        return (_SocketWire(a, client_qpn, server_qpn, f"qp{client_qpn:x}"),
                _SocketWire(b, server_qpn, client_qpn, f"qp{server_qpn:x}"))
    raise ValueError(f"fabric must be {MEMORY!r} or {SOCKET!r}")


# ---------------------------------------------------------------- endpoint

@dataclass
class EndpointStats:
    sends: int = 0  # SENDs posted (one completion each at the peer)
    send_bytes: int = 0
    largest_send: int = 0
    completions: int = 0  # receive completions taken
    recv_bytes: int = 0
    flushes: int = 0
    overruns: int = 0
    dropped: int = 0
    tcp_hangup_seen: bool = False  # EOF came from the TCP liveness check


class RdmaEmuEndpoint:
    """One side of an emulated connection; a :class:`harness.transport.base.Transport`.

    Until :meth:`upgrade` activates RDMA every call goes to the TCP transport (HELLO travels
    there). The peers call two hooks around HELLO: :meth:`local_conn_caps` for the bytes to
    advertise and :meth:`upgrade` with the peer's bytes once the HELLO exchange is done.
    """

    def __init__(self, tcp: TcpTransport, wire: _Wire, config: RdmaConfig = OLD, *,
                 role: str, caps_policy: str = ADVERTISE, timeout: float | None = None,
                 transcript: Transcript | None = None, dialect: Dialect | str = D700):
        if role not in (CLIENT, SERVER):
            raise ValueError(f"role must be {CLIENT!r} or {SERVER!r}")
        probe_ok(caps_policy)  # validates the policy name
        self.tcp = tcp
        self.wire = wire
        self.config = config
        self.role = role
        self.peer_role = SERVER if role == CLIENT else CLIENT
        self.caps_policy = caps_policy
        self.qpn = wire.local_qpn
        self.timeout = config.timeout if timeout is None else timeout
        tcp.settimeout(self.timeout)
        self.transcript = transcript
        self.active = False
        self.advertised: bytes | None = None
        self.peer_caps: bytes | None = None
        self.diagnosis: str | None = None  # why the last wait ran out
        self.failure: RdmaError | None = None
        self.stats = EndpointStats()
        self.closed = False
        out_dir, in_dir = (REQUEST, RESPONSE) if role == CLIENT else (RESPONSE, REQUEST)
        self._sent_dir, self._recv_dir = (C2S, S2C) if role == CLIENT else (S2C, C2S)
        self.framer = SendFramer(config.chunk, make_cutter(config.send_framing, out_dir,
                                                           dialect=dialect))
        self.reader = CompletionReader(
            config.recv_policy, on_oversize=config.on_oversize,
            cutter=make_cutter(config.read_calls, in_dir, data_piece=config.data_read_piece,
                               dialect=dialect))

    # ------------------------------------------------------------ HELLO hooks (spec 10.1)
    def real_caps(self) -> bytes:
        gid = self.wire.gid or gid_for_ipv4(self.tcp.sock.getsockname()[0])
        if self.config.platform == MACOS:
            return pack_macos(self.qpn, 0, gid)
        return pack_linux(self.qpn, gid)

    def local_conn_caps(self) -> bytes:
        """The conn_caps this side puts in its HELLO part (per its caps policy)."""
        self.advertised = advertised_caps(self.caps_policy, self.real_caps())
        return self.advertised

    def upgrade(self, peer_caps: bytes) -> bool:
        """Apply the peer's caps after HELLO; True when this side switched to RDMA.

        Linux activation is local (QP to RTR/RTS, ``recv_depth`` receives posted) with no
        confirmation, so nothing is exchanged with the peer here.
        """
        self.peer_caps = bytes(peer_caps)
        if self.active or not activates(self.caps_policy, self.peer_caps):
            return self.active
        self.wire.activate(unpack(self.peer_caps, self.config.platform), self.config.recv_depth)
        self.active = True
        return True

    # ------------------------------------------------------------ Transport
    def settimeout(self, seconds: float | None) -> None:
        self.timeout = self.config.timeout if seconds is None else seconds  # never unbounded
        self.tcp.settimeout(self.timeout)

    def _record(self, direction: str, data) -> None:
        if self.transcript is not None and len(data):
            self.transcript.add(time.time(), direction, bytes(data))

    def _check(self) -> None:
        if self.failure is not None:
            raise self.failure
        if self.closed:
            raise TransportClosed("endpoint closed")

    def sendall(self, data) -> None:
        self._check()
        self._record(self._sent_dir, data)
        if not self.active:
            try:
                self.tcp.sendall(data)
            except TimeoutError:
                raise self._hang("TCP send did not complete") from None
            return
        for piece in self.framer.write(data):
            self._post(piece)

    def sendall_parts(self, parts: Sequence) -> None:
        if not self.active:
            self._check()
            for p in parts:
                self._record(self._sent_dir, memoryview(p).cast("B"))
            self.tcp.sendall_parts(parts)
            return
        for p in parts:  # each part is its own send_data call under "writes" framing
            self.sendall(memoryview(p).cast("B"))

    def _post(self, piece: bytes) -> None:
        deadline = time.monotonic() + self.timeout
        self.wire.send(piece, self.config.send_slots, deadline, self._hang)
        st = self.stats
        st.sends += 1
        st.send_bytes += len(piece)
        st.largest_send = max(st.largest_send, len(piece))
        if self.config.send_slots == 1:
            # proto 7 polls every SEND to completion before it posts the next
            self.wire.wait_sends(deadline, self._hang)

    def flush(self) -> None:
        self._check()
        if not self.active:
            self.tcp.flush()
            return
        for piece in self.framer.flush():
            self._post(piece)
        # the seed-000 sender drains its ring at every message boundary
        self.wire.wait_sends(time.monotonic() + self.timeout, self._hang)
        self.stats.flushes += 1

    def recv_into(self, buf) -> int:
        self._check()
        view = memoryview(buf)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        if not self.active:
            try:
                n = self.tcp.recv_into(view)
            except TimeoutError:
                raise self._hang("no TCP data") from None
            self._record(self._recv_dir, view[:n])
            return n
        if not len(view):
            return 0
        try:
            while self.reader.wants_completion():
                comp = self._next_completion()
                if comp is None:
                    return 0
                self.stats.completions += 1
                self.reader.give(comp)
            n, released = self.reader.read_into(view)
        except RdmaOverrun as e:
            self.failure = e
            self.stats.overruns += 1
            raise
        finally:
            self.stats.dropped = self.reader.dropped
        if released:
            self.wire.post_receives(released)
        self.stats.recv_bytes += n
        self._record(self._recv_dir, view[:n])
        return n

    def _next_completion(self) -> bytes | None:
        deadline = time.monotonic() + self.timeout
        while True:
            left = deadline - time.monotonic()
            got = self.wire.poll(max(0.0, min(LIVENESS_INTERVAL, left)))
            if got is EOF:
                return None
            if got is not None:
                return got
            # the C receiver checks now and then whether the TCP peer hung up
            if self._tcp_pending() < 0:
                self.stats.tcp_hangup_seen = True
                return None
            if time.monotonic() >= deadline:
                raise self._hang("no RDMA completion")

    def shutdown_write(self) -> None:
        if self.active and self.failure is None and not self.closed:
            try:
                self.flush()
            except (RdmaError, TransportClosed):
                pass
            self.wire.finish_sending()
        self.tcp.shutdown_write()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.wire.close(fin=self.active)
        self.tcp.close()

    # ------------------------------------------------------------ diagnosis
    def _tcp_pending(self) -> int:
        """Bytes waiting on the TCP socket; -1 when the peer hung up. Never blocks."""
        sock = self.tcp.sock
        try:
            readable, _, _ = select.select([sock], [], [], 0)
            if not readable:
                return 0
            data = sock.recv(1 << 16, socket.MSG_PEEK)  # readable: returns at once
        except (BlockingIOError, InterruptedError, TimeoutError):
            return 0
        except (OSError, ValueError):
            return -1
        return len(data) if data else -1

    def diagnose(self) -> str:
        """Why nothing gets through, in terms of the negotiation (spec 10.4)."""
        me, peer = self.role, self.peer_role
        pending = self._tcp_pending()
        if self.active:
            if pending > 0:
                return (f"asymmetric activation: the {me} switched to RDMA after HELLO but the "
                        f"{peer} still talks TCP ({pending} bytes wait on the TCP socket)")
            if not self.wire.peer_active():
                return (f"asymmetric activation: the {me} switched to RDMA after HELLO but the "
                        f"{peer} never posted receives (it stayed on TCP)")
            if not self.wire.reachable():
                return (f"the {me}'s QP targets the qpn in the {peer}'s caps, which names no "
                        f"queue pair (caps lie)")
            if pending < 0:
                return f"the {peer} hung up"
            return f"RDMA active on both sides; the {peer} sent nothing (stalled or waiting too)"
        if self.wire.peer_active():
            why = ("its own RDMA is withheld" if not probe_ok(self.caps_policy) else
                   f"the {peer}'s caps were zero" if self.peer_caps is not None
                   and not supports_rdma(self.peer_caps) else "it never applied the caps")
            return (f"asymmetric activation: the {me} stayed on TCP ({why}) but the {peer} "
                    f"switched to RDMA and posted its receive ring")
        if pending < 0:
            return f"the {peer} hung up"
        return f"TCP on both sides; the {peer} sent nothing"

    def _hang(self, what: str) -> RdmaHang:
        self.diagnosis = f"{what} within {self.timeout:g} s: {self.diagnose()}"
        return RdmaHang(self.diagnosis)

    # ------------------------------------------------------------ observability
    @property
    def wire_stats(self) -> WireStats:
        return self.wire.stats

    def summary(self) -> dict:
        return {"role": self.role, "generation": self.config.name, "active": self.active,
                "caps_policy": self.caps_policy,
                "advertised": self.advertised.hex() if self.advertised is not None else None,
                "peer_caps": self.peer_caps.hex() if self.peer_caps is not None else None,
                "stats": self.stats.__dict__, "wire": self.wire.stats.__dict__,
                "diagnosis": self.diagnosis,
                "failure": self.failure.to_dict() if isinstance(self.failure, RdmaOverrun)
                else (str(self.failure) if self.failure else None)}


@dataclass
class RdmaCheck:
    """An RDMA-specific check of one connection (same fields as harness.matrix Check)."""

    name: str
    ok: bool
    evidence: str = ""


def rdma_checks(client: RdmaEmuEndpoint, server: RdmaEmuEndpoint, *,
                expect_rdma: bool = True) -> list[RdmaCheck]:
    """What must hold on an emulated-RDMA connection besides the scenario's own checks."""
    out = []
    if expect_rdma:
        out.append(RdmaCheck("both sides switched to RDMA after HELLO",
                             client.active and server.active,
                             f"client {'on' if client.active else 'off'}, "
                             f"server {'on' if server.active else 'off'}"))
    for ep in (client, server):
        cfg, st, ws = ep.config, ep.stats, ep.wire.stats
        out.append(RdmaCheck(f"{ep.role}: no receive overrun or lost bytes",
                             not st.overruns and not st.dropped and
                             not isinstance(ep.failure, RdmaOverrun),
                             str(ep.failure) if ep.failure else f"{st.completions} completions"))
        out.append(RdmaCheck(f"{ep.role}: no wait ran out", ep.diagnosis is None,
                             ep.diagnosis or ""))
        out.append(RdmaCheck(f"{ep.role}: every SEND <= chunk, in flight <= slots",
                             st.largest_send <= cfg.chunk and ws.max_in_flight <= cfg.send_slots,
                             f"largest {st.largest_send}, max in flight {ws.max_in_flight}"))
        out.append(RdmaCheck(f"{ep.role}: receive ring never over-filled",
                             ws.max_landed <= cfg.recv_depth,
                             f"most waiting {ws.max_landed}, depth {cfg.recv_depth}"))
    return out


# ---------------------------------------------------------------- construction

def tcp_socket_pair(timeout: float = 10.0) -> tuple[socket.socket, socket.socket]:
    """A connected loopback TCP pair (client, server): HELLO travels over real TCP."""
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(1)
        lsock.settimeout(timeout)
        c = socket.create_connection(lsock.getsockname(), timeout=timeout)
        s, _ = lsock.accept()
    finally:
        lsock.close()
    return c, s


@dataclass
class EmuPair:
    client: RdmaEmuEndpoint
    server: RdmaEmuEndpoint

    def close(self) -> None:
        self.client.close()
        self.server.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def checks(self, *, expect_rdma: bool = True) -> list[RdmaCheck]:
        return rdma_checks(self.client, self.server, expect_rdma=expect_rdma)


def emu_pair(client: RdmaConfig = OLD, server: RdmaConfig = OLD, *, fabric: str = MEMORY,
             client_policy: str = ADVERTISE, server_policy: str = ADVERTISE,
             timeout: float | None = None, record: bool = False,
             dialect: Dialect | str = D700) -> EmuPair:
    """Two connected endpoints (client, server) in this process."""
    cq, sq = _next_qpn(), _next_qpn()
    cwire, swire = _make_wires(fabric, cq, sq)
    csock, ssock = tcp_socket_pair()
    t = timeout
    return EmuPair(
        RdmaEmuEndpoint(TcpTransport(csock, t or client.timeout), cwire, client, role=CLIENT,
                        caps_policy=client_policy, timeout=t,
                        transcript=Transcript() if record else None, dialect=dialect),
        RdmaEmuEndpoint(TcpTransport(ssock, t or server.timeout), swire, server, role=SERVER,
                        caps_policy=server_policy, timeout=t,
                        transcript=Transcript() if record else None, dialect=dialect))


class _Rendezvous:
    """Pairs a client endpoint with the connection a listener accepts, by TCP 4-tuple."""

    def __init__(self):
        self.cond = threading.Condition()
        self.waiting: dict[tuple, tuple[_Wire, float]] = {}

    def offer(self, key: tuple, wire: _Wire) -> None:
        with self.cond:
            now = time.monotonic()
            for k in [k for k, (_, t) in self.waiting.items() if now - t > 60]:
                self.waiting.pop(k)[0].close()  # never picked up: bounded registry
            self.waiting[key] = (wire, now)
            self.cond.notify_all()

    def take(self, key: tuple, timeout: float) -> _Wire | None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while key not in self.waiting:
                if not _wait(self.cond, deadline):
                    return None
            return self.waiting.pop(key)[0]


_RENDEZVOUS = _Rendezvous()

# The endpoint is not emulator-specific: with a real queue pair behind it (verbs.py) it is the
# same data path over hardware.
RdmaEndpoint = RdmaEmuEndpoint


def connect_emu(host: str, port: int, config: RdmaConfig = OLD, *, caps_policy: str = ADVERTISE,
                fabric: str = MEMORY, timeout: float | None = None, record: bool = False,
                dialect: Dialect | str = D700, connect_timeout: float = 10.0) -> RdmaEmuEndpoint:
    """Connect to an :class:`RdmaEmuListener` of this process (the fabric is in-process)."""
    sock = socket.create_connection((host, port), timeout=connect_timeout)
    cq, sq = _next_qpn(), _next_qpn()
    cwire, swire = _make_wires(fabric, cq, sq)
    _RENDEZVOUS.offer((sock.getsockname(), sock.getpeername()), swire)
    return RdmaEmuEndpoint(TcpTransport(sock, timeout or config.timeout), cwire, config,
                           role=CLIENT, caps_policy=caps_policy, timeout=timeout,
                           transcript=Transcript() if record else None, dialect=dialect)


class RdmaEmuListener:
    """Accepts TCP connections and serves each as an emulated-RDMA server endpoint.

    ``serve(endpoint, peer)`` runs one connection (``ReferenceServer.serve_transport``). A
    client that did not come through :func:`connect_emu` gets an endpoint with no fabric
    behind it: fine for a TCP-only client (zero caps), a hang for one that activates.
    """

    def __init__(self, serve: Callable[[RdmaEmuEndpoint, str], object], config: RdmaConfig = OLD,
                 *, caps_policy: str = ADVERTISE, host: str = "127.0.0.1", port: int = 0,
                 timeout: float | None = None, record: bool = False,
                 dialect: Dialect | str = D700, pair_timeout: float = 5.0,
                 wire_factory: Callable[[socket.socket], _Wire] | None = None):
        self.serve = serve
        self.wire_factory = wire_factory  # e.g. a real RC QP (harness.transport.verbs)
        self.config = config
        self.caps_policy = caps_policy
        self.host, self.port = host, port
        self.timeout = timeout
        self.record = record
        self.dialect = dialect
        self.pair_timeout = pair_timeout
        self.endpoints: list[RdmaEmuEndpoint] = []
        self.notes: list[str] = []
        self._lsock: socket.socket | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accept: threading.Thread | None = None

    def start(self) -> int:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((self.host, self.port))
        s.listen(16)
        s.settimeout(0.2)
        self._lsock = s
        self.port = s.getsockname()[1]
        self._accept = threading.Thread(target=self._accept_loop, name="rdma-emu-accept",
                                        daemon=True)
        self._accept.start()
        return self.port

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                sock, addr = self._lsock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                wire = self.wire_factory(sock) if self.wire_factory else \
                    _RENDEZVOUS.take((addr, sock.getsockname()), self.pair_timeout)
            except Exception as e:
                self.notes.append(f"{addr}: {type(e).__name__}: {e}")
                wire = None
            # without a device the server offers nothing (as the C peer whose probe failed)
            policy = WITHHOLD if wire is None and self.wire_factory else self.caps_policy
            ep = RdmaEmuEndpoint(TcpTransport(sock, self.timeout or self.config.timeout),
                                 wire or _NullWire(_next_qpn()), self.config, role=SERVER,
                                 caps_policy=policy, timeout=self.timeout,
                                 transcript=Transcript() if self.record else None,
                                 dialect=self.dialect)
            self.endpoints.append(ep)
            t = threading.Thread(target=self.serve, args=(ep, f"{addr[0]}:{addr[1]}"),
                                 name=f"rdma-emu-conn-{addr[1]}", daemon=True)
            self._threads = [x for x in self._threads if x.is_alive()] + [t]
            t.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._lsock is not None:
            try:
                self._lsock.shutdown(socket.SHUT_RDWR)  # wakes accept() now, not at its timeout
            except OSError:
                pass
            self._lsock.close()
        if self._accept is not None:
            self._accept.join(timeout)
        # let each connection end on its own first (its client has usually left), so that
        # nothing is closed under a server thread that is still finishing a command
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        for ep in self.endpoints:
            ep.close()  # unblocks what still waits: its reads end with EOF
        for t in self._threads:
            t.join(timeout)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
