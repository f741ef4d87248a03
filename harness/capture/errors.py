"""The root of harness.capture's errors (under :class:`harness.errors.HarnessError`)."""

from __future__ import annotations

from ..errors import HarnessError


class CaptureError(HarnessError):
    """Base of every error reading or writing a capture (transcripts, pcaps, logs) raises."""
