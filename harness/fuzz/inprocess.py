"""Cases against the reference server's own connection object, in this process.

The reference server's semantics live in a sans-IO object (:class:`ServerProtocol`, the one
``harness serve`` drives over a socket). Here each case's steps go into a fresh one and its
answers come out in memory, with the :class:`~harness.fuzz.execute.Outcome` a lockstep socket
run reports: the answers of each step (checked against the lengths the spec gives), the
handles, bases and sizes it learned, the step a close came at. No socket, no process: the
whole deterministic sweep of a dialect runs here in seconds, which is what holding the
reference to the oracles in every dialect takes (:mod:`harness.fuzz.bounds`: the honest
reference must never accept what the oracle flags; its planted knobs must be found).

It is the reference's code on the other side, not a model of it: only the transport differs
from ``harness serve``, whose socket path the live campaigns against ``ref-*`` targets run.
"""

from __future__ import annotations

import time

from ..proto import get_dialect
from ..proto.wire import RESPONSE_HEADER_SIZE, U64
from ..reference.knobs import Misbehaviour
from ..reference.behaviour_view import behaviour_view_for
from ..reference.server_core import ServerConfig, ServerState
from ..reference.server_protocol import ConnectionRecord, ServerProtocol
from .case import BASE, HANDLE, SIZE, Case, relocate
from .execute import CLOSED, OK, PROTOCOL, Outcome

MEMORY = 256 << 20  # the reference's buffer budget under fuzzing (as harness/fuzz/target.py)


class InProcessReference:
    """Runs cases against one reference server state (shared by its connections, as a
    ``harness serve`` process's is)."""

    def __init__(self, dialect: str, knobs: Misbehaviour | None = None):
        d = get_dialect(dialect)
        self.dialect = d
        self.state = ServerState(ServerConfig(dialect=d, knobs=knobs or Misbehaviour(),
                                              memory_budget=MEMORY))
        self.behaviour = behaviour_view_for(d)

    def run(self, case: Case) -> Outcome:
        t0 = time.monotonic()
        n = case.n_buffers
        out = Outcome(OK, live={HANDLE: [0] * n, BASE: [0] * n, SIZE: [0] * n})
        proto = ServerProtocol(self.state, self.behaviour, ConnectionRecord("in-process", t0))
        pending = bytearray()  # answers the server wrote and the client did not read yet
        try:
            for i, s in enumerate(case.steps):
                out.at = i
                proto.receive_data(relocate(s.frame, s.relocs, out.live) if s.relocs
                                   else s.frame)
                if s.eof:
                    proto.receive_data(b"")
                proto.pump(lambda parts: pending.extend(b"".join(map(bytes, parts))))
                out.frames_sent += 1
                out.bytes_sent += len(s.frame)
                for size in s.expect:
                    if len(pending) < RESPONSE_HEADER_SIZE:
                        out.status = CLOSED if proto.closed else PROTOCOL
                        out.detail = proto.close_reason or f"no answer to {s.cmd}"
                        return out
                    (got,) = U64.unpack_from(pending, 0)
                    if got != size or len(pending) < RESPONSE_HEADER_SIZE + size:
                        out.status, out.detail = PROTOCOL, \
                            f"{s.cmd} answered with a {got}-byte payload, the spec says {size}"
                        return out
                    end = RESPONSE_HEADER_SIZE + size
                    self._answer(out, i, s, bytes(pending[RESPONSE_HEADER_SIZE:end]))
                    del pending[:end]
                if pending:
                    out.status, out.detail = PROTOCOL, \
                        f"{len(pending)} bytes arrived after {s.cmd} although no answer was due"
                    return out
                if proto.closed:
                    out.status, out.detail = CLOSED, proto.close_reason or "closed"
                    out.server_close = "fin"
                    return out
                out.progress = i + 1
                if s.expect:
                    out.proven = i + 1
            out.at = None
            if case.protocol_error_at is not None or any(s.eof for s in case.steps):
                out.at = len(case.steps)
                out.status = CLOSED if proto.closed else PROTOCOL
                out.detail = proto.close_reason or "still open after a request it must refuse"
                if proto.closed:
                    out.at = None
            return out
        finally:
            proto.abort()
            proto.session.close()
            out.elapsed = time.monotonic() - t0

    @staticmethod
    def _answer(out: Outcome, i: int, s, payload: bytes) -> None:
        if len(payload) <= 32:
            out.note_answer(i, s.learn, payload)
