"""The sans-IO core of the emulated ggml-rpc RDMA transport (spec 10): no threads, no sockets.

* **Send**: every ``send_data`` call is cut into pieces of at most ``chunk`` bytes (256 KiB),
  each one SEND and one completion at the receiver (:class:`SendFramer`).
* **Receive**: policy ``whole-completion`` (proto 7) copies each completion whole into the
  current ``recv_data`` call; one larger than what that call still expects is an **overrun**,
  raised as :class:`RdmaOverrun` with the details instead of corrupting memory (or, with
  ``on_oversize="drop"``, clamped and the rest lost: the "frame loss" variant). Policy
  ``partial`` (seed 000, 9.0.0) serves reads of any size from a cursor
  (:class:`CompletionReader`).
* **Which calls**: what a C peer passes to ``send_data`` / ``recv_data`` is not what the
  Python peers' ``sendall`` / ``recv_into`` calls look like, so the framing is chosen
  explicitly: ``c-old`` cuts the stream like a proto-7 C peer (request ``[cmd 1][len 8]
  [payload]``, response ``[len 8][payload]``), ``c-new`` like seed 000 / 9.0.0 (the client's
  SET_TENSOR as ``[1][8][305-byte header][data]``), ``writes`` / ``app`` take the caller's
  own write and read boundaries (what the fuzzer varies) (:class:`CallCutter`).

Which generation a peer has comes from its dialect's row (``Dialect.rdma``,
:mod:`harness.proto.behaviour`): :func:`config_for_dialect`. :func:`simulate_transfer` runs one
direction of the data path in memory (the fuzzing model); the threaded wires are in
:mod:`.rdma_wires`, the endpoints and listener in :mod:`.rdma_endpoint`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, fields, replace
from functools import lru_cache
from typing import Iterator, Sequence

from ..proto.behaviour import (APP, C_NEW, PARTIAL, RDMA_PROTO7, RDMA_SEED000, RDMA_V9,
                               RECV_POLICIES, WHOLE_COMPLETION, WRITES, RdmaGeneration)
from ..proto.constants import RDMA_CHUNK, RDMA_RX_RING, SET_TENSOR_HEADER_SIZE, Cmd
from ..proto.dialects import DEFAULT, Dialect, get_dialect
from ..proto.wire import LENGTH_SIZE, U64
from .base import TransportError
from .caps import LINUX, MACOS

REQUEST, RESPONSE = "request", "response"


# ---------------------------------------------------------------- errors

class RdmaError(TransportError):
    """Base of the RDMA transport's errors (an OSError via TransportError, so peers treat it
    as a broken connection)."""


class RdmaOverrun(RdmaError):
    """A whole-completion receiver got a completion larger than its current read expects.

    The proto-7 C receiver copies all ``byte_len`` bytes into the caller's buffer (writing
    past it) and its remaining count wraps around; the emulator stops here instead.
    """

    FIELDS = ("completion_index", "byte_len", "call_kind", "call_size", "call_remaining",
              "stream_offset")

    def __init__(self, **details):
        if set(details) != set(self.FIELDS):
            raise TypeError(f"RdmaOverrun needs exactly {', '.join(self.FIELDS)}")
        vars(self).update(details)
        self.excess = self.byte_len - self.call_remaining
        super().__init__(
            f"RDMA overrun: completion #{self.completion_index} carries {self.byte_len} bytes "
            f"but the receiver's {self.call_kind} read (recv_data of {self.call_size} bytes) "
            f"expects only {self.call_remaining} more, at stream offset {self.stream_offset}: "
            f"a whole-completion receiver would write {self.excess} bytes past its buffer")

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.FIELDS + ("excess",)}


class RdmaHang(RdmaError, TimeoutError):
    """A wait ran out: nothing arrived, or the peer never made room. ``reason`` says why."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(reason)



# ---------------------------------------------------------------- configuration

_GENERATION_FIELDS = frozenset(f.name for f in fields(RdmaGeneration))


