"""Conformance cases for the server-to-server link (COMM_INIT / COMM_ALLREDUCE / COMM_FREE):
each case drives two servers of world 2 over raw sessions.

A :class:`PairCase` gets a :class:`Pair` (one hello'd session per server, more on request)
and returns the sessions to observe afterwards plus facts (answers, digests of allreduce
results) that must be equal on every pair of servers that speaks 8.0.0. The recording from two
real p8 servers is ``harness/data/vectors/conformance-comm-8.0.0.json``
(``python -m harness.conformance.record --peer p8 --dialect 8.0.0 --comm``).

Servers come from a factory (``pair_factory``): two real peers started with the loopback_bind
shim and checked to listen on loopback only before any COMM_INIT, two reference servers, or one
of each. Every case gets fresh servers: a rank-0 COMM_INIT with no peer wedges the real server.
"""

from __future__ import annotations

import hashlib
import io
import tempfile
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from ..proto import Cmd, first_with, get_dialect, messages as m

# The communicator commands' first dialect: what these helpers speak unless told.
COMM_DIALECT = first_with(Cmd.COMM_INIT).name
from .cases import CaseError, _check, _f32
from .raw import CLOSED, OPEN, RawSession

LOOPBACK = b"127.0.0.1".ljust(64, b"\0")
GGML_TYPE_F16 = 1


@dataclass
class Pair:
    endpoints: tuple[tuple[str, int], tuple[str, int]]
    dialect: str
    free_port: Callable[[], int]
    timeout: float = 10.0

    def __post_init__(self):
        self.opened: list[RawSession] = []
        self.s = (self.session(0), self.session(1))

    def session(self, i: int) -> RawSession:
        s = RawSession(*self.endpoints[i], dialect=self.dialect, timeout=self.timeout)
        self.opened.append(s)
        s.hello()
        return s

    def init(self, port: int | None = None, *, world: int = 2) -> tuple[int, int]:
        """Both COMM_INITs sent before either answer is read, as the C client does."""
        port = port or self.free_port()
        r0 = m.CommInitRequest(0, 0, world, port, LOOPBACK)
        r1 = m.CommInitRequest(0, 1, world, port, LOOPBACK)
        self.s[0].request(r0)
        self.s[1].request(r1)
        return self.s[0].read_response(r0).ok, self.s[1].read_response(r1).ok

    def free(self) -> None:
        """COMM_FREE on both servers."""
        for s in self.s:
            s.request(m.CommFreeRequest(0))

    def close(self) -> None:
        for s in self.opened:
            s.close()

    def __enter__(self) -> "Pair":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass(frozen=True)
class PairCase:
    id: str
    title: str
    command: str
    expect: tuple[str | None, str | None]  # outcome on server 0 / 1 (None: not observed)
    run: Callable[[Pair], tuple[dict, tuple[RawSession | None, RawSession | None]]]


PAIR_CASES: list[PairCase] = []


def pair_case(id: str, title: str, command: str, expect: tuple[str | None, str | None]):
    def deco(fn):
        PAIR_CASES.append(PairCase(id, title, command, expect, fn))
        return fn
    return deco


def _values(n: int, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(n) * 3.3).astype(np.float32)


def _tensor(s: RawSession, data: np.ndarray, type_: int = 0):
    h, base = s.alloc(data.nbytes)
    t = _f32(h, base, ne=(len(data),), type=type_)
    s.request(m.SetTensorRequest(t, 0, 0, data.tobytes()))
    return t


def _read(s: RawSession, t, size: int) -> bytes:
    return s.call(m.GetTensorRequest(t, 0, size)).data


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def _allreduce(p: Pair, x: np.ndarray, y: np.ndarray, type_: int = 0) -> dict:
    _check(p.init() == (1, 1), "COMM_INIT did not answer 1 on both servers")
    t0, t1 = _tensor(p.s[0], x, type_), _tensor(p.s[1], y, type_)
    p.s[0].request(m.CommAllreduceRequest(0, t0))
    p.s[1].request(m.CommAllreduceRequest(0, t1))
    r0, r1 = _read(p.s[0], t0, x.nbytes), _read(p.s[1], t1, y.nbytes)
    exact = (x + y).tobytes()
    return {"rank0": _digest(r0), "rank1": _digest(r1), "ranks_equal": r0 == r1,
            "exact_sum": r0 == exact and r1 == exact}


