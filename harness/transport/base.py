"""The byte-stream interface the reference peers run on (TCP, chopped TCP, emulated RDMA)."""

from __future__ import annotations

import socket
import threading
from typing import Protocol, Sequence

from ..errors import HarnessError


class TransportError(HarnessError, OSError):
    """Root of every error this package raises (an OSError: a broken connection to callers
    that do not care which transport it was)."""


class TransportClosed(TransportError, ConnectionError):
    """The peer closed or reset the connection."""


class Transport(Protocol):
    def sendall(self, data) -> None:
        """Write every byte or raise (TransportClosed, TimeoutError)."""

    def sendall_parts(self, parts: Sequence) -> None:
        """Write several buffers back to back without joining them (no staging copy)."""

    def recv_into(self, buf: memoryview) -> int:
        """Read at most len(buf) bytes; 0 means the peer finished sending. Raises TimeoutError
        when nothing arrives within the idle timeout."""

    def flush(self) -> None:
        """Message boundary: a transport that batches (RDMA send ring) drains here."""

    def settimeout(self, seconds: float | None) -> None: ...

    def shutdown_write(self) -> None: ...

    def close(self) -> None: ...


class Listening:
    """``with listener:`` starts it (``start``) and stops it on the way out (``stop``).
    Connections run in threads kept in ``_threads`` (finished ones are dropped as new ones
    start, so a long-running listener does not grow)."""

    _threads: list[threading.Thread]
    _stop: threading.Event
    _lsock: socket.socket | None

    def _accepted(self):
        """``(sock, addr)`` of each new connection until ``_stop`` is set (the listening socket
        has a timeout, so the flag is seen within it)."""
        while not self._stop.is_set():
            try:
                conn = self._lsock.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                raise
            yield conn

    def _spawn(self, serve, args: tuple, name: str) -> None:
        t = threading.Thread(target=serve, args=args, name=name, daemon=True)
        self._threads = [x for x in self._threads if x.is_alive()] + [t]
        t.start()

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()


def recv_exact_into(tr: Transport, buf: memoryview) -> int:
    """Fill ``buf`` completely unless the peer closes first; returns bytes received."""
    got = 0
    n = len(buf)
    while got < n:
        k = tr.recv_into(buf[got:])
        if k == 0:
            break
        got += k
    return got
