"""The emulated RDMA fabric: one reliable-connected queue pair per connection, as threads.

A wire is one endpoint's view of a connection (both directions): ``send`` posts a SEND (and
waits while the send ring is full), ``post_receives`` (re)posts receive buffers, ``poll``
returns one completion. Wires come in pairs over memory (:class:`MemoryWire`) or over a
stream socket (:class:`SocketWire`: one length-prefixed record per SEND, so record
boundaries are completions). A SEND only lands in a posted buffer; past the receiver's
posted depth it waits (RNR, retried forever as ``rnr_retry = 7`` does). Every blocking wait
has a deadline.
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
from typing import Callable

from .base import TransportClosed
from .caps import LinuxCaps, MacCaps

MEMORY, SOCKET = "memory", "socket"


class _Eof:
    def __repr__(self) -> str:
        return "EOF"


EOF = _Eof()


def wait_bounded(cond: threading.Condition, deadline: float) -> bool:
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


def queue_send(cond: threading.Condition, in_flight: deque, piece: bytes, slots: int,
               deadline: float, hang: Callable[[str], Exception], stats: "WireStats", *,
               gone: Callable[[], bool], lands: Callable[[], bool]) -> None:
    """Post one SEND (``cond`` held): wait while ``slots`` are in flight, then queue it.
    ``gone``: the peer's end is closed; ``lands``: it has a receive posted for it now."""
    while len(in_flight) >= slots and not gone():
        if not wait_bounded(cond, deadline):
            raise hang(f"send ring full ({len(in_flight)} of {slots} SENDs in flight)")
    if gone():
        raise TransportClosed("the peer closed its end of the RDMA connection")
    in_flight.append(piece)
    stats.sends += 1
    if not lands():
        stats.rnr_waits += 1
    stats.max_in_flight = max(stats.max_in_flight, len(in_flight))


class Wire:
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
    def send(self, piece: bytes, slots: int, deadline: float,
             hang: Callable[[str], Exception]) -> None: ...
    def wait_sends(self, deadline: float, hang: Callable[[str], Exception]) -> None: ...
    def post_receives(self, n: int) -> None: ...
    def poll(self, timeout: float): ...
    def finish_sending(self) -> None: ...
    def close(self, fin: bool = True) -> None: ...
    def peer_active(self) -> bool: ...
    def reachable(self) -> bool: ...
    def in_flight(self) -> int: ...


class Link:
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


class MemoryWire(Wire):
    def __init__(self, tx: Link, rx: Link, local_qpn: int, peer_qpn: int):
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
            queue_send(tx.cond, tx.in_flight, piece, slots, deadline, hang, tx.stats,
                       gone=lambda: tx.receiver_gone, lands=lambda: tx.posted and tx.reachable)
            tx.deliver()

    def wait_sends(self, deadline, hang) -> None:
        tx = self.tx
        with tx.cond:
            while tx.in_flight and not tx.receiver_gone:
                if not wait_bounded(tx.cond, deadline):
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
                if not wait_bounded(rx.cond, deadline):
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


class SocketWire(Wire):
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
            queue_send(self.cond, self._in_flight, piece, slots, deadline, hang, self.stats,
                       gone=lambda: self._peer_gone,
                       lands=lambda: self._credits and self._reachable)
            self.cond.notify_all()

    def wait_sends(self, deadline, hang) -> None:
        with self.cond:
            while self._in_flight and not self._peer_gone:
                if not wait_bounded(self.cond, deadline):
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
                if not wait_bounded(self.cond, deadline):
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
                    if not wait_bounded(self.cond, deadline):
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


class NullWire(Wire):
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


def next_qpn() -> int:
    with _qpn_lock:
        return next(_qpns) & 0xFFFFFF or next(_qpns)


def make_wires(fabric: str, client_qpn: int, server_qpn: int) -> tuple[Wire, Wire]:
    if fabric == MEMORY:
        c2s, s2c = Link(), Link()
        return (MemoryWire(c2s, s2c, client_qpn, server_qpn),
                MemoryWire(s2c, c2s, server_qpn, client_qpn))
    if fabric == SOCKET:
        a, b = socket.socketpair()
        return (SocketWire(a, client_qpn, server_qpn, f"qp{client_qpn:x}"),
                SocketWire(b, server_qpn, client_qpn, f"qp{server_qpn:x}"))
    raise ValueError(f"fabric must be {MEMORY!r} or {SOCKET!r}")
