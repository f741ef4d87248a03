"""Splitting one job into N shards (``--shard I/N``): fuzz campaigns and matrix runs."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def parse_shard(text: str) -> tuple[int, int]:
    """``"i/n"`` (1 <= i <= n) -> (i, n)."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise ValueError(f"--shard wants I/N with 1 <= I <= N, not {text!r}")
    return int(m.group(1)), int(m.group(2))


def take_shard(items: Sequence[T], shard: tuple[int, int]) -> list[T]:
    """Shard I of N: every N-th item from the I-th, so long and short kinds of work (a design's
    cells come together in the list) spread over all shards."""
    i, n = shard
    return list(items[i - 1::n])
