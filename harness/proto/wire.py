"""The wire's primitives, in one place: the little-endian packers, the integer limits, the frame
headers, and the one walker that follows a byte stream's frames by their length prefixes (no
dialect needed). The proxies, the dissector, the session decoder's HELLO sniffing and the
splitters below all walk frames with :class:`FrameWalker`. (The incremental, bounded readers
that decode messages are :mod:`.readers`.)"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import NamedTuple

U8 = struct.Struct("<B")
U32 = struct.Struct("<I")
U64 = struct.Struct("<Q")

U8_MAX = (1 << 8) - 1
U32_MAX = (1 << 32) - 1
U64_MAX = (1 << 64) - 1
I32_MIN, I32_MAX = -(1 << 31), (1 << 31) - 1
I64_MAX = (1 << 63) - 1

REQUEST_HEAD = struct.Struct("<BQ")  # command byte, payload size
REQUEST_HEADER_SIZE = REQUEST_HEAD.size  # 9
RESPONSE_HEADER_SIZE = U64.size  # 8: payload size
LENGTH_SIZE = U64.size  # the length prefix ends every header


def announced_length(frame) -> int:
    """The payload size a request frame's header announces (its length prefix)."""
    return REQUEST_HEAD.unpack_from(frame)[1]


def request_header(cmd_id: int, length: int) -> bytes:
    """A request frame's header: the command byte and the payload length it announces."""
    return REQUEST_HEAD.pack(cmd_id, length)


def request_frame(cmd_id: int, payload: bytes = b"", length: int | None = None) -> bytes:
    """A request frame as sent; ``length`` announces another size than the payload's."""
    return request_header(cmd_id, len(payload) if length is None else length) + payload


def response_frame(payload: bytes) -> bytes:
    """A response frame: the u64 payload length, then the payload."""
    return U64.pack(len(payload)) + payload


class FrameHead(NamedTuple):
    """A frame whose header is complete, in stream offsets of its direction."""

    start: int  # the frame's first byte
    payload: int  # its first payload byte (``start`` + the header size)
    end: int  # one past its last byte, as its length announces (the stream may end sooner)
    cmd: int | None  # the command byte of a request; None for a response
    index: int  # frames before it in this direction

    @property
    def length(self) -> int:
        return self.end - self.payload


class Piece(NamedTuple):
    """A stretch of the bytes fed to :meth:`FrameWalker.feed`, inside one frame."""

    lo: int  # offsets into the fed bytes
    hi: int
    header: bool  # header bytes (else payload)
    frame: FrameHead | None  # payload: its frame; header: the frame whose header it completed


class FrameWalker:
    """Follows one direction's frame boundaries from the length prefixes (request: command byte
    + u64 length, response: u64 length), whatever the bytes are cut into. Work is per piece
    and per header, never per payload byte."""

    __slots__ = ("requests", "header_size", "pos", "frame", "index", "_head")

    def __init__(self, requests: bool):
        self.requests = requests
        self.header_size = REQUEST_HEADER_SIZE if requests else RESPONSE_HEADER_SIZE
        self.pos = 0  # stream offset of the next byte fed
        self.frame: FrameHead | None = None  # the frame whose payload is being walked
        self.index = 0  # frames whose header completed
        self._head = bytearray()  # a header split across feeds

    @property
    def in_header(self) -> bool:
        """Part of a header has been fed, and not all of it."""
        return bool(self._head)

    def feed(self, data) -> list[Piece]:
        """Walk ``data``, the stream's next bytes: its pieces, in order."""
        return self._walk(data, len(data))

    def skip(self, n: int) -> list[Piece]:
        """Walk ``n`` bytes that are not at hand (elided in a recording): payload is stepped
        over, header bytes read as zeros."""
        return self._walk(None, n)

    def _walk(self, data, n: int) -> list[Piece]:
        pieces, i = [], 0
        while i < n:
            frame = self.frame
            if frame is None:
                take = min(self.header_size - len(self._head), n - i)
                self._head += data[i:i + take] if data is not None else bytes(take)
                done = None
                if len(self._head) == self.header_size:
                    done = self._start_frame(self.pos + take)
                pieces.append(Piece(i, i + take, True, done))
            else:
                take = min(frame.end - self.pos, n - i)
                pieces.append(Piece(i, i + take, False, frame))
            i += take
            self.pos += take
            if self.frame is not None and self.pos >= self.frame.end:
                self.frame = None  # an empty payload ends with its header
        return pieces

    def _start_frame(self, payload: int) -> FrameHead:
        head = self._head
        (length,) = U64.unpack_from(head, self.header_size - LENGTH_SIZE)
        frame = FrameHead(payload - self.header_size, payload, payload + length,
                          head[0] if self.requests else None, self.index)
        self.index += 1
        head.clear()
        self.frame = frame
        return frame


def frame_heads(data, *, requests: bool) -> list[FrameHead]:
    """The frames of a whole direction whose header is in ``data``."""
    return [p.frame for p in FrameWalker(requests).feed(data) if p.header and p.frame]


def split_request_frames(data: bytes) -> list[bytes]:
    """The request frames of a client stream, as sent (the last one may be cut short, or be
    a header cut short)."""
    heads = frame_heads(data, requests=True)
    frames = [data[f.start:f.end] for f in heads]
    done = heads[-1].end if heads else 0
    if done < len(data):  # fewer bytes than a header are left
        frames.append(data[done:])
    return frames


def iter_response_payloads(stream: bytes) -> Iterator[tuple[int, bytes]]:
    """(announced size, payload) of each answer of a server stream, in order; the last payload
    may be shorter than announced (the stream was cut), a header cut short ends the walk."""
    for f in frame_heads(stream, requests=False):
        payload = stream[f.payload:f.end]
        yield f.length, payload
        if len(payload) < f.length:
            return
