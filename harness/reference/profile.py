"""Peer behaviour per dialect that does not change the message formats.

The behaviour itself is part of the dialect's row (``Dialect.peer``, see
:mod:`harness.proto.behaviour`); a :class:`Profile` is that row's values for one peer, which a
test or a misbehaviour can override (``with_``) without touching the dialect.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..proto.behaviour import HASH_ALWAYS, HASH_IF_FLAG, RECEIVE_STREAMED, RECEIVE_WHOLE
from ..proto.dialects import Dialect, get_dialect

# the policy names the peers import from here
__all__ = ["HASH_ALWAYS", "HASH_IF_FLAG", "RECEIVE_STREAMED", "RECEIVE_WHOLE", "Profile",
           "profile_for"]


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
    p = d.peer
    return Profile(dialect=d, client_hash=p.client_hash, server_receive=p.server_receive,
                   server_chunk=p.server_chunk, client_zero_copy=p.client_zero_copy)
