"""The root of every error the harness raises: ``except HarnessError`` catches any of them.

Each package has its own root under it (``harness.proto``: ProtocolError, ``harness.reference``:
ReferencePeerError, ``harness.transport``: TransportError, ``harness.impls``: ImplError,
``harness.fuzz``: FuzzError, ``harness.matrix``: MatrixError, ``harness.capture``: CaptureError,
``harness.conformance``: ConformanceError, ``harness.bisect``: BisectError, ``harness.history``:
HistoryError, ``harness.pr``: PrError), so a caller can also catch one package's errors with one clause;
tests/test_error_roots.py holds every module to it. A root may also derive from the builtin its callers expect (TransportError is an
OSError, ImplError a RuntimeError).
"""

from __future__ import annotations


class HarnessError(Exception):
    """Base class of every error of the harness."""
