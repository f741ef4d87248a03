"""Session-aware dissection of recorded ggml-rpc connections with the generated scapy layers
(:mod:`.scapy_layer`).

A response cannot be dissected on its own: its layout depends on the request it answers. So the
dissector runs the codec's ``SessionDecoder`` over both directions, finds each exchange's frames
in the two byte streams with the wire's frame walker, and dissects each with the right classes.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from scapy.packet import Packet, Raw

from ..proto.constants import Cmd
from ..proto.dialects import DEFAULT, Dialect
from ..proto.messages import spec_for
from ..proto.session import Exchange, Session
from ..proto.wire import REQUEST_HEADER_SIZE, FrameHead, FrameWalker
from .scapy_layer import layer_for, request_frame_class, response_frame_class
from .transcript import C2S, S2C, Chunk, Transcript


@dataclass
class DissectedExchange:
    index: int
    exchange: Exchange
    request: Packet | None  # request frame (header layer with the payload layer under it)
    response: Packet | None  # response frame, None for fire-and-forget commands

    @property
    def cmd(self) -> Cmd | None:
        return self.exchange.cmd


@dataclass
class Dissection:
    """A dissected TCP conversation; errors are the codec's (``session.c2s_error`` ...)."""

    session: Session
    exchanges: list[DissectedExchange] = field(default_factory=list)
    transcript: Transcript | None = None
    c2s_rest: Packet | None = None  # undecodable client bytes from the error on, if any
    s2c_rest: Packet | None = None

    @property
    def dialect(self) -> Dialect | None:
        return self.session.dialect

    @property
    def packets(self) -> list[Packet]:
        """Request, then its response, for every exchange in order."""
        out: list[Packet] = []
        for ex in self.exchanges:
            if ex.request is not None:
                out.append(ex.request)
            if ex.response is not None:
                out.append(ex.response)
        return out


class StreamView:
    """Random access into one direction of a transcript without joining it (elided = zeros)."""

    def __init__(self, chunks: Sequence[Chunk]):
        self.chunks = list(chunks)
        self.starts: list[int] = []
        off = 0
        for c in self.chunks:
            self.starts.append(off)
            off += c.length
        self.size = off

    def _index(self, offset: int) -> int:
        return max(bisect.bisect_right(self.starts, offset) - 1, 0)

    def read(self, offset: int, n: int) -> bytes:
        n = max(0, min(n, self.size - offset))
        out, i = [], self._index(offset)
        while n > 0 and i < len(self.chunks):
            c, start = self.chunks[i], self.starts[i]
            lo = offset - start
            take = min(c.length - lo, n)
            out.append(c.data[lo:lo + take] if c.data is not None else bytes(take))
            offset += take
            n -= take
            i += 1
        return b"".join(out)

    def time_at(self, offset: int) -> float | None:
        if not self.chunks:
            return None
        return self.chunks[min(self._index(offset), len(self.chunks) - 1)].t

    def chunk_at(self, offset: int) -> Chunk | None:
        return self.chunks[self._index(offset)] if self.chunks else None

    def captured(self, offset: int, n: int) -> bool:
        """Whether every byte of ``[offset, offset + n)`` was kept (none elided or missing)."""
        if offset + n > self.size:
            return False
        i = self._index(offset)
        while n > 0 and i < len(self.chunks):
            if self.chunks[i].data is None:
                return False
            n -= self.starts[i] + self.chunks[i].length - max(offset, self.starts[i])
            i += 1
        return True


@dataclass
class FrameSpan:
    """Where an exchange's frames sit in the two byte streams."""

    req_offset: int
    req_size: int
    rsp_offset: int | None = None
    rsp_size: int = 0


def walk_frames(view: StreamView, *, requests: bool) -> list[FrameHead]:
    """Every frame of one direction whose header is in the stream (elided header bytes read as
    zeros, as ``StreamView.read`` gives them)."""
    walker, out = FrameWalker(requests), []
    for c in view.chunks:
        pieces = walker.feed(c.data) if c.data is not None else walker.skip(c.length)
        out += [p.frame for p in pieces if p.header and p.frame]
    return out


