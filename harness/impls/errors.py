"""Every error of ``harness.impls`` derives from ``ImplError``: catch it for "any peer error".

Vocabulary (the same in the code, the CLI and the tests): a **real peer** is a llama.cpp build
the harness can start (a pinned release, a variant of one, the prebuilt wheel, or a user's own
build dir); ``harness peers`` manages them and ``tests/test_peers_*.py`` test them. The Python
implementation in ``harness.reference`` is the **reference** (``ref``), never a "peer" alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..errors import HarnessError


class ImplError(HarnessError, RuntimeError):
    """Root of the errors raised while finding, building, starting or driving an implementation."""


class PeerError(ImplError):
    """A real peer cannot be found, built, started or trusted."""


class PeerNotFound(PeerError, KeyError):
    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class PeerUnavailable(PeerError):
    """The peer exists but cannot be started here (not built, tools missing, ...)."""


class VerificationError(PeerError):
    """The server did not come up or did not answer HELLO."""


class MislabelledPeer(VerificationError):
    """The server announced another protocol version than its pin promises."""


class BuildError(PeerError):
    """A step of a peer build failed. Carries the command and the tail of its output."""

    def __init__(self, message: str, *, command: Sequence[str] | None = None,
                 output_tail: Sequence[str] = (), log_path: Path | None = None):
        self.message = message
        self.command = list(command) if command else None
        self.output_tail = list(output_tail)
        self.log_path = log_path
        super().__init__(message)

    def __str__(self) -> str:
        parts = [self.message]
        if self.command:
            parts.append("  command: " + " ".join(self.command))
        if self.output_tail:
            parts.append(f"  last {len(self.output_tail)} lines of output:")
            parts += ["    " + line for line in self.output_tail]
        if self.log_path:
            parts.append(f"  full log: {self.log_path}")
        return "\n".join(parts)


class ToolMissing(BuildError):
    """cmake, ninja, a compiler or patch is not installed."""


class PatchRejected(BuildError):
    """A pin's patch does not apply to its base release's llama.cpp tree."""


class VariantUnsupported(BuildError):
    """The variant asked for cannot be built from this pin (e.g. RDMA on a release without it)."""
