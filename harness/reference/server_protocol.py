"""One reference-server connection without I/O: bytes in, responses out.

:class:`ServerProtocol` runs the sans-IO ``ServerConnection`` for framing and
``server_core.ServerSession`` for semantics, plus the dialect's receive policy and the server's
misbehaviours. It never blocks (but in COMM_INIT / COMM_ALLREDUCE, which wait on the peer
server, each wait with a deadline: harness.reference.comm), never raises for what the client sent (a
rule that makes the server close is recorded as ``close_reason``) and never holds a SET_TENSOR
payload whole: the payload goes straight into the destination buffer, and a driver that owns a
socket may receive it there itself (:meth:`payload_view` / :meth:`payload_received`).

Drivers: ``ReferenceServer.serve_transport`` (any Transport, one thread per connection) and
``harness.reference.pair.ConnectionPair`` (the reference client in the same thread, bytes in
memory).
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from ..proto import (NEED_DATA, ConnectionClosed, EndOfMessage, Request, RequestHead,
                     ServerConnection)
from ..proto.constants import Cmd
from ..proto.errors import ProtocolError
from ..proto.wire import RESPONSE_HEADER_SIZE, U64
from ..transport.base import TransportClosed
from .behaviour_view import RECEIVE_STREAMED, BehaviourView
from .server_core import Close, ServerSession, ServerState, SetTensorSink

DISCARD_CHUNK = 1 << 20  # scratch for payloads the old server reads only to drop them
_LEAKED_FDS: list[int] = []  # knob leak_fd_per_connection: kept open for the process's life


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


def close_reason_of(exc: BaseException, idle_timeout: float) -> str:
    """The record's close reason for an error that ended a connection."""
    if isinstance(exc, Close):
        return exc.reason
    if isinstance(exc, ProtocolError):
        return str(exc)
    if isinstance(exc, TimeoutError):
        # a transport that knows why it waited (emulated RDMA) says so
        return getattr(exc, "reason", None) or f"no data from the client within {idle_timeout} s"
    if isinstance(exc, (TransportClosed, OSError)):
        return f"connection error: {exc}"
    raise exc


