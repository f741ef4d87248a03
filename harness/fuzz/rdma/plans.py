"""RDMA fuzz cases: a request stream of valid messages and a SEND plan that cuts it.

A case is what one connection of the fuzzer (the RDMA peer of a real server) does after HELLO
and setup: the request frames (drawn from the valid-message strategies of
:mod:`harness.strategies`, against sentinel buffers relocated at run time, see
:mod:`harness.fuzz.case`) end with a probe (``SET_TENSOR`` + ``GET_TENSOR`` of a buffer no other
request touches) whose answer must be the bytes written; the SEND plan says how the stream goes
out: the sizes of the fuzzer's ``send_data`` writes (each cut into SENDs of at most ``chunk``
bytes), and what else the fuzzer does to the transport (a SEND ring of 8, a TCP close with
SENDs in flight, receives it stops posting, receive slots smaller than the server's SENDs).

Every plan is one function registered with :func:`send_plan`, like the TCP campaigns'
mutations (:func:`harness.strategies.mutation`): the campaign draws from
:data:`SEND_PLANS`, the report's coverage counts against :func:`plan_catalogue`, nothing else
lists them. :func:`predict` is the emulation's view of a case (:func:`simulate_transfer` of
each receiver generation), kept with every finding.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from hypothesis import strategies as st

from ...proto import DEFAULT, DIALECTS, get_dialect
from ...proto import messages as m
from ...proto.codec import pack_request
from ...proto.constants import RDMA_CHUNK, Cmd
from ...proto.tensor import RpcTensor
from ...proto import ggml
from ...proto.behaviour import C_NEW, WHOLE_COMPLETION
from ...transport.rdma_core import REQUEST, CallCutter, simulate_transfer
from ..case import BASE, HANDLE, Step, annotate, sentinel, step
from ...strategies import BufferRegion, hello_request_frame, messages

DIALECT = DEFAULT.name  # the RDMA transport exists from 4.0.2; the fuzzed servers speak it
# Buffer 0 holds the drawn requests' tensors, buffer 1 only the probe's.
BUFFER_SIZES = (64 << 10, 640 << 10)
SMALL_RECV = 4096  # receive slots of the error-completion plan (below any real SEND size)
# Commands whose valid requests the stream draws: answered or not, none ends the session
# (no FREE_BUFFER, no HELLO) or costs seconds (no GRAPH_COMPUTE).
STREAM_COMMANDS = (Cmd.SET_TENSOR, Cmd.GET_TENSOR, Cmd.BUFFER_GET_BASE, Cmd.BUFFER_CLEAR,
                   Cmd.GET_ALIGNMENT, Cmd.GET_MAX_SIZE, Cmd.GET_ALLOC_SIZE, Cmd.COPY_TENSOR,
                   Cmd.DEVICE_COUNT, Cmd.GET_DEVICE_MEMORY)
MAX_DRAWN = 5
# Drawn sizes cycle over at most this many writes; the rest of the stream is one write (cut
# by the chunk). Cycled over a whole 600 KB stream, sizes of 1-2 bytes made 300,000+ SENDs,
# each a round trip of the soft device: a case longer than the worker's 46 s deadline, which
# the CI run of stop 27 reported as a worker that gave no answer.
MAX_CYCLED_WRITES = 2048


@dataclass(frozen=True)
class RdmaCase:
    """One connection's request stream and SEND plan (JSON-ready, see :meth:`to_json`)."""

    requests: tuple[Step, ...]  # frames in order; the last two are the probe
    writes: tuple[int, ...]  # send_data sizes over the stream (sum == stream length)
    plan: dict  # {"what": registered plan, ...its parameters}: coverage and listings
    chunk: int = RDMA_CHUNK  # the fuzzer's SEND pieces and receive slots
    slots: int = 1  # SENDs in flight (1: stop-and-wait as 7.0.0)
    recv_depth: int = 24
    close_after: int | None = None  # close TCP and the QP after this many writes
    starve: bool = False  # never read the answers (nor repost receives), hold, then close
    dialect: str = DIALECT
    buffers: tuple[int, ...] = BUFFER_SIZES

    @property
    def stream(self) -> bytes:
        return b"".join(s.frame for s in self.requests)

    @property
    def legal(self) -> bool:
        """Every SEND fits the server's 256 KiB receive slot and every answer fits ours: a
        correct server must answer this stream correctly."""
        return self.chunk == RDMA_CHUNK and self.close_after is None and not self.starve

    def to_json(self) -> dict:
        return {"dialect": self.dialect, "buffers": list(self.buffers),
                "requests": [s.to_json() for s in self.requests], "writes": list(self.writes),
                "plan": self.plan, "chunk": self.chunk, "slots": self.slots,
                "recv_depth": self.recv_depth, "close_after": self.close_after,
                "starve": self.starve}

    @classmethod
    def from_json(cls, d: dict) -> "RdmaCase":
        return cls(requests=tuple(Step.from_json(s) for s in d["requests"]),
                   writes=tuple(int(w) for w in d["writes"]), plan=dict(d["plan"]),
                   chunk=int(d.get("chunk", RDMA_CHUNK)), slots=int(d.get("slots", 1)),
                   recv_depth=int(d.get("recv_depth", 24)), close_after=d.get("close_after"),
                   starve=bool(d.get("starve", False)), dialect=d.get("dialect", DIALECT),
                   buffers=tuple(d.get("buffers", BUFFER_SIZES)))

    def describe(self) -> list[str]:
        """One line per request and the SEND plan, for reports."""
        lines = [f"{i:3d} {s.cmd:<18} {len(s.frame):7d} B" + ("  (probe)" if i >= len(
            self.requests) - 2 else "") for i, s in enumerate(self.requests)]
        sizes = list(self.writes)
        shown = ", ".join(map(str, sizes[:24])) + (f", ... ({len(sizes)} writes)"
                                                   if len(sizes) > 24 else "")
        lines.append(f"SEND plan {self.plan.get('what')}: writes [{shown}], chunk {self.chunk}, "
                     f"{self.slots} in flight" + (f", TCP close after {self.close_after} writes"
                                                  if self.close_after is not None else "")
                     + (", stops posting receives" if self.starve else "")
                     + (f", {self.recv_depth} receives posted" if self.recv_depth != 24 else ""))
        return lines


