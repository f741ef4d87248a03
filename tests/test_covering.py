"""The covering-array generator (harness/fuzz/covering.py): every required combination is in
some row, constraints hold in every row, a combination a constraint refuses alone gets a row
of its own; property-tested over random parameter shapes, with planted faults."""

from __future__ import annotations

from itertools import combinations, product

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from harness.fuzz import covering as cv


def _missing(rows, sizes, tuples) -> list:
    """Every required combination no row holds (the check, written without the module)."""
    have = {t: {tuple(int(r[q]) for q in t) for r in rows} for t in tuples}
    return [(t, c) for t in tuples for c in product(*(range(sizes[q]) for q in t))
            if c not in have[t]]


@st.composite
def designs(draw):
    n = draw(st.integers(2, 7))
    sizes = draw(st.lists(st.integers(1, 5), min_size=n, max_size=n))
    triples = draw(st.lists(st.tuples(*[st.integers(0, n - 1)] * 3), max_size=3))
    tuples = cv.all_pairs(n) + [tuple(sorted(set(t))) for t in triples if len(set(t)) == 3]
    return sizes, tuples


@settings(max_examples=60, deadline=None)
@given(designs())
def test_every_required_combination_is_covered(design):
    sizes, tuples = design
    rows = cv.build(sizes, tuples)
    assert rows.min(initial=0) >= 0 and all((rows[:, q] < s).all() for q, s in enumerate(sizes))
    assert _missing(rows, sizes, tuples) == []
    covered, possible = cv.coverage(rows, sizes, tuples)
    assert covered == possible
    assert np.array_equal(rows, cv.build(sizes, tuples))  # deterministic


def _no_two_threes(row) -> bool:
    """A constraint for the tests: no two parameters at value 3 in one row."""
    return sum(1 for v in row if v == 3) < 2


def _lone(row, sizes, t, c) -> bool:
    """Is ``row`` the combination ``c`` of tuple ``t`` with every other parameter at 0?"""
    return all(row[q] == v for q, v in zip(t, c)) and \
        all(row[q] == 0 for q in range(len(sizes)) if q not in t)


def _negative(sizes, tuples) -> list:
    return [(t, c) for t in tuples for c in product(*(range(sizes[q]) for q in t))
            if not _no_two_threes(c)]


def _constraint_problems(rows, sizes, tuples) -> list[str]:
    """What a constrained array gets wrong: combinations the constraint allows left uncovered
    by rows it allows, a refused row that is not a negative combination alone, a negative
    combination never tried alone."""
    negative = _negative(sizes, tuples)
    valid = [r for r in rows if _no_two_threes(r)]
    out = [f"uncovered {m}" for m in set(_missing(valid, sizes, tuples)) - set(negative)]
    out += [f"refused row {list(r)}" for r in rows if not _no_two_threes(r)
            and not any(_lone(r, sizes, t, c) for t, c in negative)]
    out += [f"never alone {t} {c}" for t, c in negative
            if not any(_lone(r, sizes, t, c) for r in rows)]
    return out


@settings(max_examples=40, deadline=None)
@given(designs())
def test_constraints_hold_and_negative_combinations_get_rows_of_their_own(design):
    sizes, tuples = design
    assert _constraint_problems(cv.build(sizes, tuples, _no_two_threes), sizes, tuples) == []


def test_a_mixed_strength_design_the_size_of_its_largest_triple():
    """The COPY_TENSOR shape: two tensors' (buffer, data, shape), every triple of the six."""
    sizes = [2, 21, 11, 2, 21, 11]
    tuples = list(combinations(range(6), 3))
    rows = cv.build(sizes, tuples)
    assert _missing(rows, sizes, tuples) == []
    assert 21 * 21 * 11 <= len(rows) <= 1.2 * 21 * 21 * 11  # near the lower bound


def test_bad_requests_are_refused():
    with pytest.raises(cv.CoveringError):
        cv.build([2, 0, 3], cv.all_pairs(3))
    with pytest.raises(cv.CoveringError):
        cv.build([2, 2], [(0, 5)])


def test_planted_no_vertical_growth_leaves_combinations_uncovered(monkeypatch):
    """The check above is not vacuous: without vertical growth the array misses pairs."""
    monkeypatch.setattr(cv, "_vertical", lambda *a, **k: None)
    sizes = [4, 4, 3]
    rows = cv.build(sizes, cv.all_pairs(3))
    assert _missing(rows, sizes, cv.all_pairs(3))
    covered, possible = cv.coverage(rows, sizes, cv.all_pairs(3))
    assert covered < possible


def test_planted_a_constraint_ignored_is_caught():
    """An array built without the constraint fails the property's checks."""
    sizes = [4, 4, 4, 4]
    assert _constraint_problems(cv.build(sizes, cv.all_pairs(4)), sizes, cv.all_pairs(4))
