"""Oracles beyond death (harness/fuzz/oracles.py): each planted reference-server bug is found
by a short campaign as exactly one finding of its kind, named after the right command,
minimised, and its reproducer replays; the honest reference server gives none of them."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest

from harness.fuzz.campaign import CampaignConfig, run_campaign
from harness.fuzz.case import annotate, step
from harness.fuzz.oracles import (ANY_FRAME, KINDS, SERIAL_NOTE, OracleLimits, case_cost,
                                  held_variant, open_frame_step, written)
from harness.fuzz.replay import load, replay
from harness.fuzz.report import DEFAULT_MIN_MESSAGES, campaign_problems
from harness.strategies import hello_request_frame
from harness.reference.knobs import parse_knobs
from harness.proto import get_dialect
from harness.proto.codec import pack_request
from harness.proto.messages import (AllocBufferRequest, GetAlignmentRequest, GetTensorRequest,
                                     SetTensorRequest)
from harness.proto.tensor import RpcTensor

from shared_campaigns import HONEST_REF_ORACLES
from test_realclient_support import realpeer, require_peer_dir

slow = pytest.mark.slow
D7 = get_dialect("7.0.0")
# 1 Mi x each upload, 256 MiB per connection at most: any upload of 16 bytes or more passes
# the tests' 16 MiB floor, so the random phase finds it seconds after the sweep (64 Ki x was
# found at 25 s of a 30 s campaign, and on a busier CI machine not at all)
PLANTED_AMPLIFICATION = "ref:amplify_set_tensor=1048576"


def _case(*msgs) -> "annotate":
    steps = [step(hello_request_frame(D7), "HELLO")]
    steps += [step(pack_request(D7, m), m.cmd.value) for m in msgs]
    return annotate(D7, tuple(steps))


def _upload(n: int, flag: int) -> SetTensorRequest:
    t = RpcTensor.null()
    return SetTensorRequest(tensor=t, cache_flag=flag, offset=0, data=b"\x01" * n)


# ---------------------------------------------------------------- units

def test_case_cost_counts_bytes_buffers_and_flagged_uploads():
    case = _case(AllocBufferRequest(0, 4096), _upload(100, 1), _upload(50, 0))
    cost = case_cost(case)
    assert cost.bytes == sum(len(s.frame) for s in case.steps)
    assert cost.alloc == 4096
    assert (cost.uploads, cost.upload_bytes) == (1, 100)  # the unflagged one may not be filed
    assert case_cost(case, 2).uploads == 0  # only what was sent counts
    # Before proto 7 there is no flag: every upload may be filed.
    d6 = get_dialect("6.0.0")
    old = annotate(d6, (step(hello_request_frame(d6), "HELLO"),) + tuple(
        step(pack_request(d6, m), m.cmd.value) for m in (_upload(10, 0), _upload(20, 0))))
    assert (case_cost(old).uploads, case_cost(old).upload_bytes) == (2, 30)


def test_identical_flagged_uploads_justify_one_cache_file():
    # planted: the cache is content-addressed, so ten flagged uploads of the same bytes make
    # one file; counted as ten, they hid nine files written for uploads that never asked
    same = _case(*[_upload(100, 1)] * 10, _upload(60, 0))
    cost = case_cost(same)
    assert (cost.uploads, cost.upload_bytes) == (1, 100)
    total = case_cost(_case(_upload(100, 1)))
    total.add(cost)
    total.add(case_cost(_case(_upload(40, 1))))
    assert (total.uploads, total.upload_bytes) == (2, 140)
    # a payload cut short is not filed: it justifies nothing
    cut = _case(_upload(100, 1))
    cut = cut.with_steps(cut.steps[:-1] + (step(cut.steps[-1].frame[:-10], "SET_TENSOR"),))
    assert case_cost(cut).uploads == 0


def test_held_variant_cuts_one_frame_and_leaves_it_open():
    case = _case(GetAlignmentRequest(0), AllocBufferRequest(0, 64))
    rng = random.Random(1)
    seen = set()
    for _ in range(50):
        held = held_variant(case, rng)
        if held is None:
            continue
        assert held.open_ended and held.protocol_error_at is None
        at = open_frame_step(held)
        assert at == len(held.steps) - 1 and held.steps[at].mutated
        assert len(held.steps[at].frame) < len(case.steps[at].frame)
        seen.add(held.steps[at].cmd)
    assert len(seen) >= 2
    assert open_frame_step(case) is None  # every frame complete


def test_cache_writes_count_rewrites_of_the_same_entry():
    before = {"a": (1, 10, 4), "b": (2, 10, 8)}
    assert written(before, dict(before)) == (0, 0)
    assert written(before, {**before, "a": (1, 11, 4)}) == (1, 4)  # rewritten in place
    assert written(before, {**before, "c": (3, 12, 16)}) == (1, 16)


def test_knob_values_and_limits_round_trip():
    k = parse_knobs(["spin_on=GET_ALLOC_SIZE", "spin_seconds=0.75", "amplify_set_tensor=8"])
    assert (k.spin_on, k.spin_seconds, k.amplify_set_tensor) == ("GET_ALLOC_SIZE", 0.75, 8)
    lim = OracleLimits(cache=True, fd_growth=3)
    assert OracleLimits.from_json(json.loads(json.dumps(lim.to_json()))) == lim
    assert OracleLimits.from_json({"unknown": 1}) == OracleLimits()


# ---------------------------------------------------------------- planted bugs, end to end

def _campaign(tmp_path, target: str, oracles: dict, duration: float = 30, seed: int = 5):
    out, report = run_campaign(CampaignConfig(target=target, duration=duration, seed=seed,
                                              out=tmp_path / "c", shrink_seconds=15,
                                              oracles=oracles))
    assert not report["errors"], report["errors"]
    return out, report


def _the_one(report: dict, kind: str, command: str, max_steps: int) -> dict:
    kinds = [f["signature"]["kind"] for f in report["findings"]]
    assert kinds == [kind], json.dumps([f["title"] for f in report["findings"]], indent=1)
    f = report["findings"][0]
    assert f["signature"]["command"] == command, f["title"]
    assert f["confirmed"] and f["minimised"] and f["replays"], f
    assert f["steps"] <= max_steps, f["listing"]
    return f


@slow
def test_amplification_is_found_once_in_set_tensor(tmp_path):
    out, report = _campaign(tmp_path, PLANTED_AMPLIFICATION, {"amplification_floor": 16 << 20})
    f = _the_one(report, "amplification", "SET_TENSOR", 5)
    # `harness replay` reproduces it from the folder alone (thresholds in finding.json).
    proc = subprocess.run([sys.executable, "-m", "harness", "replay",
                           str(out / "crashes" / f["id"]), "--target", PLANTED_AMPLIFICATION],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "REPRODUCED" in proc.stdout
    # The honest reference server does not grow for the same bytes.
    assert not replay(out / "crashes" / f["id"], "ref").reproduced


@slow
def test_freeze_is_found_once_and_generalised_to_any_frame(tmp_path):
    out, report = _campaign(tmp_path, "ref:freeze_mid_frame=true", {})
    f = _the_one(report, "freeze", ANY_FRAME, 3)
    # held mid-frame: by the oracle's own cut, or by a framing mutation that leaves the stream
    # inside a frame (the sweep's trailing garbage: a partial header, then silence)
    assert "held-open" in f["listing"][-1] or "<- framing:" in f["listing"][-1], f["listing"]
    assert "concurrently" in report["oracles"]["notes"]["freeze"]
    assert replay(out / "crashes" / f["id"], "ref:freeze_mid_frame=true").reproduced


@slow
def test_cache_file_per_upload_is_found_once(tmp_path):
    out, report = _campaign(tmp_path, "ref:cache_every_upload=true", {"cache": True})
    f = _the_one(report, "cache", "SET_TENSOR", 5)
    assert "0 upload(s) with cache_flag set" in f["detail"]
    assert replay(out / "crashes" / f["id"], "ref:cache_every_upload=true").reproduced
    assert not replay(out / "crashes" / f["id"], "ref").reproduced  # cache_flag is 0


@slow
def test_fd_leak_per_connection_is_found_once(tmp_path):
    out, report = _campaign(tmp_path, "ref:leak_fd_per_connection=true", {})
    f = _the_one(report, "fd-leak", "connection", 1)
    assert replay(out / "crashes" / f["id"], "ref:leak_fd_per_connection=true").reproduced
    assert not replay(out / "crashes" / f["id"], "ref").reproduced


@slow
def test_spin_is_found_once_in_its_command(tmp_path):
    target = "ref:spin_on=GET_ALLOC_SIZE,spin_seconds=1.0"
    out, report = _campaign(tmp_path, target, {"spin_seconds": 0.5})
    f = _the_one(report, "spin", "GET_ALLOC_SIZE", 3)
    assert replay(out / "crashes" / f["id"], target).reproduced


@slow
def test_honest_reference_server_gives_no_oracle_finding(honest_reference_campaign):
    # Every oracle on, the cache too, floors low enough that the planted bugs are found.
    _, report = honest_reference_campaign
    assert report["oracles"]["limits"] == {**OracleLimits().to_json(), **HONEST_REF_ORACLES}
    _assert_it_fuzzed(report)
    assert report["nothing_found"], [f["title"] for f in report["findings"]]
    # Serial by design: one note, no findings (the freeze oracle does not apply).
    assert report["oracles"]["notes"]["freeze"] == SERIAL_NOTE


def _assert_it_fuzzed(report: dict) -> None:
    """A campaign that sent nothing found nothing: no evidence of an honest server."""
    assert not campaign_problems(report), report["problems"]
    assert report["messages_sent"] >= DEFAULT_MIN_MESSAGES and report["cases"] > 0, \
        (report["messages_sent"], report["cases"])
    assert report["coverage"]["mutations_exercised"] > 0


def test_a_campaign_that_sent_nothing_is_no_evidence_of_honesty():
    """Planted: the report of a campaign that exchanged nothing passes every assertion the
    honest-server test made before, and fails the one it makes now."""
    silent = {"messages_sent": 0, "cases": 0, "findings": [], "nothing_found": True,
              "errors": [], "target_kind": "ref", "workers_never_listened": [],
              "duration_s": 20, "coverage": {"mutations_exercised": 0},
              "oracles": {"notes": {"freeze": SERIAL_NOTE}}}
    silent["problems"] = campaign_problems(silent)
    assert silent["nothing_found"] and silent["oracles"]["notes"]["freeze"] == SERIAL_NOTE
    with pytest.raises(AssertionError):
        _assert_it_fuzzed(silent)


@slow
@realpeer
def test_real_7_gives_no_oracle_finding(real_7_campaign):
    out, report = real_7_campaign
    assert report["oracles"]["limits"]["cache"]
    new = [f for f in report["findings"] if f["signature"]["kind"] in KINDS]
    # The one true positive p7 has: it allocates (and zero-fills) the length a frame
    # announces before receiving it, so a header announcing GBs makes it grow by GBs. Such a
    # finding must be a case that ends mid-frame (held open, or cut by the client's EOF: the
    # peak counts) and replays; the reference server grows nothing.
    for f in new:
        assert f["signature"]["kind"] == "amplification", f["title"]
        case, _, _ = load(out / "crashes" / f["id"])
        assert (case.open_ended or case.steps[-1].eof) and f["replays"], f["listing"]
        assert not replay(out / "crashes" / f["id"], "ref").reproduced
    assert report["oracles"]["notes"]["freeze"] == SERIAL_NOTE


@realpeer
def test_memory_given_back_before_any_sample_still_counts(tmp_path, monkeypatch):
    """p7 allocates and zero-fills the payload a SET_TENSOR header announces before reading
    it, and frees it when the client hangs up mid-frame: the RSS samples see nothing, the
    case's peak (the kernel's high-water mark) sees 512 MiB for a few dozen bytes."""
    from harness.fuzz.oracles import OracleLimits, Oracles
    from harness.fuzz.shrink import save_reproducer
    from harness.fuzz.signature import Signature
    require_peer_dir()
    head = bytes([D7.id_of(SetTensorRequest.cmd)]) + (512 << 20).to_bytes(8, "little")
    steps = (step(hello_request_frame(D7), "HELLO"),
             step(head + bytes(24), "SET_TENSOR", eof=True))
    case = annotate(D7, steps)
    folder = tmp_path / "f"
    save_reproducer(folder, signature=Signature("amplification", "", "resident memory grew far "
                    "beyond what the connection sent and asked for", "SET_TENSOR"), case=case,
                    outcome=None, target="p7", dialect="7.0.0")
    found = replay(folder, "p7")
    assert found.reproduced, found.summary()
    assert "SET_TENSOR" in found.observed.command
    # Zeroing the memory is also CPU (2.3 s of it on a loaded CI machine): with a CPU bound
    # it certainly passes, the finding is still the memory, its cause.
    found = replay(folder, "p7", oracles={**OracleLimits().to_json(), "spin_seconds": 0.01})
    assert found.reproduced, found.summary()
    # Planted fault: the samples alone (no peak) miss it.
    monkeypatch.setattr(Oracles, "_peak_rss", lambda self: None)
    assert not replay(folder, "p7").reproduced


@realpeer
def test_a_peak_above_the_rss_bound_is_a_memory_finding_though_no_sample_saw_it(tmp_path,
                                                                             monkeypatch):
    """The same with 1.5 GiB announced: the peak passes the 1 GiB RSS bound for a moment."""
    from harness.fuzz.shrink import save_reproducer
    from harness.fuzz.target import Target
    from harness.fuzz.signature import Signature
    require_peer_dir()
    head = bytes([D7.id_of(SetTensorRequest.cmd)]) + (3 << 29).to_bytes(8, "little")
    case = annotate(D7, (step(hello_request_frame(D7), "HELLO"),
                         step(head + bytes(24), "SET_TENSOR", eof=True)))
    folder = tmp_path / "f"
    save_reproducer(folder, signature=Signature("memory", "", "resident memory above the bound",
                                                "SET_TENSOR"), case=case, outcome=None,
                    target="p7", dialect="7.0.0")
    # the samples are blinded, so the peak alone must find it (whether a sample catches the
    # moment depends on the machine's load: a clean-clone CI run's samples did)
    monkeypatch.setattr(Target, "rss", lambda self: None)
    found = replay(folder, "p7")
    assert found.reproduced and found.observed.kind == "memory", found.summary()
    monkeypatch.setattr(Target, "peak_rss", lambda self: None)  # planted: the peak unread
    assert not replay(folder, "p7").reproduced


@realpeer
def test_a_server_busy_past_the_deadline_is_late_not_stopped(tmp_path, monkeypatch):
    """p7 zeroes the 1.75 GiB a SET_TENSOR prefix announces before reading the payload and
    frees it when the client hangs up: over a second on the CPU before it serves the next
    client, past a 0.05 s deadline. It did serve it: the verdict says late (naming the
    prefix), not 'stopped serving'; a server neither answering nor working is stopped."""
    import harness.fuzz.target as target_mod
    from harness.fuzz.case_runner import CaseRunner
    from harness.fuzz.target import Target
    from harness.fuzz.target_spec import TargetSpec
    require_peer_dir()
    head = bytes([D7.id_of(SetTensorRequest.cmd)]) + (7 << 28).to_bytes(8, "little")
    case = annotate(D7, (step(hello_request_frame(D7), "HELLO"),
                         step(head + bytes(24), "SET_TENSOR")))  # we hang up, no EOF wait
    # bounds far above the 1.75 GiB (under the reference's 2 GiB payload bound), so the
    # memory oracle does not answer first
    target = Target(TargetSpec.parse("p7", None), tmp_path / "w", as_limit=6 << 30,
                    rss_limit=5 << 30)
    target.start()
    try:
        # 0.05 s: zeroing 1.75 GiB takes longer even on a quiet machine with warm huge pages
        # (0.06 s at best, measured); at 0.2 s a quiet machine could serve in time
        runner = CaseRunner(target, deadline=0.05)
        verdict, _ = runner.check(case)
        assert verdict is not None and verdict.signature.kind == "hang", verdict
        assert verdict.signature.line == ("server busy past the deadline before it served a "
                                          "new connection after a length prefix over 1 GiB")
        assert "answered after" in verdict.detail
        # planted: working is never enough (the old probe: one deadline, then 'stopped', or
        # the SIGPIPE death of answering the probe it closed, whichever the runner sees first)
        monkeypatch.setattr(target_mod, "BUSY_SHARE", 1e9)
        verdict, _ = runner.check(case)
        assert verdict is not None and "busy past" not in verdict.signature.line, verdict
    finally:
        target.stop()


def test_memory_settles_only_while_a_request_may_still_be_running(monkeypatch):
    """An isolated check waits for the RSS to settle only when the server may still be
    working on the case: its last request unanswered and the connection open. Answered or
    closed, one sample is the settled value (the wait was half of a campaign's minimising)."""
    from harness.fuzz import oracles as oracles_mod
    from harness.fuzz.execute import CLOSED, OK, Outcome
    hello = step(hello_request_frame(D7), "HELLO")
    align = step(pack_request(D7, GetAlignmentRequest(device=0)), "GET_ALIGNMENT")
    upload = step(bytes([D7.id_of(SetTensorRequest.cmd)]) + (64).to_bytes(8, "little")
                  + bytes(64), "SET_TENSOR")
    answered = annotate(D7, (hello, align))
    unanswered = annotate(D7, (hello, upload))
    assert oracles_mod._caught_up(answered, Outcome(OK, progress=2))
    assert oracles_mod._caught_up(unanswered, Outcome(CLOSED, progress=1))
    assert not oracles_mod._caught_up(unanswered, Outcome(OK, progress=2))
    assert not oracles_mod._caught_up(answered, Outcome(OK, progress=1))

    class Counting(oracles_mod.Oracles):
        settles = 0

        def __init__(self):  # only what during() reads
            self.limits, self.local, self._rss_during = OracleLimits(), True, None

        def _settled_rss(self):
            Counting.settles += 1
            return 1

        def _rss(self):
            return 1

    o = Counting()
    o.during(answered, Outcome(OK, progress=2), isolated=True)
    assert Counting.settles == 0
    o.during(unanswered, Outcome(OK, progress=2), isolated=True)
    assert Counting.settles == 1
    # planted: every check settles again
    monkeypatch.setattr(oracles_mod, "_caught_up", lambda case, out: False)
    o.during(answered, Outcome(OK, progress=2), isolated=True)
    assert Counting.settles == 2


def test_every_frame_written_counts_toward_what_justifies_a_cache_file():
    """A pipelined case whose end was pinned before its last upload: the server may have read
    and cached that upload (CI run 16: a cache_flag=255 SET_TENSOR at step 16 cached by real
    p7, its case's end pinned earlier). Planted: counting only up to the pinned step."""
    from harness.fuzz import oracles
    from harness.fuzz.execute import CLOSED, Outcome
    from harness.fuzz.case import annotate, step
    from harness.proto import get_dialect, pack_request
    from harness.proto import messages as m
    from harness.proto.tensor import RpcTensor
    from harness import strategies as rst
    d = get_dialect("7.0.0")
    t = RpcTensor.make(id=1, type=0, ne=(64,), buffer=0x1000, data=0x1000)
    case = annotate(d, (step(rst.hello_request_frame(d), "HELLO"),
                        step(pack_request(d, m.GetAlignmentRequest(0)), "GET_ALIGNMENT"),
                        step(pack_request(d, m.SetTensorRequest(t, 255, 0, bytes(256))),
                             "SET_TENSOR")))
    out = Outcome(CLOSED, at=1, frames_sent=3)
    assert oracles.case_cost(case, oracles._sent(case, out)).uploads == 1
    assert oracles.case_cost(case, min(out.at + 1, 3)).uploads == 0  # the old count


def _upload_then_read() -> "annotate":
    """HELLO, a buffer, a valid 256-byte SET_TENSOR into it, then a valid GET_TENSOR and a
    GET_ALIGNMENT, both answered after the upload."""
    from harness.fuzz import generate as gen
    model = gen._Model()
    steps = [step(hello_request_frame(D7), "HELLO")] + gen._alloc_steps(4096, D7, model)
    region = model.regions[0]
    t = RpcTensor.make(id=model.new_id(), type=0, ne=(64, 1, 1, 1)).with_(
        buffer=region.handle, data=region.base)
    steps += [step(pack_request(D7, SetTensorRequest(tensor=t, offset=0, data=b"\x01" * 256)),
                   "SET_TENSOR"),
              step(pack_request(D7, GetTensorRequest(t, 0, 256)), "GET_TENSOR"),
              step(pack_request(D7, GetAlignmentRequest(0)), "GET_ALIGNMENT")]
    return annotate(D7, tuple(steps))


def test_amplification_is_named_after_and_cut_to_the_step_that_allocated(tmp_path,
                                                                          monkeypatch):
    """The planted SET_TENSOR hoard is kept for the connection, so the two answered requests
    after it are in the window a death is named from; the finding names the upload and its
    reproducer ends there (CI run 27 filed this bug a second time as GET_TENSOR)."""
    from harness.fuzz.case_runner import CaseRunner
    from harness.fuzz.oracles import Oracles
    from harness.fuzz.target import Target
    from harness.fuzz.target_spec import TargetSpec
    case = _upload_then_read()
    target = Target(TargetSpec.parse(PLANTED_AMPLIFICATION, None), tmp_path / "w")
    target.start()
    try:
        runner = CaseRunner(target, oracles=Oracles(target, OracleLimits()))
        for lockstep in (False, True):
            found, out = runner.check(case, lockstep=lockstep, record=True)
            assert found is not None and found.signature.kind == "amplification", found
            assert found.signature.command == "SET_TENSOR", found.signature
            assert [s.cmd for s in found.case.steps][-2:] == ["BUFFER_GET_BASE", "SET_TENSOR"]
            assert out is found.outcome and out.log  # the cut case's own run, recorded
        # planted: the name of a death (the window since the last answer)
        monkeypatch.setattr(CaseRunner, "_pin_growth", lambda self, found, **kw: found)
        found, _ = runner.check(case, lockstep=True)
        assert found.signature.command == "GET_ALIGNMENT" and found.case is case
    finally:
        target.stop()
