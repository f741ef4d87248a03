"""A recording TCP proxy: relays client connections to an upstream and records both directions.

One background thread runs a ``selectors`` loop over non-blocking sockets. Each direction of
a connection receives into its own preallocated 1 MiB buffer (``recv_into``: no allocation
per read) and forwards from it; a direction is not read again until its buffer is flushed,
so a slow receiver throttles its sender instead of growing memory. Python work is per read
and per frame header, never per byte.

Recording keeps the first ``keep`` bytes of each direction verbatim. Beyond that it follows
the frame lengths (request: cmd u8 + len u64, response: len u64; no dialect needed) and keeps
only the first ``head_bytes`` of each frame (GRAPH_COMPUTE frames whole) until another
``heads_keep`` bytes are used up; everything else is recorded as length only. So a long
session stays decodable (headers intact, bulk payload elided) with bounded memory.
"""

from __future__ import annotations

import errno
import hashlib
import selectors
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from ..proto.session import Session, SessionDecoder
from ..proto.wire import FrameWalker
from .transcript import C2S, S2C, Chunk, Transcript

OnChunk = Callable[[int, str, memoryview, float], None]

GRAPH_COMPUTE_ID = 10  # the same id in every dialect; its payload is structure, not bulk data
_COALESCE_S = 0.01  # elided reads closer together than this share one Chunk record
_RESET_ERRNOS = {errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED}


class _FrameRecorder:
    """Decides which bytes of one direction are kept, and appends them to the transcript."""

    def __init__(self, tr: Transcript, direction: str, keep: int, head_bytes: int,
                 heads_keep: int, *, hash_elided: bool = False):
        self.tr = tr
        # SHA-256 of each elided run, for a transcript compacted from real bytes (the live
        # proxy does not hash: it would slow every upload it measures)
        self.hash_elided = hash_elided
        self._hashers: dict[int, object] = {}  # id(chunk) -> its running hash
        self.direction = direction
        self.keep = keep
        self.head_bytes = head_bytes
        self.heads_left = heads_keep
        self.offset = 0  # bytes of this direction seen so far
        self.walker = FrameWalker(requests=direction == C2S)
        self.tracking = head_bytes > 0  # follow frame boundaries (stops when the budget is spent)
        self.keep_left = 0  # payload bytes of the current frame still to keep

    def record(self, t: float, data: memoryview, *, real: bool = True) -> None:
        n = len(data)
        full = max(0, min(n, self.keep - self.offset))  # bytes still inside the verbatim budget
        self.offset += n
        spans = self._frame_spans(data) if self.tracking else [(0, n, False)]
        ranges: list[tuple[int, int, bool]] = []  # (start, end, kept)
        for start, end, head in spans:
            if start < full:
                cut = min(end, full)
                ranges.append((start, cut, True))
                start = cut
                if start >= end:
                    continue
            if head and self.tracking:
                if end - start <= self.heads_left:
                    self.heads_left -= end - start
                    ranges.append((start, end, True))
                    continue
                self.tracking = False  # heads budget spent: lengths only from here on
            ranges.append((start, end, False))
        for start, end, kept in _merge_ranges(ranges):
            self._append(t, data[start:end], kept, real=real)

    def _frame_spans(self, data: memoryview) -> list[tuple[int, int, bool]]:
        """Split a read at frame boundaries: (start, end, is frame head to keep)."""
        spans = []
        for lo, hi, header, frame in self.walker.feed(data):
            if header:
                spans.append((lo, hi, True))
                if frame is not None:  # a GRAPH_COMPUTE payload is structure: kept whole
                    self.keep_left = frame.length if frame.cmd == GRAPH_COMPUTE_ID else \
                        min(frame.length, self.head_bytes)
                continue
            head = min(hi - lo, self.keep_left)
            if head:
                spans.append((lo, lo + head, True))
                self.keep_left -= head
            if hi - lo > head:
                spans.append((lo + head, hi, False))
        return spans

    def _append(self, t: float, data: memoryview, kept: bool, *, real: bool = True) -> None:
        chunks = self.tr.chunks
        if kept and real:  # bytes the source did not have stay elided: never zeros as data
            chunks.append(Chunk(t, self.direction, len(data), bytes(data)))
            return
        last = chunks[-1] if chunks else None
        if (last is not None and last.data is None and last.direction == self.direction
                and t - last.t < _COALESCE_S):
            last.length += len(data)  # one record per burst keeps long transfers small
        else:
            last = Chunk(t, self.direction, len(data), None)
            chunks.append(last)
            if self.hash_elided:
                self._hashers[id(last)] = hashlib.sha256()
        h = self._hashers.get(id(last))
        if h is not None:
            if real:
                h.update(data)
            else:  # bytes the source had already elided: no hash can stand for them
                del self._hashers[id(last)]

    def finish(self) -> None:
        """Set each elided chunk's hash (compact's last step)."""
        for c in self.tr.chunks:
            h = self._hashers.pop(id(c), None)
            if h is not None and c.data is None and c.direction == self.direction:
                c.sha256 = h.digest()


