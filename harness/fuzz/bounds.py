"""The accepted-out-of-bounds oracle: a server that *accepts* a request naming memory outside
its buffers is a finding even when it does not crash.

The harness knows every buffer of a session on the wire: each ALLOC_BUFFER answer (handle and
size) and BUFFER_GET_BASE answer (base), and every FREE_BUFFER. For each request a server
provably processed (an answer came after it), the oracle computes the byte ranges the request
names by ggml's own rules (spec 3.3, 3.4, 5, 6) in the server's address space:

* each tensor's range ``[data, data + ggml_nbytes)`` (nbytes in size_t, as the server computes
  it; a tensor with no elements names nothing);
* the region a SET/GET/MEMSET accesses, ``[data + offset, + size)``, with the address wrapping
  as a pointer does; every copy of a SET/GET_TENSOR_2D; a COPY_TENSOR's ``nbytes(src)`` bytes
  read at the source and written at the destination;
* every tensor a GRAPH_COMPUTE reaches from its nodes that has memory (a live buffer, or data
  the server must refuse without one) by its range as above; and for a node the CPU backend
  computes (it carries the COMPUTE flag and its op is not a view), the node and its sources by
  their *element extent* (a kernel walks ``ne`` by ``nb``: a size that wraps in size_t does
  not shorten what it touches), the node written, its sources read; a GRAPH_RECOMPUTE
  touches what the stored graph did.

A processed request with a range not inside the live buffer it names (a freed or never
allocated handle, before the base, past the end, wrapping) is an ``accepted-out-of-bounds``
finding, ranked a write or a read out of bounds as ClusterFuzz ranks them.

The converse, :func:`refused_in_bounds`: a request the server closed on although it is wholly in
bounds and plain in every other field the spec checks (a valid type with whole blocks and
contiguous strides, no graph fields, offset and size inside the tensor) is a compatibility
finding. It is judged only where the close is pinned to one step (a lockstep run).

Nothing is sent here: the oracle reads a case and its outcome.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..proto import Cmd, get_dialect, ggml
from ..proto.codec import REQUEST_HEADER_SIZE, unpack_request_payload
from ..proto.dialects import Dialect
from ..proto.tensor import RpcTensor, element_extent
from ..proto.wire import U64_MAX, announced_length
from .case import BASE, HANDLE, SIZE, Case, relocate
from .signature import Signature

ACCEPTED_OOB = "accepted-out-of-bounds"
REFUSED_IN_BOUNDS = "refused-in-bounds"
INT64_MAX = (1 << 63) - 1
# ops the CPU backend computes nothing for (ggml_graph_compute skips them)
_NO_COMPUTE = ("NONE", "RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE")
_COPIES_JUDGED = 64  # copies of a 2D request checked one by one (then only the last)


@dataclass(frozen=True)
class Access:
    """A range a request names: ``kind`` is read or write; ``length`` is exact (may pass
    2^64: a graph tensor's element extent)."""

    role: str
    kind: str
    handle: int
    start: int
    length: int


@dataclass(frozen=True)
class BoundsViolation:
    step: int
    cmd: str
    access: Access
    how: str  # "past its buffer's end", "before its buffer's base", "in no live buffer", ...
    buffer: tuple[int, int] | None  # (base, size) of the buffer named, when live

    @property
    def line(self) -> str:
        """The signature line: what was accepted, without any address."""
        return f"{self.access.kind} out of bounds accepted: {self.cmd} {self.access.role} " \
               f"{self.how}"

    @property
    def detail(self) -> str:
        a = self.access
        where = f"buffer [0x{self.buffer[0]:x}, +{self.buffer[1]})" if self.buffer else \
            f"handle 0x{a.handle:x}"
        return f"step {self.step} {self.cmd}: {a.role} [0x{a.start:x}, +{a.length}) vs {where}"

    def signature(self) -> Signature:
        return Signature(ACCEPTED_OOB, "", self.line, self.cmd)


def nbytes64(t: RpcTensor, numbering) -> int | None:
    """ggml_nbytes as the server computes it (size_t: wrapping)."""
    n = element_extent(t, numbering)
    return None if n is None else n & U64_MAX


@dataclass
class _Buffers:
    live: dict[int, tuple[int, int]] = field(default_factory=dict)  # handle -> (base, size)

    def judge(self, a: Access) -> tuple[str, tuple[int, int] | None] | None:
        if a.length == 0:
            return None  # names no byte
        if a.start + a.length > U64_MAX + 1:
            return "wrapping the address space", self.live.get(a.handle)
        b = self.live.get(a.handle)
        if b is None:
            return "in no live buffer", None
        base, size = b
        if a.start < base:
            return "before its buffer's base", b
        if a.start + a.length > base + size:
            return "past its buffer's end", b
        return None


def _named(role: str, kind: str, t: RpcTensor, numbering) -> list[Access]:
    n = nbytes64(t, numbering)
    return [] if not n else [Access(role, kind, t.buffer, t.data, n)]


def _region(role: str, kind: str, t: RpcTensor, offset: int, size: int) -> Access:
    return Access(role, kind, t.buffer, (t.data + offset) & U64_MAX, size)


def _copies(kind: str, t: RpcTensor, offset: int, size: int, n: int, stride: int
            ) -> list[Access]:
    if not n or not size:
        return []
    idx = list(range(min(n, _COPIES_JUDGED)))
    if n > _COPIES_JUDGED:
        idx.append(n - 1)
    return [Access(f"copy {i}", kind, t.buffer, (t.data + offset + i * stride) & U64_MAX, size)
            for i in idx]


def accesses(d: Dialect, msg, answer: int | None, graphs: dict, live: dict
             ) -> list[Access] | None:
    """The ranges ``msg`` names if the server accepted it (None: the oracle cannot judge it,
    e.g. a tensor of an invalid type, which the type check refuses anyway)."""
    num = d.numbering
    cmd = msg.cmd
    if any(nbytes64(t, num) is None for t in _tensors_of(msg)):
        return None
    if cmd is Cmd.SET_TENSOR:
        return _named("tensor", "write", msg.tensor, num) + \
            [_region("region", "write", msg.tensor, msg.offset, len(msg.data))]
    if cmd is Cmd.GET_TENSOR:
        return _named("tensor", "read", msg.tensor, num) + \
            [_region("region", "read", msg.tensor, msg.offset, msg.size)]
    if cmd is Cmd.MEMSET_TENSOR:
        return _named("tensor", "write", msg.tensor, num) + \
            [_region("region", "write", msg.tensor, msg.offset, msg.size)]
    if cmd in (Cmd.SET_TENSOR_2D, Cmd.GET_TENSOR_2D):
        kind = "write" if cmd is Cmd.SET_TENSOR_2D else "read"
        return _named("tensor", kind, msg.tensor, num) + \
            _copies(kind, msg.tensor, msg.offset, msg.size, msg.n_copies, msg.stride)
    if cmd is Cmd.COPY_TENSOR:
        if answer != 1:
            return []  # refused to copy: nothing moved
        n = nbytes64(msg.src, num)
        return _named("src", "read", msg.src, num) + _named("dst", "write", msg.dst, num) + \
            ([Access("dst room for src", "write", msg.dst.buffer, msg.dst.data, n)] if n else [])
    if cmd is Cmd.SET_TENSOR_HASH:
        return _named("tensor", "write", msg.tensor, num) if answer == 1 else []
    if cmd is Cmd.INIT_TENSOR:
        # a tensor with no live buffer is logged and skipped by every server (spec 5.12)
        return _named("tensor", "write", msg.tensor, num) if msg.tensor.buffer in live else []
    if cmd is Cmd.COMM_ALLREDUCE:
        return _named("tensor", "write", msg.tensor, num)
    if cmd is Cmd.GRAPH_COMPUTE:
        return _graph(d, msg, live)
    if cmd is Cmd.GRAPH_RECOMPUTE:
        return graphs.get((msg.device, msg.uid if d.graph_uid else 0))
    return []


def _tensors_of(msg) -> list[RpcTensor]:
    if msg.cmd is Cmd.COPY_TENSOR:
        return [msg.src, msg.dst]
    if msg.cmd in (Cmd.GRAPH_COMPUTE, Cmd.GET_ALLOC_SIZE, Cmd.GET_DEVICE_SUPPORTS_OP):
        return []  # judged tensor by tensor (a graph), or never (queries)
    t = getattr(msg, "tensor", None)
    return [t] if t is not None else []


def _graph(d: Dialect, msg, live: dict) -> list[Access] | None:
    """What building and computing the graph names: every tensor reachable from a node that
    has memory, by its range; a computed node and its sources by their element extents. A
    handle that names no live buffer is null to the server (spec 3.2): with data 0 such a
    tensor names no memory, with other data the server must refuse it."""
    num = d.numbering
    records: dict[int, RpcTensor] = {}
    for t in msg.tensors:
        records.setdefault(t.id, t)
    no_compute = {num.op[n] for n in _NO_COMPUTE if n in num.op}
    out: list[Access] = []
    seen: set[int] = set()
    for nid in msg.nodes:
        node = records.get(nid)
        if node is None:
            return None  # the server must refuse a missing node: not this oracle's call
        computed = bool(node.flags & ggml.FLAG_COMPUTE) and node.op not in no_compute
        if computed:
            for role, t in [("node", node)] + [("source", records[s]) for s in node.src
                                                if s and s in records]:
                n = element_extent(t, num)
                if n is None:
                    return None
                if n:
                    out.append(Access(f"computed {role}", "write" if role == "node" else "read",
                                      t.buffer, t.data, n))
        stack = [(node, "node")]
        while stack:
            t, role = stack.pop()
            if t.id in seen:
                continue
            seen.add(t.id)
            if nbytes64(t, num) is None:
                return None
            if t.buffer in live or t.data:
                out += _named(role, "write" if role == "node" else "read", t, num)
            for sid in (*t.src, t.view_src):
                if sid and sid in records:
                    stack.append((records[sid], "source"))
    return out


@dataclass
class _Model:
    d: Dialect
    buffers: _Buffers = field(default_factory=_Buffers)
    graphs: dict = field(default_factory=dict)


def requests(case: Case, out) -> list[tuple[int, object]]:
    """(step, decoded request) of every step whose frame is exactly one complete request,
    relocated as the executor sent it, up to the first step that is not (a framing mutation:
    the stream is no longer what the decoder would read, so nothing after it is judged)."""
    d = get_dialect(case.dialect)
    live = {k: [0] * len(v) for k, v in out.live.items()}
    found = []
    for i, s in enumerate(case.steps):
        frame = relocate(s.frame, s.relocs, live) if s.relocs else s.frame
        if len(frame) < REQUEST_HEADER_SIZE:
            break
        size = announced_length(frame)
        cmd = d.ids.get(frame[0])
        if cmd is None or size != len(frame) - REQUEST_HEADER_SIZE:
            break
        try:
            found.append((i, unpack_request_payload(d, cmd, memoryview(frame)[
                REQUEST_HEADER_SIZE:])))
        except Exception:  # noqa: BLE001 - the server must refuse it: judged no further
            break
        if s.learn is not None and i < out.proven and i in out.answers:
            kind, index = s.learn  # the value this step learned, not the slot's last one
            live[kind][index] = out.answers[i]
            if kind == HANDLE:
                live[BASE][index] = 0
    return found


def _walk(case: Case, out, upto: int):
    """(step, request, model) of each request before step ``upto``, the model holding the
    buffers (handle -> base, size) as the answers before that request left them; requests
    that only change the buffers are applied, not yielded."""
    model = _Model(get_dialect(case.dialect))
    live = model.buffers.live
    for i, msg in requests(case, out):
        if i >= upto:
            return
        learn = case.steps[i].learn
        if msg.cmd is Cmd.ALLOC_BUFFER and learn is not None:
            handle = out.answers.get(i)
            if handle:
                live[handle] = (None, out.sizes.get(i, 0))
        elif msg.cmd is Cmd.BUFFER_GET_BASE and learn is not None:
            if msg.remote_ptr in live and i in out.answers:
                live[msg.remote_ptr] = (out.answers[i], live[msg.remote_ptr][1])
        elif msg.cmd is Cmd.FREE_BUFFER:
            live.pop(msg.remote_ptr, None)
        else:
            yield i, msg, model


def judge(case: Case, out) -> list[BoundsViolation]:
    """Every range a processed request of ``case`` named outside the live buffer it names
    (a close may be a refusal: only steps before ``out.proven`` were processed for sure)."""
    found: list[BoundsViolation] = []
    for i, msg, model in _walk(case, out, out.proven):
        ranges = accesses(model.d, msg, out.answers.get(i), model.graphs, model.buffers.live)
        if msg.cmd is Cmd.GRAPH_COMPUTE and ranges is not None:
            model.graphs[(msg.device, msg.uid if model.d.graph_uid else 0)] = ranges
        for a in ranges or ():
            b = model.buffers.live.get(a.handle)
            if b is not None and b[0] is None:
                continue  # a base never learned: the range cannot be placed
            verdict = model.buffers.judge(a)
            if verdict is not None:
                found.append(BoundsViolation(i, msg.cmd.value, a, verdict[0], verdict[1]))
    return found


def worst(violations: list[BoundsViolation]) -> BoundsViolation | None:
    """The one a finding is named after: the first write, else the first read."""
    writes = [v for v in violations if v.access.kind == "write"]
    return (writes or violations or [None])[0]


# ---------------------------------------------------------------- the converse

_PLAIN_CMDS = (Cmd.SET_TENSOR, Cmd.GET_TENSOR, Cmd.MEMSET_TENSOR, Cmd.COPY_TENSOR,
               Cmd.SET_TENSOR_2D, Cmd.GET_TENSOR_2D)


def _plain(t: RpcTensor, num) -> bool:
    tr = num.type_traits(t.type)
    if tr is None or not tr.blck_size or any(n <= 0 for n in t.ne):
        return False
    count = t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3]
    return (t.ne[0] % tr.blck_size == 0 and count <= INT64_MAX
            and tuple(t.nb) == num.contiguous_strides(t.type, t.ne)
            and not t.op and not any(t.src) and not t.view_src and not t.view_offs
            and not t.flags and b"\0" in t.name)


