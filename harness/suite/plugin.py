"""pytest plugin: the suite's profile, and one worker per expensive fixture under xdist.

``pytest --suite-profile DIR`` writes ``DIR/suite-profile.json`` (every test's setup, call and
teardown seconds and CPU seconds, every fixture above function scope with its own set-up
seconds, the area of each test; :mod:`harness.suite.profile`), files it into the history
beside ``DIR`` and ends the run with the budget: wall time, seconds by area, the slowest tests
and, with ``--suite-slow-list``, the slow tests the reviewed list does not name. Under
pytest-xdist the workers measure and attach what they measured to their reports; the
controller, which sees every report, writes the file.

Under ``--dist loadgroup`` the plugin also marks tests that share a fixture above function
scope defined in the suite (a module's matrix run, a session's built wheel) with one
``xdist_group``, so that fixture is set up once, on one worker; and it orders the collection
by expected cost, so the long groups start first rather than last (run with
``--no-loadscope-reorder`` so xdist keeps that order). The expected cost is the last profile's
seconds (``--suite-order-from``) where there is one, else the reviewed slow list and the
``slow`` and ``realpeer`` marks.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from .profile import (FIXTURE_PREFIX, SLOW_SECONDS, FixtureTime, ProfileError, SuiteProfile,
                      TestTime, area_of, listed_but_quick, read_profile, read_slow_list,
                      unlisted_slow, without_group, write_profile)

_PROFILE, _SLOW_LIST, _ORDER_FROM, _SLOWEST, _SCHEDULE = (
    "--suite-profile", "--suite-slow-list", "--suite-order-from", "--suite-slowest",
    "--suite-schedule")
_EXTRA = "suite_profile"  # the attribute a worker's report carries to the controller
_GROUP = pytest.StashKey[str]()  # the group the schedule put a test in


def pytest_addoption(parser):
    group = parser.getgroup("ggml-rpc suite profile")
    group.addoption(_PROFILE, default=None, metavar="DIR",
                    help="write DIR/suite-profile.json (per test and per fixture seconds) and "
                         "file it into the history beside DIR")
    group.addoption(_SLOW_LIST, default=None, metavar="TOML",
                    help=f"the reviewed list of tests that may need more than {SLOW_SECONDS:.0f}"
                         " s: the run's summary names the slow tests it does not list")
    group.addoption(_ORDER_FROM, default=None, metavar="PROFILE",
                    help="under --dist loadgroup: order the work by this earlier profile's "
                         "seconds (missing or unreadable: by the slow list and the marks)")
    group.addoption(_SCHEDULE, action="store_true", default=False,
                    help="with -n N: keep the tests that share a fixture above function scope "
                         "on one worker and start the longest work first")
    group.addoption(_SLOWEST, type=int, default=20, metavar="N",
                    help="how many of the slowest tests the summary lists (default 20)")


def pytest_configure(config):
    if not any(config.getoption(o) for o in (_PROFILE, _SLOW_LIST, _SCHEDULE)):
        return  # installed with the harness, it stays out of every other pytest run
    config.pluginmanager.register(_Measure(), "suite-profile-measure")
    if _is_controller(config):
        config.pluginmanager.register(_Collect(config), "suite-profile-collect")


def _is_controller(config) -> bool:
    return not hasattr(config, "workerinput")


def _worker() -> str:
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


def _cpu_seconds() -> float:
    own, children = (resource.getrusage(w) for w in (resource.RUSAGE_SELF,
                                                    resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def fixture_key(fixturedef) -> str:
    """``<where it is defined>::<name>``: the module's node id for a fixture of a test module
    (imported ones included), the folder for a conftest's."""
    return f"{fixturedef.baseid or '<plugin>'}::{fixturedef.argname}"