def has_probe(case: RdmaCase) -> bool:
    return [s.cmd for s in case.requests[-2:]] == ["SET_TENSOR", "GET_TENSOR"]


def expected_probe(case: RdmaCase) -> bytes:
    """The bytes the probe's GET_TENSOR must return: the probe SET_TENSOR's data."""
    get = case.requests[-1]
    size = int.from_bytes(get.frame[-8:], "little")
    return case.requests[-2].frame[-size:] if size else b""


# ---------------------------------------------------------------- the plan registry

@dataclass(frozen=True)
class SendPlan:
    """One registered SEND plan: ``build(draw, frames) -> (writes, options)``."""

    what: str
    build: Callable
    min_probe: int = 1  # probe size the plan needs (a SEND above a slot, an answer above ours)
    doc: str = ""


#: what -> plan, in registration order.
SEND_PLANS: dict[str, SendPlan] = {}


def send_plan(what: str, *, min_probe: int = 1):
    """Register ``fn(draw, frames: list[bytes]) -> (writes, options)`` as SEND plan ``what``:
    ``writes`` the send_data sizes (cut by the fuzzer into SENDs of ``chunk``), ``options``
    :class:`RdmaCase` fields (``chunk``, ``slots``, ``close_after``, ``starve``,
    ``recv_depth``) and parameters for the description."""
    if what in SEND_PLANS:
        raise ValueError(f"SEND plan {what} is registered twice")

    def deco(fn):
        SEND_PLANS[what] = SendPlan(what, fn, min_probe, (fn.__doc__ or "").strip())
        return fn
    return deco


def unregister(what: str) -> None:
    del SEND_PLANS[what]


def plan_catalogue() -> list[dict]:
    """Every registered plan (the denominator of the report's coverage)."""
    return [{"what": p.what, "doc": p.doc.splitlines()[0] if p.doc else ""}
            for p in SEND_PLANS.values()]


def read_calls(stream: bytes, calls: str = DEFAULT.rdma.read_calls) -> list[int]:
    """The sizes of a C receiver's ``recv_data`` calls over ``stream`` (7.0.0: cmd, len,
    payload; seed 000: the SET_TENSOR payload as header + data)."""
    cutter = CallCutter(REQUEST, split_set_tensor=calls == C_NEW)
    out, cur = [], 0
    for k, ends in cutter.advance(memoryview(stream)):
        cur += k
        if ends:
            out.append(cur)
            cur = 0
    if cur:
        out.append(cur)
    return out


