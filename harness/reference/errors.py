"""The root of the reference peer's errors, so a caller can catch any of them at once."""

from __future__ import annotations

from ..errors import HarnessError


class ReferencePeerError(HarnessError):
    """Base of every error ``harness.reference`` raises (codec errors stay ProtocolError)."""
