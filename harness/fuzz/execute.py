"""Run a :class:`~harness.fuzz.case.Case` on one fresh connection and say what happened.

Fast path (campaigns): fire-and-forget frames are pipelined; bytes are sent in one ``sendall``
per batch that ends at a frame with a response (or a value to learn), and that response is
read straight away, so the server never blocks on a full socket while we keep writing.
Lockstep path (replay, final attribution): one step at a time, and after a step with no
response a short wait for the connection to end, so the step that killed the server is known
exactly.

The connection oracle: every response must have exactly the length the spec gives for the
request it answers; a server that sends bytes when none are due, or neither answers nor
closes within the deadline while it has a complete request, breaks the spec.
"""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..proto.wire import RESPONSE_HEADER_SIZE, U64
from .errors import FuzzError
from .case import BASE, HANDLE, SIZE, Case, relocate


# Outcome statuses
OK = "ok"  # every due response arrived with the right length; the server still listens
CLOSED = "closed"  # the connection ended (FIN/RST) -- deliberate close or death, see target
HANG = "hang"  # a due response did not come within the deadline and the connection stayed open
PROTOCOL = "protocol"  # a response broke the spec (wrong length, bytes when none were due)
REFUSED = "refused"  # could not even connect

S2C_KEEP = 64 << 10  # response bytes kept for the transcript of a finding
_SCRATCH = 1 << 16
_SMALL_ANSWER = 32  # answers up to this size are read whole (values, not tensor data)
# A batch of pipelined frames holds at most this many bytes of frames plus awaited answers:
# a long answer the server writes while the client is still writing a long frame would
# leave both waiting on full socket buffers.
PIPELINE_BYTES = 64 << 10
# A server still busy (not asleep, Target.is_idle) when the close deadline passes gets up to
# this many deadlines more, looked at every BUSY_RECHECK s: slow is not the same as open.
BUSY_CLOSE_GRACE = 3
BUSY_RECHECK = 0.25


def _bucket(value: int) -> str:
    if value <= 1:
        return str(value)
    return "small" if value < 1 << 16 else "large"


@dataclass
class Outcome:
    status: str
    progress: int = 0  # steps whose bytes were sent and whose responses (if any) all arrived
    proven: int = 0  # steps the server provably processed (up to the last answered one)
    at: int | None = None  # step the status was observed at (None: after the last step)
    detail: str = ""
    frames_sent: int = 0
    bytes_sent: int = 0
    live: dict = field(default_factory=dict)  # learned handles, bases and buffer sizes
    # step -> the first u64 of its (last) answer of at most 32 bytes: a result byte, a handle
    answers: dict = field(default_factory=dict)
    # step -> remote_size of each ALLOC_BUFFER answer: with ``answers``, what every step learned
    # when it ran (``live`` holds only the last value of each slot, and a slot is reused).
    sizes: dict = field(default_factory=dict)
    # Recording runs only: ("c2s" | "s2c", monotonic time, bytes) in wire order (s2c bounded),
    # and how the server ended the connection ("fin" | "rst" | None).
    log: list[tuple[str, float, bytes]] | None = None
    server_close: str | None = None
    elapsed: float = 0.0
    # Answer shapes seen: (command, payload size, value bucket), the "new behaviour" signal of
    # the evolving corpus (an allocation that failed, a hash hit, a copy refused...).
    shapes: set = field(default_factory=set)
    # The answered batch that took longest: (first step, answered step, seconds), for the
    # time-per-request oracle (harness.fuzz.oracles).
    slowest: tuple[int, int, float] | None = None

    def note_answer(self, i: int, learn, payload) -> int:
        """Record step i's small answer (at most 32 bytes) and what it teaches the live
        table; returns its first u64."""
        value = int.from_bytes(payload[:8], "little") if len(payload) else 0
        self.answers[i] = value
        if learn is not None and len(payload) in (8, 16):
            kind, index = learn
            self.live[kind][index] = value
            if kind == HANDLE:
                # Index i now names another buffer: the base learned for the old one is
                # not this buffer's (whether it lies inside it is the heap's layout).
                self.live[BASE][index] = 0
                self.live[SIZE][index] = self.sizes[i] = int.from_bytes(payload[8:16], "little")
        return value

    def note_wait(self, first: int, last: int, seconds: float) -> None:
        if self.slowest is None or seconds > self.slowest[2]:
            self.slowest = (first, last, seconds)

    def window(self, n_steps: int) -> tuple[int, int]:
        """Steps (first, last inclusive) that may have caused what was observed: after the
        last answered step, up to the one being waited for (or the end)."""
        last = self.at if self.at is not None else n_steps - 1
        last = min(max(last, 0), n_steps - 1)
        return min(self.proven, last), last


