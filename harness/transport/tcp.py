"""TCP transport: a socket with an idle deadline on every read and write."""

from __future__ import annotations

import socket
from typing import Sequence

from .base import TransportClosed

SOCK_BUF = 4 << 20
IOV_MAX = 1024


def tune_socket(sock: socket.socket) -> None:
    """No Nagle delay and large kernel buffers: what every harness connection uses."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, SOCK_BUF)
        except OSError:
            pass


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """Exactly ``n`` bytes from a plain socket (its own timeout applies); ConnectionError if
    the peer closes first."""
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError(f"connection closed after {len(data)} of {n} bytes")
        data += chunk
    return bytes(data)


class TcpTransport:
    def __init__(self, sock: socket.socket, timeout: float | None = 60.0):
        self.sock = sock
        tune_socket(sock)
        sock.settimeout(timeout)
        self.bytes_sent = 0
        self.bytes_received = 0

    @classmethod
    def connect(cls, host: str, port: int, timeout: float | None = 60.0,
                connect_timeout: float = 10.0) -> "TcpTransport":
        sock = socket.create_connection((host, port), timeout=connect_timeout)
        return cls(sock, timeout)

    def settimeout(self, seconds: float | None) -> None:
        self.sock.settimeout(seconds)

    def sendall(self, data) -> None:
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError) as e:
            raise TransportClosed(str(e)) from None
        self.bytes_sent += len(data) if not isinstance(data, memoryview) else data.nbytes

    def sendall_parts(self, parts: Sequence) -> None:
        views = [memoryview(p).cast("B") for p in parts if len(p)]
        try:
            while views:
                sent = self.sock.sendmsg(views[:IOV_MAX])
                self.bytes_sent += sent
                while sent and views:
                    if sent >= len(views[0]):
                        sent -= len(views[0])
                        views.pop(0)
                    else:
                        views[0] = views[0][sent:]
                        sent = 0
        except (BrokenPipeError, ConnectionResetError) as e:
            raise TransportClosed(str(e)) from None

    def recv_into(self, buf: memoryview) -> int:
        try:
            n = self.sock.recv_into(buf)
        except ConnectionResetError as e:
            raise TransportClosed(str(e)) from None
        self.bytes_received += n
        return n

    def flush(self) -> None:
        pass  # TCP_NODELAY: every send is already on its way

    def shutdown_write(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
