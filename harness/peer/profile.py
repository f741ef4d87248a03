"""Peer behaviour per dialect that does not change the message formats.

Two peers can share a wire format and still differ on the wire: whether the client hashes
before uploading, whether the server validates a SET_TENSOR header before reading its payload.
Those choices are here, keyed by dialect, so the emulated old and new peers differ exactly
where the real ones do.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..proto.constants import SERVER_STREAM_CHUNK_9
from ..proto.dialects import Dialect, get_dialect

# Client hashing policies (spec 9, 12.3):
#   "always"  - proto 7/8: SET_TENSOR_HASH first for every weights upload > 10 MiB
#   "if-flag" - seed 000 / 9.0.0: only when the server's HELLO carries the cache flag
HASH_ALWAYS, HASH_IF_FLAG = "always", "if-flag"

# Server receive policies for SET_TENSOR:
#   "whole"    - read the whole payload, then validate (real 7.0.0 / 8.0.0 server)
#   "streamed" - validate the header first and close before reading a bad payload (seed 000,
#                9.0.0 [INF: the PR describes a header-first chunked read])
RECEIVE_WHOLE, RECEIVE_STREAMED = "whole", "streamed"


@dataclass(frozen=True)
class Profile:
    dialect: Dialect
    client_hash: str
    server_receive: str
    server_chunk: int  # bytes per receive step when streaming into staging memory
    client_zero_copy: bool  # header and caller's data written separately, no staging copy

    def with_(self, **kw) -> "Profile":
        return replace(self, **kw)


def profile_for(dialect: Dialect | str) -> Profile:
    d = get_dialect(dialect)
    new_generation = d.server_flags  # 7.0.0+flags and 9.0.0 carry the load-time changes
    return Profile(
        dialect=d,
        client_hash=HASH_IF_FLAG if new_generation else HASH_ALWAYS,
        server_receive=RECEIVE_STREAMED if new_generation else RECEIVE_WHOLE,
        server_chunk=SERVER_STREAM_CHUNK_9,
        client_zero_copy=new_generation,
    )