def compact(tr: Transcript, keep: int, *, head_bytes: int = 512,
            heads_keep: int | None = None, hash_elided: bool = False) -> Transcript:
    """The transcript the proxy would have recorded with these budgets: frame headers kept,
    bulk payload beyond ``keep`` bytes per direction recorded by length only. For transcripts
    recorded elsewhere in full (emulated RDMA endpoints) before they are written to disk, and
    for a passing cell's transcripts after its verdict (``hash_elided``: each elided run
    keeps the SHA-256 of its bytes, where the source had them all)."""
    out = Transcript(meta=dict(tr.meta), keep=keep)
    out.closed = dict(tr.closed)
    recorders = {d: _FrameRecorder(out, d, keep, head_bytes,
                                   keep if heads_keep is None else heads_keep,
                                   hash_elided=hash_elided)
                 for d in (C2S, S2C)}
    for c in tr.chunks:
        data = c.data if c.data is not None else bytes(c.length)
        recorders[c.direction].record(c.t, memoryview(data), real=c.data is not None)
    for r in recorders.values():
        r.finish()
    return out


class LiveDecoder:
    """An ``on_chunk`` observer that decodes every connection while it runs.

    Costs a copy and a decode per read (the decoder hashes streamed payloads), so it lowers
    the proxy's throughput; leave it out for bulk transfers and decode the transcript later.
    """

    def __init__(self, dialect=None, *, keep_data: int = 1 << 16):
        self.dialect = dialect
        self.keep_data = keep_data
        self.decoders: dict[int, SessionDecoder] = {}

    def __call__(self, conn_index: int, direction: str, data: memoryview, t: float) -> None:
        dec = self.decoders.get(conn_index)
        if dec is None:
            dec = self.decoders[conn_index] = SessionDecoder(self.dialect, keep_data=self.keep_data)
        (dec.feed_c2s if direction == C2S else dec.feed_s2c)(bytes(data))

    def session(self, conn_index: int) -> Session:
        """What has been decoded so far (``SessionDecoder.close()`` it for the final state)."""
        return self.decoders[conn_index].session


def _merge_ranges(ranges: list[tuple[int, int, bool]]) -> list[tuple[int, int, bool]]:
    out: list[tuple[int, int, bool]] = []
    for start, end, kept in ranges:
        if end <= start:
            continue
        if out and out[-1][2] == kept and out[-1][1] == start:
            out[-1] = (out[-1][0], end, kept)
        else:
            out.append((start, end, kept))
    return out


@dataclass
class _Pipe:
    """One direction of a relayed connection."""

    direction: str
    src: socket.socket
    dst: socket.socket
    buf: bytearray
    recorder: _FrameRecorder
    start: int = 0  # unsent bytes are buf[start:end]
    end: int = 0
    eof: bool = False  # the source closed (FIN) or reset
    shut: bool = False  # FIN forwarded to the destination
    broken: bool = False  # the destination refused data

    @property
    def pending(self) -> int:
        return self.end - self.start

    @property
    def done(self) -> bool:
        return self.broken or (self.eof and self.shut)


@dataclass
class _Conn:
    index: int
    client: socket.socket
    upstream: socket.socket
    transcript: Transcript
    pipes: dict = field(default_factory=dict)
    connected: bool = False
    connect_deadline: float = 0.0
    last_activity: float = 0.0
    closed: bool = False
    masks: dict = field(default_factory=dict)  # socket -> registered event mask


