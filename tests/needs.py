"""What a test needs from the machine, as coded skips (harness/strictness.py): outside CI a
missing peer or tool skips the test with its code and how to get it; under CI it fails."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

from harness.impls.registry import PeerError, get_peer
from harness.strictness import NOT_ROOT, PEER_MISSING, TOOL_MISSING, coded


def skip(code: str, reason: str) -> NoReturn:
    pytest.skip(coded(code, reason))


def peer(name: str):
    """The built peer ``name``, or a [peer-missing] skip saying how to build it."""
    try:
        found = get_peer(name)
    except PeerError as e:
        skip(PEER_MISSING, str(e))
    if not found.available:
        skip(PEER_MISSING, f"{name} is not built: {found.reason}")
    return found


def tool(found, what: str):
    """``found`` (a path, a module, a truthy value) or a [tool-missing] skip naming ``what``."""
    if not found:
        skip(TOOL_MISSING, what)
    return found


def module(name: str, install: str):
    """``importlib.import_module(name)`` or a [tool-missing] skip saying what installs it."""
    try:
        return __import__(name)
    except ImportError as e:
        skip(TOOL_MISSING, f"{name} is not importable ({e}): {install}")


def root(what: str) -> None:
    if os.geteuid() != 0:
        skip(NOT_ROOT, what)


def peer_marker(missing: bool, reason: str):
    return pytest.mark.skipif(missing, reason=coded(PEER_MISSING, reason))


def tool_marker(missing: bool, reason: str):
    return pytest.mark.skipif(missing, reason=coded(TOOL_MISSING, reason))


def built(what: str, build):
    """Run a build a test needs (``build()``): a missing tool or peer is a coded skip (a failure
    under CI); a build that fails is a failure with the compiler's last lines, never a skip."""
    from harness.impls.errors import BuildError, PeerNotFound, PeerUnavailable, ToolMissing
    from harness.fuzz.libfuzzer.build import ToolchainMissing
    try:
        return build()
    except (ToolMissing, ToolchainMissing) as e:
        skip(TOOL_MISSING, f"{what}: {e}")
    except (PeerNotFound, PeerUnavailable) as e:
        skip(PEER_MISSING, f"{what}: {e}")
    except BuildError as e:
        pytest.fail(f"{what} does not build:\n{e}", pytrace=False)
