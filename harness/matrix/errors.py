"""The root of harness.matrix's errors (under :class:`harness.errors.HarnessError`), in a module
of its own so that importing it loads nothing else (the pytest plugin does)."""

from __future__ import annotations

from ..errors import HarnessError


class MatrixError(HarnessError, ValueError):
    """matrix.yaml is not valid (the message names file, line and field), or a matrix run
    cannot go on."""
