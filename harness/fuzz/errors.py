"""The root of harness.fuzz's errors (under :class:`harness.errors.HarnessError`)."""

from __future__ import annotations

from ..errors import HarnessError


class FuzzError(HarnessError):
    """Base of every error a campaign, a target, a replay or a merge raises."""


class TargetError(FuzzError, RuntimeError):
    """The target cannot be resolved or started."""


class DifferentialError(FuzzError, ValueError):
    """Bad differential set-up (allow-list file, targets of different dialects)."""