class _Measure:
    """In every process that runs tests: fixture set-ups and CPU, attached to the reports."""

    def __init__(self):
        self._stack: list[list[float]] = []  # [started, seconds of nested tracked set-ups]
        self._fixtures: list[dict] = []  # set up since the last report
        self._cpu: dict[str, float] = {}

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        if fixturedef.scope == "function":
            yield
            return
        frame = [time.perf_counter(), 0.0]
        self._stack.append(frame)
        try:
            yield
        finally:
            self._stack.pop()
            took = time.perf_counter() - frame[0]
            if self._stack:
                self._stack[-1][1] += took
            self._fixtures.append({"id": fixture_key(fixturedef), "scope": fixturedef.scope,
                                   "seconds": round(took - frame[1], 3)})

    def pytest_runtest_logstart(self, nodeid, location):
        self._cpu[nodeid] = _cpu_seconds()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        report = outcome.get_result()
        extra = {"worker": _worker()}
        if self._fixtures:
            extra["fixtures"], self._fixtures = self._fixtures, []
        if call.when == "setup":
            extra["area"] = area_of(item.nodeid, {m.name for m in item.iter_markers()})
            extra["group"] = item.stash.get(_GROUP, None) or _group_of(item)
        if call.when == "teardown" and item.nodeid in self._cpu:
            extra["cpu"] = round(_cpu_seconds() - self._cpu.pop(item.nodeid), 3)
        setattr(report, _EXTRA, extra)


def _group_of(item) -> str | None:
    names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                    for m in item.iter_markers("xdist_group")})
    return "_".join(names) or None


class _Collect:
    """In the controller (or the only process): every report, then the profile."""

    def __init__(self, config):
        self.config = config
        self.started = time.time()
        self.load_start = _load()
        self.tests: dict[str, TestTime] = {}
        self.fixtures: list[FixtureTime] = []
        self.profile: SuiteProfile | None = None

    def pytest_runtest_logreport(self, report):
        extra = getattr(report, _EXTRA, None) or {}
        group = extra.get("group")
        t = self.tests.get(report.nodeid)
        if t is None:
            t = self.tests[report.nodeid] = TestTime(
                id=without_group(report.nodeid, group), area=extra.get("area") or
                area_of(report.nodeid), outcome="passed", worker=extra.get("worker", "main"),
                group=group)
        setattr(t, report.when, getattr(t, report.when) + report.duration)
        if report.failed:
            t.outcome = "failed"
        elif report.skipped and t.outcome == "passed":
            t.outcome = "skipped"
        if "cpu" in extra:
            t.cpu = extra["cpu"]
        for f in extra.get("fixtures", ()):
            self.fixtures.append(FixtureTime(test=t.id, worker=extra.get("worker", "main"), **f))

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus):
        folder = self.config.getoption(_PROFILE)
        ended = time.time()
        counts: dict[str, int] = {}
        for t in self.tests.values():
            counts[t.outcome] = counts.get(t.outcome, 0) + 1
        numprocesses = getattr(self.config.option, "numprocesses", None) or 0
        self.profile = SuiteProfile(
            run_id=f"suite:{time.strftime('%Y%m%d-%H%M%S', time.localtime(self.started))}"
                   f"-{os.getpid()}",
            started=self.started, wall=round(ended - self.started, 2),
            workers=int(numprocesses), dist=getattr(self.config.option, "dist", None),
            args=[str(a) for a in self.config.invocation_params.args],
            host={"cpu": _cpu_model(), "cores": os.cpu_count(), "machine": platform.machine(),
                  "load_start": self.load_start, "load_end": _load()},
            outcomes=counts, tests=list(self.tests.values()), fixtures=self.fixtures)
        if folder:
            path = write_profile(self.profile, Path(folder))
            self._file(path.parent)

    def _file(self, folder: Path) -> None:
        from ..history.errors import HistoryError
        from ..history.ingest import file_report
        try:
            self.filed = file_report(folder)[0]
        except (HistoryError, OSError) as e:
            self.filed = f"not filed: {e}"

    def pytest_terminal_summary(self, terminalreporter):
        p = self.profile
        if p is None or not (self.config.getoption(_PROFILE) or
                             self.config.getoption(_SLOW_LIST)):
            return
        tr = terminalreporter
        tr.section("suite budget")
        tests = p.test_seconds()
        tr.write_line(f"wall {p.wall:.0f} s, {len(p.tests)} tests, {tests:.0f} s of test time"
                      f" on {p.workers or 1} process(es); load {p.host.get('load_start')} -> "
                      f"{p.host.get('load_end')}")
        for area, seconds in sorted(p.by_area().items(), key=lambda kv: -kv[1]):
            tr.write_line(f"  {seconds:8.1f} s  {100 * seconds / (tests or 1):5.1f} %  {area}")
        n = self.config.getoption(_SLOWEST)
        tr.write_line(f"the {n} slowest tests (setup + call + teardown, s):")
        for t in p.slowest(n):
            tr.write_line(f"  {t.total:8.1f}  {t.id}  [{t.area}]")
        if self.config.getoption(_PROFILE):
            tr.write_line(f"profile: {Path(self.config.getoption(_PROFILE)) / 'suite-profile.json'}"
                          f"; history: {getattr(self, 'filed', None) or 'off'}")
        slow_list = self.config.getoption(_SLOW_LIST)
        if slow_list:
            try:
                listed = read_slow_list(Path(slow_list))
            except ProfileError as e:
                tr.write_line(f"slow list: {e}", red=True)
                return
            unlisted = unlisted_slow(p, listed)
            tr.write_line(f"over {SLOW_SECONDS:.0f} s and not in {slow_list}: " +
                          ("none" if not unlisted else ""), red=bool(unlisted))
            for s in unlisted:
                tr.write_line(f"  {s.seconds:8.1f}  {s.id}", red=True)
            for i, seconds in listed_but_quick(p, listed):
                tr.write_line(f"  note: listed but took {seconds} s this run: {i}")


