"""The byte-stream interface the reference peers run on (TCP, chopped TCP, emulated RDMA)."""

from __future__ import annotations

from typing import Protocol, Sequence


class TransportError(OSError):
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