def frame_spans(session: Session, c2s: StreamView, s2c: StreamView) -> list[FrameSpan]:
    """Stream offsets of every exchange's request and response frames.

    Walked from the frame headers instead of taken from ``Exchange.req_offset``: the decoder
    measures that from the event that completed the frame, which lands after the header when
    the header and the payload arrived in different reads.
    """
    spans: list[FrameSpan] = []
    requests = walk_frames(c2s, requests=True)
    for i, _ in enumerate(session.exchanges):
        if i < len(requests):
            spans.append(FrameSpan(requests[i].start, requests[i].end - requests[i].start))
        else:  # a header cut short
            off = requests[-1].end if requests else 0
            spans.append(FrameSpan(off, max(0, min(REQUEST_HEADER_SIZE, c2s.size - off))))
    responses = iter(walk_frames(s2c, requests=False))
    for ex, span in zip(session.exchanges, spans):
        if ex.response is None and ex.rsp_offset is None:
            continue
        frame = next(responses, None)
        if frame is None:
            break
        span.rsp_offset, span.rsp_size = frame.start, frame.end - frame.start
    return spans


def dissect_transcript(tr: Transcript, dialect: Dialect | str | None = None, *,
                       max_frame: int = 1 << 20) -> Dissection:
    """Dissect every frame of a recorded connection, in order, with its timestamp.

    Frames longer than ``max_frame`` bytes are dissected from their first ``max_frame`` bytes
    (like a capture snap length): ``len`` still gives the real size, the data field is cut.
    """
    session = tr.decode(dialect, keep_data=0)
    c2s = StreamView(list(tr.stream(C2S)))
    s2c = StreamView(list(tr.stream(S2C)))
    d = session.dialect or DEFAULT
    req_cls = request_frame_class(d)
    out = Dissection(session, transcript=tr)
    spans = frame_spans(session, c2s, s2c)
    for ex, span in zip(session.exchanges, spans):
        req = rsp = None
        if ex.request is not None:
            req = req_cls(c2s.read(span.req_offset, min(span.req_size, max_frame)))
            req.time = c2s.time_at(span.req_offset)
        if ex.response is not None and span.rsp_offset is not None:
            spec = spec_for(d, ex.request.cmd)
            frame_cls = response_frame_class(layer_for(spec.response))
            rsp = frame_cls(s2c.read(span.rsp_offset, min(span.rsp_size, max_frame)))
            rsp.time = s2c.time_at(span.rsp_offset)
        out.exchanges.append(DissectedExchange(ex.index, ex, req, rsp))
    # what follows the last good frame, when the decoder gave up on a direction
    c2s_end = spans[-1].req_offset + spans[-1].req_size if spans else 0
    s2c_end = max((sp.rsp_offset + sp.rsp_size for sp in spans if sp.rsp_offset is not None),
                  default=0)
    if session.c2s_error is not None and c2s_end < c2s.size:
        out.c2s_rest = Raw(c2s.read(c2s_end, max_frame))
        out.c2s_rest.time = c2s.time_at(c2s_end)
    if session.s2c_error is not None and s2c_end < s2c.size:
        out.s2c_rest = Raw(s2c.read(s2c_end, max_frame))
        out.s2c_rest.time = s2c.time_at(s2c_end)
    return out


def dissect_streams(c2s: bytes, s2c: bytes, dialect: Dialect | str | None = None, *,
                    max_frame: int = 1 << 20) -> Dissection:
    """Dissect two reassembled byte streams of one TCP conversation."""
    tr = Transcript(keep=1 << 62)
    if c2s:
        tr.chunks.append(Chunk(0.0, C2S, len(c2s), bytes(c2s)))
    if s2c:  # after the requests, so each response finds its request already registered
        tr.chunks.append(Chunk(0.0, S2C, len(s2c), bytes(s2c)))
    return dissect_transcript(tr, dialect, max_frame=max_frame)


def dissect_packets(packets: Iterable[Packet], dialect: Dialect | str | None = None, *,
                    server_port: int | None = None, max_frame: int = 1 << 20) -> list[Dissection]:
    """Reassemble the TCP conversations in ``packets`` (e.g. ``rdpcap(...)``) and dissect each."""
    from .pcap import transcripts_from_packets  # pcap imports this module's siblings only

    return [dissect_transcript(tr, dialect, max_frame=max_frame)
            for tr in transcripts_from_packets(packets, server_port=server_port)]
