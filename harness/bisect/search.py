"""The search of ``harness bisect``: the first build whose result differs from the first one's.

Pure logic over an ordered list of builds and two callables: ``probe(build)`` measures a
build (building it if needed) and ``klass(build)`` names its equivalence class (its RPC
digest, cheap: the archive is read, nothing built). Like ``git bisect`` it

* measures both ends first: they must give stable, different results;
* probes the middle of what is left and moves the bound whose side the result is on;
* skips a build that does not build or does not speak RPC (``PredicateAnswer.skipped``), trying its
  neighbours instead, and says so when the answer ends up bracketing skipped builds;
* measures every probe twice before it moves a bound ("rechecked once"): two runs that
  disagree make the build ``flaky``, which moves nothing;
* infers instead of measuring when a build shares its class with a measured build: builds
  of one class cannot differ on the wire, so inside a class the search costs no build.
  When the two ends share a class and still differ, the predicate depends on more than the
  class and inference is turned off (said in the notes).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from ..errors import HarnessError

MEASURED, INFERRED, SKIPPED, FLAKY = "measured", "inferred", "skipped", "flaky"


class BisectError(HarnessError):
    """The search cannot start or cannot decide (ends unstable, equal, or unbuildable)."""


@dataclass(frozen=True)
class PredicateAnswer:
    """What one run of the predicate said about one build."""

    result: str | None  # None: the build could not be probed (see skipped)
    skipped: str | None = None  # why it could not: "does not build: ...", "no RPC"
    detail: str = ""
    proto: str | None = None  # what the build announced, when it ran
    build_seconds: float = 0.0  # of this run, spent building the build (0: it was cached)


@dataclass
class Probe:
    build: str
    index: int
    klass: str | None
    status: str  # measured | inferred | skipped | flaky
    result: str | None
    proto: str | None = None
    runs: list[str] = field(default_factory=list)  # each run's result (measured: two)
    detail: str = ""
    seconds: float = 0.0  # the whole probe: building and every run
    build_seconds: float = 0.0
    inferred_from: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class BisectResult:
    builds: list[str]
    good: str
    good_result: str
    bad: str
    bad_result: str
    probes: list[Probe]
    first_different: str | None  # the first build whose result differs from good's
    last_same: str | None  # its neighbour on the other side
    untested_between: list[str]  # skipped or flaky builds the answer brackets
    notes: list[str]
    classes_used: bool

    @property
    def measured(self) -> int:
        return sum(p.status == MEASURED for p in self.probes)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["probes"] = [p.to_dict() for p in self.probes]
        d["measured"] = self.measured
        d["spanned"] = len(self.builds)
        return d


def bisect(builds: Sequence[str], probe: Callable[[str], PredicateAnswer], *,
           klass: Callable[[str], str | None] | None = None, infer: bool = True,
           recheck: bool = True, log: Callable[[Probe], None] | None = None,
           clock: Callable[[], float] = time.monotonic) -> BisectResult:
    """Find the first build in ``builds`` (oldest first) whose result differs from
    ``builds[0]``'s, assuming results change once along the list. ``infer`` False: classes
    are shown but every probe is measured."""
    if len(builds) < 2:
        raise BisectError("bisect needs two different builds")
    probes: list[Probe] = []
    known: dict[int, Probe] = {}
    notes: list[str] = []
    use_classes = klass is not None and infer
    class_cache: dict[int, str | None] = {}

    def class_of(i: int) -> str | None:
        if klass is None:
            return None
        if i not in class_cache:
            class_cache[i] = klass(builds[i])
        return class_cache[i]

    def record(p: Probe) -> Probe:
        probes.append(p)
        known[p.index] = p
        if log:
            log(p)
        return p

    def measure(i: int) -> Probe:
        t0 = clock()
        runs: list[PredicateAnswer] = []
        for _ in range(2 if recheck else 1):
            out = probe(builds[i])
            runs.append(out)
            if out.result is None:  # unbuildable: no point running it again
                break
        seconds = clock() - t0
        first = runs[0]
        base = dict(build=builds[i], index=i, klass=class_of(i), proto=first.proto,
                    runs=[r.result if r.result is not None else f"skip: {r.skipped}"
                          for r in runs], seconds=seconds,
                    build_seconds=sum(r.build_seconds for r in runs))
        if first.result is None:
            return record(Probe(status=SKIPPED, result=None, detail=first.skipped or "", **base))
        if any(r.result != first.result for r in runs):
            return record(Probe(status=FLAKY, result=None,
                                detail="runs disagree: " + " / ".join(base["runs"]), **base))
        return record(Probe(status=MEASURED, result=first.result, detail=first.detail, **base))

    def infer(i: int, source: Probe) -> Probe:
        measured = source.inferred_from or source.build  # the build that was actually run
        return record(Probe(build=builds[i], index=i, klass=class_of(i), status=INFERRED,
                            result=source.result, proto=source.proto,
                            detail=f"same class as {measured}", inferred_from=measured))

    lo, hi = 0, len(builds) - 1
    ends = []
    for i in (lo, hi):
        p = measure(i)
        if p.status != MEASURED:
            raise BisectError(f"{builds[i]}: {p.status} ({p.detail}); both ends must give a "
                              "stable result")
        ends.append(p)
    good, bad = ends
    if good.result == bad.result:
        raise BisectError(f"{good.build} and {bad.build} give the same result "
                          f"({good.result}): nothing to bisect")
    if use_classes and good.klass is not None and good.klass == bad.klass:
        use_classes = False
        notes.append(f"{good.build} and {bad.build} share class {good.klass} yet differ: the "
                     "result depends on more than the RPC sources, so no result was inferred")

    def unknown_between() -> list[int]:
        return [i for i in range(lo + 1, hi) if i not in known]

    while True:
        candidates = unknown_between()
        if not candidates:
            break
        middle = (lo + hi) / 2
        i = min(candidates, key=lambda j: (abs(j - middle), j))
        p = None
        if use_classes and class_of(i) is not None:
            same = next((known[j] for j in (lo, hi) if known[j].klass == class_of(i)), None)
            if same is not None:
                p = infer(i, same)
        if p is None:
            p = measure(i)
        if p.status not in (MEASURED, INFERRED):
            continue  # skipped / flaky: try its neighbours, the bounds stay
        if p.result == good.result:
            lo = i
        else:
            hi = i
    untested = [builds[i] for i in range(lo + 1, hi)]
    if untested:
        notes.append(f"the change is in one of {len(untested) + 1} builds: "
                     f"{', '.join(untested)} could not be probed, then {builds[hi]}")
    if known[hi].result != bad.result:
        notes.append(f"{builds[hi]} gives {known[hi].result}, neither the first build's "
                     f"result nor the last's ({bad.result}): results change more than once")
    return BisectResult(builds=list(builds), good=good.build, good_result=good.result,
                        bad=bad.build, bad_result=bad.result, probes=probes,
                        first_different=builds[hi], last_same=builds[lo],
                        untested_between=untested, notes=notes,
                        classes_used=use_classes)
