"""Covering arrays of mixed strength: rows of parameter values in which every combination of
values of each *required tuple* of parameters appears at least once.

The combinatorial phase (:mod:`harness.fuzz.interactions`) asks for every pair of parameters
(t = 2) plus chosen triples (t = 3): no maintained generator on PyPI builds mixed strength
(``allpairspy`` is one uniform n), so this is IPOG (Lei, Kacker, Kuhn, Okun, Lawrence: "IPOG: A
General Strategy for T-Way Software Testing", 2007) over an explicit list of tuples:

* parameters are added one at a time, largest first;
* **horizontal growth**: each existing row takes the value of the new parameter that covers the
  most combinations still missing (a row that would cover nothing keeps a *don't care*);
* **vertical growth**: each combination still missing goes into the first row whose values
  agree with it or are don't cares, else into a new row;
* don't cares left at the end take value 0, which callers make their baseline, so a row
  changes only what it must.

Deterministic (no randomness, ties go to the lowest value and the first row). Value 0 first
also keeps an invalid-looking value out of rows that do not need it, which limits *masking*
(a value the server refuses early hiding the rest of its row).

**Constraints.** ``valid(row)`` (a row with don't cares as -1) says whether a row may exist:
no row is grown into one it refuses. A required combination it refuses *by itself* is a
negative combination (PICT's term): it gets a row of its own with every other parameter at
0, so it is tried, but it never shares a row, where it would mask every other combination.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from itertools import combinations
from math import prod

import numpy as np

from .errors import FuzzError

DONT_CARE = -1


class CoveringError(FuzzError, ValueError):
    """A request no covering array answers (an empty parameter, a tuple out of range)."""


def all_pairs(n: int) -> list[tuple[int, ...]]:
    return list(combinations(range(n), 2))


def _checked(sizes: Sequence[int], tuples: Iterable[Iterable[int]]) -> list[tuple[int, ...]]:
    if any(s < 1 for s in sizes):
        raise CoveringError(f"every parameter needs at least one value: {list(sizes)}")
    out = set()
    for t in tuples:
        t = tuple(sorted(set(t)))
        if not t or t[0] < 0 or t[-1] >= len(sizes):
            raise CoveringError(f"tuple {t} names a parameter outside 0..{len(sizes) - 1}")
        if len(t) > 1:
            out.add(t)
    return sorted(out)


Valid = Callable[[np.ndarray], bool]


def build(sizes: Sequence[int], tuples: Iterable[Iterable[int]], valid: Valid | None = None
          ) -> np.ndarray:
    """Rows (an ``int`` array, one column per parameter) covering every combination of every
    tuple in ``tuples`` (tuples of parameter indices; a single parameter's values need no
    covering). A parameter no tuple names stays 0. ``valid`` (see above) sees rows in the
    caller's column order."""
    tuples = _checked(sizes, tuples)
    n = len(sizes)
    if n == 0:
        return np.zeros((0, 0), dtype=np.int64)
    # largest parameters first: the first one's values seed the rows
    order = sorted(range(n), key=lambda p: (-sizes[p], p))
    rank = {p: i for i, p in enumerate(order)}
    by_last: dict[int, list[tuple[int, ...]]] = {}
    for t in tuples:
        inner = tuple(sorted(rank[p] for p in t))
        by_last.setdefault(inner[-1], []).append(inner)
    s = [sizes[p] for p in order]
    back = [rank[p] for p in range(n)]
    ok = (lambda row: True) if valid is None else (lambda row: valid(row[back]))
    rows = _Rows(n)
    negative: list[dict[int, int]] = []
    for v in range(s[0]):
        if ok(_row(n, {0: v})):
            rows.add({0: v})
        else:
            negative.append({0: v})
    for p in range(1, n):
        required = by_last.get(p, [])
        if not required:
            continue
        missing = [np.ones(tuple(s[q] for q in t), dtype=bool) for t in required]
        if valid is not None:
            for t, m in zip(required, missing):
                for combo in np.argwhere(m):
                    values = dict(zip(t, map(int, combo)))
                    if not ok(_row(n, values)):
                        m[tuple(combo)] = False
                        negative.append(values)
        _horizontal(rows, p, required, missing, s[p], ok)
        _vertical(rows, p, required, missing, ok)
    for values in negative:
        rows.add(values)
    out = rows.array()
    out[out == DONT_CARE] = 0
    return out[:, back]  # back to the caller's column order


