"""How many messages per second the harness pushes through one connection to a live server.

The fuzz executor's send path, measured on its own: valid traffic (uploads, downloads,
memsets, copies, graph computes, queries; see :func:`harness.fuzz.generate.steady_session`)
pre-packed and relocated once, then written in batches that end at each request with a
response, whose answer is read (``recv_into`` a reused buffer) before the next batch. A
``lockstep`` run sends one request at a time and waits for its answer where there is one.
For ``harness bench`` (the issue's bar is >= 2,000 messages/s against a live C server).
"""

from __future__ import annotations

import socket
import time
from pathlib import Path
import tempfile

from ..proto.wire import RESPONSE_HEADER_SIZE, U64
from ..transport.base import recv_exact_into
from .case import BASE, HANDLE, annotate, relocate
from .generate import steady_session
from .target import Target
from .target_spec import TargetSpec

BUFFER_SIZES = (65536, 4096, 1024)


def _recv_exact(sock: socket.socket, view: memoryview, n: int) -> None:
    if recv_exact_into(sock, view[:n]) < n:
        raise ConnectionError("the server closed the connection")


def measure_on(host: str, port: int, dialect: str, *, seconds: float = 5.0,
               lockstep: bool = False, n_steps: int = 2000, seed: int = 0,
               timeout: float = 10.0) -> dict:
    """Run steady valid traffic on one connection to ``host:port`` for ``seconds``."""
    prologue, body = steady_session(dialect, BUFFER_SIZES, n_steps, seed)
    case = annotate(dialect, tuple(prologue + body))
    if case.protocol_error_at is not None:
        raise AssertionError("steady traffic must be valid")  # a generator bug, not the server's
    scratch = bytearray(1 << 20)
    view = memoryview(scratch)
    live = {HANDLE: [0] * len(BUFFER_SIZES), BASE: [0] * len(BUFFER_SIZES)}
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for s in case.steps[:len(prologue)]:  # round trips: the live values are learned here
            sock.sendall(relocate(s.frame, s.relocs, live))
            for size in s.expect:
                _recv_exact(sock, view, RESPONSE_HEADER_SIZE + size)
                if s.learn:
                    live[s.learn[0]][s.learn[1]] = U64.unpack_from(scratch, RESPONSE_HEADER_SIZE)[0]
        # Batches of ready bytes, each ending at a request with an answer.
        batches: list[tuple[bytes, int, int]] = []  # (bytes, frames, answer bytes)
        pending, frames = [], 0
        for s in case.steps[len(prologue):]:
            pending.append(relocate(s.frame, s.relocs, live))
            frames += 1
            if s.expect or lockstep:
                batches.append((b"".join(pending), frames, sum(RESPONSE_HEADER_SIZE + n for n in s.expect)))
                pending, frames = [], 0
        if pending:
            batches.append((b"".join(pending), frames, 0))
        sent = answered = nbytes = 0
        t0 = time.perf_counter()
        end = t0 + seconds
        while time.perf_counter() < end:
            for data, k, answer in batches:
                sock.sendall(data)
                if answer:
                    if answer > len(scratch):
                        raise AssertionError("answer larger than the scratch buffer")
                    _recv_exact(sock, view, answer)
                    answered += 1
                sent += k
                nbytes += len(data)
        elapsed = time.perf_counter() - t0
    return {"messages": sent, "answered": answered, "bytes": nbytes,
            "seconds": round(elapsed, 3), "messages_per_s": round(sent / elapsed, 1),
            "mode": "lockstep" if lockstep else "pipelined"}


def measure(target: str, *, seconds: float = 5.0, dialect: str | None = None,
            lockstep: bool = False) -> dict:
    """Start ``target`` (a peer, ``ref``, a server path), measure, stop it."""
    spec = TargetSpec.parse(target, dialect)
    with tempfile.TemporaryDirectory(prefix="harness-throughput-") as tmp:
        t = Target(spec, Path(tmp) / "target")
        t.start()
        try:
            result = measure_on(t.host, t.port, t.dialect, seconds=seconds, lockstep=lockstep)
            info = t.exit_info()
            result["target_survived"] = info is None
        finally:
            t.stop()
    return {"target": spec.name, "dialect": t.dialect, **result}