def _cycle(sizes: list[int], n: int) -> list[int]:
    """``sizes`` repeated over ``n`` bytes, for :data:`MAX_CYCLED_WRITES` writes at most."""
    out, total, i = [], 0, 0
    while total < n and len(out) < MAX_CYCLED_WRITES:
        w = min(sizes[i % len(sizes)], n - total)
        out.append(w)
        total += w
        i += 1
    return out + ([n - total] if total < n else [])


@send_plan("aligned-reads")
def _aligned(draw, frames):
    """One SEND per 7.0.0 read call (cmd, len, payload): the control every server takes."""
    return read_calls(b"".join(frames)), {}


@send_plan("whole-frames")
def _whole_frames(draw, frames):
    """One write per request frame (as a TCP client writes them)."""
    return [len(f) for f in frames], {}


@send_plan("one-send")
def _one_send(draw, frames):
    """The whole stream in one write (SENDs of 256 KiB)."""
    return [sum(map(len, frames))], {}


@send_plan("bytewise")
def _bytewise(draw, frames):
    """1-byte SENDs (the first bytes; the rest as one write)."""
    n = sum(map(len, frames))
    k = min(n, draw(st.integers(1, 400)))
    return [1] * k + ([n - k] if n > k else []), {}


@send_plan("ragged")
def _ragged(draw, frames):
    """Cycled drawn sizes, small to above a slot."""
    sizes = draw(st.lists(st.one_of(st.integers(1, 64), st.integers(65, 4096),
                                    st.sampled_from((RDMA_CHUNK - 1, RDMA_CHUNK, RDMA_CHUNK + 1)),
                                    st.integers(4097, 300_000)), min_size=1, max_size=6))
    return _cycle(sizes, sum(map(len, frames))), {"sizes": sizes}


@send_plan("split-frame")
def _split_frame(draw, frames):
    """One frame split at one of its byte boundaries (the campaign visits them all), the
    other frames on 7.0.0's read boundaries."""
    i = draw(st.integers(0, len(frames) - 1))
    at = draw(st.integers(1, max(1, len(frames[i]) - 1)))
    before = read_calls(b"".join(frames[:i]))
    after = read_calls(b"".join(frames[i + 1:]))
    cut = [at, len(frames[i]) - at] if len(frames[i]) > 1 else [1]
    return before + cut + after, {"frame": i, "at": at}


@send_plan("many-small")
def _many_small(draw, frames):
    """Many small SENDs (1..32 bytes cycled)."""
    sizes = draw(st.lists(st.integers(1, 32), min_size=1, max_size=8))
    n = sum(map(len, frames))
    head = min(n, 2048)
    return _cycle(sizes, head) + ([n - head] if n > head else []), {"sizes": sizes}


@send_plan("oversize-send", min_probe=RDMA_CHUNK + 1)
def _oversize(draw, frames):
    """A SEND larger than the server's 256 KiB receive slot (a length error on its QP)."""
    return [sum(map(len, frames))], {"chunk": 2 * RDMA_CHUNK}


@send_plan("pipelined")
def _pipelined(draw, frames):
    """Ragged writes with 8 SENDs in flight (seed 000's send ring)."""
    writes, opts = _ragged(draw, frames)
    return writes, dict(opts, slots=8)


@send_plan("tcp-close")
def _tcp_close(draw, frames):
    """Ragged writes, 8 in flight, TCP and QP closed after some of them."""
    writes, opts = _ragged(draw, frames)
    return writes, dict(opts, slots=8, close_after=draw(st.integers(1, max(1, len(writes)))))


@send_plan("stop-receiving", min_probe=2 << 20)
def _stop_receiving(draw, frames):
    """7.0.0-aligned writes, then no answer read and no receive reposted (one posted): the
    server's SENDs meet receiver-not-ready; then the fuzzer leaves."""
    return read_calls(b"".join(frames)), {"starve": True, "recv_depth": 1}


@send_plan("small-receives", min_probe=SMALL_RECV + 1)
def _small_receives(draw, frames):
    """7.0.0-aligned writes, but the fuzzer's receive slots are 4 KiB: the server's answer
    SEND gets an error completion (remote invalid request) and its QP goes to error."""
    return read_calls(b"".join(frames)), {"chunk": SMALL_RECV}


# ---------------------------------------------------------------- streams

def _regions() -> list[BufferRegion]:
    return [BufferRegion(sentinel(HANDLE, i), sentinel(BASE, i), size)
            for i, size in enumerate(BUFFER_SIZES)]