class RecordingProxy:
    """Listen on ``host:port`` (0 = a free port), relay every client to ``upstream``, record.

    ``transcripts`` holds one Transcript per accepted connection, in accept order; read it
    after ``stop()`` (during the run it is only appended to). ``on_chunk(conn_index,
    direction, data, t)`` is called for every read with a memoryview that is valid only during
    the call (copy what you keep). ``idle_timeout`` closes a connection with no traffic in
    either direction for that long; ``deadline`` (seconds after ``start``) ends everything.
    """

    def __init__(self, upstream: tuple[str, int], *, host: str = "127.0.0.1", port: int = 0,
                 keep: int = 64 << 20, head_bytes: int = 512, heads_keep: int | None = None,
                 idle_timeout: float = 60.0, deadline: float | None = None,
                 connect_timeout: float = 5.0, recv_size: int = 1 << 20,
                 on_chunk: OnChunk | None = None):
        self.upstream = (upstream[0], int(upstream[1]))
        self.keep = keep
        self.head_bytes = head_bytes
        self.heads_keep = keep if heads_keep is None else heads_keep
        self.idle_timeout = idle_timeout
        self.deadline = deadline
        self.connect_timeout = connect_timeout
        self.recv_size = recv_size
        self.on_chunk = on_chunk
        self.transcripts: list[Transcript] = []
        self.errors: list[str] = []  # callback failures and other non-fatal trouble
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((host, port))
        self._listener.listen(16)
        self._listener.setblocking(False)
        self.address: tuple[str, int] = self._listener.getsockname()[:2]
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._live: dict[int, _Conn] = {}  # open connections by index (closed ones drop out)
        self._accepted = 0
        self._deadline_at: float | None = None

    @property
    def port(self) -> int:
        return self.address[1]

    # -- lifecycle
    def start(self) -> "RecordingProxy":
        if self._thread is not None:
            raise RuntimeError("proxy already started")
        if self.deadline is not None:
            self._deadline_at = time.monotonic() + self.deadline
        self._sel.register(self._listener, selectors.EVENT_READ, "accept")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._run, name=f"rpc-proxy-{self.port}",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> list[Transcript]:
        """Close every connection, stop the thread and return the transcripts."""
        self._stopping.set()
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass  # already woken or torn down
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise RuntimeError("proxy thread did not stop")
        else:
            self._shutdown()
        return self.transcripts

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- observation from other threads (the matrix watchdog)
    def active_connections(self) -> int:
        return len(self._live)

    def idle_seconds(self) -> float:
        """Seconds since the last byte moved on any open connection (0 with none open)."""
        live = list(self._live.values())
        if not live:
            return 0.0
        return time.monotonic() - max(c.last_activity for c in live)

    def wait_quiet(self, timeout: float = 10.0) -> bool:
        """Wait until every accepted connection has ended, so its transcript is complete."""
        end = time.monotonic() + timeout
        while self._live and time.monotonic() < end:
            time.sleep(0.005)
        return not self._live

    def __enter__(self) -> "RecordingProxy":
        return self.start() if self._thread is None else self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- the loop
    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                now = time.monotonic()
                if self._deadline_at is not None and now >= self._deadline_at:
                    for c in list(self._live.values()):
                        self._finish(c, "deadline")
                    break
                for key, mask in self._sel.select(self._next_timeout(now)):
                    what = key.data
                    if what == "accept":
                        self._accept()
                    elif what == "wake":
                        try:
                            self._wake_r.recv(64)
                        except BlockingIOError:
                            pass
                    else:
                        conn, sock = what
                        if not conn.closed:
                            self._on_event(conn, sock, mask)
                self._check_timers(time.monotonic())
        except Exception as e:  # noqa: BLE001 - record, then tear down cleanly
            self.errors.append(f"proxy loop failed: {e!r}")
        finally:
            self._shutdown()

    def _next_timeout(self, now: float) -> float:
        """Sleep until the nearest deadline of any kind, and never longer than 0.5 s."""
        wake = [now + 0.5]
        if self._deadline_at is not None:
            wake.append(self._deadline_at)
        for c in self._live.values():
            wake.append(c.last_activity + self.idle_timeout if c.connected else c.connect_deadline)
        return max(min(wake) - now, 0.0)

    def _check_timers(self, now: float) -> None:
        for c in list(self._live.values()):
            if not c.connected and now >= c.connect_deadline:
                self._fail_connect(c, "upstream connect timed out")
            elif c.connected and now - c.last_activity >= self.idle_timeout:
                self._finish(c, "idle_timeout")

    def _shutdown(self) -> None:
        for c in list(self._live.values()):
            self._finish(c, "stopped")
        for s in (self._listener, self._wake_r, self._wake_w):
            try:
                self._sel.unregister(s)
            except (KeyError, ValueError):
                pass
            s.close()
        self._sel.close()

    # -- connections
    def _accept(self) -> None:
        while True:
            try:
                client, addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            client.setblocking(False)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            up = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            up.setblocking(False)
            up.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            now = time.time()
            tr = Transcript(keep=self.keep, meta={
                "client": [addr[0], addr[1]], "server": list(self.upstream),
                "proxy": list(self.address), "t_open": now})
            conn = _Conn(self._accepted, client, up, tr,
                         connect_deadline=time.monotonic() + self.connect_timeout,
                         last_activity=time.monotonic())
            for direction, src, dst in ((C2S, client, up), (S2C, up, client)):
                conn.pipes[direction] = _Pipe(
                    direction, src, dst, bytearray(self.recv_size),
                    _FrameRecorder(tr, direction, self.keep, self.head_bytes, self.heads_keep))
            self._accepted += 1
            self._live[conn.index] = conn
            self.transcripts.append(tr)
            err = up.connect_ex(self.upstream)
            if err not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK):
                self._fail_connect(conn, f"upstream connect failed: {errno.errorcode.get(err, err)}")
                continue
            # the client is not read until the upstream is connected
            self._set_mask(conn, up, selectors.EVENT_WRITE)

    def _fail_connect(self, conn: _Conn, reason: str) -> None:
        conn.transcript.meta["error"] = reason
        self._finish(conn, "connect_failed", reset_client=True)

    def _set_mask(self, conn: _Conn, sock: socket.socket, mask: int) -> None:
        old = conn.masks.get(sock, 0)
        if mask == old:
            return
        if not mask:
            self._sel.unregister(sock)
        elif not old:
            self._sel.register(sock, mask, (conn, sock))
        else:
            self._sel.modify(sock, mask, (conn, sock))
        conn.masks[sock] = mask

    def _update_masks(self, conn: _Conn) -> None:
        for sock in (conn.client, conn.upstream):
            mask = 0
            for p in conn.pipes.values():
                if p.src is sock and not p.eof and not p.pending and not p.broken:
                    mask |= selectors.EVENT_READ
                if p.dst is sock and p.pending and not p.broken:
                    mask |= selectors.EVENT_WRITE
            self._set_mask(conn, sock, mask)

    def _on_event(self, conn: _Conn, sock: socket.socket, mask: int) -> None:
        if not conn.connected:
            err = conn.upstream.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                self._fail_connect(conn, f"upstream connect failed: {errno.errorcode.get(err, err)}")
                return
            conn.connected = True
            conn.last_activity = time.monotonic()
            self._update_masks(conn)
            return
        if mask & selectors.EVENT_WRITE:
            for p in conn.pipes.values():
                if p.dst is sock and p.pending:
                    self._flush(conn, p)
        if mask & selectors.EVENT_READ and not conn.closed:
            for p in conn.pipes.values():
                if p.src is sock and not p.eof and not p.pending:
                    self._read(conn, p)
        if conn.closed:
            return
        if all(p.done for p in conn.pipes.values()):
            self._finish(conn, "closed")
        else:
            self._update_masks(conn)

    def _read(self, conn: _Conn, p: _Pipe) -> None:
        try:
            n = p.src.recv_into(p.buf)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            if e.errno in _RESET_ERRNOS:
                self._reset(conn, p)
                return
            raise
        t = time.time()
        conn.last_activity = time.monotonic()
        if n == 0:
            p.eof = True
            conn.transcript.close(t, p.direction, "fin")
            self._flush(conn, p)  # forwards the FIN once the buffer is empty
            return
        view = memoryview(p.buf)[:n]
        p.recorder.record(t, view)
        if self.on_chunk is not None:
            try:
                self.on_chunk(conn.index, p.direction, view, t)
            except Exception as e:  # noqa: BLE001 - a faulty observer must not break the relay
                self.errors.append(f"on_chunk failed on connection {conn.index}: {e!r}")
        view.release()
        p.start, p.end = 0, n
        self._flush(conn, p)

    def _flush(self, conn: _Conn, p: _Pipe) -> None:
        if p.broken:
            return
        if p.pending:
            try:
                with memoryview(p.buf) as mv:
                    sent = p.dst.send(mv[p.start:p.end])
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in _RESET_ERRNOS:
                    # the receiver is gone; its own read side reports how it closed
                    p.broken = True
                    p.start = p.end = 0
                    return
                raise
            p.start += sent
            conn.last_activity = time.monotonic()
            if p.pending:
                return
            p.start = p.end = 0
        if p.eof and not p.shut:
            try:
                p.dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass  # the peer is already gone
            p.shut = True

    def _reset(self, conn: _Conn, p: _Pipe) -> None:
        """The source reset the connection: record it and reset the other side too."""
        conn.transcript.close(time.time(), p.direction, "rst")
        p.eof = True
        self._finish(conn, "reset", reset_other=p.dst)

    def _finish(self, conn: _Conn, reason: str, *, reset_other: socket.socket | None = None,
                reset_client: bool = False) -> None:
        if conn.closed:
            return
        conn.closed = True
        self._live.pop(conn.index, None)
        conn.transcript.meta.setdefault("end", reason)
        conn.transcript.meta["t_end"] = time.time()
        for sock in (conn.client, conn.upstream):
            if conn.masks.get(sock):
                try:
                    self._sel.unregister(sock)
                except (KeyError, ValueError):
                    pass
            if sock is reset_other or (reset_client and sock is conn.client):
                # SO_LINGER 0 makes close() send RST, so the peer sees what we saw
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                except OSError:
                    pass
            sock.close()
        for p in conn.pipes.values():
            p.buf = bytearray()  # release the relay buffers of finished connections
