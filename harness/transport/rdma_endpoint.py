"""Emulated-RDMA endpoints: the ggml-rpc connection as the C peers make it (spec 10).

* **Connection**: TCP until HELLO; then each side decides on its own whether to switch
  (:mod:`harness.transport.caps`). After the switch every RPC byte travels as RDMA SENDs and
  the TCP socket only signals that the peer hung up.
* **Send**: ``send_slots`` SENDs may be in flight: 1 = proto 7 stop-and-wait (wait for every
  SEND's completion), 8 = seed 000's ring (wait only when the ring is full, and drain at
  ``flush``, which marks every message boundary).
* **Receive**: ``recv_depth`` (24) receive buffers are posted at activation and each is
  reposted only once consumed, so a sender never has more unconsumed completions outstanding
  than that.

:class:`RdmaEmuEndpoint` is a :class:`harness.transport.base.Transport` over a TCP transport
and a wire (:mod:`.rdma_wires`), driving the sans-IO core (:mod:`.rdma_core`). Endpoints come
in pairs in this process (:func:`emu_pair`) or through a listener (:class:`RdmaEmuListener`,
:func:`connect_emu`). Every blocking wait has a deadline.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from ..capture.transcript import C2S, S2C, Transcript
from ..proto.dialects import DEFAULT, Dialect
from .base import Listening, TransportClosed
from .caps import (ADVERTISE, MACOS, WITHHOLD, activates, advertised_caps, gid_for_ipv4,
                   pack_linux, pack_macos, probe_ok, supports_rdma, unpack)
from .rdma_core import (OLD, REQUEST, RESPONSE, CompletionReader, RdmaConfig, RdmaError,
                        RdmaHang, RdmaOverrun, SendFramer, make_cutter)
from .rdma_wires import (EOF, MEMORY, NullWire, Wire, WireStats, make_wires, next_qpn,
                         wait_bounded)
from .tcp import TcpTransport

CLIENT, SERVER = "client", "server"
LIVENESS_INTERVAL = 0.05  # how often a waiting receiver looks at the TCP socket


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

    def __init__(self, tcp: TcpTransport, wire: Wire, config: RdmaConfig = OLD, *,
                 role: str, caps_policy: str = ADVERTISE, timeout: float | None = None,
                 transcript: Transcript | None = None, dialect: Dialect | str = DEFAULT):
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


def emu_pair(client: RdmaConfig = OLD, server: RdmaConfig = OLD, *, fabric: str = MEMORY,
             client_policy: str = ADVERTISE, server_policy: str = ADVERTISE,
             timeout: float | None = None, record: bool = False,
             dialect: Dialect | str = DEFAULT) -> EmuPair:
    """Two connected endpoints (client, server) in this process."""
    cq, sq = next_qpn(), next_qpn()
    cwire, swire = make_wires(fabric, cq, sq)
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
        self.waiting: dict[tuple, tuple[Wire, float]] = {}

    def offer(self, key: tuple, wire: Wire) -> None:
        with self.cond:
            now = time.monotonic()
            for k in [k for k, (_, t) in self.waiting.items() if now - t > 60]:
                self.waiting.pop(k)[0].close()  # never picked up: bounded registry
            self.waiting[key] = (wire, now)
            self.cond.notify_all()

    def take(self, key: tuple, timeout: float) -> Wire | None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while key not in self.waiting:
                if not wait_bounded(self.cond, deadline):
                    return None
            return self.waiting.pop(key)[0]


_RENDEZVOUS = _Rendezvous()

# The endpoint is not emulator-specific: with a real queue pair behind it (verbs.py) it is the
# same data path over hardware.
RdmaEndpoint = RdmaEmuEndpoint


def connect_emu(host: str, port: int, config: RdmaConfig = OLD, *, caps_policy: str = ADVERTISE,
                fabric: str = MEMORY, timeout: float | None = None, record: bool = False,
                dialect: Dialect | str = DEFAULT, connect_timeout: float = 10.0) -> RdmaEmuEndpoint:
    """Connect to an :class:`RdmaEmuListener` of this process (the fabric is in-process)."""
    sock = socket.create_connection((host, port), timeout=connect_timeout)
    cq, sq = next_qpn(), next_qpn()
    cwire, swire = make_wires(fabric, cq, sq)
    _RENDEZVOUS.offer((sock.getsockname(), sock.getpeername()), swire)
    return RdmaEmuEndpoint(TcpTransport(sock, timeout or config.timeout), cwire, config,
                           role=CLIENT, caps_policy=caps_policy, timeout=timeout,
                           transcript=Transcript() if record else None, dialect=dialect)


class RdmaEmuListener(Listening):
    """Accepts TCP connections and serves each as an emulated-RDMA server endpoint.

    ``serve(endpoint, peer)`` runs one connection (``ReferenceServer.serve_transport``). A
    client that did not come through :func:`connect_emu` gets an endpoint with no fabric
    behind it: fine for a TCP-only client (zero caps), a hang for one that activates.
    """

    def __init__(self, serve: Callable[[RdmaEmuEndpoint, str], object], config: RdmaConfig = OLD,
                 *, caps_policy: str = ADVERTISE, host: str = "127.0.0.1", port: int = 0,
                 timeout: float | None = None, record: bool = False,
                 dialect: Dialect | str = DEFAULT, pair_timeout: float = 5.0,
                 wire_factory: Callable[[socket.socket], Wire] | None = None):
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
        for sock, addr in self._accepted():
            try:
                wire = self.wire_factory(sock) if self.wire_factory else \
                    _RENDEZVOUS.take((addr, sock.getsockname()), self.pair_timeout)
            except Exception as e:
                self.notes.append(f"{addr}: {type(e).__name__}: {e}")
                wire = None
            # without a device the server offers nothing (as the C peer whose probe failed)
            policy = WITHHOLD if wire is None and self.wire_factory else self.caps_policy
            ep = RdmaEmuEndpoint(TcpTransport(sock, self.timeout or self.config.timeout),
                                 wire or NullWire(next_qpn()), self.config, role=SERVER,
                                 caps_policy=policy, timeout=self.timeout,
                                 transcript=Transcript() if self.record else None,
                                 dialect=self.dialect)
            self.endpoints.append(ep)
            self._spawn(self.serve, (ep, f"{addr[0]}:{addr[1]}"), f"rdma-emu-conn-{addr[1]}")

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