class _Ended(FuzzError):
    def __init__(self, status: str, detail: str):
        self.status = status
        self.detail = detail


class Executor:
    """Runs cases against ``host:port``; one instance per worker (it reuses its scratch)."""

    def __init__(self, host: str, port: int, *, deadline: float = 5.0,
                 connect_timeout: float = 2.0, lockstep_wait: float = 0.05,
                 close_deadline: float | None = None,
                 idle_probe: Callable[[], bool | None] | None = None):
        self.host, self.port = host, port
        # is the server asleep, done with what it read? (Target.is_idle; None: cannot tell)
        self.idle_probe = idle_probe
        self.deadline = deadline
        # A server may still be busy with earlier requests (a 38 MB graph) before it reaches
        # the one it must refuse: allow it the same deadline as an answer.
        self.close_deadline = deadline if close_deadline is None else close_deadline
        self.connect_timeout = connect_timeout
        self.lockstep_wait = lockstep_wait
        self._scratch = bytearray(_SCRATCH)
        self._view = memoryview(self._scratch)

    # ---------------------------------------------------------------- public
    def run(self, case: Case, *, lockstep: bool = False, record: bool = False,
            before_close=None, pin_from: int = 0) -> Outcome:
        """Run ``case`` on a new connection. ``before_close(outcome)`` is called while the
        connection is still open (for memory sampling), then the socket is closed.
        ``pin_from`` (lockstep): pin steps from this one on; see :meth:`_lockstep`."""
        t0 = time.monotonic()
        n = case.n_buffers
        out = Outcome(OK, live={HANDLE: [0] * n, BASE: [0] * n, SIZE: [0] * n})
        if record:
            out.log = []
        self._s2c_kept = 0
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.connect_timeout)
        except OSError as e:
            out.status, out.detail, out.at = REFUSED, f"connect: {e}", 0
            out.elapsed = time.monotonic() - t0
            return out
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(self.deadline)
            try:
                if lockstep:
                    self._lockstep(sock, case, out, pin_from)
                else:
                    self._pipelined(sock, case, out)
            except _Ended as e:
                out.status, out.detail = e.status, e.detail
                if e.status == CLOSED:
                    out.server_close = "rst" if e.detail == "reset" else "fin"
            if before_close is not None:
                before_close(out)
        finally:
            _close(sock)
        out.elapsed = time.monotonic() - t0
        return out

    # ---------------------------------------------------------------- modes
    def _pipelined(self, sock: socket.socket, case: Case, out: Outcome) -> None:
        steps = case.steps
        batch: list[int] = []  # steps whose frames are pending (not sent yet)
        frames: list[bytes] = []
        learning: set[tuple[str, int]] = set()  # what the batch's answers will teach
        budget = 0  # bytes of the batch's frames plus its awaited answers
        for i, s in enumerate(steps):
            # A frame that needs a handle or base an awaited answer brings must wait for it;
            # anything else rides along (one round trip for the sweep's HELLO and two
            # ALLOC_BUFFERs), within a budget so a long answer never meets a long send.
            if batch and (any((r.kind, r.index) in learning for r in s.relocs)
                          or budget + len(s.frame) > PIPELINE_BYTES
                          and any(steps[k].expect for k in batch)):
                self._flush(sock, steps, batch, frames, out)
                learning.clear()
                budget = 0
            batch.append(i)
            frames.append(relocate(s.frame, s.relocs, out.live) if s.relocs else s.frame)
            budget += len(s.frame) + sum(s.expect)
            if s.learn is not None:
                learning.add(tuple(s.learn))
            if s.eof or i == len(steps) - 1 or s.expect and budget > PIPELINE_BYTES:
                self._flush(sock, steps, batch, frames, out, eof=s.eof)
                learning.clear()
                budget = 0
        out.at = None
        if case.protocol_error_at is not None or any(s.eof for s in steps):
            # The server must close after a refused request or at our EOF: wait for it.
            self._expect_close(sock, out, len(steps))

    def _flush(self, sock, steps, batch: list[int], frames: list[bytes], out: Outcome, *,
               eof: bool = False) -> None:
        """Send the batch's frames, then read every answer it awaits, in order."""
        sent_at = time.monotonic()
        self._send(sock, frames, out)
        if eof:
            _shutdown_write(sock)
        for i in batch:
            s = steps[i]
            if not s.expect:
                continue
            out.at = i
            for size in s.expect:
                self._read_response(sock, size, i, s, out)
            out.proven = out.progress = i + 1
            out.note_wait(batch[0], i, time.monotonic() - sent_at)
        out.at = batch[-1]
        out.progress = batch[-1] + 1
        batch.clear()
        frames.clear()

    def _lockstep(self, sock: socket.socket, case: Case, out: Outcome, pin_from: int = 0
                  ) -> None:
        """One step at a time: each answer read, and after a step without one a short wait
        for a close, so the close is pinned to its step. Steps before ``pin_from`` get no
        wait but the last of them (a run before this one proved them served; the wait was
        half of a p7 campaign's time): a close among them then shows at ``pin_from - 1`` or
        earlier, and the caller runs the case again pinning every step."""
        for i, s in enumerate(case.steps):
            frame = relocate(s.frame, s.relocs, out.live) if s.relocs else s.frame
            out.at = i
            sent_at = time.monotonic()
            self._send(sock, [frame], out)
            if s.eof:
                _shutdown_write(sock)
            for size in s.expect:
                self._read_response(sock, size, i, s, out)
            if not s.expect:
                # Did this step end the connection? A short wait tells the step exactly.
                if i >= pin_from - 1:
                    self._peek_end(sock, out, s.cmd, self.lockstep_wait)
            else:
                out.proven = i + 1
                out.note_wait(i, i, time.monotonic() - sent_at)
            out.progress = i + 1
        out.at = None
        if case.protocol_error_at is not None or any(s.eof for s in case.steps):
            self._expect_close(sock, out, len(case.steps))

    # ---------------------------------------------------------------- I/O
    def _send(self, sock, parts: list[bytes], out: Outcome) -> None:
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError) as e:
            raise _Ended(CLOSED, f"send: {type(e).__name__}") from None
        except TimeoutError:
            # The server stopped reading (busy or stuck) with our bytes unsent.
            raise _Ended(HANG, f"send blocked for {self.deadline:g} s") from None
        out.frames_sent += len(parts)
        out.bytes_sent += len(data)
        if out.log is not None:
            out.log.append(("c2s", time.monotonic(), bytes(data)))

    def _recv_into(self, sock, view: memoryview, out: Outcome, what: str) -> int:
        try:
            n = sock.recv_into(view)
        except TimeoutError:
            raise _Ended(HANG, f"no {what} within {self.deadline:g} s") from None
        except (ConnectionResetError, ConnectionAbortedError):
            raise _Ended(CLOSED, "reset") from None
        if n == 0:
            raise _Ended(CLOSED, "eof")
        self._keep(out, view[:n])
        return n

    def _keep(self, out: Outcome, data) -> None:
        if out.log is not None and self._s2c_kept < S2C_KEEP:
            chunk = bytes(data[:S2C_KEEP - self._s2c_kept])
            self._s2c_kept += len(chunk)
            out.log.append(("s2c", time.monotonic(), chunk))

    def _read_exact(self, sock, n: int, out: Outcome, what: str) -> memoryview:
        """Read exactly ``n`` (<= scratch) bytes into the scratch buffer."""
        got = 0
        while got < n:
            got += self._recv_into(sock, self._view[got:n], out, what)
        return self._view[:n]

    def _read_response(self, sock, size: int, i: int, s, out: Outcome) -> None:
        head = self._read_exact(sock, RESPONSE_HEADER_SIZE, out, f"answer to {s.cmd}")
        (n,) = U64.unpack_from(head)
        if n != size:
            raise _Ended(PROTOCOL, f"{s.cmd} answered with a {n}-byte payload, the spec says "
                                   f"{size}")
        if n <= _SMALL_ANSWER:
            payload = self._read_exact(sock, n, out, "payload")
            # The first u64 (ALLOC_BUFFER: remote_ptr, BUFFER_GET_BASE: base, results...).
            value = out.note_answer(i, s.learn, payload)
            out.shapes.add((s.cmd, n, _bucket(value)))
            return
        out.shapes.add((s.cmd, -1, "data"))
        left = n
        while left:  # discard (GET_TENSOR data can be large); bounded by the deadline
            left -= self._recv_into(sock, self._view[:min(left, _SCRATCH)], out, "payload")

    def _peek_end(self, sock, out: Outcome, cmd: str, wait: float) -> None:
        """Did the step just sent end the connection? Waits up to ``wait`` for a close, or
        less: until the server is seen asleep twice in a row (``idle_probe``), done with the
        step (it closes before it sleeps, so a close would be here by then)."""
        if not self._ended_within(sock, wait):
            return
        try:
            n = sock.recv_into(self._view[:_SCRATCH])
        except (ConnectionResetError, ConnectionAbortedError):
            raise _Ended(CLOSED, "reset") from None
        except (BlockingIOError, TimeoutError):
            return
        if n == 0:
            raise _Ended(CLOSED, "eof")
        self._keep(out, self._view[:n])
        raise _Ended(PROTOCOL, f"{n} bytes arrived after {cmd} although no answer was due")

    def _ended_within(self, sock, wait: float) -> bool:
        if self.idle_probe is None:
            return bool(select.select([sock], [], [], wait)[0])
        end, pause, asleep = time.monotonic() + wait, 0.0005, 0
        while True:
            if select.select([sock], [], [], pause)[0]:
                return True
            asleep = asleep + 1 if self.idle_probe() else 0
            if asleep >= 2:
                return bool(select.select([sock], [], [], 0)[0])
            if time.monotonic() >= end:
                return False
            pause = min(pause * 2, 0.005)

    def _expect_close(self, sock, out: Outcome, n_steps: int) -> None:
        """After a refused request or our EOF the spec says CLOSE (spec 1.6, 7). A server
        still working when the deadline passes (zeroing a payload size it was announced, on a
        loaded machine) is given up to BUSY_CLOSE_GRACE deadlines more; one asleep with the
        connection open is a finding at the deadline."""
        out.at = n_steps
        t0 = time.monotonic()
        give_up = t0 + self.close_deadline * (1 + BUSY_CLOSE_GRACE)
        sock.settimeout(self.close_deadline)
        while True:
            try:
                self._read_exact(sock, 1, out, "close")
            except _Ended as e:
                if e.status == CLOSED:
                    out.at = None
                    raise
                left = give_up - time.monotonic()
                if left > 0 and self.idle_probe is not None and self.idle_probe() is False:
                    sock.settimeout(min(BUSY_RECHECK, left))
                    continue
                raise _Ended(PROTOCOL, f"connection still open {time.monotonic() - t0:.0f} s "
                                       "after a request the server must refuse") from None
            raise _Ended(PROTOCOL, "bytes arrived after a request the server must refuse")


def _shutdown_write(sock) -> None:
    try:
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def _close(sock) -> None:
    try:
        sock.close()
    except OSError:
        pass