def _f32_case(n: int, note: str):
    @pair_case(f"allreduce-f32-{n}", f"COMM_ALLREDUCE of {n} f32 elements ({note})",
               "COMM_ALLREDUCE", (OPEN, OPEN))
    def _(p: Pair):
        return _allreduce(p, _values(n, 1), _values(n, 2)), p.s


_f32_case(4, "raw exchange")
_f32_case(32767, "the largest raw exchange")
_f32_case(32768, "exchanged as bf16: each rank adds the other's rounded values")


@pair_case("allreduce-f16-4", "COMM_ALLREDUCE of 4 f16 elements (raw, summed in f16)",
           "COMM_ALLREDUCE", (OPEN, OPEN))
def _(p: Pair):
    x = np.array([1.5, 2.25, 3, 4], np.float16)
    y = np.array([0.25, 1, 1, 1e-3], np.float16)
    return _allreduce(p, x, y, GGML_TYPE_F16), p.s


@pair_case("init-rank0-waits", "rank-0 COMM_INIT answers only once rank 1 connected",
           "COMM_INIT", (OPEN, OPEN))
def _(p: Pair):
    port = p.free_port()
    r0 = m.CommInitRequest(0, 0, 2, port, LOOPBACK)
    p.s[0].request(r0)
    before = p.s[0].observe(0.5)[0]
    r1 = m.CommInitRequest(0, 1, 2, port, LOOPBACK)
    p.s[1].request(r1)
    oks = p.s[0].read_response(r0).ok, p.s[1].read_response(r1).ok
    return {"rank0_before_peer": before, "ok": list(oks)}, p.s


@pair_case("init-rank0-alone", "rank-0 COMM_INIT with no rank 1 (the real server blocks in "
           "accept)", "COMM_INIT", (OPEN, None))
def _(p: Pair):
    p.s[0].request(m.CommInitRequest(0, 0, 2, p.free_port(), LOOPBACK))
    return {}, (p.s[0], None)


@pair_case("init-rank1-alone", "rank-1 COMM_INIT with no rank 0 listening (retries, then 0)",
           "COMM_INIT", (None, OPEN))
def _(p: Pair):
    r1 = m.CommInitRequest(0, 1, 2, p.free_port(), LOOPBACK)
    p.s[1].request(r1)
    return {"ok": p.s[1].read_response(r1).ok}, (None, p.s[1])


def _bad_init(cid: str, title: str, device: int, rank: int, world: int):
    @pair_case(cid, f"COMM_INIT {title}", "COMM_INIT", (OPEN, None))
    def _(p: Pair):
        r = m.CommInitRequest(device, rank, world, p.free_port(), LOOPBACK)
        p.s[0].request(r)
        return {"ok": p.s[0].read_response(r).ok}, (p.s[0], None)


_bad_init("init-world-3", "world 3", 0, 0, 3)
_bad_init("init-world-1", "world 1", 0, 0, 1)
_bad_init("init-rank-2", "rank 2 of world 2", 0, 2, 2)
_bad_init("init-device-1", "device 1", 1, 0, 2)


@pair_case("init-twice", "a second rank-0 COMM_INIT on a linked server answers 1 at once",
           "COMM_INIT", (OPEN, OPEN))
def _(p: Pair):
    first = p.init()
    r = m.CommInitRequest(0, 0, 2, p.free_port(), LOOPBACK)
    p.s[0].request(r)
    return {"first": list(first), "second": p.s[0].read_response(r).ok}, p.s


@pair_case("free-then-allreduce", "COMM_ALLREDUCE after COMM_FREE on both", "COMM_FREE",
           (CLOSED, OPEN))
