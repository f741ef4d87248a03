"""The release watch: what counts as a change, and a real watch of the newest py-sync wheel."""

from __future__ import annotations

import copy
import json
import shutil

import pytest
import yaml

from harness.data import default_matrix, shipped
from harness.releases.watch import WatchConfig, WatchReport, compare, reproducer_dirs, run_watch


def _report(**kw) -> WatchReport:
    base = dict(at="t", newest={"newest:pkg": "pkg==2"}, builds={"newest:pkg": "built"},
                verdicts={"p7|newest:pkg": {"client": "p7", "server": "pkg==2",
                                            "outcome": "works", "verdict": "pass"}},
                differential={"newest:pkg": {"build": "pkg==2", "divergences": ["d1"]}},
                replays={"repro-a": {"newest:pkg": "reproduced"}})
    base.update(kw)
    return WatchReport(**base)


def test_nothing_changed_and_the_baseline_compare_empty():
    assert compare(None, _report()) == []
    assert compare(_report(), _report()) == []


def test_a_new_newest_build_that_behaves_the_same_is_no_change():
    after = _report(newest={"newest:pkg": "pkg==3"})
    after.verdicts["p7|newest:pkg"]["server"] = "pkg==3"
    assert compare(_report(), after) == []


@pytest.mark.parametrize("edit, kind", [
    (lambda r: r.verdicts["p7|newest:pkg"].update(outcome="rejected-at-hello by client"),
     "verdict"),
    (lambda r: r.differential["newest:pkg"].update(divergences=["d1", "d2"]), "differential"),
    (lambda r: r.differential["newest:pkg"].update(divergences=[]), "differential"),
    (lambda r: r.replays["repro-a"].update({"newest:pkg": "no failure"}), "replay"),
    (lambda r: r.builds.update({"newest:pkg": "failed: cmake"}), "build"),
])
def test_each_kind_of_change_is_named(edit, kind):
    after = _report()
    edit(after)
    changes = compare(_report(), after)
    assert [c["kind"] for c in changes] == [kind]


def test_something_new_is_no_change_but_is_recorded():
    after = _report(replays={"repro-a": {"newest:pkg": "reproduced"},
                             "repro-b": {"newest:pkg": "reproduced"}})
    assert compare(_report(), after) == []


def test_the_state_round_trips_and_a_foreign_file_is_refused(tmp_path):
    r = _report()
    assert WatchReport.from_json(json.loads(json.dumps(r.to_json()))) == r
    with pytest.raises(ValueError, match="not a release-watch state"):
        WatchReport.from_json({"format": "something else"})


def test_the_saved_reproducers_are_found():
    found = reproducer_dirs(shipped("reproducers"))
    assert len(found) >= 6 and all((d / "repro.rpct").is_file() for d in found)


@pytest.mark.realpeer
def test_a_real_watch_is_its_own_baseline_and_sees_a_planted_change(tmp_path):
    m = yaml.safe_load(default_matrix().read_text())
    m["releases"]["peers"] = ["p7", "p8"]
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(yaml.safe_dump(m))
    repros = tmp_path / "repros"
    for name in ("p8-crash-graph_compute-5b517a6f", "p7-crash-get_tensor-671d0589"):
        shutil.copytree(shipped("reproducers") / name, repros / name)
    # the catalogue walk stands for the whole sweep here: the mechanics are the same, the
    # sweep's phases against real builds are tests/test_phases_real.py's
    cfg = WatchConfig(out=tmp_path / "w1", matrix_file=matrix, sessions=20, seed=3,
                      reproducers=repros, packages=("llama-cpp-py-sync",),
                      phases=("catalogue",))
    first, code = run_watch(cfg, say=lambda _: None)
    assert first.baseline and first.changes == []
    assert code == 0, first.problems
    assert first.newest == {"newest:llama-cpp-py-sync": "p8"}  # the pin is the newest wheel
    assert first.verdicts["p7|newest:llama-cpp-py-sync"]["outcome"] == \
        "rejected-at-hello by client"
    assert first.replays == {"p8-crash-graph_compute-5b517a6f": {"newest:llama-cpp-py-sync":
                                                                  "reproduced"},
                             "p7-crash-get_tensor-671d0589": {"newest:llama-cpp-py-sync":
                                                               "no failure"}}
    from harness.fuzz.sweep import size as sweep_size
    assert first.differential["newest:llama-cpp-py-sync"]["cases"] == \
        sweep_size("8.0.0", only=("catalogue",)) + 20
    live = first.fuzz["newest:llama-cpp-py-sync"]
    assert live["cases"] >= sweep_size("8.0.0", only=("catalogue",)), live
    assert "live sweep findings" in (tmp_path / "w1" / "watch.md").read_text()

    # the last run saw other answers: the watch names exactly those and fails
    planted = copy.deepcopy(first.to_json())
    planted["verdicts"]["p7|newest:llama-cpp-py-sync"]["outcome"] = "works"
    planted["replays"]["p7-crash-get_tensor-671d0589"]["newest:llama-cpp-py-sync"] = "reproduced"
    planted["differential"] = {}  # not compared: its sessions may find what the last did not
    planted["fuzz"]["newest:llama-cpp-py-sync"]["findings"].append("crash-planted-00000000")
    state = tmp_path / "state.json"
    state.write_text(json.dumps(planted))
    second, code = run_watch(WatchConfig(**{**cfg.__dict__, "out": tmp_path / "w2",
                                            "state": state}), say=lambda _: None)
    assert code == 1 and not second.baseline
    assert sorted((c["kind"], c["key"]) for c in second.changes) == [
        ("fuzz", "newest:llama-cpp-py-sync"),
        ("replay", "p7-crash-get_tensor-671d0589 @ newest:llama-cpp-py-sync"),
        ("verdict", "p7|newest:llama-cpp-py-sync")]
    assert "3 change(s)" in (tmp_path / "w2" / "watch.md").read_text()
