"""The suite's own budget (harness/suite): the profile a run writes, the schedule that keeps a
shared fixture on one xdist worker and starts the long work first, the reviewed list of slow
tests and the check against it, and the profile's way into the history and the site."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.history import store
from harness.history.ingest import file_report, records_from
from harness.site.build import build_site
from harness.suite.profile import (FIXTURE_PREFIX, SLOW_SECONDS, FixtureTime, ProfileError,
                                   SlowEntry, SuiteProfile, TestTime, area_of, read_profile,
                                   read_slow_list, unlisted_slow, write_profile)
from needs import module

TESTS = Path(__file__).resolve().parent
SLOW_LIST = TESTS / "slow-tests.toml"

# A module fixture that takes a while, four tests that share it, and independent tests that
# wait: under the schedule the shared ones run on one worker and the fixture is set up once.
SAMPLE = '''
import time
import pytest

@pytest.fixture(scope="module")
def expensive():
    time.sleep(0.6)
    return object()

@pytest.mark.parametrize("i", range(4))
def test_shares(expensive, i):
    assert expensive is not None

@pytest.mark.parametrize("i", range(6))
def test_waits(i):
    time.sleep(0.3)
'''


def _inner(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    out = tmp_path / "suite-out"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "CI")) and k != "GGML_RPC_HARNESS_STRICT"}
    env["GGML_RPC_HARNESS_HISTORY"] = str(tmp_path / "history.jsonl")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--suite-profile", str(out), *args, str(tmp_path)], cwd=tmp_path,
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done, json.loads((out / "suite-profile.json").read_text())


def _shared_fixture(profile: dict) -> list[dict]:
    return [f for f in profile["fixtures"] if f["id"].endswith("::expensive")]


def test_the_profile_has_every_test_and_the_fixture_that_its_first_user_paid(tmp_path):
    done, p = _inner(tmp_path)
    assert p["format"] == "ggml-rpc-suite-profile/1" and p["workers"] == 0
    assert len(p["tests"]) == 10 and p["outcomes"] == {"passed": 10}
    [f] = _shared_fixture(p)
    assert f["scope"] == "module" and f["seconds"] >= 0.6
    first = next(t for t in p["tests"] if t["id"] == f["test"])
    assert first["setup"] >= 0.6 and first["cpu"] is not None
    waits = [t for t in p["tests"] if "test_waits" in t["id"]]
    assert all(t["call"] >= 0.3 for t in waits)
    assert sum(p["areas"].values()) == pytest.approx(sum(
        t["setup"] + t["call"] + t["teardown"] for t in p["tests"]), abs=0.2)
    assert "suite budget" in done.stdout and "slowest tests" in done.stdout
    # filed into the history the run's environment names
    [record] = store.read(tmp_path / "history.jsonl")
    assert record.kind == "suite" and record.tests == 10


def test_under_xdist_a_shared_fixture_is_set_up_once_and_the_rest_spread(tmp_path):
    module("xdist", "pip install -e '.[test]' (pytest-xdist)")
    _, p = _inner(tmp_path, "-n", "2", "--suite-schedule")
    assert p["workers"] == 2 and len(p["tests"]) == 10
    assert len(_shared_fixture(p)) == 1  # one set-up for the four tests that share it
    shared = {t["worker"] for t in p["tests"] if "test_shares" in t["id"]}
    assert len(shared) == 1 and {t["group"] for t in p["tests"]
                                 if "test_shares" in t["id"]} == {"test_sample"}
    assert {t["worker"] for t in p["tests"]} == {"gw0", "gw1"}  # the others spread


def test_planted_without_the_schedule_xdist_sets_the_fixture_up_on_both_workers(tmp_path):
    """The check above is not vacuous: xdist's own distribution (no --suite-schedule) splits
    the four tests and pays the fixture on each worker that got one."""
    module("xdist", "pip install -e '.[test]' (pytest-xdist)")
    _, p = _inner(tmp_path, "-n", "2", "--dist", "load")
    assert len(_shared_fixture(p)) == 2


def _profile(tests: list[tuple[str, float]], fixtures=()) -> SuiteProfile:
    return SuiteProfile(run_id="r", started=0, wall=1,
                        tests=[TestTime(id=i, area=area_of(i), outcome="passed", call=s)
                               for i, s in tests],
                        fixtures=[FixtureTime(id=f, scope="module", seconds=s, test=t)
                                  for f, s, t in fixtures])


def test_a_slow_test_must_be_listed_and_a_listed_fixture_is_not_its_first_users_time():
    slow, quick = "tests/test_a.py::test_slow", "tests/test_a.py::test_quick"
    p = _profile([(slow, SLOW_SECONDS + 30), (quick, 3)])
    assert [s.id for s in unlisted_slow(p, {})] == [slow]
    assert unlisted_slow(p, {slow: SlowEntry(id=slow, reason="a campaign")}) == []
    # 200 s of which 150 are a listed module fixture's set-up: the test's own 50 s are fine
    first = "tests/test_b.py::test_first"
    p = _profile([(first, 200)], [("tests/test_b.py::runs", 150, first)])
    assert [s.id for s in unlisted_slow(p, {})] == [first]
    key = FIXTURE_PREFIX + "tests/test_b.py::runs"
    assert unlisted_slow(p, {key: SlowEntry(id=key, reason="every cell once")}) == []


def test_the_slow_list_reads_and_refuses_what_it_cannot(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text('[[slow]]\nid = "tests/test_a.py::test_x"\nreason = "why"\n')
    assert list(read_slow_list(good)) == ["tests/test_a.py::test_x"]
    for text, why in (('[[slow]]\nid = "x"\nreason = " "\n', "no reason"),
                      ('[[slow]]\nid = "x"\nreason = "a"\n[[slow]]\nid = "x"\nreason = "b"\n',
                       "listed twice"),
                      ('[[slow]]\nid = "x"\n', "reason"),
                      ('[[fast]]\nid = "x"\nreason = "a"\n', "only \\[\\[slow\\]\\]")):
        bad = tmp_path / "bad.toml"
        bad.write_text(text)
        with pytest.raises(ProfileError, match=why):
            read_slow_list(bad)


def _defined(path: Path) -> set[str]:
    """Top-level test functions and fixtures of a test module."""
    tree = ast.parse(path.read_text())
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_every_entry_of_the_reviewed_list_names_a_test_or_fixture_of_the_suite():
    listed = read_slow_list(SLOW_LIST)
    assert listed, "the reviewed list is empty: then nothing is allowed over the threshold"
    for key, entry in listed.items():
        where = key[len(FIXTURE_PREFIX):] if entry.is_fixture else key
        module, _, name = where.partition("::")
        path = TESTS.parent / module
        assert path.is_file(), key
        assert name.split("[", 1)[0] in _defined(path), f"{key}: no such test or fixture"
        assert len(entry.reason) > 20, f"{key}: say why it needs the time"


def test_the_check_command_fails_on_an_unlisted_slow_test(tmp_path):
    slow = "tests/test_a.py::test_slow"
    folder = tmp_path / "suite-x"
    write_profile(_profile([(slow, SLOW_SECONDS + 1)]), folder)
    listed = tmp_path / "list.toml"
    listed.write_text("")

    def check() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "harness", "suite", "check", str(folder),
                               "--slow-list", str(listed)], capture_output=True, text=True,
                              timeout=120)
    done = check()
    assert done.returncode == 1 and slow in done.stdout, done.stdout + done.stderr
    listed.write_text(f'[[slow]]\nid = "{slow}"\nreason = "a planted slow test"\n')
    done = check()
    assert done.returncode == 0, done.stdout + done.stderr
    (folder / "suite-profile.json").write_text("{}")
    assert check().returncode == 2  # a profile it cannot read is an error, not a pass


def test_a_profile_files_into_the_history_and_the_site_shows_it(tmp_path, monkeypatch):
    monkeypatch.setenv(store.HISTORY_ENV, str(tmp_path / "history.jsonl"))
    runs = []
    for n, seconds in enumerate((300.0, 420.0)):
        p = _profile([("tests/test_fuzz_x.py::test_a", seconds / 2),
                      ("tests/test_matrix.py::test_b", 10.0)])
        p.run_id, p.started, p.wall = f"suite:{n}", 1000.0 * (n + 1), seconds
        folder = write_profile(p, tmp_path / f"suite-{n}").parent
        file_report(folder)
        runs.append(folder)
    records = store.read(tmp_path / "history.jsonl")
    assert [(r.kind, r.wall) for r in records] == [("suite", 300.0), ("suite", 420.0)]
    assert records[1].areas["fuzz campaigns"] == 210.0
    assert records[1].slowest[0] == ("tests/test_fuzz_x.py::test_a", 210.0)
    assert records_from(runs[0]) == [records[0]]  # filing twice adds nothing new
    site, broken = build_site(runs, tmp_path / "site", history=tmp_path / "history.jsonl")
    assert broken == [] and len(site.suites) == 2
    page = (tmp_path / "site" / "suite.html").read_text()
    assert "tests/test_fuzz_x.py::test_a" in page and "7.0" in page  # 420 s as minutes
    assert "Test suite" in (tmp_path / "site" / "index.html").read_text()  # in the nav


def test_a_profile_that_is_not_one_is_refused(tmp_path):
    (tmp_path / "suite-profile.json").write_text(json.dumps({"format": "something/1"}))
    with pytest.raises(ProfileError, match="not a suite profile"):
        read_profile(tmp_path)


@pytest.mark.parametrize("nodeid, markers, area", [
    ("tests/test_fuzz_oracles.py::test_x", set(), "fuzz campaigns"),
    ("tests/test_rdma_soft_matrix.py::test_x", {"realpeer"}, "RDMA"),
    ("tests/test_fourway.py::test_x", {"realpeer"}, "matrix"),
    ("tests/test_peers_variants.py::test_x", {"realpeer"}, "builds inside tests"),
    ("tests/test_interop_real.py::test_x", {"realpeer"}, "real peers"),
    ("tests/test_proto_roundtrip.py::test_x", set(), "unit and properties"),
])
def test_areas(nodeid, markers, area):
    assert area_of(nodeid, markers) == area
