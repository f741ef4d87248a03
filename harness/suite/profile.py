"""A test run's profile: every test's setup, call and teardown seconds, every fixture above
function scope with the seconds its set-up took, the area each test belongs to; and the
reviewed list of what may need more than :data:`SLOW_SECONDS`.

The profile is a JSON file (``suite-profile.json``, :data:`PROFILE_FORMAT`) in a report folder
of its own, so the history files it like any other run (``harness history add``) and the site
shows the suite's wall time and the share of each area run over run. Nothing here fails a
test on its time: the machines are noisy. What is checked is the list: a test whose own time
is over :data:`SLOW_SECONDS` must be on it, with its reason (:func:`unlisted_slow`).
"""

from __future__ import annotations

import fnmatch
import json
import tomllib
from collections import Counter
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import HarnessError

PROFILE_FORMAT = "ggml-rpc-suite-profile/1"
PROFILE_NAME = "suite-profile.json"
SLOW_SECONDS = 120.0
MAX_PROFILE = 64 << 20  # a profile is a few MB for thousands of tests; beyond this it is not one
FIXTURE_PREFIX = "fixture "  # how the slow list names a fixture: "fixture <where>::<name>"

# Where the suite's time goes, by module name (first match wins); a test of a module that no
# rule names is "real peers" when it is marked realpeer, else "unit and properties".
AREAS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("builds inside tests", ("test_peers_variants", "test_peers_build", "test_source_builds",
                             "test_registry_builds", "test_extending", "test_wheel",
                             "test_pr_action", "test_seed000_patch", "test_sanitizer*")),
    ("fuzz campaigns", ("test_fuzz_*", "test_libfuzzer*", "test_clusterfuzzlite", "test_sweep",
                        "test_interactions", "test_bounds", "test_covering", "test_written",
                        "test_differential_*", "test_triage")),
    ("RDMA", ("test_rdma_*", "test_softverbs*")),
    ("matrix", ("test_matrix", "test_fourway", "test_chop", "test_scenarios", "test_site",
                "test_report_*", "test_comm_*", "test_docker_adapter", "test_ci_scripts")),
)
REAL_PEERS, UNIT = "real peers", "unit and properties"
AREA_NAMES = (*(a for a, _ in AREAS), REAL_PEERS, UNIT)


class ProfileError(HarnessError):
    """A profile or slow list that cannot be read."""


def area_of(nodeid: str, markers: set[str] | frozenset[str] = frozenset()) -> str:
    module = Path(nodeid.split("::", 1)[0]).stem
    for area, patterns in AREAS:
        if any(fnmatch.fnmatchcase(module, p) for p in patterns):
            return area
    return REAL_PEERS if "realpeer" in markers else UNIT


class TestTime(BaseModel):
    model_config = ConfigDict(extra="ignore")
    __test__ = False  # not a pytest class
    id: str
    area: str
    outcome: str  # passed, failed, skipped (a test whose set-up failed: failed)
    setup: float = 0.0
    call: float = 0.0
    teardown: float = 0.0
    cpu: float | None = None  # seconds of CPU: the test's process and the children it reaped
    worker: str = "main"
    group: str | None = None  # the xdist group it ran in (shares an expensive fixture)

    @property
    def total(self) -> float:
        return self.setup + self.call + self.teardown


