"""The reference client and server connected through bytes in memory (like h11's
ConnectionPair): no sockets, no threads, no sleeps.

The client runs over :class:`MemoryTransport`, which hands every byte it writes to the
server's sans-IO :class:`~harness.reference.server_protocol.ServerProtocol` and, when the client
reads, lets the server process what it has and returns its responses. Everything runs in the
caller's thread, so a session is deterministic; a read the server will never answer (a
stalled server, or a client waiting for a response it did not ask for) raises
``TimeoutError`` at once instead of blocking.
"""

from __future__ import annotations

import io
from pathlib import Path

from ..proto.dialects import Dialect, get_dialect
from ..transport.base import TransportClosed
from .client import RefClient
from .knobs import Misbehaviour
from .server import ReferenceServer
from .server_core import ServerConfig
from .server_protocol import ConnectionRecord, ServerProtocol, close_reason_of


class MemoryTransport:
    """The client's Transport in a pair. ``c2s`` / ``s2c`` hold every byte each way."""

    def __init__(self, server: ServerProtocol, idle_timeout: float = 0.0):
        self.server = server
        self.idle_timeout = idle_timeout
        self.c2s = bytearray()
        self.s2c = bytearray()
        self._inbox = bytearray()
        self._read_pos = 0
        self.write_closed = False
        self.closed = False

    def _run_server(self, step, *args) -> None:
        """One step of the server; an error ends its side as serve_transport would."""
        proto = self.server
        if proto.closed:
            return
        try:
            step(*args)
            proto.pump(self._deliver)  # no RDMA in memory: no upgrade after HELLO
        except Exception as e:
            proto.record.close_reason = close_reason_of(e, self.idle_timeout)
            proto.abort()
            proto.closed = True

    def _deliver(self, parts: list) -> None:
        for p in parts:
            self._inbox += p
            self.s2c += p

    # ------------------------------------------------------------ Transport
    def sendall(self, data) -> None:
        if self.closed or self.write_closed:
            raise TransportClosed("the client closed this connection")
        data = bytes(memoryview(data).cast("B"))
        self.c2s += data
        if data:
            # a closed server drops what arrives, as a TCP peer's buffer would before the RST
            self._run_server(self.server.receive_data, data)

    def sendall_parts(self, parts) -> None:
        for p in parts:
            self.sendall(p)

    def flush(self) -> None:
        pass

    def recv_into(self, buf) -> int:
        if self.closed:
            raise TransportClosed("the client closed this connection")
        if self._read_pos == len(self._inbox):
            self._run_server(lambda: None)
        if self._read_pos == len(self._inbox):
            if self.server.closed:
                return 0
            raise TimeoutError("the server waits for bytes the client has not sent: in a "
                               "single-threaded pair this read would never return")
        view = memoryview(buf).cast("B")
        n = min(len(view), len(self._inbox) - self._read_pos)
        view[:n] = self._inbox[self._read_pos:self._read_pos + n]
        self._read_pos += n
        if self._read_pos == len(self._inbox):
            self._inbox.clear()
            self._read_pos = 0
        return n

    def settimeout(self, seconds: float | None) -> None:
        pass  # nothing here waits

    def shutdown_write(self) -> None:
        if not self.write_closed:
            self.write_closed = True
            self._run_server(self.server.receive_data, b"")

    def close(self) -> None:
        if not self.closed:
            self.shutdown_write()
            self.closed = True


class ConnectionPair:
    """A reference client of ``client_dialect`` connected in memory to a reference server.

    ``server`` may be shared between pairs (its cache and memory budget are process-wide, as a
    real server's): each pair is one connection of it. ``record`` is the server's record of
    the connection, final once the pair is closed.
    """

    def __init__(self, client_dialect: Dialect | str, server_dialect: Dialect | str | None = None,
                 *, server: ReferenceServer | None = None, cache_dir: Path | None = None,
                 server_knobs: Misbehaviour | None = None,
                 client_knobs: Misbehaviour | None = None, hello: bool = True):
        if server is None:
            config = ServerConfig(dialect=get_dialect(server_dialect or client_dialect),
                                  cache_dir=cache_dir, knobs=server_knobs or Misbehaviour())
            server = ReferenceServer(config, out=io.StringIO(), err=io.StringIO())
        self.server = server
        self.protocol = server.open_connection("memory")
        self.transport = MemoryTransport(self.protocol)
        self.client = RefClient(self.transport, client_dialect, knobs=client_knobs)
        self._finished = False
        if hello and not self.client.knobs.skip_hello:
            try:
                self.client.hello()
            except BaseException:
                self.close()  # the record stays in server.connections
                raise

    @property
    def record(self) -> ConnectionRecord:
        return self.protocol.record

    def close(self) -> ConnectionRecord:
        self.client.close()
        if not self._finished:
            self._finished = True
            self.server.finish_connection(self.protocol)
        return self.record

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
