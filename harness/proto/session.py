"""Decode both directions of a captured session into request/response exchanges.

Fed incrementally (a proxy calls ``feed_c2s`` / ``feed_s2c`` as bytes pass) or all at once
(``decode_session``). Which dialect the rest of the session speaks is read off the HELLO
response unless the caller pins it; payloads larger than ``keep_data`` are summarised by
length and FNV hash instead of being kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .wire import REQUEST_HEADER_SIZE, RESPONSE_HEADER_SIZE, frame_heads
from .constants import CONN_CAPS_SIZE, HELLO_ID, Cmd
from .dialects import DEFAULT, EMPTY_HELLO, Dialect, dialect_for_version, get_dialect
from .errors import ProtocolError
from .events import (NEED_DATA, ConnectionClosed, Data, EndOfMessage, Request, RequestHead,
                     Response, ResponseHead)
from .fnv import Fnv1a64
from .readers import RequestReader, ResponseReader
from .messages import RESPONSE_TYPES, HelloResponse, Message



@dataclass
class Exchange:
    """One request and, if the command has one, its response."""

    index: int
    request: Message | None = None
    response: Message | None = None
    req_offset: int = 0  # byte offset of the request in the client's stream
    req_size: int = 0
    rsp_offset: int | None = None
    rsp_size: int = 0
    data_length: int = 0  # payload bytes of a streamed request or response
    data_hash: str | None = None  # FNV-1a of that payload, when it was not kept
    expects_response: bool = False

    @property
    def cmd(self) -> Cmd | None:
        return self.request.cmd if self.request is not None else None


@dataclass
class Session:
    exchanges: list[Exchange] = field(default_factory=list)
    dialect: Dialect | None = None
    server_hello: HelloResponse | None = None
    c2s_error: str | None = None  # first undecodable thing the client sent, if any
    s2c_error: str | None = None
    c2s_error_offset: int | None = None
    s2c_error_offset: int | None = None
    c2s_closed: bool = False
    s2c_closed: bool = False
    c2s_bytes: int = 0
    s2c_bytes: int = 0

    def count(self, cmd: Cmd) -> int:
        return sum(1 for e in self.exchanges if e.cmd is cmd)

    @property
    def commands(self) -> list[Cmd]:
        return [e.cmd for e in self.exchanges if e.cmd is not None]


class SessionDecoder:
    def __init__(self, dialect: Dialect | str | None = None, *, keep_data: int = 1 << 20):
        self.pinned = get_dialect(dialect) if dialect is not None else None
        self.keep_data = keep_data
        self.session = Session(dialect=self.pinned)
        self._req_reader: RequestReader | None = None
        self._rsp_reader: ResponseReader | None = None
        self._c2s_pending = bytearray()  # client bytes before the dialect is known
        self._s2c_pending = bytearray()
        self._req_stream: Exchange | None = None
        self._req_hash: Fnv1a64 | None = None
        self._req_data: list[bytes] | None = None
        self._rsp_stream: Exchange | None = None
        self._rsp_hash: Fnv1a64 | None = None
        self._rsp_data: list[bytes] | None = None
        self._awaiting: list[Exchange] = []  # exchanges whose response is still due
        self._c2s_eof = self._s2c_eof = False
        if self.pinned is not None:
            self._start(self.pinned)

    # The HELLO request length tells the family (0: proto <= 3, 24: >= 4) before the server
    # has answered; the response then names the exact dialect.
    def _start(self, d: Dialect) -> None:
        self.session.dialect = d
        self._req_reader = RequestReader(d, max_payload=1 << 62, max_stream=1 << 62,
                                         hello_first=False)
        self._rsp_reader = ResponseReader(d)

    def _detect(self) -> None:
        if self._req_reader is not None:
            return
        c = self._c2s_pending
        opening = frame_heads(c[:REQUEST_HEADER_SIZE], requests=True)  # once its header is in
        if opening and opening[0].cmd == HELLO_ID:
            guess = EMPTY_HELLO if opening[0].length == 0 else DEFAULT
        elif c and c[0] != HELLO_ID:
            guess = DEFAULT
        elif self._c2s_eof and not opening:
            guess = DEFAULT
        else:
            return
        s = self._s2c_pending
        answer = frame_heads(s[:RESPONSE_HEADER_SIZE], requests=False)
        at = answer[0].payload if answer else None
        if guess.hello_caps and answer and len(s) >= at + 4:
            if answer[0].length == 4 + CONN_CAPS_SIZE:
                found = dialect_for_version(tuple(s[at:at + 3]), server_flags_seen=s[at + 3] != 0)
                guess = found or guess
        elif not guess.hello_caps and answer and len(s) >= at + 3:
            found = dialect_for_version(tuple(s[at:at + 3]))
            guess = found if found is not None and not found.hello_caps else guess
        elif not (self._s2c_eof or self._c2s_eof):
            # wait for the HELLO response before committing to a dialect
            return
        self._start(guess)

    # -- feeding
    def feed_c2s(self, data: bytes) -> None:
        if not data:
            self._c2s_eof = True
        if self._req_reader is None:
            self._c2s_pending += data
            self._detect()
            self._flush_pending()
        else:
            self._feed_req(data)

    def feed_s2c(self, data: bytes) -> None:
        if not data:
            self._s2c_eof = True
        if self._req_reader is None:
            self._s2c_pending += data
            self._detect()
            self._flush_pending()
        else:
            self._feed_rsp(data)

    def _flush_pending(self) -> None:
        """Once the dialect is known, decode what waited for it (requests first)."""
        if self._req_reader is None:
            return
        c, self._c2s_pending = bytes(self._c2s_pending), bytearray()
        s, self._s2c_pending = bytes(self._s2c_pending), bytearray()
        if c:
            self._feed_req(c)
        if self._c2s_eof:
            self._feed_req(b"")
        if s:
            self._feed_rsp(s)
        if self._s2c_eof:
            self._feed_rsp(b"")

    def close(self) -> Session:
        """Both directions ended: flush what is buffered and return the session."""
        if not self._c2s_eof:
            self.feed_c2s(b"")
        if not self._s2c_eof:
            self.feed_s2c(b"")
        if self._req_reader is None:  # nothing decodable was ever seen
            self._start(DEFAULT)
            self._flush_pending()
        return self.session

    # -- requests
    def _feed_req(self, data: bytes) -> None:
        s = self.session
        if s.c2s_error is not None:
            return
        s.c2s_bytes += len(data)
        r = self._req_reader
        r.feed(data)
        while True:
            try:
                ev = r.next_event()
            except ProtocolError as e:
                s.c2s_error, s.c2s_error_offset = str(e), r.bytes_consumed
                return
            if ev is NEED_DATA:
                return
            if isinstance(ev, ConnectionClosed):
                s.c2s_closed = True
                return
            if isinstance(ev, Request):
                ex = Exchange(len(s.exchanges), ev.message, req_offset=r.frame_start,
                              req_size=ev.frame_size)
                self._add_request(ex)
            elif isinstance(ev, RequestHead):
                ex = Exchange(len(s.exchanges), ev.message, req_offset=r.frame_start,
                              req_size=r.bytes_consumed - r.frame_start,
                              data_length=ev.data_length)
                self._req_stream, self._req_hash = ex, Fnv1a64()
                self._req_data = [] if ev.data_length <= self.keep_data else None
                self._add_request(ex)
            elif isinstance(ev, Data):
                ex = self._req_stream
                ex.req_size += len(ev.data)
                self._req_hash.update(ev.data)
                if self._req_data is not None:
                    self._req_data.append(ev.data)
            elif isinstance(ev, EndOfMessage):
                ex = self._req_stream
                if self._req_data is not None:
                    ex.request = _with_data(ex.request, b"".join(self._req_data))
                else:
                    ex.data_hash = self._req_hash.hexdigest()
                self._req_stream = self._req_hash = self._req_data = None

    def _add_request(self, ex: Exchange) -> None:
        s = self.session
        s.exchanges.append(ex)
        msg = ex.request
        big = msg.cmd in (Cmd.GET_TENSOR, Cmd.GET_TENSOR_2D)
        ex.expects_response = self._rsp_reader.expect(msg, stream=big)
        if ex.expects_response:
            self._awaiting.append(ex)

    # -- responses
    def _feed_rsp(self, data: bytes) -> None:
        s = self.session
        if s.s2c_error is not None:
            return
        s.s2c_bytes += len(data)
        r = self._rsp_reader
        r.feed(data)
        while True:
            start = r.bytes_consumed
            try:
                ev = r.next_event()
            except ProtocolError as e:
                s.s2c_error, s.s2c_error_offset = str(e), r.bytes_consumed
                return
            if ev is NEED_DATA:
                return
            if isinstance(ev, ConnectionClosed):
                s.s2c_closed = True
                return
            if isinstance(ev, Response):
                ex = self._awaiting.pop(0)
                ex.response, ex.rsp_offset, ex.rsp_size = ev.message, start, ev.frame_size
                if isinstance(ev.message, HelloResponse):
                    s.server_hello = ev.message
            elif isinstance(ev, ResponseHead):
                ex = self._awaiting[0]
                ex.rsp_offset, ex.rsp_size = start, RESPONSE_HEADER_SIZE
                ex.data_length = ev.data_length
                self._rsp_stream, self._rsp_hash = ex, Fnv1a64()
                self._rsp_data = [] if ev.data_length <= self.keep_data else None
            elif isinstance(ev, Data):
                self._rsp_stream.rsp_size += len(ev.data)
                self._rsp_hash.update(ev.data)
                if self._rsp_data is not None:
                    self._rsp_data.append(ev.data)
            elif isinstance(ev, EndOfMessage):
                ex = self._awaiting.pop(0)
                cls = RESPONSE_TYPES[ex.request.cmd]
                if self._rsp_data is not None:
                    ex.response = cls(data=b"".join(self._rsp_data))
                else:
                    ex.response = cls()
                    ex.data_hash = self._rsp_hash.hexdigest()
                self._rsp_stream = self._rsp_hash = self._rsp_data = None


def _with_data(msg: Message, data: bytes) -> Message:
    return replace(msg, data=data)


def decode_session(c2s: bytes, s2c: bytes, dialect: Dialect | str | None = None, *,
                   keep_data: int = 1 << 30) -> Session:
    """Decode two complete byte streams (requests first, as they were causally ordered)."""
    dec = SessionDecoder(dialect, keep_data=keep_data)
    dec.feed_c2s(c2s)
    dec.feed_s2c(s2c)
    return dec.close()