def _inside(buffers: _Buffers, handle: int, start: int, length: int, *,
            allow_empty_at_end: bool = False) -> bool:
    b = buffers.live.get(handle)
    if b is None or b[0] is None:
        return False
    base, size = b
    end_ok = start < base + size or (allow_empty_at_end and length == 0)
    return base <= start and end_ok and start + length <= base + size


def wholly_in_bounds(d: Dialect, msg, buffers: _Buffers) -> bool:
    """Is ``msg`` a request every server must accept: plain tensors inside their live buffers,
    and the accessed region inside both the tensor and the buffer (spec 3.4, 5)?"""
    num = d.numbering
    if msg.cmd not in _PLAIN_CMDS:
        return False
    tensors = [msg.src, msg.dst] if msg.cmd is Cmd.COPY_TENSOR else [msg.tensor]
    for t in tensors:
        if not _plain(t, num) or not _inside(buffers, t.buffer, t.data, nbytes64(t, num)):
            return False
    if msg.cmd is Cmd.COPY_TENSOR:
        n = nbytes64(msg.src, num)
        dst = buffers.live[msg.dst.buffer]
        return dst[1] > 0 and _inside(buffers, msg.dst.buffer, msg.dst.data, n)
    t = msg.tensor
    n = nbytes64(t, num)
    if msg.cmd in (Cmd.SET_TENSOR_2D, Cmd.GET_TENSOR_2D):
        if not msg.n_copies or not msg.size or msg.n_copies > _COPIES_JUDGED:
            return False
        if msg.cmd is Cmd.SET_TENSOR_2D and len(msg.data) != msg.size * msg.n_copies:
            return False
        span = msg.offset + (msg.n_copies - 1) * msg.stride + msg.size
        return span <= n and msg.stride >= 0
    size = len(msg.data) if msg.cmd is Cmd.SET_TENSOR else msg.size
    if msg.offset + size > n or msg.offset > n:
        return False
    # a zero-length access at exactly the buffer end is refused by every server (spec 3.4)
    return _inside(buffers, t.buffer, t.data + msg.offset, size)


def refused_in_bounds(case: Case, out, step: int) -> Signature | None:
    """A compatibility finding when the request at ``step`` (where the server closed, pinned
    by a lockstep run) is wholly in bounds and plain; None otherwise."""
    if case.protocol_error_at is not None and case.protocol_error_at <= step:
        return None
    for i, msg, model in _walk(case, out, step + 1):
        if i == step and wholly_in_bounds(model.d, msg, model.buffers):
            return Signature(REFUSED_IN_BOUNDS, "", f"in-bounds {msg.cmd.value} refused",
                             msg.cmd.value)
    return None
