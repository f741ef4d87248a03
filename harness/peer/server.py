"""The reference server on real sockets (or any Transport).

Each connection runs the sans-IO ServerConnection for framing and server_core.Session for
semantics. SET_TENSOR payloads are received straight into the destination buffer, never held
whole; GET_TENSOR answers are sent straight from it. Every read has an idle deadline. By
default connections are served concurrently (a thread each); ``serial=True`` serves one client
at a time with a backlog of 1, as the real server does.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, TextIO

from ..proto import (NEED_DATA, ConnectionClosed, EndOfMessage, Request, RequestHead,
                     ServerConnection)
from ..proto.constants import Cmd
from ..proto.errors import ProtocolError
from ..transport.base import Transport, TransportClosed
from ..transport.tcp import TcpTransport
from .profile import RECEIVE_STREAMED, Profile, profile_for
from .server_core import Close, ServerConfig, ServerState, Session

RECV_CHUNK = 1 << 20
# Connection records kept for tests and reports: the most recent ones only, so a server that
# runs for days does not grow by a record per connection (found by `harness fuzz`).
MAX_RECORDS = 4096


@dataclass
class ConnectionRecord:
    """What happened on one connection, for tests and reports."""

    peer: str
    started: float
    ended: float | None = None
    commands: int = 0
    close_reason: str | None = None  # None = the client closed cleanly
    note: str | None = None  # what the server could infer about a clean close
    cache_saves: list[str] = field(default_factory=list)
    cache_hits: int = 0
    hello_only: bool = False
    bytes_in: int = 0  # request bytes the server actually read
    rdma_active: bool | None = None  # after HELLO; None: the transport cannot switch


class ReferenceServer:
    def __init__(self, config: ServerConfig, *, profile: Profile | None = None,
                 host: str = "127.0.0.1", port: int = 0, serial: bool = False,
                 idle_timeout: float = 120.0, out: TextIO | None = None,
                 err: TextIO | None = None):
        self.config = config
        self.profile = profile or profile_for(config.dialect)
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
                      f"receive {self.profile.server_receive})")

    # ------------------------------------------------------------ lifecycle
    def bind(self) -> tuple[str, int]:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((self.host, self.port))
        s.listen(1 if self.serial else 64)
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
        self._lsock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                sock, addr = self._lsock.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():
                    break
                raise
            tr = TcpTransport(sock, timeout=self.idle_timeout)
            peer = f"{addr[0]}:{addr[1]}"
            if self.serial:
                self.serve_transport(tr, peer)
            else:
                t = threading.Thread(target=self.serve_transport, args=(tr, peer),
                                     name=f"ref-conn-{peer}", daemon=True)
                self._threads = [x for x in self._threads if x.is_alive()] + [t]
                t.start()

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

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    # ------------------------------------------------------------ one connection
    def serve_transport(self, tr: Transport, peer: str = "?") -> ConnectionRecord:
        rec = ConnectionRecord(peer, time.time())
        self.connections.append(rec)
        if len(self.connections) > 2 * MAX_RECORDS:  # trim in chunks: amortised O(1)
            del self.connections[:len(self.connections) - MAX_RECORDS]
        self._log_out("Accepted client connection")
        session = Session(self.state)
        caps_of = getattr(tr, "local_conn_caps", None)  # RDMA upgrade hook (spec 10.1)
        if caps_of is not None:
            session.local_conn_caps = caps_of()
        # A streamed payload lands in a buffer, so nothing larger than all memory can fit.
        conn = ServerConnection(self.config.dialect, max_payload=self.config.max_payload,
                                max_stream=self.config.memory_budget,
                                stream=frozenset({Cmd.SET_TENSOR}))
        try:
            _ConnectionLoop(self, tr, conn, session, rec).run()
        except Close as c:
            rec.close_reason = c.reason
        except ProtocolError as e:
            rec.close_reason = str(e)
        except TimeoutError as e:
            # a transport that knows why it waited (emulated RDMA) says so
            rec.close_reason = getattr(e, "reason", None) or \
                f"no data from the client within {self.idle_timeout} s"
        except (TransportClosed, OSError) as e:
            rec.close_reason = f"connection error: {e}"
        finally:
            rec.bytes_in = conn.reader.bytes_consumed
            rec.cache_saves = session.cache_saves
            rec.cache_hits = session.cache_hits
            session.close()
            tr.close()
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


class _ConnectionLoop:
    def __init__(self, server: ReferenceServer, tr: Transport, conn: ServerConnection,
                 session: Session, rec: ConnectionRecord):
        self.server = server
        self.tr = tr
        self.conn = conn
        self.session = session
        self.rec = rec
        self.knobs = server.config.knobs
        self.streamed = server.profile.server_receive == RECEIVE_STREAMED
        self._rbuf = bytearray(RECV_CHUNK)
        self._rview = memoryview(self._rbuf)

    def _fill(self) -> None:
        n = self.tr.recv_into(self._rview)
        self.conn.receive_data(bytes(self._rview[:n]) if n else b"")

    def run(self) -> None:
        conn = self.conn
        while True:
            ev = conn.next_event()
            if ev is NEED_DATA:
                self._fill()
            elif isinstance(ev, ConnectionClosed):
                return
            elif isinstance(ev, Request):
                self.rec.commands += 1
                self.rec.hello_only = self.rec.commands == 1 and ev.message.cmd is Cmd.HELLO
                self._request(ev.message)
            elif isinstance(ev, RequestHead):
                self.rec.commands += 1
                self._set_tensor(ev.message, ev.data_length)
            elif isinstance(ev, EndOfMessage):
                continue
            else:  # Data: only when a payload was not consumed in _set_tensor
                raise Close(f"unexpected payload event {type(ev).__name__}")

    def _request(self, msg) -> None:
        name = msg.cmd.value
        if self.knobs.close_on == name:
            raise Close(f"misbehaviour: close on {name}")
        if self.knobs.stall_on == name:
            self._stall()
        rsp = self.session.handle(msg)
        if rsp is None:
            return
        if self.knobs.garble_response_len == name or (
                msg.cmd is Cmd.HELLO and self.knobs.hello_response_size is not None):
            frame = self.conn.send(rsp)
            n = (self.knobs.hello_response_size if msg.cmd is Cmd.HELLO
                 and self.knobs.hello_response_size is not None else len(frame) - 8 + 1)
            self.tr.sendall(n.to_bytes(8, "little") + frame[8:])
        else:
            self.tr.sendall_parts(self.conn.send_parts(rsp))
        self.tr.flush()
        if msg.cmd is Cmd.HELLO:
            self._after_hello(msg)

    def _after_hello(self, msg) -> None:
        # Spec 10.1: the HELLO response went out over TCP; now switch with the client's caps.
        # No confirmation follows (Linux), so the client may stay on TCP: asymmetric.
        upgrade = getattr(self.tr, "upgrade", None)
        if upgrade is not None and self.server.config.dialect.hello_caps:
            self.rec.rdma_active = upgrade(msg.conn_caps)

    def _stall(self) -> None:
        # Never answer; wait for the client to give up (bounded by the idle deadline).
        while self.tr.recv_into(self._rview):
            pass
        raise Close("misbehaviour: stalled until the client closed")

    def _set_tensor(self, msg, size: int) -> None:
        reader = self.conn.reader
        try:
            sink = self.session.begin_set_tensor(msg, size)
        except Close:
            if not self.streamed:
                self._discard(size)  # the old server reads the whole message before checking
            raise
        try:
            dest = sink.dest
            got = reader.take_payload_into(dest)  # bytes that came with the header
            direct = 0
            while got < size:
                n = self.tr.recv_into(dest[got:])
                if n == 0:
                    raise Close(f"[set_tensor] connection closed after {got} of {size} "
                                "payload bytes")
                got += n
                direct += n
            if direct:
                reader.payload_received(direct)
        except BaseException:
            sink.abort()
            raise
        self.session.end_set_tensor(sink)

    def _discard(self, size: int) -> None:
        reader = self.conn.reader
        scratch = self._rview
        left = size
        while left:
            got = reader.take_payload_into(scratch[:min(left, len(scratch))])
            if not got:
                break
            left -= got
        while left:
            n = self.tr.recv_into(scratch[:min(left, len(scratch))])
            if n == 0:
                return
            reader.payload_received(n)
            left -= n


def run_server(config: ServerConfig, *, host: str, port: int, serial: bool,
               idle_timeout: float, on_ready: Callable[[ReferenceServer], None] | None = None) -> None:
    """Blocking entry point of ``harness serve``."""
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
