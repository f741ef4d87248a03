"""One strictness switch: under CI a skip (an xfail, an xpass: every outcome that is not a
pass) is a failure unless its reason is allowed here.

``strict()`` is on when ``CI`` is true (every CI system sets it, so does ``.ci/run``) or
``GGML_RPC_HARNESS_STRICT=1``. Every skip carries a code (``[peer-missing] p7 is not built``,
see :func:`coded`); in strict mode a skip whose code is not in :data:`ALLOWED` fails, and the
run lists the skips it allowed with their reasons at the end. Outside CI, skips stay skips,
with the same codes.

:data:`ALLOWED` is the reviewed list of things that cannot exist on the machines this project
runs CI on. Nothing that an install step can provide belongs here: a missing peer, program,
Python package or Debian package is a set-up failure, and so is a build error.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

STRICT_ENV = "GGML_RPC_HARNESS_STRICT"

# Why a test or cell could not run (the code in front of every skip reason; matrix cells use
# the first four, harness.scenario.SKIP_CODES).
NOT_APPLICABLE = "not-applicable"  # a matrix cell whose scenario does not apply
PEER_MISSING = "peer-missing"  # a real build, user build or image (or its engine) is missing
PROGRAM_MISSING = "program-missing"  # a program a scenario runs (e.g. llama-simple) is not built
DEVICE_MISSING = "device-missing"  # hardware a transport needs (an RDMA device)
TOOL_MISSING = "tool-missing"  # a program, library or Python package is not installed
PYVERBS_MISSING = "pyverbs-missing"  # rdma-core's python3-pyverbs (a Debian package) is absent
BUILD_ERROR = "build-error"  # a build or compile a test or cell needs failed: never allowed
NOT_ROOT = "not-root"  # the test starts daemons or installs packages
PLATFORM = "platform"  # not Linux/glibc/x86-64
RDMA_HCA = "rdma-hca"  # no real RDMA host channel adapter
RDMA_HCA_PRESENT = "rdma-hca-present"  # a test of the no-device path, on a machine with one
GPU = "gpu"  # no GPU
UNCODED = "uncoded"  # a skip that names no code (third-party, or a test not updated)

ALLOWED: Mapping[str, str] = {
    RDMA_HCA: "a real RDMA HCA (InfiniBand or RoCE NIC): the CI machines have none, and their "
              "kernels have no RDMA core for soft-RoCE; the project's soft verbs device "
              "(harness.transport.softverbs) runs llama.cpp's real RDMA transport instead",
    RDMA_HCA_PRESENT: "a test of the fallback without an RDMA device cannot run where one is",
    GPU: "a GPU: the CI machines have none, and no test needs one today",
    NOT_APPLICABLE: "a matrix cell whose scenario does not apply to its implementations (a "
                    "property of the cell, e.g. model-load with a client library that has no "
                    "llama-simple): nothing is missing",
}

_CODE_RE = re.compile(r"^\[([a-z0-9-]+)\]\s*")


def strict(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return env.get("CI", "").lower() in ("true", "1") or env.get(STRICT_ENV, "") == "1"


def coded(code: str, reason: str) -> str:
    """A skip reason that names its code: ``[tool-missing] tshark is not installed``."""
    return f"[{code}] {reason}"


def parse(reason: str) -> tuple[str, str]:
    """(code, text) of a skip reason; ``uncoded`` when it names none."""
    m = _CODE_RE.match(reason or "")
    return (m.group(1), reason[m.end():]) if m else (UNCODED, reason or "")


def allowed(code: str) -> bool:
    return code in ALLOWED


def refusal(reason: str, *, what: str = "a skip") -> str | None:
    """Why a skip (``what``: or an xfail, an xpass) with ``reason`` fails in strict mode (None:
    it is allowed, or not strict)."""
    if not strict():
        return None
    code, text = parse(reason)
    if allowed(code):
        return None
    where = "CI=true" if os.environ.get("CI", "").lower() in ("true", "1") else f"{STRICT_ENV}=1"
    return (f"strict ({where}): {what} is a failure here unless its reason is allowed "
            f"(harness/strictness.py ALLOWED: {', '.join(ALLOWED)}); this one is [{code}] {text}")
