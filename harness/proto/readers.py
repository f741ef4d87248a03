"""Incremental frame readers: feed any bytes, get whole frames (or streamed payloads).

Both readers give the same events whatever the input chunking is (whole, one byte at a time,
or followed by trailing bytes, which stay buffered), and both refuse a length over their bound
before allocating anything for it.

Zero-copy path for large payloads: while a payload is streaming, a caller may copy what is
already buffered with ``take_payload_into`` and then receive the rest straight into its own
memory, reporting it with ``payload_received``.
"""

from __future__ import annotations

from collections import deque
from typing import Callable

from .wire import U64
from .codec import (REQUEST_HEADER_SIZE, RESPONSE_HEADER_SIZE, response_payload_size,
                    unpack_request_header, unpack_request_payload, unpack_response_payload)
from .constants import HELLO_ID, Cmd
from .dialects import Dialect
from .errors import LocalProtocolError, RemoteProtocolError
from .events import (NEED_DATA, ConnectionClosed, Data, EndOfMessage, Request, RequestHead,
                     Response, ResponseHead)
from .messages import GraphLayout, Message, spec_for


DEFAULT_MAX_PAYLOAD = 1 << 30  # bound for whole (non-streamed) payloads, e.g. GRAPH_COMPUTE
DEFAULT_MAX_STREAM = 1 << 40  # bound for streamed payloads, which are never held whole
DEFAULT_DATA_CHUNK = 1 << 20  # largest Data event


class ReceiveBuffer:
    """Append-only byte buffer with a read cursor; compacts lazily (amortised O(n))."""

    __slots__ = ("_buf", "_pos")

    def __init__(self):
        self._buf = bytearray()
        self._pos = 0

    def __len__(self) -> int:
        return len(self._buf) - self._pos

    def append(self, data) -> None:
        if self._pos and self._pos >= len(self._buf) // 2:
            del self._buf[:self._pos]
            self._pos = 0
        self._buf += data

    def peek(self, n: int) -> memoryview:
        return memoryview(self._buf)[self._pos:self._pos + n]

    def byte_at(self, i: int) -> int:
        return self._buf[self._pos + i]

    def take(self, n: int) -> bytes:
        out = bytes(self._buf[self._pos:self._pos + n])
        self._pos += n
        if self._pos == len(self._buf):
            self._buf.clear()
            self._pos = 0
        return out

    def take_into(self, dest: memoryview) -> int:
        n = min(len(dest), len(self))
        dest[:n] = memoryview(self._buf)[self._pos:self._pos + n]
        self._pos += n
        if self._pos == len(self._buf):
            self._buf.clear()
            self._pos = 0
        return n

    def remaining(self) -> bytes:
        return bytes(self._buf[self._pos:])


class _StreamState:
    """Shared bookkeeping for a payload that is being streamed."""

    __slots__ = ("remaining",)

    def __init__(self, remaining: int):
        self.remaining = remaining


class _StreamingReader:
    """What both readers share: the buffer, EOF, byte accounting and payload streaming."""

    def __init__(self, data_chunk: int):
        self.data_chunk = data_chunk
        self.bytes_consumed = 0  # stream offset of the next unread byte
        self._buf = ReceiveBuffer()
        self._eof = False
        self._stream: _StreamState | None = None

    def feed(self, data) -> None:
        """Add bytes; ``b""`` means the peer closed its sending side."""
        if self._eof and data:
            raise LocalProtocolError("data fed after EOF")
        if not data:
            self._eof = True
        else:
            self._buf.append(data)

    @property
    def trailing(self) -> bytes:
        """Bytes buffered beyond what the events so far consumed."""
        return self._buf.remaining()

    # -- zero-copy streaming
    @property
    def payload_remaining(self) -> int:
        return self._stream.remaining if self._stream is not None else 0

    def take_payload_into(self, dest: memoryview) -> int:
        if self._stream is None:
            raise LocalProtocolError("no payload is streaming")
        n = self._buf.take_into(dest[:self._stream.remaining])
        self._stream.remaining -= n
        self.bytes_consumed += n
        return n

    def payload_received(self, n: int) -> None:
        """Account for ``n`` payload bytes the caller received directly from the transport."""
        if self._stream is None or n > self._stream.remaining or len(self._buf):
            raise LocalProtocolError("payload_received out of order")
        self._stream.remaining -= n
        self.bytes_consumed += n

    def _stream_event(self, truncated: Callable[[], RemoteProtocolError]):
        """The next Data or EndOfMessage of the payload being streamed."""
        st = self._stream
        if st.remaining == 0:
            self._stream = None
            self._end_of_frame()
            return EndOfMessage()
        if not len(self._buf):
            if self._eof:
                raise truncated()
            return NEED_DATA
        n = min(len(self._buf), st.remaining, self.data_chunk)
        st.remaining -= n
        self.bytes_consumed += n
        return Data(self._buf.take(n))

    def _end_of_frame(self) -> None:
        raise NotImplementedError


