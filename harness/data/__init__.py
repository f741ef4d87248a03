"""What the harness ships besides its code: the default matrix, the differential allow-lists,
the saved reproducers, the project's patches of llama.cpp trees and the conformance vectors
recorded from the real servers. They are package data, found through importlib.resources, so
an installed wheel reads the same files a checkout does; a path given on the command line
still wins over each default.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

MATRIX = "matrix.yaml"
ALLOW_LISTS = "differential"  # allow-<dialect>.yaml, the differential's default per dialect
REPRODUCERS = "reproducers"  # one folder per saved finding (finding.json, repro.rpct)
PATCHES = "patches"  # pins.toml's `patch` paths are relative to the data root
VECTORS = "vectors"  # the real servers' recorded exchanges (conformance, decoding)


def data_root() -> Path:
    """The shipped data's folder on disk. pip installs a wheel unpacked, so it is a real
    directory; a zipped import could not hand a patch or a reproducer folder to a tool."""
    root = files(__name__)
    if not isinstance(root, Path):
        raise RuntimeError(f"the harness's data is not on disk ({root}): install the package "
                           "unpacked (pip install), not as a zip")
    return root


def shipped(*parts: str) -> Path:
    """A file or folder shipped with the harness, e.g. ``shipped("differential",
    "allow-7.0.0.yaml")`` (it may not exist: a dialect without an allow-list has none)."""
    return data_root().joinpath(*parts)


def default_matrix() -> Path:
    return shipped(MATRIX)
