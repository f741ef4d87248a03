"""Differential fuzzing: two servers, the same sessions, every difference a finding.

The planted difference is a reference-server knob that changes one answer
(``claim_cache_hit``: SET_TENSOR_HASH answered 1 without the data): it must come out as
exactly one finding, minimised, that replays against the planted pair only."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from harness.fuzz.case import annotate, step
from harness.fuzz.allow_list import load_allow
from harness.fuzz.differential import (DifferentialConfig, _Pair, replay_differential,
                                       run_differential)
from harness.fuzz.divergence import compare
from harness.fuzz.errors import DifferentialError
from harness.fuzz.execute import CLOSED, OK, Outcome
from harness.proto import get_dialect, pack_request
from harness.proto import messages as m
from harness import strategies as rst

D7 = get_dialect("7.0.0")
LABELS = ("a", "b")


def _case():
    return annotate(D7, (step(rst.hello_request_frame(D7), "HELLO"),
                         step(pack_request(D7, m.AllocBufferRequest(0, 1024)), "ALLOC_BUFFER"),
                         step(pack_request(D7, m.GetAlignmentRequest(0)), "GET_ALIGNMENT")))


def _run(*answers: bytes, status=OK, at=None) -> tuple[None, Outcome]:
    s2c = b"".join(len(a).to_bytes(8, "little") + a for a in answers)
    return None, Outcome(status, at=at, proven=len(answers), log=[("s2c", 0.0, s2c)])


HELLO = bytes([7, 0, 0])


def test_pointers_are_renamed_and_the_first_differing_answer_named():
    case = _case()
    a = _run(HELLO, (0x55AA_0000).to_bytes(8, "little") + (1024).to_bytes(8, "little"),
             (32).to_bytes(8, "little"))
    b = _run(HELLO, (0x7F00_1234).to_bytes(8, "little") + (1024).to_bytes(8, "little"),
             (32).to_bytes(8, "little"))
    assert compare(case, [a, b], LABELS, []) is None  # handles differ: renamed away
    failed = _run(HELLO, bytes(16), (32).to_bytes(8, "little"))  # allocation failed on b
    div = compare(case, [a, failed], LABELS, [])
    assert div.signature.command == "ALLOC_BUFFER" and div.step == 1
    other = _run(HELLO, bytes(16), (64).to_bytes(8, "little"))
    assert compare(case, [failed, other], LABELS, []).signature.command == "GET_ALIGNMENT"
    allow = [{"cmd": "GET_ALIGNMENT", "kind": "answer", "bytes": [0, 8]}]
    used: list[dict] = []
    assert compare(case, [failed, other], LABELS, allow, used) is None
    assert used == allow  # the entry that let it pass is named (the report counts them)
    assert compare(case, [a, b], LABELS, allow, used := []) is None and used == []


def test_close_points_differ():
    case = _case()
    a = _run(HELLO, bytes(16), (32).to_bytes(8, "little"))
    b = _run(HELLO, status=CLOSED, at=1)
    div = compare(case, [a, b], LABELS, [])
    assert div.signature.command == "ALLOC_BUFFER" and "close point" in div.signature.line
    assert compare(case, [a, b], LABELS, [{"cmd": "ALLOC_BUFFER", "kind": "close"}]) is None


def test_a_close_by_reset_is_judged_again_in_lockstep():
    """A reset discards answers the client had not read: a pipelined run may show a close a
    step early. The pair runs such a case again in lockstep and judges that run."""
    case = _case()
    both = _run(HELLO, bytes(16), (32).to_bytes(8, "little"))
    early = _run(HELLO, status=CLOSED, at=1)
    early[1].detail = "reset"
    pair = object.__new__(_Pair)
    pair.labels = LABELS
    calls = []

    def run(c, *, lockstep=False):
        calls.append(lockstep)
        return [both, both if lockstep else early]
    pair.run = run
    assert pair.judge(case, [])[0] is None and calls == [False, True]
    calls.clear()  # planted: the lockstep run shows the early close too
    pair.run = lambda c, *, lockstep=False: calls.append(lockstep) or [both, early]
    div, _ = pair.judge(case, [])
    assert "close point" in div.signature.line and calls == [False, True]
    calls.clear()  # a close by FIN is not timing: no second run
    early[1].detail = "eof"
    assert pair.judge(case, [])[0] is not None and calls == [False]


def test_allow_list_files(tmp_path):
    good = tmp_path / "allow.yaml"
    good.write_text("- cmd: HELLO\n  bytes: [3, 4]\n  reason: 7.0.0+flags byte 3\n")
    entries = load_allow(good)
    assert entries[-1] == {"kind": "answer", "cmd": "HELLO", "bytes": [3, 4],
                           "reason": "7.0.0+flags byte 3"}
    for bad in ("cmd: HELLO\n", "- kind: answer\n", "- cmd: HELLO\n  bytes: [3]\n",
                "- cmd: HELLO\n  kind: sometimes\n"):
        good.write_text(bad)
        with pytest.raises(DifferentialError):
            load_allow(good)


@pytest.mark.slow
def test_a_planted_difference_is_one_minimised_finding_that_replays(tmp_path):
    planted = "ref:claim_cache_hit=true"
    out, report = run_differential(DifferentialConfig(a="ref", b=planted, duration=15, seed=2,
                                                      out=tmp_path / "d", shrink_seconds=20))
    assert not report["errors"] and not report["problems"], report
    # One answer difference; the same lie ("hit" for a tensor outside every buffer) is also
    # what the bounds oracle calls an accepted out-of-bounds write, on the planted side only.
    (f,) = [f for f in report["findings"] if f["signature"]["line"].startswith("answer differs")]
    assert all(g["signature"]["command"] == "SET_TENSOR_HASH" for g in report["findings"])
    assert all("claim_cache_hit=true: accepted-out-of-bounds" in g["detail"]
               for g in report["findings"] if g is not f), report["findings"]
    assert f["steps"] <= 2, f["listing"]  # HELLO + SET_TENSOR_HASH
    assert f["replays_on_fresh_targets"] is True, f
    folder = out / "divergences" / f["id"]
    assert {p.name for p in folder.iterdir()} >= {"repro.rpct", "a.rpct", "b.rpct",
                                                  "finding.json"}
    assert replay_differential(folder / "repro.rpct", "ref", planted) is not None
    assert replay_differential(folder / "repro.rpct", "ref", "ref") is None
    # The same through the CLI: exit 1 = reproduced, 0 = the two agree.
    proc = subprocess.run([sys.executable, "-m", "harness", "replay", str(folder),
                           "--differential", "ref", planted], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1 and "REPRODUCED" in proc.stdout, proc.stdout + proc.stderr
    assert json.loads((folder / "finding.json").read_text())["replay"].endswith(
        f"--differential ref {planted}")
    # An allow-list that covers it: not reproduced, and the entry that let it pass is named
    (tmp_path / "allow.yaml").write_text(
        "- cmd: SET_TENSOR_HASH\n  kind: answer\n  reason: the planted cache claim\n")
    used: list[dict] = []
    assert replay_differential(folder / "repro.rpct", "ref", planted,
                               allow=tmp_path / "allow.yaml", used=used) is None
    assert [e["reason"] for e in used] == ["the planted cache claim"]
    proc = subprocess.run([sys.executable, "-m", "harness", "replay", str(folder),
                           "--differential", "ref", planted, "--allow",
                           str(tmp_path / "allow.yaml")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and "differ only as the allow-list allows" in proc.stdout \
        and "the planted cache claim" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.slow
def test_identical_servers_do_not_diverge(tmp_path):
    out, report = run_differential(DifferentialConfig(a="ref", b="ref-7.0.0", duration=8,
                                                      seed=3, out=tmp_path / "d"))
    assert report["nothing_found"] and report["cases"] > 20, report["findings"]


def test_the_sweeps_divergences_are_minimised_after_it(tmp_path, monkeypatch):
    """A divergence the deterministic phases find is minimised once they are done: a minimiser
    inside them spent their share of the duration (a 10-minute p8 differential's sweep fell
    two cases short after a 70 s minimisation in its scale part)."""
    import harness.fuzz.differential as differential
    real_minimise, real_sweep = differential._minimise_and_save, differential.sweep_cases
    swept, during = [], []

    def sweep_cases(*a, **k):
        yield from real_sweep(*a, **k)
        swept.append(True)

    def minimise(*a, **k):
        during.append(not swept)
        return real_minimise(*a, **k)
    monkeypatch.setattr(differential, "sweep_cases", sweep_cases)
    monkeypatch.setattr(differential, "_minimise_and_save", minimise)
    _, report = run_differential(DifferentialConfig(
        a="ref", b="ref:claim_cache_hit=true", duration=60, seed=2, out=tmp_path / "d",
        shrink_seconds=2, sweep_only=True, phases=("catalogue",)))
    assert report["sweep"]["complete"] and report["findings"], report["sweep"]
    assert during and not any(during), during