class FixtureTime(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: str  # "<where it is defined>::<name>", e.g. "tests/test_rdma_soft_matrix.py::runs"
    scope: str
    seconds: float  # its own set-up: fixtures it requested are counted on themselves
    test: str  # the test whose set-up paid for it
    worker: str = "main"


class SuiteProfile(BaseModel):
    model_config = ConfigDict(extra="ignore")
    format: str = PROFILE_FORMAT
    run_id: str
    started: float
    wall: float
    workers: int = 0  # xdist workers; 0: in process
    dist: str | None = None
    args: list[str] = []
    host: dict[str, str | int | float | list[float] | None] = {}
    outcomes: dict[str, int] = {}
    areas: dict[str, float] = {}  # by_area(), kept in the file for the history's reader
    tests: list[TestTime] = []
    fixtures: list[FixtureTime] = Field(default_factory=list)

    def by_area(self) -> dict[str, float]:
        seconds = Counter({a: 0.0 for a in AREA_NAMES})
        for t in self.tests:
            seconds[t.area] += t.total
        return {a: round(s, 1) for a, s in seconds.items()}

    def slowest(self, n: int = 20) -> list[TestTime]:
        return sorted(self.tests, key=lambda t: -t.total)[:n]

    def test_seconds(self) -> float:
        return sum(t.total for t in self.tests)


def write_profile(profile: SuiteProfile, folder: Path) -> Path:
    profile.areas = profile.by_area()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / PROFILE_NAME
    tmp = path.with_suffix(".tmp")
    tmp.write_text(profile.model_dump_json(indent=1) + "\n")
    tmp.replace(path)
    return path


def read_profile(path: Path) -> SuiteProfile:
    """A profile from its file or its folder; ProfileError says why not."""
    path = Path(path)
    if path.is_dir():
        path = path / PROFILE_NAME
    try:
        if path.stat().st_size > MAX_PROFILE:
            raise ProfileError(f"{path}: {path.stat().st_size:,} bytes: not a suite profile")
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ProfileError(f"{path}: {e}") from None
    if not isinstance(raw, dict) or not str(raw.get("format", "")).startswith(
            PROFILE_FORMAT.rsplit("/", 1)[0] + "/"):
        raise ProfileError(f"{path}: not a suite profile (format {PROFILE_FORMAT})")
    try:
        return SuiteProfile.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        raise ProfileError(f"{path}: {'.'.join(map(str, first['loc']))}: {first['msg']}") \
            from None


# ------------------------------------------------------------------------- the slow list
class SlowEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str  # a test's node id, or "fixture <where>::<name>"
    reason: str

    @property
    def is_fixture(self) -> bool:
        return self.id.startswith(FIXTURE_PREFIX)


def read_slow_list(path: Path) -> dict[str, SlowEntry]:
    """The reviewed list (TOML, ``[[slow]]`` tables of ``id`` and ``reason``), by id. Every
    entry needs a reason, and an id is listed once."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ProfileError(f"{path}: {e}") from None
    unknown = set(raw) - {"slow"}
    if unknown:
        raise ProfileError(f"{path}: unknown table(s) {', '.join(sorted(unknown))}: only [[slow]]")
    out: dict[str, SlowEntry] = {}
    for n, item in enumerate(raw.get("slow", []), 1):
        try:
            entry = SlowEntry.model_validate(item)
        except ValidationError as e:
            raise ProfileError(f"{path}: entry {n}: {e.errors()[0]['loc']}: "
                               f"{e.errors()[0]['msg']}") from None
        if not entry.reason.strip():
            raise ProfileError(f"{path}: entry {n} ({entry.id}): no reason")
        if entry.id in out:
            raise ProfileError(f"{path}: {entry.id} is listed twice")
        out[entry.id] = entry
    return out


class SlowTest(BaseModel):
    id: str
    seconds: float  # the test's own time: its total less the listed fixtures it set up
    total: float


def own_seconds(test: TestTime, listed_fixtures: dict[str, float]) -> float:
    return test.total - listed_fixtures.get(test.id, 0.0)


def unlisted_slow(profile: SuiteProfile, listed: dict[str, SlowEntry],
                  threshold: float = SLOW_SECONDS) -> list[SlowTest]:
    """Tests over ``threshold`` seconds that the list does not name. A listed fixture's set-up
    is not its first user's own time (that test did not ask for the cost, it only paid it)."""
    paid: Counter = Counter()
    for f in profile.fixtures:
        if FIXTURE_PREFIX + f.id in listed:
            paid[f.test] += f.seconds
    out = []
    for t in profile.tests:
        own = own_seconds(t, paid)
        if own > threshold and t.id not in listed:
            out.append(SlowTest(id=t.id, seconds=round(own, 1), total=round(t.total, 1)))
    for f in profile.fixtures:
        key = FIXTURE_PREFIX + f.id
        if f.seconds > threshold and key not in listed and not any(
                s.id == f.test for s in out) and f.test not in listed:
            out.append(SlowTest(id=key, seconds=round(f.seconds, 1), total=round(f.seconds, 1)))
    return sorted(out, key=lambda s: -s.seconds)


def listed_but_quick(profile: SuiteProfile, listed: dict[str, SlowEntry],
                     threshold: float = SLOW_SECONDS) -> list[tuple[str, float]]:
    """Entries of the list that took under half the threshold in this run (candidates to
    leave it: a note, never a failure, since one quiet run proves little)."""
    seen: dict[str, float] = {t.id: t.total for t in profile.tests}
    seen.update({FIXTURE_PREFIX + f.id: f.seconds for f in profile.fixtures})
    return [(i, round(seen[i], 1)) for i in listed if i in seen and seen[i] < threshold / 2]


def without_group(nodeid: str, group: str | None) -> str:
    """xdist's loadgroup appends ``@<group>`` to a grouped test's node id; the profile keeps
    the test's own id (the one the slow list and -k name)."""
    suffix = f"@{group}" if group else None
    return nodeid[:-len(suffix)] if suffix and nodeid.endswith(suffix) else nodeid
