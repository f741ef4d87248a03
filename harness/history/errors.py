"""The history package's root error: a store that cannot be read or a folder that cannot be
filed."""

from __future__ import annotations

from ..errors import HarnessError


class HistoryError(HarnessError):
    """A history line or report folder the harness cannot read."""
