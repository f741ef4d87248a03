"""The wire's primitives, in one place: the little-endian packers every module uses, the frame
header sizes, and the splitters of a byte stream into request frames and response payloads.
(The incremental, bounded readers are :mod:`.framing`; these split what is already whole.)"""

from __future__ import annotations

import struct
from collections.abc import Iterator

U8 = struct.Struct("<B")
U32 = struct.Struct("<I")
U64 = struct.Struct("<Q")
REQUEST_HEAD = struct.Struct("<BQ")  # command byte, payload size
REQUEST_HEADER_SIZE = REQUEST_HEAD.size  # 9
RESPONSE_HEADER_SIZE = U64.size  # 8: payload size


def split_request_frames(data: bytes) -> list[bytes]:
    """The request frames of a client stream, as sent (the last one may be cut short)."""
    frames, pos = [], 0
    while pos < len(data):
        if len(data) - pos < REQUEST_HEADER_SIZE:
            frames.append(data[pos:])
            break
        (size,) = U64.unpack_from(data, pos + 1)
        end = pos + REQUEST_HEADER_SIZE + min(size, len(data) - pos - REQUEST_HEADER_SIZE)
        frames.append(data[pos:end])
        pos = end
    return frames


def iter_response_payloads(stream: bytes) -> Iterator[tuple[int, bytes]]:
    """(announced size, payload) of each answer of a server stream, in order; the last payload
    may be shorter than announced (the stream was cut), a header cut short ends the walk."""
    pos = 0
    while pos + RESPONSE_HEADER_SIZE <= len(stream):
        (n,) = U64.unpack_from(stream, pos)
        payload = stream[pos + RESPONSE_HEADER_SIZE:pos + RESPONSE_HEADER_SIZE + n]
        yield n, payload
        if len(payload) < n:
            return
        pos += RESPONSE_HEADER_SIZE + n
