"""Splitting one job into N shards (``--shard I/N``): fuzz campaigns and matrix runs, and what
a merge of shard folders is missing against the cell list it was cut from."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
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


def expected_cells(listing: list) -> dict[str, str | None]:
    """Cell id -> its shard (``"i/N"``, None without shards) from ``harness list --json``
    output: a list of cells (``{"id": ...}``) or, with ``--shards N``, a list of shards
    (``{"shard": "i/N", "ids": [...]}``)."""
    if not isinstance(listing, list):
        raise ValueError("the expected cell list is `harness list --json` output: a JSON list")
    cells: dict[str, str | None] = {}
    for item in listing:
        if isinstance(item, dict) and isinstance(item.get("ids"), list) and "shard" in item:
            cells.update({str(i): str(item["shard"]) for i in item["ids"]})
        elif isinstance(item, dict) and "id" in item:
            cells[str(item["id"])] = None
        else:
            raise ValueError(f"not a cell or a shard of `harness list --json`: {item!r}")
    return cells


@dataclass(frozen=True)
class Gaps:
    """What a merged report lacks against its expected cells, and what it has beyond them."""
    shards: list[str]  # shards none of whose cells arrived
    cells: list[str]  # missing cells of the shards that did arrive (or of no shard)
    unexpected: list[str]  # cells that arrived but were not expected

    def __bool__(self) -> bool:
        return bool(self.shards or self.cells or self.unexpected)

    def lines(self) -> list[str]:
        out = [f"shard {s}: none of its cells arrived" for s in self.shards]
        out += [f"cell {c}: missing" for c in self.cells]
        out += [f"cell {c}: not in the expected list" for c in self.unexpected]
        return out


def gaps(expected: dict[str, str | None], arrived: Iterable[str]) -> Gaps:
    got = set(arrived)
    lost = [c for c in expected if c not in got]
    by_shard: dict[str, list[str]] = {}
    for c, shard in expected.items():
        if shard is not None:
            by_shard.setdefault(shard, []).append(c)
    empty = [sh for sh, ids in by_shard.items() if not got.intersection(ids)]
    return Gaps(shards=empty, cells=[c for c in lost if expected[c] not in empty],
                unexpected=sorted(got - set(expected)))