def _load() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


# --------------------------------------------------------------------- grouping and order
def shared_fixture_groups(items) -> dict[str, str]:
    """node id -> group, for every test that shares a fixture above function scope defined in
    the suite (not by a plugin) with another: tests connected through such fixtures, or
    through an xdist_group mark they already have, form one group, named after the module
    or fixture that joins them first."""
    parent: dict[str, str] = {}

    def find(k: str) -> str:
        while parent.setdefault(k, k) != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    keys_of: dict[str, list[str]] = {}
    for item in items:
        keys = [f"group {g}" for g in (_group_of(item) or "").split("_") if g]
        info = getattr(item, "_fixtureinfo", None)
        for name in getattr(item, "fixturenames", ()):
            defs = info.name2fixturedefs.get(name) if info else None
            if not defs:
                continue
            fd = defs[-1]
            if fd.scope != "function" and fd.baseid:
                # a module's fixture is one per module; a session fixture one per session
                keys.append(fd.baseid if fd.scope in ("module", "class") else fixture_key(fd))
        if keys:
            keys_of[item.nodeid] = keys
            for k in keys[1:]:
                parent[find(k)] = find(keys[0])
    members: dict[str, list[str]] = {}
    for nodeid, keys in keys_of.items():
        members.setdefault(find(keys[0]), []).append(nodeid)
    out = {}
    for root, nodeids in members.items():
        name = _group_name(root)
        for nodeid in nodeids:
            out[nodeid] = name
    return out


def _group_name(key: str) -> str:
    if key.startswith("group "):
        return key[len("group "):]
    where, _, fixture = key.partition("::")
    stem = Path(where).stem if where.endswith(".py") else Path(where).name
    return f"{stem}.{fixture}" if fixture else stem


