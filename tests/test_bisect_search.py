"""harness bisect's search on fake build lists: bounds, skips, flaky probes, classes."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.bisect.search import FLAKY, INFERRED, MEASURED, SKIPPED, BisectError, PredicateAnswer, \
    bisect

BUILDS = [f"b{i}" for i in range(20)]


class Fake:
    """A predicate over BUILDS: result 'old' before ``change``, 'new' from it on."""

    def __init__(self, change: int, *, unbuildable=(), flaky=(), builds=BUILDS):
        self.change, self.unbuildable, self.flaky = change, set(unbuildable), set(flaky)
        self.builds = builds
        self.calls: list[str] = []

    def __call__(self, build: str) -> PredicateAnswer:
        self.calls.append(build)
        i = self.builds.index(build)
        if i in self.unbuildable:
            return PredicateAnswer(None, skipped="does not build: planted")
        if i in self.flaky:  # alternates between runs
            return PredicateAnswer("old" if self.calls.count(build) % 2 else "new")
        return PredicateAnswer("old" if i < self.change else "new")


def test_finds_the_first_different_build_and_its_neighbour():
    fake = Fake(13)
    r = bisect(BUILDS, fake)
    assert (r.first_different, r.last_same) == ("b13", "b12")
    assert (r.good_result, r.bad_result) == ("old", "new")
    assert r.untested_between == [] and not r.notes
    # logarithmic: the two ends plus ~log2(18) probes, each run twice
    assert r.measured <= 2 + math.ceil(math.log2(len(BUILDS)))
    assert all(fake.calls.count(b) == 2 for b in set(fake.calls))


def test_without_recheck_each_probe_runs_once():
    fake = Fake(5)
    bisect(BUILDS, fake, recheck=False)
    assert all(fake.calls.count(b) == 1 for b in set(fake.calls))


def test_an_unbuildable_build_is_skipped_and_bracketed():
    fake = Fake(13, unbuildable={12, 13})
    r = bisect(BUILDS, fake)
    assert r.first_different == "b14" and r.last_same == "b11"
    assert r.untested_between == ["b12", "b13"]
    assert any("could not be probed" in n for n in r.notes)
    skipped = [p for p in r.probes if p.status == SKIPPED]
    assert {p.build for p in skipped} == {"b12", "b13"}
    # an unbuildable build is not built twice
    assert fake.calls.count("b12") == 1


def test_a_flaky_build_moves_no_bound():
    fake = Fake(13, flaky={9})
    r = bisect(BUILDS, fake)
    assert r.first_different == "b13"
    flaky = [p for p in r.probes if p.status == FLAKY]
    assert [p.build for p in flaky] == ["b9"] and flaky[0].runs in (["new", "old"], ["old", "new"])


def test_without_recheck_a_flaky_build_can_mislead():
    # the planted fault for the recheck: one run of b9 says "new" and the search goes wrong
    fake = Fake(13, flaky={9})
    fake.calls.append("b9")  # its first run now returns "new"
    r = bisect(BUILDS, fake, recheck=False)
    assert r.first_different != "b13"


def test_classes_infer_results_inside_a_class():
    classes = {b: ("A" if i < 4 else "B" if i < 13 else "C") for i, b in enumerate(BUILDS)}
    fake = Fake(13)
    r = bisect(BUILDS, fake, klass=classes.get)
    assert r.first_different == "b13" and r.classes_used
    measured = [p.build for p in r.probes if p.status == MEASURED]
    inferred = [p for p in r.probes if p.status == INFERRED]
    assert inferred and all(p.inferred_from for p in inferred)
    # an inference names the build that was run, never another inference
    assert {p.inferred_from for p in inferred} <= set(measured)
    # nothing of class A or C but the ends is measured; B at most to find its edges
    assert len(measured) <= 2 + 2
    assert len(set(fake.calls)) == len(measured)


def test_ends_in_one_class_turn_inference_off():
    fake = Fake(13)
    r = bisect(BUILDS, fake, klass=lambda b: "same")
    assert r.first_different == "b13" and not r.classes_used
    assert any("depends on more than the RPC sources" in n for n in r.notes)
    assert not [p for p in r.probes if p.status == INFERRED]


@pytest.mark.parametrize("fake, match", [
    (Fake(100), "same result"),
    (Fake(5, unbuildable={0}), "both ends"),
    (Fake(5, flaky={19}), "both ends"),
])
def test_ends_must_be_stable_and_different(fake, match):
    with pytest.raises(BisectError, match=match):
        bisect(BUILDS, fake)


def test_a_result_neither_end_gave_is_said():
    def probe(b):
        i = BUILDS.index(b)
        return PredicateAnswer("old" if i < 8 else "crash" if i < 12 else "new")
    r = bisect(BUILDS, probe)
    assert r.first_different == "b8"
    assert any("change more than once" in n for n in r.notes)


@settings(max_examples=300, deadline=None)
@given(n=st.integers(2, 40), data=st.data())
def test_the_answer_is_always_the_change(n, data):
    builds = [f"b{i}" for i in range(n)]
    change = data.draw(st.integers(1, n - 1), label="change")
    unbuildable = data.draw(st.sets(st.integers(1, n - 2)), label="unbuildable") if n > 2 else set()
    # classes consistent with results: a class never spans the change
    cuts = sorted(data.draw(st.sets(st.integers(1, n - 1)), label="cuts") | {change})
    klass = {b: f"c{sum(i >= c for c in cuts)}" for i, b in enumerate(builds)}
    fake = Fake(change, unbuildable=unbuildable, builds=builds)
    r = bisect(builds, fake, klass=klass.get if data.draw(st.booleans()) else None)
    first = builds.index(r.first_different)
    last = builds.index(r.last_same)
    assert last < change <= first
    assert all(i in unbuildable for i in range(last + 1, first))
    assert r.untested_between == builds[last + 1:first]


def test_classes_without_inference_are_shown_and_everything_is_measured():
    classes = {b: ("A" if i < 13 else "B") for i, b in enumerate(BUILDS)}
    r = bisect(BUILDS, Fake(13), klass=classes.get, infer=False)
    assert r.first_different == "b13" and not r.classes_used
    assert all(p.status == MEASURED and p.klass in "AB" for p in r.probes)
