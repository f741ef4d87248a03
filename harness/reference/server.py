"""The reference server on real sockets (or any Transport).

Each connection is a sans-IO :class:`ServerProtocol` driven over the transport.
SET_TENSOR payloads are received straight into the destination buffer, never held whole;
GET_TENSOR answers are sent straight from it. Every read has an idle deadline. By
default connections are served concurrently (a thread each); ``serial=True`` serves one client
at a time with a backlog of 1, as the real server does.
"""

from __future__ import annotations

import signal
import socket
import sys
import threading
import time
from typing import Callable, TextIO

from ..transport.base import Listening, Transport
from ..transport.tcp import TcpTransport
from .behaviour_view import BehaviourView, behaviour_view_for
from .server_core import ServerConfig, ServerState
from .server_protocol import ConnectionRecord, ServerProtocol, close_reason_of

RECV_CHUNK = 1 << 20
# Connection records kept for tests and reports: the most recent ones only, so a server that
# runs for days does not grow by a record per connection (found by `harness fuzz`).
MAX_RECORDS = 4096


class ReferenceServer(Listening):
    def __init__(self, config: ServerConfig, *, behaviour: BehaviourView | None = None,
                 host: str = "127.0.0.1", port: int = 0, serial: bool = False,
                 idle_timeout: float = 120.0, out: TextIO | None = None,
                 err: TextIO | None = None):
        self.config = config
        self.behaviour = behaviour or behaviour_view_for(config.dialect)
        self.host, self.port = host, port
        self.serial = serial
        self.idle_timeout = idle_timeout
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.state = ServerState(config, log=self._log_err)
        self.connections: list[ConnectionRecord] = []
        self._lsock: socket.socket | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accept_thread: threading.Thread | None = None
        self._print_lock = threading.Lock()

    # ------------------------------------------------------------ logging
    def _log_out(self, line: str) -> None:
        with self._print_lock:
            print(line, file=self.out, flush=True)

    def _log_err(self, line: str) -> None:
        with self._print_lock:
            print(line, file=self.err, flush=True)

    def banner(self) -> None:
        d = self.config.dialect
        cache = str(self.config.cache_dir) if self.config.cache_dir else "n/a"
        self._log_out(f"Starting RPC server v{d.version_str} (reference peer, dialect {d.name})")
        self._log_out(f"  endpoint       : {self.host}:{self.port}")
        self._log_out(f"  local cache    : {cache}")
        self._log_out("Devices:")
        for i in range(self.config.devices):
            self._log_out(f"  REF{i}: reference CPU ({self.config.memory_budget >> 20} MiB)")
        self._log_out(f"  transport      : TCP ({'serial' if self.serial else 'concurrent'}, "
                      f"receive {self.behaviour.server_receive})")

    # ------------------------------------------------------------ lifecycle
    def bind(self) -> tuple[str, int]:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((self.host, self.port))
        s.listen(1 if self.serial else 64)
        s.settimeout(0.2)  # the accept loop looks at the stop flag this often
        self._lsock = s
        self.port = s.getsockname()[1]
        return self.host, self.port

    def start(self) -> tuple[str, int]:
        """Bind and serve in a background thread (for in-process use)."""
        addr = self.bind()
        self._accept_thread = threading.Thread(target=self.serve_forever, name="ref-accept",
                                               daemon=True)
        self._accept_thread.start()
        return addr

    def serve_forever(self) -> None:
        if self._lsock is None:
            self.bind()
        for sock, addr in self._accepted():
            tr = TcpTransport(sock, timeout=self.idle_timeout)
            peer = f"{addr[0]}:{addr[1]}"
            if self.serial:
                self.serve_transport(tr, peer)
            else:
                self._spawn(self.serve_transport, (tr, peer), f"ref-conn-{peer}")

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._lsock is not None:
            try:
                self._lsock.close()
            except OSError:
                pass
        if self._accept_thread is not None:
            self._accept_thread.join(timeout)
        for t in self._threads:
            t.join(timeout)

    # ------------------------------------------------------------ one connection
    def open_connection(self, peer: str = "?",
                        local_conn_caps: bytes | None = None) -> ServerProtocol:
        """A new connection's protocol state (its record is in ``connections``)."""
        rec = ConnectionRecord(peer, time.time())
        self.connections.append(rec)
        if len(self.connections) > 2 * MAX_RECORDS:  # trim in chunks: amortised O(1)
            del self.connections[:len(self.connections) - MAX_RECORDS]
        self._log_out("Accepted client connection")
        return ServerProtocol(self.state, self.behaviour, rec, local_conn_caps=local_conn_caps)

    def finish_connection(self, proto: ServerProtocol,
                          close: Callable[[], None] | None = None) -> ConnectionRecord:
        """The connection has ended: free its buffers, ``close`` its transport and complete
        its record."""
        rec = proto.record
        proto.abort()
        rec.bytes_in = proto.bytes_in
        rec.cache_saves = proto.session.cache_saves
        rec.cache_hits = proto.session.cache_hits
        proto.session.close()
        if close is not None:
            close()
        if rec.close_reason is None and rec.commands == 1 and rec.hello_only:
            # The client has nothing more to say after HELLO: it refused our version.
            rec.note = (f"client closed right after HELLO (v{self.config.dialect.version_str}"
                        " rejected by its version rule?)")
            self._log_err(f"[close] {rec.note}")
        if rec.close_reason:
            self._log_err(f"[close] {rec.close_reason}")
        self._log_out("Client connection closed")
        rec.ended = time.time()  # last: observers treat a set ``ended`` as final
        return rec

    def serve_transport(self, tr: Transport, peer: str = "?") -> ConnectionRecord:
        caps_of = getattr(tr, "local_conn_caps", None)  # RDMA upgrade hook (spec 10.1)
        proto = self.open_connection(peer, caps_of() if caps_of is not None else None)
        try:
            _drive(proto, tr, memoryview(bytearray(RECV_CHUNK)))
        except Exception as e:
            proto.record.close_reason = close_reason_of(e, self.idle_timeout)
        finally:
            self.finish_connection(proto, tr.close)
        return proto.record


def _drive(proto: ServerProtocol, tr: Transport, rbuf: memoryview) -> None:
    """Run one connection over a blocking transport until either side closes it."""
    tr_upgrade = getattr(tr, "upgrade", None)

    def send(parts: list) -> None:
        tr.sendall_parts(parts)
        tr.flush()

    def upgrade(caps: bytes | None) -> None:
        if caps is not None and tr_upgrade is not None:
            proto.record.rdma_active = tr_upgrade(caps)

    while True:
        proto.pump(send, upgrade)
        if proto.closed:
            return
        direct = proto.payload_view()
        if direct is not None:  # SET_TENSOR payload: straight into the buffer
            proto.payload_received(tr.recv_into(direct))
        else:
            n = tr.recv_into(rbuf)
            proto.receive_data(bytes(rbuf[:n]) if n else b"")


def run_server(config: ServerConfig, *, host: str, port: int, serial: bool,
               idle_timeout: float, on_ready: Callable[[ReferenceServer], None] | None = None) -> None:
    """Blocking entry point of ``harness serve``."""
    # A leaf process ends at once on SIGTERM, as the real server does (the harness's own
    # handler, which unwinds to stop children, would only delay its supervisor's stop).
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    server = ReferenceServer(config, host=host, port=port, serial=serial,
                             idle_timeout=idle_timeout)
    server.bind()
    server.banner()
    if on_ready:
        on_ready(server)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