@dataclass(frozen=True)
class RdmaConfig:
    """One side's RDMA data path: a generation (``Dialect.rdma``, the one record of what
    differs between peers) plus the device limits and the emulator's own switches. The
    generation's fields read through (``config.send_slots``); ``with_`` changes either."""

    generation: RdmaGeneration = RDMA_PROTO7
    chunk: int = RDMA_CHUNK  # largest SEND
    recv_depth: int = RDMA_RX_RING  # receive buffers posted at activation
    on_oversize: str = "raise"  # whole-completion only: "raise" (detect) or "drop" (clamp)
    timeout: float = 30.0  # every wait
    platform: str = LINUX  # conn_caps layout

    def __post_init__(self):
        if self.on_oversize not in ("raise", "drop"):
            raise ValueError("on_oversize must be 'raise' or 'drop'")
        if self.platform not in (LINUX, MACOS):
            raise ValueError(f"platform must be {LINUX} or {MACOS}")
        if min(self.chunk, self.recv_depth) < 1:
            raise ValueError("chunk and recv_depth must be >= 1")

    def __getattr__(self, name: str):
        # Only called for names the config itself lacks: the generation's fields.
        if name in _GENERATION_FIELDS:
            return getattr(self.generation, name)
        raise AttributeError(name)

    @staticmethod
    @lru_cache(maxsize=None)
    def of(generation: RdmaGeneration) -> "RdmaConfig":
        """The default configuration of a generation (one object per generation)."""
        return RdmaConfig(generation)

    def with_(self, **kw) -> "RdmaConfig":
        changed = {k: kw.pop(k) for k in list(kw) if k in _GENERATION_FIELDS}
        generation = replace(self.generation, **changed) if changed else self.generation
        return replace(self, generation=generation, **kw)


OLD = RdmaConfig.of(RDMA_PROTO7)
SEED000 = RdmaConfig.of(RDMA_SEED000)
V9 = RdmaConfig.of(RDMA_V9)


def config_for_dialect(dialect: Dialect | str) -> RdmaConfig:
    """The RDMA data path a peer of ``dialect`` has: its row's generation. GGML_RPC_LOAD_OPT=0
    on a seed-000 build sends like OLD but keeps the partial receive (docs/RDMA.md, section 1;
    measured on the real build over softverbs)."""
    return RdmaConfig.of(get_dialect(dialect).rdma)


# ---------------------------------------------------------------- sans-IO core

class CallCutter:
    """Where a C peer's ``send_data`` / ``recv_data`` calls begin and end in one direction.

    Requests are ``[cmd 1][len 8][payload len]`` (no payload call when len is 0); the new
    generation splits SET_TENSOR's payload into ``[header 305][data]``, the data optionally in
    pieces (9.0.0 reads it through a 16 MiB buffer). Responses are ``[len 8][payload]``. The
    cutter only parses the cmd byte and the length, so it follows garbage as a C peer would.
    """

    def __init__(self, direction: str, *, split_set_tensor: bool = False,
                 data_piece: int | None = None, dialect: Dialect | str = DEFAULT):
        if direction not in (REQUEST, RESPONSE):
            raise ValueError(f"direction must be {REQUEST!r} or {RESPONSE!r}")
        self.direction = direction
        self.split_set_tensor = split_set_tensor
        self.data_piece = data_piece
        self.set_tensor_id = get_dialect(dialect).id_of(Cmd.SET_TENSOR)
        self.calls = 0  # calls completed so far
        self._cmd: int | None = None
        self._len = bytearray()
        self._data_left = 0
        self._kind, self._size, self._left = "", 0, 0
        self._start_frame()

    @property
    def kind(self) -> str:
        """The current call: cmd, len, payload, set_tensor header, set_tensor data."""
        return self._kind

    @property
    def size(self) -> int:
        return self._size

    @property
    def remaining(self) -> int:
        return self._left

    def _set(self, kind: str, size: int) -> None:
        self._kind, self._size, self._left = kind, size, size

    def _start_frame(self) -> None:
        if self.direction == REQUEST:
            self._set("cmd", 1)
        else:
            self._set("len", LENGTH_SIZE)

    def advance(self, data) -> list[tuple[int, bool]]:
        """Consume ``data``; returns its segments as ``(length, ends_a_call)``."""
        view = memoryview(data).cast("B") if not isinstance(data, (bytes, bytearray)) else data
        segs = []
        i, n = 0, len(view)
        while i < n:
            k = min(self._left, n - i)
            if self._kind == "cmd":
                self._cmd = view[i]
            elif self._kind == "len":
                self._len += view[i:i + k]
            self._left -= k
            i += k
            ends = self._left == 0
            segs.append((k, ends))
            if ends:
                self.calls += 1
                self._next_call()
        return segs

    def _next_call(self) -> None:
        kind = self._kind
        if kind == "cmd":
            self._set("len", LENGTH_SIZE)
        elif kind == "len":
            (length,) = U64.unpack(self._len)
            self._len.clear()
            if length == 0:
                self._start_frame()
            elif (self.direction == REQUEST and self.split_set_tensor
                  and self._cmd == self.set_tensor_id and length > SET_TENSOR_HEADER_SIZE):
                self._data_left = length - SET_TENSOR_HEADER_SIZE
                self._set("set_tensor header", SET_TENSOR_HEADER_SIZE)
            else:
                self._set("payload", length)
        elif kind in ("set_tensor header", "set_tensor data") and self._data_left:
            piece = min(self._data_left, self.data_piece or self._data_left)
            self._data_left -= piece
            self._set("set_tensor data", piece)
        else:
            self._start_frame()