class ServerProtocol:
    """The server side of one connection, as a state machine over bytes.

    ``receive_data(b"")`` means the client finished sending. ``process`` handles what is
    buffered and queues responses (``take_responses``: one list of buffers per response, to
    be written back to back and flushed). After a HELLO response processing pauses until the
    driver has sent it and called ``take_upgrade`` (the RDMA switch comes between the HELLO
    response and the next read, spec 10.1). ``pump`` does all three in order.
    """

    def __init__(self, state: ServerState, behaviour: BehaviourView, record: ConnectionRecord, *,
                 local_conn_caps: bytes | None = None):
        self.state = state
        self.config = state.config
        self.knobs = state.config.knobs
        self.record = record
        self.session = ServerSession(state, behaviour)
        self.session.local_conn_caps = local_conn_caps
        self.streamed = behaviour.server_receive == RECEIVE_STREAMED
        self.receive_step = behaviour.server_chunk  # at most this much per receive call
        # A streamed payload lands in a buffer, so nothing larger than all memory can fit.
        self.conn = ServerConnection(self.config.dialect, max_payload=self.config.max_payload,
                                     max_stream=self.config.memory_budget,
                                     stream=frozenset({Cmd.SET_TENSOR}))
        self.closed = False
        self._responses: deque[list] = deque()
        self._upgrade: bytes | None = None
        self._upgrade_pending = False
        self._stalled = False
        self._sink: SetTensorSink | None = None
        self._sink_got = self._sink_size = 0
        self._discard_left = 0
        self._discard_close: Close | None = None
        self._scratch: memoryview | None = None
        self._frame_lock_held = False
        if self.knobs.leak_fd_per_connection:
            _LEAKED_FDS.append(os.open(os.devnull, os.O_RDONLY))

    # ------------------------------------------------------------ driver API
    @property
    def close_reason(self) -> str | None:
        return self.record.close_reason

    @property
    def bytes_in(self) -> int:
        return self.conn.reader.bytes_consumed

    def receive_data(self, data) -> None:
        """Bytes from the client (``b""``: it finished sending)."""
        if self.closed:
            return
        self._take_frame_lock()
        if self._stalled:
            if not data:
                self._close(Close("misbehaviour: stalled until the client closed"))
            return
        view = memoryview(data).cast("B")
        if not len(view):
            self._eof()
            return
        while len(view) and not self.closed:
            dest = self.payload_view()
            if dest is None:
                break
            n = min(len(dest), len(view))
            dest[:n] = view[:n]
            self.payload_received(n)
            view = view[n:]
        if len(view) and not self.closed:
            self.conn.receive_data(bytes(view))

    def _take_frame_lock(self) -> None:
        if self.knobs.freeze_mid_frame and not self._frame_lock_held:
            # Every connection with bytes to process waits for the one that is mid-frame;
            # released by process() once this one is between frames again.
            self.state.frame_lock.acquire()
            self._frame_lock_held = True

    def _release_frame_lock(self) -> None:
        if self._frame_lock_held:
            self._frame_lock_held = False
            self.state.frame_lock.release()

    @property
    def mid_frame(self) -> bool:
        return self._sink is not None or self._discard_close is not None \
            or self.conn.reader.in_frame

    def payload_view(self) -> memoryview | None:
        """Where the next payload bytes may be received directly, or None (use receive_data)."""
        if self._sink is not None:
            # in steps of the dialect's receive chunk, as the C server's receive loop reads
            return self._sink.dest[self._sink_got:self._sink_got + self.receive_step]
        if self._discard_close is not None:
            if self._scratch is None:
                self._scratch = memoryview(bytearray(DISCARD_CHUNK))
            return self._scratch[:min(self._discard_left, DISCARD_CHUNK)]
        return None

    def payload_received(self, n: int) -> None:
        """``n`` bytes landed in :meth:`payload_view`'s buffer (0: the client finished)."""
        if n == 0:
            self._eof()
            return
        self._take_frame_lock()
        self.conn.reader.payload_received(n)
        if self._sink is not None:
            self._sink_got += n
            self._sink_progress()
        else:
            self._discard_left -= n
            self._discard_progress()

    def process(self) -> None:
        """Handle every buffered event (until more data is needed, a close or an upgrade)."""
        try:
            self._process()
        finally:
            if self._frame_lock_held and (self.closed or not self.mid_frame):
                self._release_frame_lock()

    def _process(self) -> None:
        try:
            while not (self.closed or self._upgrade_pending or self._sink is not None
                       or self._discard_close is not None or self._stalled):
                ev = self.conn.next_event()
                if ev is NEED_DATA:
                    return
                if isinstance(ev, ConnectionClosed):
                    self.closed = True
                elif isinstance(ev, Request):
                    self.record.commands += 1
                    self.record.hello_only = (self.record.commands == 1
                                              and ev.message.cmd is Cmd.HELLO)
                    self._request(ev.message)
                elif isinstance(ev, RequestHead):
                    self.record.commands += 1
                    self._set_tensor(ev.message, ev.data_length)
                elif not isinstance(ev, EndOfMessage):  # Data: a payload nobody took
                    raise Close(f"unexpected payload event {type(ev).__name__}")
        except (Close, ProtocolError) as e:
            self._close(e)

    def pump(self, send: Callable[[list], None],
             upgrade: Callable[[bytes | None], None] | None = None) -> None:
        """``process``, handing each response's buffers to ``send`` in order, and ``upgrade``
        the client's HELLO conn_caps right after the HELLO response went out."""
        while True:
            self.process()
            for parts in self.take_responses():
                send(parts)
            if not self._upgrade_pending:
                return
            caps = self.take_upgrade()
            if upgrade is not None:
                upgrade(caps)

    def take_responses(self) -> list[list]:
        out = list(self._responses)
        self._responses.clear()
        return out

    def take_upgrade(self) -> bytes | None:
        """The client's HELLO conn_caps once its response is out (None: no switch to make);
        processing resumes after this call."""
        caps, self._upgrade, self._upgrade_pending = self._upgrade, None, False
        return caps

    def abort(self) -> None:
        """The connection ended under the protocol (I/O error): drop a half-written entry."""
        self._release_frame_lock()
        if self._sink is not None:
            self._sink.abort()
            self._sink = None

    # ------------------------------------------------------------ requests
    def _close(self, exc: Close | ProtocolError) -> None:
        self.abort()
        self.closed = True
        self.record.close_reason = close_reason_of(exc, 0)

    def _eof(self) -> None:
        if self._sink is not None:
            self._close(Close(f"[set_tensor] connection closed after {self._sink_got} of "
                              f"{self._sink_size} payload bytes"))
        elif self._discard_close is not None:
            self._close(self._discard_close)
        else:
            self.conn.receive_data(b"")

    def _request(self, msg) -> None:
        name = msg.cmd.value
        if self.knobs.close_on == name:
            raise Close(f"misbehaviour: close on {name}")
        if self.knobs.stall_on == name:
            self._stalled = True  # never answer; the driver's idle deadline bounds the wait
            return
        if self.knobs.spin_on == name:
            end = time.thread_time() + self.knobs.spin_seconds  # CPU time, whatever the load
            while time.thread_time() < end:
                pass
        rsp = self.session.handle(msg)
        if rsp is None:
            return
        if self.knobs.garble_response_len == name or (
                msg.cmd is Cmd.HELLO and self.knobs.hello_response_size is not None):
            frame = self.conn.send(rsp)
            n = (self.knobs.hello_response_size if msg.cmd is Cmd.HELLO
                 and self.knobs.hello_response_size is not None
                 else len(frame) - RESPONSE_HEADER_SIZE + 1)
            self._responses.append([U64.pack(n) + frame[RESPONSE_HEADER_SIZE:]])
        else:
            self._responses.append(self.conn.send_parts(rsp))
        if msg.cmd is Cmd.HELLO:
            # Spec 10.1: the HELLO response goes out over TCP; then the switch with the
            # client's caps. No confirmation follows (Linux), so the client may stay on TCP.
            self._upgrade_pending = True
            self._upgrade = msg.conn_caps if self.config.dialect.hello_caps else None

    def _set_tensor(self, msg, size: int) -> None:
        try:
            sink = self.session.begin_set_tensor(msg, size)
        except Close as c:
            if self.streamed:
                raise
            # the old server reads the whole message before checking
            self._discard_close, self._discard_left = c, size
            while self._discard_left:
                got = self.conn.reader.take_payload_into(self.payload_view())
                if not got:
                    break
                self._discard_left -= got
            self._discard_progress()
            return
        self._sink, self._sink_size = sink, size
        self._sink_got = self.conn.reader.take_payload_into(sink.dest)  # came with the header
        self._sink_progress()

    def _sink_progress(self) -> None:
        if self._sink_got < self._sink_size:
            return
        sink, self._sink = self._sink, None
        try:
            self.session.end_set_tensor(sink)
        except Close as c:
            self._close(c)

    def _discard_progress(self) -> None:
        if not self._discard_left:
            self._close(self._discard_close)
