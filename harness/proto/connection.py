"""Sans-IO client and server connections: bytes in, events out; messages in, bytes out."""

from __future__ import annotations

from collections import deque

from .wire import U64, request_header
from .codec import has_response, pack_fixed, pack_request, pack_response
from .constants import Cmd
from .dialects import Dialect, get_dialect
from .errors import LocalProtocolError
from .events import Request, RequestHead, Response
from .readers import (DEFAULT_DATA_CHUNK, DEFAULT_MAX_PAYLOAD, DEFAULT_MAX_STREAM,
                      RequestReader, ResponseReader)
from .messages import HelloResponse, Message, spec_for



class ClientConnection:
    """The client half. ``send`` returns the bytes to write; responses come from ``next_event``."""

    def __init__(self, dialect: Dialect | str, *, strict: bool = True,
                 data_chunk: int = DEFAULT_DATA_CHUNK):
        self.dialect = get_dialect(dialect)
        self.strict = strict
        self.reader = ResponseReader(self.dialect, data_chunk=data_chunk)
        self.hello_sent = False
        self.server_hello: HelloResponse | None = None

    def _check_order(self, msg: Message) -> None:
        if not self.strict:
            return
        if not self.hello_sent and msg.cmd is not Cmd.HELLO:
            raise LocalProtocolError(f"{msg.cmd} before HELLO")
        if self.hello_sent and msg.cmd is Cmd.HELLO:
            raise LocalProtocolError("HELLO sent twice")

    def send(self, msg: Message, *, stream_response: bool = False) -> bytes:
        self._check_order(msg)
        frame = pack_request(self.dialect, msg)
        self.hello_sent = self.hello_sent or msg.cmd is Cmd.HELLO
        self.reader.expect(msg, stream=stream_response)
        return frame

    def send_head(self, msg: Message, data_length: int) -> bytes:
        """Frame header and fixed fields of a request whose ``data`` the caller sends itself.

        This is how the new clients send SET_TENSOR: header, then the caller's buffer, with
        no staging copy. The bytes on the wire are the same as ``send``'s.
        """
        self._check_order(msg)
        layout = spec_for(self.dialect, msg.cmd).request
        if not getattr(layout, "tail", None) or len(getattr(msg, layout.tail)):
            raise LocalProtocolError(f"send_head needs a variable request with empty data, got {msg.cmd}")
        fixed = pack_fixed(layout, msg)
        self.reader.expect(msg)
        return request_header(self.dialect.id_of(msg.cmd), len(fixed) + data_length) + fixed

    def receive_data(self, data) -> None:
        self.reader.feed(data)

    def next_event(self):
        ev = self.reader.next_event()
        if isinstance(ev, Response) and isinstance(ev.message, HelloResponse):
            self.server_hello = ev.message
        return ev

    @property
    def pending_responses(self) -> int:
        return self.reader.pending


class ServerConnection:
    """The server half: request events in order, and a check that responses answer them."""

    def __init__(self, dialect: Dialect | str, *, max_payload: int = DEFAULT_MAX_PAYLOAD,
                 max_stream: int = DEFAULT_MAX_STREAM,
                 stream: frozenset = frozenset({Cmd.SET_TENSOR, Cmd.SET_TENSOR_2D}),
                 hello_first: bool = True, data_chunk: int = DEFAULT_DATA_CHUNK):
        self.dialect = get_dialect(dialect)
        self.reader = RequestReader(self.dialect, max_payload=max_payload, max_stream=max_stream,
                                    stream=stream, hello_first=hello_first, data_chunk=data_chunk)
        self._owed: deque[Cmd] = deque()

    def receive_data(self, data) -> None:
        self.reader.feed(data)

    def next_event(self):
        ev = self.reader.next_event()
        if isinstance(ev, (Request, RequestHead)) and has_response(self.dialect, ev.message.cmd):
            self._owed.append(ev.message.cmd)
        return ev

    def send(self, msg: Message) -> bytes:
        if not self._owed:
            raise LocalProtocolError(f"{msg.cmd} response with no request awaiting one")
        if self._owed[0] is not msg.cmd:
            raise LocalProtocolError(f"{msg.cmd} response while {self._owed[0]} is owed")
        self._owed.popleft()
        return pack_response(self.dialect, msg)

    def send_parts(self, msg: Message) -> list:
        """Like ``send`` but a data tail is returned as its own buffer, not copied."""
        layout = spec_for(self.dialect, msg.cmd).response if self._owed else None
        data = getattr(msg, "data", None)
        if layout is None or not getattr(layout, "tail", None) or data is None or len(data) < 4096:
            return [self.send(msg)]
        if self._owed[0] is not msg.cmd:
            raise LocalProtocolError(f"{msg.cmd} response while {self._owed[0]} is owed")
        self._owed.popleft()
        n = data.nbytes if isinstance(data, memoryview) else len(data)
        return [U64.pack(n), data]

    @property
    def owed(self) -> int:
        return len(self._owed)
