"""The harness as an installed tool: what it is (``harness --version``) and a matrix of the
user's own to edit (``harness init``)."""

from __future__ import annotations

import shutil
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from .data import MATRIX, default_matrix
from .errors import HarnessError
from .proto.dialects import DIALECTS, PRIMARY

DISTRIBUTION = "ggml-rpc-harness"


def harness_version() -> str:
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:  # imported from a source tree that was never installed
        return "unknown (not installed)"


def version_text() -> str:
    """The version and the dialects this harness speaks (the rows of harness/proto/dialects.py)."""
    return "\n".join([f"{DISTRIBUTION} {harness_version()}",
                      f"dialects: {', '.join(DIALECTS)}",
                      f"primary (held to byte-exactness): {', '.join(PRIMARY)}"])


class InitError(HarnessError):
    """The copy cannot be written (a matrix is there already, or the folder is not writable)."""


def init_matrix(directory: Path, *, force: bool = False) -> Path:
    """Write the shipped default matrix to ``directory``/matrix.yaml, for the user to change
    and pass with ``--matrix``; an existing file is kept unless ``force``."""
    target = Path(directory) / MATRIX
    if target.exists() and not force:
        raise InitError(f"{target} exists; --force replaces it")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(default_matrix(), target)
    except OSError as e:
        raise InitError(f"cannot write {target}: {e}") from None
    return target