def expected_seconds(items, profile: SuiteProfile | None, listed: dict) -> dict[str, float]:
    """What each test is expected to take: the earlier profile's seconds where it ran, else a
    guess from the slow list and the marks (enough to put the long work first)."""
    measured = {t.id: t.total for t in profile.tests} if profile else {}
    out = {}
    for item in items:
        if item.nodeid in measured:
            out[item.nodeid] = measured[item.nodeid]
            continue
        marks = {m.name for m in item.iter_markers()}
        out[item.nodeid] = (2 * SLOW_SECONDS if item.nodeid in listed else
                            20.0 if "slow" in marks else 5.0 if "realpeer" in marks else 0.5)
    for key in listed:  # a listed fixture's cost lands on the first test of its module
        if key.startswith(FIXTURE_PREFIX):
            where = key[len(FIXTURE_PREFIX):].split("::", 1)[0]
            first = next((i.nodeid for i in items if i.nodeid.startswith(where + "::")), None)
            if first and first not in measured:
                out[first] += 2 * SLOW_SECONDS
    return out


# ------------------------------------------------------------------- the xdist schedule
# xdist's own loadgroup sends a test's group to the controller in its node id, which pytest 9.2
# no longer lets a plugin change (pytest-xdist issue 1386): the groups would be ignored. Here
# the workers write the groups and the order to a file the controller's scheduler reads.
_SCHEDULE_FILE = "suite_schedule_file"


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    config = node.config
    if not config.getoption(_SCHEDULE):
        return
    path = getattr(config, "_suite_schedule_file", None)
    if path is None:
        path = Path(tempfile.mkdtemp(prefix="suite-schedule-")) / "groups.json"
        config._suite_schedule_file = path
        config.add_cleanup(lambda: shutil.rmtree(path.parent, ignore_errors=True))
    node.workerinput[_SCHEDULE_FILE] = str(path)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    if not config.getoption(_SCHEDULE):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixtureScheduling(LoadScopeScheduling):
        """xdist's scope scheduling with the workers' groups as the scopes (a test in no group
        is a scope of its own), in the workers' order (the longest work first)."""

        def __init__(self, config, log=None):
            super().__init__(config, log)
            self.groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:  # first called once every worker has collected
                path = getattr(self.config, "_suite_schedule_file", None)
                try:
                    self.groups = json.loads(Path(path).read_text())["groups"]
                except (OSError, TypeError, ValueError, KeyError):
                    self.groups = {}
            return self.groups.get(nodeid, nodeid)

        def schedule(self) -> None:
            self.config.option.loadscopereorder = False  # the collection is in cost order
            super().schedule()

    return SharedFixtureScheduling(config, log)


@pytest.hookimpl(hookwrapper=True)  # around every other: the order is final before xdist's
def pytest_collection_modifyitems(session, config, items):
    target = getattr(config, "workerinput", {}).get(_SCHEDULE_FILE)
    if target:
        groups = group_and_order(config, items)
        tmp = Path(f"{target}.{os.getpid()}")
        tmp.write_text(json.dumps({"groups": groups}))
        tmp.replace(target)  # every worker writes the same: the last one is as good
    yield


def group_and_order(config, items) -> dict[str, str]:
    """Order ``items`` by expected cost, a group as one unit; returns node id -> group."""
    groups = shared_fixture_groups(items)
    profile = listed = None
    try:
        if config.getoption(_ORDER_FROM) and Path(config.getoption(_ORDER_FROM)).exists():
            profile = read_profile(Path(config.getoption(_ORDER_FROM)))
    except ProfileError:
        profile = None
    try:
        listed = read_slow_list(Path(config.getoption(_SLOW_LIST))) \
            if config.getoption(_SLOW_LIST) else {}
    except ProfileError:
        listed = {}
    cost = expected_seconds(items, profile, listed)
    units: dict[str, list] = {}
    for item in items:  # a group is one unit of work, in the place of its first test
        units.setdefault(groups.get(item.nodeid, item.nodeid), []).append(item)
    ordered = sorted(units.values(), key=lambda unit: -sum(cost[i.nodeid] for i in unit))
    items[:] = [i for unit in ordered for i in unit]
    for item in items:
        if item.nodeid in groups:
            item.stash[_GROUP] = groups[item.nodeid]
    return groups