class RequestReader(_StreamingReader):
    """Server side: turns the client's byte stream into Request / RequestHead+Data events.

    Validation happens exactly where the real server validates: the command byte as soon as it
    arrives, the length as soon as its 8 bytes are in (fixed-size commands must match exactly,
    variable ones must fit the bound), the payload once it is complete.
    """

    def __init__(self, dialect: Dialect, *, max_payload: int = DEFAULT_MAX_PAYLOAD,
                 max_stream: int = DEFAULT_MAX_STREAM,
                 stream: frozenset = frozenset({Cmd.SET_TENSOR, Cmd.SET_TENSOR_2D}),
                 hello_first: bool = True, data_chunk: int = DEFAULT_DATA_CHUNK):
        super().__init__(data_chunk)
        self.dialect = dialect
        self.max_payload = max_payload
        self.max_stream = max_stream
        self.stream = stream
        self.hello_first = hello_first
        self.hello_seen = False
        self._cmd: Cmd | None = None  # command of the frame being read
        self._len: int | None = None
        self._head_pending = False  # streamed request: fixed header not yet emitted
        self._frame_start = 0

    @property
    def in_frame(self) -> bool:
        return self._cmd is not None or len(self._buf) > 0

    @property
    def frame_start(self) -> int:
        """Stream offset of the first byte of the frame read last (or being read)."""
        return self._frame_start

    def _end_of_frame(self) -> None:
        self._cmd = self._len = None

    # -- events
    def _truncated(self, what: str):
        return RemoteProtocolError(f"connection closed inside {what}", command=self._cmd_name(),
                                   field=what, offset=self.bytes_consumed - self._frame_start
                                   + len(self._buf))

    def _cmd_name(self):
        return self._cmd.value if self._cmd is not None else None

    def next_event(self):
        if self._stream is not None:
            return self._stream_event(lambda: self._truncated("payload"))
        if self._cmd is None:
            if not len(self._buf):
                return ConnectionClosed() if self._eof else NEED_DATA
            self._frame_start = self.bytes_consumed
            cid = self._buf.byte_at(0)
            if self.hello_first and not self.hello_seen and cid != HELLO_ID:
                raise RemoteProtocolError("Expected HELLO command, update client",
                                          command=cid, field="cmd", offset=0)
            if cid == HELLO_ID and self.hello_seen:
                raise RemoteProtocolError("HELLO received twice", command="HELLO", field="cmd",
                                          offset=0)
            cmd = self.dialect.ids.get(cid)
            if cmd is None:
                raise RemoteProtocolError(f"Unknown command: {cid}", command=cid, field="cmd",
                                          offset=0)
            self._cmd = cmd
        if self._len is None:
            if len(self._buf) < REQUEST_HEADER_SIZE:
                if self._eof:
                    raise self._truncated("len")
                return NEED_DATA
            (n,) = U64.unpack_from(self._buf.peek(REQUEST_HEADER_SIZE), 1)
            self._check_length(n)
            self._buf.take(REQUEST_HEADER_SIZE)
            self.bytes_consumed += REQUEST_HEADER_SIZE
            self._len = n
            if self._cmd is Cmd.HELLO:
                self.hello_seen = True
            layout = spec_for(self.dialect, self._cmd).request
            self._head_pending = (self._cmd in self.stream and not isinstance(layout, GraphLayout)
                                  and layout.variable and n >= layout.fixed_size)
        if self._head_pending:
            layout = spec_for(self.dialect, self._cmd).request
            if len(self._buf) < layout.fixed_size:
                if self._eof:
                    raise self._truncated("payload")
                return NEED_DATA
            msg = unpack_request_header(self.dialect, self._cmd, self._buf.take(layout.fixed_size))
            self.bytes_consumed += layout.fixed_size
            self._head_pending = False
            self._stream = _StreamState(self._len - layout.fixed_size)
            return RequestHead(msg, self._stream.remaining)
        n = self._len
        if len(self._buf) < n:
            if self._eof:
                raise self._truncated("payload")
            return NEED_DATA
        payload = self._buf.peek(n)
        cmd = self._cmd
        try:
            msg = unpack_request_payload(self.dialect, cmd, payload)
        finally:
            payload.release()
        self._buf.take(n)
        self.bytes_consumed += n
        self._cmd = self._len = None
        return Request(msg, REQUEST_HEADER_SIZE + n)

    def _check_length(self, n: int) -> None:
        cmd = self._cmd
        layout = spec_for(self.dialect, cmd).request
        if not layout.variable:
            if n != layout.fixed_size:
                reason = (f"HELLO request size mismatch ({n} vs {layout.fixed_size})"
                          if cmd is Cmd.HELLO else
                          f"{cmd} length {n} differs from its size {layout.fixed_size}")
                raise RemoteProtocolError(reason, command=cmd.value, field="len", offset=1)
            return
        bound = self.max_stream if cmd in self.stream else self.max_payload
        if n > bound:
            raise RemoteProtocolError(f"{cmd} payload length {n} exceeds the bound {bound}",
                                      command=cmd.value, field="len", offset=1)