def probe_steps(size: int, fill: int) -> list[Step]:
    """SET_TENSOR + GET_TENSOR of ``size`` bytes at the start of buffer 1."""
    d = get_dialect(DIALECT)
    t = RpcTensor.make(id=0x7F00, type=ggml.TYPE_I8, ne=(size,), buffer=sentinel(HANDLE, 1),
                       data=sentinel(BASE, 1))
    period = bytes((fill + 31 * i) & 0xFF for i in range(256))  # 31 * i mod 256: period 256
    data = (period * (size // 256 + 1))[:size]
    return [step(pack_request(d, m.SetTensorRequest(t, 0, 0, data)), "SET_TENSOR"),
            step(pack_request(d, m.GetTensorRequest(t, 0, size)), "GET_TENSOR")]


@st.composite
def rdma_cases(draw, plans: tuple[str, ...] | None = None) -> RdmaCase:
    """A case: drawn valid requests in buffer 0, the probe in buffer 1, a registered plan."""
    d = get_dialect(DIALECT)
    plan = SEND_PLANS[draw(st.sampled_from(plans or tuple(SEND_PLANS)))]
    region = _regions()[0]
    cmds = draw(st.lists(st.sampled_from(STREAM_COMMANDS), max_size=MAX_DRAWN))
    # the fuzzed servers have one device: a request for another is refused on any transport
    reqs = [_on_device_0(draw(messages(d, c, buffers=[region]))) for c in cmds]
    steps = [step(pack_request(d, r), r.cmd.value) for r in reqs]
    size = draw(st.one_of(st.integers(1, 4096), st.integers(4097, 600_000),
                          st.sampled_from((RDMA_CHUNK - 8, RDMA_CHUNK + 3))))
    size = max(size, plan.min_probe)
    steps += probe_steps(size, draw(st.integers(0, 255)))
    writes, opts = plan.build(draw, [s.frame for s in steps])
    params = {k: v for k, v in opts.items() if k not in _OPTION_FIELDS}
    fields = {k: v for k, v in opts.items() if k in _OPTION_FIELDS}
    # buffer 1 holds the probe (a tensor beyond its buffer is refused on any transport)
    buffers = (BUFFER_SIZES[0], max(BUFFER_SIZES[1], size))
    return RdmaCase(requests=tuple(steps), writes=tuple(writes), buffers=buffers,
                    plan={"what": plan.what, **params}, **fields)


# the sweep's probe sizes: one byte, a receive slot's edge from below and from above
SWEEP_PROBES = (1, RDMA_CHUNK - 8, RDMA_CHUNK + 3)


@st.composite
def _sweep_case(draw, plan: str, cmd: Cmd, size: int) -> RdmaCase:
    d = get_dialect(DIALECT)
    p = SEND_PLANS[plan]
    req = _on_device_0(draw(messages(d, cmd, buffers=[_regions()[0]])))
    steps = [step(pack_request(d, req), req.cmd.value)]
    size = max(size, p.min_probe)
    steps += probe_steps(size, 0x5A)
    writes, opts = p.build(draw, [s.frame for s in steps])
    params = {k: v for k, v in opts.items() if k not in _OPTION_FIELDS}
    fields = {k: v for k, v in opts.items() if k in _OPTION_FIELDS}
    return RdmaCase(requests=tuple(steps), writes=tuple(writes),
                    buffers=(BUFFER_SIZES[0], max(BUFFER_SIZES[1], size)),
                    plan={"what": p.what, **params}, **fields)


def sweep_cases(plans: tuple[str, ...] | None = None) -> list[RdmaCase]:
    """The deterministic first phase of an RDMA campaign: every SEND plan x every probe size
    of :data:`SWEEP_PROBES`, each with one valid request before the probe (the stream
    commands in turn, so every one of them is cut by some plan), drawn from fixed seeds: the
    same cases on every machine."""
    import zlib
    from ..sweep import _drawn
    out = []
    for i, (plan, size) in enumerate((p, z) for p in (plans or tuple(SEND_PLANS))
                                     for z in SWEEP_PROBES):
        cmd = STREAM_COMMANDS[i % len(STREAM_COMMANDS)]
        seed = zlib.crc32(f"rdma|{plan}|{size}|{cmd.value}".encode())
        out += _drawn(_sweep_case(plan, cmd, size), 1, seed)
    return out


def _on_device_0(msg):
    return replace(msg, device=0) if getattr(msg, "device", 0) else msg


def aligned(case: RdmaCase) -> RdmaCase:
    """The control of a case: its requests on 7.0.0's read boundaries, nothing else."""
    return RdmaCase(requests=case.requests, writes=tuple(read_calls(case.stream)),
                    plan={"what": "aligned-reads"}, dialect=case.dialect, buffers=case.buffers)


_OPTION_FIELDS = ("chunk", "slots", "close_after", "starve", "recv_depth")


def with_requests(case: RdmaCase, keep: list[int]) -> RdmaCase:
    """``case`` with only the requests at ``keep`` (in order); the SEND plan is the same cut
    of what is left: each write loses the bytes of the dropped frames it covered."""
    spans, pos = [], 0
    for s in case.requests:
        spans.append((pos, pos + len(s.frame)))
        pos += len(s.frame)
    dropped = [spans[i] for i in range(len(spans)) if i not in set(keep)]
    writes, pos = [], 0
    for w in case.writes:
        lo, hi = pos, pos + w
        pos = hi
        lost = sum(max(0, min(hi, b) - max(lo, a)) for a, b in dropped)
        if w - lost > 0:
            writes.append(w - lost)
    close_after = None if case.close_after is None else min(case.close_after, len(writes))
    return replace(case, requests=tuple(case.requests[i] for i in keep), writes=tuple(writes),
                   close_after=close_after)


# ---------------------------------------------------------------- the emulation's view

def _receivers() -> dict[str, dict]:
    """The receive generations of the primary rows, each under the first row that has it:
    ``"<row> (<policy> receive)"`` -> its receive policy and read calls."""
    out: dict[str, dict] = {}
    for d in DIALECTS.values():
        how = dict(recv_policy=d.rdma.recv_policy, read_calls=d.rdma.read_calls)
        if d.primary and how not in out.values():
            out[f"{d.name} ({d.rdma.recv_policy} receive)"] = how
    return out


RECEIVERS = _receivers()
OLD_RECEIVER = next(k for k, v in RECEIVERS.items() if v["recv_policy"] == WHOLE_COMPLETION)


def predict(case: RdmaCase) -> dict[str, str]:
    """Per receiver generation, what :func:`simulate_transfer` says of the stream's SENDs:
    ``intact`` or the model's overrun message (it knows neither slot sizes nor flow control,
    so a SEND above a slot or a starved receiver is outside it)."""
    out = {}
    for name, kw in RECEIVERS.items():
        res = simulate_transfer(case.stream, write_sizes=list(case.writes), chunk=case.chunk,
                                **kw)
        out[name] = "intact" if res.intact else str(res.error or f"{res.dropped} bytes dropped")
    return out


def first_misfit(case: RdmaCase) -> tuple[str, str]:
    """Where a whole-completion (7.0.0) receive first overruns on this case, from the
    emulation: (the read it overruns, e.g. ``"len read"``, the command whose frame it is in);
    (plan name, "") when the model sees no overrun."""
    res = simulate_transfer(case.stream, write_sizes=list(case.writes), chunk=case.chunk,
                            **RECEIVERS[OLD_RECEIVER])
    if res.error is None:
        return case.plan.get("what", "?"), ""
    pos, cmd = 0, ""
    for s in case.requests:
        if pos > res.error.stream_offset:
            break
        cmd, pos = s.cmd, pos + len(s.frame)
    return f"{res.error.call_kind} read", cmd


def response_sizes(case: RdmaCase, live: dict | None = None,
                   ) -> list[tuple[int, str, bytes | None]]:
    """(payload size, command, exact payload or None) of every answer the stream is due, in
    order: the spec's sizes (:func:`harness.fuzz.case.annotate`); with the ``live`` handles
    and bases of the connection, a BUFFER_GET_BASE of a known buffer must answer its base."""
    # the server's reader has seen HELLO (said before the stream, like the setup)
    hello = step(hello_request_frame(case.dialect), "HELLO")
    out = []
    for s in annotate(case.dialect, (hello, *case.requests)).steps[1:]:
        want = None
        if live is not None and s.cmd == Cmd.BUFFER_GET_BASE.value and s.relocs:
            r = s.relocs[0]
            if r.kind == HANDLE and r.addend == 0 and r.index < len(live[BASE]):
                want = live[BASE][r.index].to_bytes(8, "little")
        out += [(size, s.cmd, want) for size in s.expect]
    return out


__all__ = ["BUFFER_SIZES", "aligned", "has_probe", "DIALECT", "RECEIVERS", "SEND_PLANS", "RdmaCase", "SendPlan",
           "expected_probe", "first_misfit", "plan_catalogue", "predict", "probe_steps",
           "rdma_cases", "read_calls", "response_sizes", "send_plan", "unregister",
           "with_requests"]
