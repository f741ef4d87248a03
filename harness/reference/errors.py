"""The root of the reference peer's errors, so a caller can catch any of them at once."""

from __future__ import annotations


class PeerError(Exception):
    """Base of every error ``harness.reference`` raises (codec errors stay ProtocolError)."""