def make_cutter(calls: str, direction: str, *, data_piece: int | None = None,
                dialect: Dialect | str = DEFAULT) -> CallCutter | None:
    """The C call plan for ``calls`` (c-old, c-new), or None for the caller's own boundaries."""
    if calls in (WRITES, APP):
        return None
    return CallCutter(direction, split_set_tensor=calls == C_NEW,
                      data_piece=data_piece if calls == C_NEW else None, dialect=dialect)


class SendFramer:
    """Application writes -> ``send_data`` calls -> SEND pieces of at most ``chunk`` bytes.

    Without a cutter every write is one call. With one, the call boundaries come from the
    stream itself and pieces are cut from each call's start; bytes of an unfinished call wait
    (at most one chunk) until the call completes or ``flush``.
    """

    def __init__(self, chunk: int, cutter: CallCutter | None = None):
        self.chunk = chunk
        self.cutter = cutter
        self._pending = bytearray()

    def write(self, data) -> Iterator[bytes]:
        view = memoryview(data).cast("B")
        chunk = self.chunk
        if self.cutter is None:
            for i in range(0, len(view), chunk):
                yield bytes(view[i:i + chunk])
            return
        pos = 0
        for k, ends in self.cutter.advance(view):
            seg = view[pos:pos + k]
            pos += k
            j = 0
            while j < k:
                take = min(chunk - len(self._pending), k - j)
                if not self._pending and take == chunk:
                    yield bytes(seg[j:j + take])  # whole chunk straight from the caller
                else:
                    self._pending += seg[j:j + take]
                    if len(self._pending) == chunk:
                        yield bytes(self._pending)
                        self._pending.clear()
                j += take
            if ends and self._pending:
                yield bytes(self._pending)
                self._pending.clear()

    def flush(self) -> list[bytes]:
        """Bytes of an unfinished call (a misbehaving or truncating sender) go out now."""
        out = [bytes(self._pending)] if self._pending else []
        self._pending.clear()
        return out