class _Expectation:
    __slots__ = ("request", "size", "stream")

    def __init__(self, request: Message, size: int, stream: bool):
        self.request = request
        self.size = size
        self.stream = stream


class ResponseReader(_StreamingReader):
    """Client side: reads responses in request order; every length must be the expected one."""

    def __init__(self, dialect: Dialect, *, data_chunk: int = DEFAULT_DATA_CHUNK):
        super().__init__(data_chunk)
        self.dialect = dialect
        self._expect: deque[_Expectation] = deque()
        self._cur: _Expectation | None = None

    def expect(self, request: Message, *, stream: bool = False) -> bool:
        """Register a sent request; returns False when it has no response."""
        size = response_payload_size(self.dialect, request)
        if size is None:
            return False
        self._expect.append(_Expectation(request, size, stream))
        return True

    @property
    def pending(self) -> int:
        return len(self._expect) + (self._cur is not None)

    def _end_of_frame(self) -> None:
        self._cur = None

    def next_event(self):
        if self._stream is not None:
            return self._stream_event(lambda: self._closed("payload"))
        if self._cur is None:
            if not self._expect:
                if len(self._buf):
                    raise RemoteProtocolError(
                        f"{len(self._buf)} unexpected bytes with no request outstanding",
                        field="len", offset=self.bytes_consumed)
                return ConnectionClosed() if self._eof else NEED_DATA
            if not len(self._buf) and self._eof:
                raise self._closed("len", cmd=self._expect[0].request.cmd)
            self._cur = self._expect.popleft()
        cur = self._cur
        if len(self._buf) < RESPONSE_HEADER_SIZE + (0 if cur.stream else cur.size):
            if len(self._buf) >= RESPONSE_HEADER_SIZE:
                self._check_len(cur)
            if self._eof:
                raise self._closed("payload" if len(self._buf) >= RESPONSE_HEADER_SIZE else "len")
            return NEED_DATA
        self._check_len(cur)
        self._buf.take(RESPONSE_HEADER_SIZE)
        self.bytes_consumed += RESPONSE_HEADER_SIZE
        if cur.stream:
            self._stream = _StreamState(cur.size)
            return ResponseHead(cur.request, cur.size)
        payload = self._buf.take(cur.size)
        self.bytes_consumed += cur.size
        self._cur = None
        return Response(unpack_response_payload(self.dialect, cur.request.cmd, payload),
                        RESPONSE_HEADER_SIZE + cur.size)

    def _check_len(self, cur: _Expectation) -> None:
        (n,) = U64.unpack_from(self._buf.peek(RESPONSE_HEADER_SIZE), 0)
        if n != cur.size:
            raise RemoteProtocolError(
                f"malformed {cur.request.cmd} response: length {n}, expected {cur.size}",
                command=cur.request.cmd.value, field="len", offset=0)

    def _closed(self, what: str, cmd=None):
        cmd = cmd or (self._cur.request.cmd if self._cur else None)
        return RemoteProtocolError(f"server closed the connection while a response was due ({what})",
                                   command=cmd.value if cmd else None, field=what,
                                   offset=self.bytes_consumed)
