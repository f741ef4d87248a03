"""The upload timing of a session, measured from the outside (what GGML_RPC_LOADPROF=1 prints
inside the seed-000 build, :mod:`.loadprof_log`, derived here from the transcript's bytes and
timestamps).

Times are when the recording proxy saw the bytes. For each command: how many, how many bytes,
how long its bytes took to cross (first byte to last byte, request and response), and the gap
before it (the client's time between its previous call and this one). The gap before a
SET_TENSOR_HASH is the client computing the hash, so it is counted as hashing time.
"""

from __future__ import annotations

import bisect
from dataclasses import asdict, dataclass, field

from ..proto import Cmd, Session
from ..proto.tensor import nbytes
from .transcript import C2S, S2C, Transcript

UPLOADS = (Cmd.SET_TENSOR, Cmd.SET_TENSOR_HASH, Cmd.SET_TENSOR_2D)


class _Clock:
    """Time at which the byte at a stream offset passed the proxy."""

    def __init__(self, tr: Transcript, direction: str):
        self.ends: list[int] = []
        self.times: list[float] = []
        off = 0
        for c in tr.stream(direction):
            off += c.length
            self.ends.append(off)
            self.times.append(c.t)

    def at(self, offset: int) -> float | None:
        i = bisect.bisect_right(self.ends, offset)
        if i >= len(self.times):
            return self.times[-1] if self.times else None
        return self.times[i]


@dataclass
class CommandStats:
    count: int = 0
    bytes: int = 0
    wire_seconds: float = 0.0


@dataclass
class UploadTiming:
    set_tensor_calls: int = 0
    set_tensor_bytes: int = 0
    hash_calls: int = 0
    hash_hits: int = 0
    bytes_hashed: int = 0  # by the client, inferred from the tensors it sent hashes for
    upload_span: float = 0.0  # first upload command's first byte to the last one's last byte
    hashing_seconds: float = 0.0  # gaps right before SET_TENSOR_HASH
    wire_seconds: float = 0.0  # SET_TENSOR bytes in flight
    gap_seconds: float = 0.0  # other client-side time between calls inside the upload span
    commands: dict[str, CommandStats] = field(default_factory=dict)
    timeline: list[tuple[float, int]] = field(default_factory=list)  # (t, c2s bytes so far)

    def to_dict(self, with_timeline: bool = False) -> dict:
        d = asdict(self)
        if not with_timeline:
            d.pop("timeline")
        d["commands"] = {k: asdict(v) for k, v in self.commands.items()}
        return d

    def merge(self, other: "UploadTiming") -> None:
        for f in ("set_tensor_calls", "set_tensor_bytes", "hash_calls", "hash_hits",
                  "bytes_hashed", "upload_span", "hashing_seconds", "wire_seconds",
                  "gap_seconds"):
            setattr(self, f, getattr(self, f) + getattr(other, f))
        for k, v in other.commands.items():
            s = self.commands.setdefault(k, CommandStats())
            s.count += v.count
            s.bytes += v.bytes
            s.wire_seconds += v.wire_seconds
        self.timeline += other.timeline


def time_uploads(tr: Transcript, session: Session, *, timeline_points: int = 400) -> UploadTiming:
    c2s, s2c = _Clock(tr, C2S), _Clock(tr, S2C)
    p = UploadTiming()
    prev_end: float | None = None
    first_upload: float | None = None
    last_upload_end: float | None = None
    exchanges = [e for e in session.exchanges if e.request is not None]
    pending_hash = None
    for i, ex in enumerate(exchanges):
        t0 = c2s.at(ex.req_offset)
        t1 = c2s.at(ex.req_offset + max(ex.req_size, 1) - 1)
        end = t1
        if ex.rsp_offset is not None and ex.rsp_size:
            end = s2c.at(ex.rsp_offset + ex.rsp_size - 1) or t1
        if t0 is None or t1 is None:
            continue
        gap = max(0.0, t0 - prev_end) if prev_end is not None else 0.0
        cmd = ex.cmd
        st = p.commands.setdefault(cmd.value, CommandStats())
        st.count += 1
        st.bytes += ex.req_size
        st.wire_seconds += t1 - t0
        if cmd in UPLOADS:
            if cmd is Cmd.SET_TENSOR_HASH:
                p.hashing_seconds += gap  # the client hashed the tensor in this gap
            elif first_upload is not None:
                p.gap_seconds += gap
            if first_upload is None:
                first_upload = t0
            last_upload_end = end
        if cmd is Cmd.SET_TENSOR_HASH:
            p.hash_calls += 1
            hit = ex.response is not None and ex.response.result == 1
            p.hash_hits += hit
            pending_hash = ex
            if hit:
                p.bytes_hashed += max(0, _tensor_bytes(ex) - ex.request.offset)
        elif cmd is Cmd.SET_TENSOR:
            size = ex.data_length or len(ex.request.data)
            p.set_tensor_calls += 1
            p.set_tensor_bytes += size
            p.wire_seconds += t1 - t0
            if pending_hash is not None and exchanges[i - 1] is pending_hash:
                p.bytes_hashed += size  # the miss this upload answers covered exactly its data
            pending_hash = None
        prev_end = end
    if first_upload is not None and last_upload_end is not None:
        p.upload_span = last_upload_end - first_upload
    p.timeline = _timeline(tr, timeline_points)
    return p


def _tensor_bytes(ex) -> int:
    try:
        return nbytes(ex.request.tensor)
    except (IndexError, AttributeError):
        return 0


def _timeline(tr: Transcript, points: int) -> list[tuple[float, int]]:
    out, total = [], 0
    chunks = [c for c in tr.stream(C2S)]
    if not chunks:
        return out
    t_first = chunks[0].t
    step = max(1, len(chunks) // points)
    for i, c in enumerate(chunks):
        total += c.length
        if i % step == 0 or i == len(chunks) - 1:
            out.append((round(c.t - t_first, 6), total))
    return out


def time_transcripts(transcripts: list[Transcript]) -> UploadTiming:
    """One timing over every connection of a cell (connections are sequential here)."""
    total = UploadTiming()
    for tr in transcripts:
        total.merge(time_uploads(tr, tr.decode()))
    return total


def plot(timings: dict[str, UploadTiming], path, title: str = "bytes uploaded over time") -> None:
    """PNG of client-to-server bytes over time, one line per cell."""
    # the object API, not pyplot: cells run in threads and pyplot keeps global state
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for label, timing in timings.items():
        if timing.timeline:
            ts, bs = zip(*timing.timeline)
            ax.plot(ts, [b / (1 << 20) for b in bs], label=label)
    ax.set_xlabel("seconds since the connection opened")
    ax.set_ylabel("MiB sent by the client")
    ax.set_title(title, fontsize=9)  # cell ids run to 80 characters
    if timings:
        ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    # fixed margins that fit these labels: tight_layout measured every text twice, half the
    # cost of a plot, and the matrix draws one for every cell that uploads
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.11, top=0.93)
    fig.savefig(path)