def _(p: Pair):
    p.init()
    p.free()
    alive = [s.still_serving() for s in p.s]
    p.s[0].request(m.CommAllreduceRequest(0, _tensor(p.s[0], _values(4, 1))))
    return {"alive_after_free": alive}, p.s


@pair_case("free-then-init", "COMM_INIT again after COMM_FREE links anew", "COMM_FREE",
           (OPEN, OPEN))
def _(p: Pair):
    p.init()
    p.free()
    return {"ok": list(p.init())}, p.s


@pair_case("reconnect-drops-comm", "COMM_ALLREDUCE on new connections after the linking ones "
           "closed", "COMM_ALLREDUCE", (CLOSED, CLOSED))
def _(p: Pair):
    p.init()
    for s in p.s:
        s.close()
    time.sleep(0.2)
    fresh = p.session(0), p.session(1)
    for s in fresh:
        s.request(m.CommAllreduceRequest(0, _tensor(s, _values(4, 1))))
    return {}, fresh


@pair_case("allreduce-one-side", "COMM_ALLREDUCE on rank 0 only: it waits; the peer's client "
           "leaves, the peer link drops, rank 0 closes", "COMM_ALLREDUCE", (CLOSED, None))
def _(p: Pair):
    p.init()
    p.s[0].request(m.CommAllreduceRequest(0, _tensor(p.s[0], _values(4, 1))))
    waiting = p.s[0].observe(0.5)[0]
    p.s[1].close()
    return {"rank0_while_peer_idle": waiting}, (p.s[0], None)


@pair_case("allreduce-size-mismatch", "COMM_ALLREDUCE of 4 elements against 8 (both wait)",
           "COMM_ALLREDUCE", (OPEN, OPEN))
def _(p: Pair):
    p.init()
    p.s[0].request(m.CommAllreduceRequest(0, _tensor(p.s[0], _values(4, 1))))
    p.s[1].request(m.CommAllreduceRequest(0, _tensor(p.s[1], _values(8, 2))))
    return {}, p.s


@pair_case("allreduce-null-tensor", "COMM_ALLREDUCE of a null tensor on a linked server",
           "COMM_ALLREDUCE", (CLOSED, OPEN))
def _(p: Pair):
    p.init()
    p.s[0].request(m.CommAllreduceRequest(0, _f32(0, 0)))
    return {}, p.s


# ---------------------------------------------------------------- running
@dataclass
class PairResult:
    case: PairCase
    outcomes: tuple[str | None, str | None]
    facts: dict
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.outcomes == self.case.expect

    def as_record(self) -> dict:
        return {"title": self.case.title, "command": self.case.command,
                "outcomes": list(self.outcomes), "facts": self.facts}


def run_pair_case(case: PairCase, servers, *, dialect: str = COMM_DIALECT,
                  observe_wait: float = 0.5, free_port: Callable[[], int]) -> PairResult:
    """Run ``case`` on a fresh pair from ``servers()`` (a context manager of two endpoints)."""
    with servers() as endpoints:
        pair = Pair(endpoints, dialect, free_port)
        try:
            try:
                facts, watch = case.run(pair)
            except CaseError as e:
                return PairResult(case, ("error", "error"), {}, str(e))
            except (ConnectionError, OSError) as e:
                return PairResult(case, ("error", "error"), {},
                                  f"closed during the case: {type(e).__name__}: {e}")
            outcomes = tuple(s.observe(observe_wait)[0] if s is not None else None
                             for s in watch)
            return PairResult(case, outcomes, facts)
        finally:
            pair.close()


# ---------------------------------------------------------------- server pairs
def _free_port() -> int:
    from ..impls.supervisor import free_fixed_port
    return free_fixed_port()


