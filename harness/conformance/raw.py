"""A deliberately low-level client session for conformance cases: raw frames, explicit reads,
and an observation of what the server did afterwards (closed, stayed open, answered)."""

from __future__ import annotations

import socket
import struct
import time

from ..proto import (ClientConnection, NEED_DATA, Response, get_dialect, pack_request,
                     response_payload_size)
from ..proto import messages as m
from ..proto.dialects import DEFAULT, Dialect

CLOSED, OPEN, ANSWERED = "closed", "open", "answered"


class RawSession:
    def __init__(self, host: str, port: int, *, dialect: Dialect | str = DEFAULT,
                 timeout: float = 5.0):
        self.dialect = get_dialect(dialect)
        self.timeout = timeout
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sent: list[bytes] = []

    # -- sending
    def send(self, frame: bytes) -> None:
        self.sent.append(frame)
        self.sock.sendall(frame)

    def request(self, msg: m.Message) -> None:
        """Send ``msg``; where the row still acknowledges it with an empty answer (before
        6.0.0: FREE_BUFFER, BUFFER_CLEAR, INIT_TENSOR, MEMSET_TENSOR), read that answer, so
        what the case observes next is what follows the request on every row alike (a close
        instead of the answer raises ConnectionError: the case's outcome is a close)."""
        self.send(pack_request(self.dialect, msg))
        if msg.cmd in self.dialect.acked:
            self.read_response(msg)

    def read_response(self, request: m.Message) -> m.Message:
        conn = ClientConnection(self.dialect, strict=False)
        conn.reader.expect(request)
        deadline = time.monotonic() + self.timeout
        while True:
            ev = conn.next_event()
            if isinstance(ev, Response):
                return ev.message
            if ev is not NEED_DATA:
                raise ConnectionError(f"unexpected {ev!r}")
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            data = self.sock.recv(1 << 16)
            if not data:  # a close where an answer was due is an outcome, not a codec error
                raise ConnectionError(f"server closed the connection while the {request.cmd} "
                                      "answer was due")
            conn.receive_data(data)

    def call(self, msg: m.Message) -> m.Message:
        if response_payload_size(self.dialect, msg) is None:
            raise ValueError(f"{msg.cmd} has no response")
        self.send(pack_request(self.dialect, msg))
        return self.read_response(msg)

    # -- common openings
    def hello(self) -> m.HelloResponse:
        return self.call(m.HelloRequest())  # the codec writes the row's HELLO layout

    def alloc(self, size: int) -> tuple[int, int]:
        """ALLOC_BUFFER + BUFFER_GET_BASE; returns (handle, base)."""
        handle = self.call(m.AllocBufferRequest(0, size)).remote_ptr
        return handle, self.call(m.BufferGetBaseRequest(handle)).base_ptr

    # -- observing
    def observe(self, wait: float = 0.5) -> tuple[str, str]:
        """What the server does next: (CLOSED, 'eof'|'reset'), (OPEN, 'timeout') or
        (ANSWERED, hex of what arrived)."""
        self.sock.settimeout(wait)
        try:
            data = self.sock.recv(1 << 16)
        except TimeoutError:
            return OPEN, "timeout"
        except ConnectionResetError:
            return CLOSED, "reset"
        if not data:
            return CLOSED, "eof"
        return ANSWERED, data.hex()

    def still_serving(self) -> bool:
        """A cheap request that every server answers: proves the connection is alive."""
        try:
            self.call(m.GetAlignmentRequest(0))
            return True
        except (OSError, ConnectionError, struct.error):
            return False
        except Exception:  # RemoteProtocolError from a closed stream
            return False

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