def _row(n: int, values: dict[int, int]) -> np.ndarray:
    row = np.full(n, DONT_CARE, dtype=np.int64)
    for q, v in values.items():
        row[q] = v
    return row


class _Rows:
    """A growable matrix of rows with don't cares."""

    def __init__(self, n: int):
        self.a = np.full((64, n), DONT_CARE, dtype=np.int64)
        self.len = 0

    def add(self, values: dict[int, int]) -> int:
        if self.len == len(self.a):
            self.a = np.concatenate([self.a, np.full_like(self.a, DONT_CARE)])
        for q, v in values.items():
            self.a[self.len, q] = v
        self.len += 1
        return self.len - 1

    def array(self) -> np.ndarray:
        return self.a[:self.len].copy()


def _horizontal(rows: _Rows, p: int, required, missing, size: int, ok) -> None:
    a = rows.a
    others = [t[:-1] for t in required]
    for r in range(rows.len):
        row = a[r]
        values = row.tolist()  # one conversion, not one numpy scalar per lookup
        gains = np.zeros(size, dtype=np.int64)
        keys = []
        for i, o in enumerate(others):
            key = tuple(values[q] for q in o)
            if DONT_CARE in key:
                keys.append(None)
                continue
            keys.append(key)
            gains += missing[i][key]
        v = _best(row, p, gains, ok)
        if v is None:
            continue  # a don't care: vertical growth may still use this row
        a[r, p] = v
        for i, key in enumerate(keys):
            if key is not None:
                missing[i][key + (v,)] = False


def _best(row: np.ndarray, p: int, gains: np.ndarray, ok) -> int | None:
    """The value of ``p`` that covers most in ``row`` and keeps it valid (None: nothing)."""
    for v in np.argsort(-gains, kind="stable"):
        if gains[v] <= 0:
            return None
        row[p] = v
        fine = ok(row)
        row[p] = DONT_CARE
        if fine:
            return int(v)
    return None


def _vertical(rows: _Rows, p: int, required, missing, ok) -> None:
    for t, m in zip(required, missing):
        cols = list(t)
        for combo in np.argwhere(m):
            if not m[tuple(combo)]:
                continue  # covered meanwhile by a row another combination filled
            view = rows.a[:rows.len][:, cols]
            fits = np.all((view == combo) | (view == DONT_CARE), axis=1)
            values = {q: int(v) for q, v in zip(cols, combo)}
            r = next((int(h) for h in np.flatnonzero(fits) if _fits(rows.a[h], values, ok)),
                     None)
            if r is not None:
                for q, v in values.items():
                    rows.a[r, q] = v
            else:
                r = rows.add(values)
            _mark(rows.a[r], required, missing)


def _fits(row: np.ndarray, values: dict[int, int], ok) -> bool:
    trial = row.copy()
    for q, v in values.items():
        trial[q] = v
    return ok(trial)


def _mark(row: np.ndarray, required, missing) -> None:
    """What a row now covers of the tuples still being grown."""
    for t, m in zip(required, missing):
        key = tuple(int(row[q]) for q in t)
        if DONT_CARE not in key:
            m[key] = False


def coverage(rows: np.ndarray, sizes: Sequence[int], tuples: Iterable[Iterable[int]]
             ) -> tuple[int, int]:
    """(combinations covered, combinations possible) of ``tuples`` by ``rows``."""
    tuples = _checked(sizes, tuples)
    covered = possible = 0
    for t in tuples:
        n = prod(sizes[q] for q in t)
        possible += n
        if len(rows):
            code = np.zeros(len(rows), dtype=np.int64)  # the combination's mixed-radix number
            for q in t:
                code = code * sizes[q] + rows[:, q]
            seen = np.zeros(n, dtype=bool)
            seen[code] = True
            covered += int(seen.sum())
    return covered, possible