class CompletionReader:
    """Receive completions in order and serve the application's reads under a policy.

    ``partial``: a cursor over the current completion serves reads of any size; the slot is
    released (reposted) when the completion is consumed. ``whole-completion``: each completion
    goes whole into the current ``recv_data`` call; with a cutter, the calls are the C peer's
    (checked when the completion arrives, then served to the application from the copy), else
    every ``read_into`` is a call (checked against the caller's buffer).
    """

    def __init__(self, policy: str, *, cutter: CallCutter | None = None,
                 on_oversize: str = "raise"):
        if policy not in RECV_POLICIES:
            raise ValueError(f"policy must be one of {RECV_POLICIES}")
        self.policy = policy
        self.cutter = cutter if policy == WHOLE_COMPLETION else None
        self.on_oversize = on_oversize
        self.completions = 0
        self.delivered = 0  # bytes handed to the application
        self.dropped = 0  # bytes lost to oversize completions (on_oversize="drop")
        self._cur: memoryview | None = None
        self._off = 0
        self._received = 0  # bytes of all completions so far (stream offset)

    def wants_completion(self) -> bool:
        return self._cur is None

    def give(self, completion) -> None:
        assert self._cur is None, "previous completion not consumed"
        data = memoryview(completion).cast("B")
        index = self.completions
        self.completions += 1
        offset = self._received
        self._received += len(data)
        cut = self.cutter
        if cut is not None and len(data) > cut.remaining:
            if self.on_oversize == "raise":
                raise RdmaOverrun(completion_index=index, byte_len=len(data),
                                  call_kind=cut.kind, call_size=cut.size,
                                  call_remaining=cut.remaining, stream_offset=offset)
            self.dropped += len(data) - cut.remaining
            data = data[:cut.remaining]
        if cut is not None:
            cut.advance(data)
        self._cur, self._off = data, 0

    def read_into(self, buf: memoryview) -> tuple[int, int]:
        """Copy into ``buf``; returns (bytes copied, receive slots released: 0 or 1)."""
        cur = self._cur
        assert cur is not None, "no completion to read from"
        left = len(cur) - self._off
        if self.policy == WHOLE_COMPLETION and self.cutter is None and left > len(buf):
            if self.on_oversize == "raise":
                raise RdmaOverrun(completion_index=self.completions - 1, byte_len=len(cur),
                                  call_kind="recv_into", call_size=len(buf),
                                  call_remaining=len(buf),
                                  stream_offset=self._received - len(cur))
            self.dropped += left - len(buf)
            left = len(buf)  # clamp: the rest of the completion is lost with its slot
            buf[:left] = cur[self._off:self._off + left]
            self.delivered += left
            self._cur = None
            return left, 1
        n = min(len(buf), left)
        buf[:n] = cur[self._off:self._off + n]
        self._off += n
        self.delivered += n
        if self._off == len(cur):
            self._cur = None
            return n, 1
        return n, 0


@dataclass
class TransferResult:
    received: bytes
    completions: list[int]  # byte_len of every SEND, in order
    error: RdmaOverrun | None = None
    dropped: int = 0
    reads: int = 0

    @property
    def intact(self) -> bool:
        return self.error is None and not self.dropped


def cut_writes(stream: bytes, write_sizes: Sequence[int] | None) -> list[bytes]:
    """``stream`` cut into writes of the given sizes (the remainder is one last write)."""
    out, pos = [], 0
    for n in write_sizes or ():
        if pos >= len(stream):
            break
        out.append(stream[pos:pos + n])
        pos += n
    if pos < len(stream):
        out.append(stream[pos:])
    return out


def simulate_transfer(stream: bytes, *, write_sizes: Sequence[int] | None = None,
                      read_sizes: Sequence[int] | None = None, chunk: int = RDMA_CHUNK,
                      recv_policy: str = PARTIAL, send_framing: str = WRITES,
                      read_calls: str = APP, direction: str = REQUEST,
                      on_oversize: str = "raise", data_read_piece: int | None = None,
                      dialect: Dialect | str = DEFAULT) -> TransferResult:
    """One direction of the data path without threads: the fuzzing model.

    The sender writes ``stream`` in ``write_sizes`` pieces (each a send_data call when
    ``send_framing`` is ``writes``); the receiver reads with ``read_sizes`` in turn (cycled;
    default: everything at once). Content does not depend on flow control, so there is none.
    """
    framer = SendFramer(chunk, make_cutter(send_framing, direction, dialect=dialect))
    completions: list[bytes] = []
    for w in cut_writes(stream, write_sizes):
        completions.extend(framer.write(w))
    completions.extend(framer.flush())
    reader = CompletionReader(recv_policy, on_oversize=on_oversize,
                              cutter=make_cutter(read_calls, direction,
                                                 data_piece=data_read_piece, dialect=dialect))
    sizes = list(read_sizes or [max(1, len(stream))])
    out = bytearray()
    res = TransferResult(b"", [len(c) for c in completions])
    queue = deque(completions)
    i = 0
    try:
        while True:
            if reader.wants_completion():
                if not queue:
                    break
                reader.give(queue.popleft())
                continue
            buf = memoryview(bytearray(sizes[i % len(sizes)]))
            i += 1
            n, _ = reader.read_into(buf)
            res.reads += 1
            out += buf[:n]
    except RdmaOverrun as e:
        res.error = e
    res.received = bytes(out)
    res.dropped = reader.dropped
    return res