@contextmanager
def reference_servers(dialect: str = COMM_DIALECT, *, count: int = 2, comm_timeout: float = 5.0
                      ) -> Iterator[tuple[tuple[str, int], ...]]:
    """``count`` in-process reference servers (serial, as the real one)."""
    from ..reference.server import ReferenceServer
    from ..reference.server_core import ServerConfig
    servers = [ReferenceServer(ServerConfig(get_dialect(dialect), comm_timeout=comm_timeout),
                               serial=True, out=io.StringIO(), err=io.StringIO())
               for _ in range(count)]
    try:
        yield tuple(srv.start() for srv in servers)
    finally:
        for srv in servers:
            srv.stop(timeout=comm_timeout + 1)


@contextmanager
def real_servers(peer, *, count: int = 2) -> Iterator[list]:
    """``count`` real servers with loopback_bind, each proven loopback-only."""
    from ..impls.loopback import require_loopback_only, start_loopback_peer_server
    with tempfile.TemporaryDirectory(prefix="comm-") as wd, ExitStack() as stack:
        procs = []
        for i in range(count):
            (Path(wd) / str(i)).mkdir()
            procs.append(stack.enter_context(start_loopback_peer_server(peer,
                                                                        workdir=Path(wd) / str(i))))
        for proc in procs:
            require_loopback_only(proc)
        yield procs


@contextmanager
def mixed_servers(peer, real_rank: int, dialect: str = COMM_DIALECT
                  ) -> Iterator[tuple[tuple[str, int], tuple[str, int]]]:
    """One real server (at ``real_rank``) and one reference server."""
    with real_servers(peer, count=1) as (proc,), reference_servers(dialect, count=1) as (ref,):
        real = ("127.0.0.1", proc.port)
        yield (real, ref) if real_rank == 0 else (ref, real)


def real_pair(peer):
    @contextmanager
    def servers():
        with real_servers(peer) as procs:
            yield tuple(("127.0.0.1", p.port) for p in procs)
    return servers


_REAL_CLIENT_INIT = """
import ctypes as C, sys
d, eps = sys.argv[1], sys.argv[2:]
base = C.CDLL(d + "/libggml-base.so", mode=C.RTLD_GLOBAL)
C.CDLL(d + "/libggml.so", mode=C.RTLD_GLOBAL)
rpc = C.CDLL(d + "/libggml-rpc.so", mode=C.RTLD_GLOBAL)
rpc.ggml_backend_rpc_init.restype = C.c_void_p
rpc.ggml_backend_rpc_init.argtypes = [C.c_char_p, C.c_uint32]
rpc.ggml_backend_rpc_reg.restype = C.c_void_p
base.ggml_backend_reg_get_proc_address.restype = C.c_void_p
base.ggml_backend_reg_get_proc_address.argtypes = [C.c_void_p, C.c_char_p]
backends = (C.c_void_p * len(eps))(*[rpc.ggml_backend_rpc_init(e.encode(), 0) for e in eps])
fn = base.ggml_backend_reg_get_proc_address(rpc.ggml_backend_rpc_reg(), b"ggml_backend_comm_init")
init = C.CFUNCTYPE(C.c_void_p, C.POINTER(C.c_void_p), C.c_size_t)(fn)
print("comm", "ok" if init(backends, len(eps)) else "null", flush=True)
"""


def real_client_comm_init(lib_dir, endpoints: list[str], timeout: float = 60.0):
    """The real client library's ``ggml_backend_comm_init`` over RPC backends of
    ``endpoints`` in a child process (it exits right after, closing the links). Returns the
    CompletedProcess; stdout ends with ``comm ok`` when the library made a communicator."""
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-c", _REAL_CLIENT_INIT, str(lib_dir), *endpoints],
                          capture_output=True, text=True, timeout=timeout)


def record_comm(peer, dialect: str = COMM_DIALECT, *, observe_wait: float = 0.5) -> dict:
    results = [run_pair_case(c, real_pair(peer), dialect=dialect, observe_wait=observe_wait,
                             free_port=_free_port) for c in PAIR_CASES]
    return {
        "recorded_from": {"peer": peer.name, "package": peer.package, "version": peer.version,
                          "proto": peer.proto, "dialect": dialect, "servers": 2},
        "cases": {r.case.id: r.as_record() for r in results},
    }
