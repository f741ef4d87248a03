"""Peer behaviour per dialect that does not change the message formats.

The behaviour itself is part of the dialect's row (``Dialect.peer``, see
:mod:`harness.proto.behaviour`); a :class:`BehaviourView` is that row's values for one peer,
which a test or a misbehaviour can override (``with_``) without touching the dialect. The
reference client and server read every behaviour through theirs.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from ..proto.behaviour import (HASH_ALWAYS, HASH_IF_FLAG, RECEIVE_STREAMED, RECEIVE_WHOLE,
                               PeerBehaviour)
from ..proto.dialects import Dialect, get_dialect

# the policy names the peers import from here
__all__ = ["HASH_ALWAYS", "HASH_IF_FLAG", "RECEIVE_STREAMED", "RECEIVE_WHOLE", "BehaviourView",
           "behaviour_view_for"]


_PEER_FIELDS = frozenset(f.name for f in fields(PeerBehaviour))


@dataclass(frozen=True)
class BehaviourView:
    """One peer's behaviour: its dialect's ``PeerBehaviour`` (the one record of it), which a
    test or a misbehaviour may override; its fields read through (``view.client_hash``)."""

    dialect: Dialect
    peer: PeerBehaviour

    def __getattr__(self, name: str):
        # Only called for names the view itself lacks: the behaviour's fields.
        if name in _PEER_FIELDS:
            return getattr(self.peer, name)
        raise AttributeError(name)

    def with_(self, **kw) -> "BehaviourView":
        changed = {k: kw.pop(k) for k in list(kw) if k in _PEER_FIELDS}
        return replace(self, peer=replace(self.peer, **changed) if changed else self.peer, **kw)


def behaviour_view_for(dialect: Dialect | str) -> BehaviourView:
    d = get_dialect(dialect)
    return BehaviourView(d, d.peer)
