"""The RDMA fuzzer's cases and SEND-plan registry, without a device (fast)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings

from harness.fuzz.rdma import plans as p
from harness.fuzz.rdma.campaign import _legal_verdict, plan_coverage
from harness.proto.constants import RDMA_CHUNK

SETTINGS = settings(max_examples=60, deadline=None)


@SETTINGS
@given(p.rdma_cases())
def test_every_case_covers_its_stream_and_round_trips(case):
    assert sum(case.writes) == len(case.stream) and all(w > 0 for w in case.writes)
    assert p.RdmaCase.from_json(case.to_json()) == case
    assert p.has_probe(case) and len(p.expected_probe(case)) == p.response_sizes(case)[-1][0]
    # one device on the fuzzed servers: every device field is 0 (the u32 after the length)
    assert all(s.frame[9:13] == bytes(4) for s in case.requests
               if s.cmd in ("GET_ALIGNMENT", "GET_MAX_SIZE", "GET_DEVICE_MEMORY", "GET_ALLOC_SIZE"))
    kept = p.with_requests(case, list(range(1, len(case.requests))))
    assert sum(kept.writes) == len(kept.stream)


def test_a_registered_plan_is_catalogued_drawn_and_covered():
    @p.send_plan("test-halves")
    def _(draw, frames):
        """Two halves."""
        n = sum(map(len, frames))
        return [n // 2, n - n // 2], {"slots": 2}
    try:
        assert {"what": "test-halves", "doc": "Two halves."} in p.plan_catalogue()

        @settings(max_examples=5, deadline=None)
        @given(p.rdma_cases(plans=("test-halves",)))
        def drawn(case):
            assert case.plan == {"what": "test-halves"} and case.slots == 2
            assert len(case.writes) == 2
        drawn()
        cov = plan_coverage(Counter({"test-halves": 3}), {})
        assert cov["command_field"]["SEND plan"]["test-halves"] == 3
        assert "test-halves" not in cov["missing"] and "ragged" in cov["missing"]
        with pytest.raises(ValueError):
            p.send_plan("test-halves")(lambda draw, frames: None)
    finally:
        p.unregister("test-halves")


def _probe_case(writes_of, **kw):
    reqs = tuple(p.probe_steps(3000, 1))
    stream = b"".join(s.frame for s in reqs)
    return p.RdmaCase(requests=reqs, writes=tuple(writes_of(stream)), plan={"what": "t"}, **kw)


def test_the_emulation_locates_the_first_misfit_send():
    ok = _probe_case(p.read_calls)
    assert p.first_misfit(ok) == ("t", "")
    assert p.predict(ok) == {k: "intact" for k in p.RECEIVERS}
    one = _probe_case(lambda s: [len(s)])
    assert p.first_misfit(one) == ("cmd read", "SET_TENSOR")
    pred = p.predict(one)
    assert pred[p.OLD_RECEIVER].startswith("RDMA overrun") and \
        pred["7.0.0+flags (partial receive)"] == "intact"


def test_which_plans_a_correct_server_must_answer():
    assert _probe_case(p.read_calls).legal
    assert not _probe_case(p.read_calls, chunk=2 * RDMA_CHUNK).legal
    assert not _probe_case(p.read_calls, chunk=p.SMALL_RECV).legal
    assert not _probe_case(p.read_calls, starve=True).legal
    assert not _probe_case(p.read_calls, close_after=1).legal


def test_with_requests_cuts_the_plan_where_the_frames_were():
    reqs = tuple(p.probe_steps(10, 1))
    a, b = (len(s.frame) for s in reqs)
    case = p.RdmaCase(requests=reqs, writes=(a - 5, 10, b - 5), plan={"what": "t"},
                      close_after=3)
    only_get = p.with_requests(case, [1])
    assert only_get.writes == (5, b - 5) and only_get.close_after == 2


def test_legal_verdicts_name_the_class():
    case = _probe_case(lambda s: [len(s)])
    assert _legal_verdict(case, {"verdict": "ok"})[0] is None
    # named by the read 7.0.0 overruns first (every later answer waits the same way)
    kind, sig, detail = _legal_verdict(case, {"verdict": "hang", "stage": "answer to GET_TENSOR"})
    assert (kind, sig.command) == ("hang", "cmd read") and "SET_TENSOR's cmd read" in detail
    assert _legal_verdict(case, {"verdict": "wrong-data", "at": "GET_TENSOR",
                                 "why": "the probe read back differs"})[0] == "overrun"
    assert _legal_verdict(case, {"verdict": "closed"})[0] == "overrun"
    assert _legal_verdict(case, {"verdict": "rdma-error", "why": "x (wr_id 1)"})[1].line == "x"


def test_the_cli_refuses_rdma_soft_where_it_does_not_apply(tmp_path):
    from rich.console import Console
    from harness.fuzz.cli import fuzz_command, replay_command
    console = Console(file=open(tmp_path / "out.txt", "w"))
    common = dict(dialect=None, duration="1s", seed=1, workers=1, out=None, deadline=1,
                  rss_limit=0, as_limit=0, corpus=None, shrink_seconds=1, max_steps=4,
                  keep_work=False, transport="rdma-soft")
    assert fuzz_command(console, target="client:p7", **common) == 2
    assert fuzz_command(console, target=None, differential=("p7", "p8"), **common) == 2
    assert fuzz_command(console, target="p7", **dict(common, transport="carrier-pigeon")) == 2
    other = tmp_path / "x.json"
    other.write_text("{}")
    assert replay_command(console, other, target="p7", dialect=None, deadline=1,
                          transport="rdma-soft") == 2


def test_the_sweep_cuts_every_stream_command_with_every_plan_the_same_way_each_time():
    cases = p.sweep_cases()
    assert len(cases) == len(p.SEND_PLANS) * len(p.SWEEP_PROBES)
    assert {c.plan["what"] for c in cases} == set(p.SEND_PLANS)
    assert {c.requests[0].cmd for c in cases} == {x.value for x in p.STREAM_COMMANDS}
    sizes = {len(p.expected_probe(c)) for c in cases}
    assert {RDMA_CHUNK - 8, RDMA_CHUNK + 3} <= sizes
    for c in cases:
        assert sum(c.writes) == len(c.stream) and p.has_probe(c)
    assert [c.to_json() for c in p.sweep_cases()] == [c.to_json() for c in cases]
    assert [c.plan["what"] for c in p.sweep_cases(("ragged",))] == ["ragged"] * 3


def _sends(case) -> int:
    return sum(-(-w // case.chunk) for w in case.writes)


def test_cycled_sizes_stop_after_a_bounded_number_of_writes():
    # 1-2 byte sizes over a 600 KB stream: once 400,000 SENDs, minutes of soft-device round
    # trips past the worker's deadline (the CI failure of stop 27); now the rest is one write
    writes = p._cycle([1, 2], 600_000)
    assert sum(writes) == 600_000 and len(writes) == p.MAX_CYCLED_WRITES + 1
    assert p._cycle([7], 20) == [7, 7, 6]


@SETTINGS
@given(p.rdma_cases())
def test_no_case_makes_more_sends_than_the_bound(case):
    assert _sends(case) <= p.MAX_CYCLED_WRITES + 256, (case.plan, len(case.writes))


def test_no_sweep_case_makes_more_sends_than_the_bound():
    # the old sweep held a ragged case of 266,051 SENDs (the plans' old unbounded cycle)
    assert max(_sends(c) for c in p.sweep_cases()) <= p.MAX_CYCLED_WRITES + 256


def test_the_receivers_are_the_tables_receive_generations(monkeypatch):
    import dataclasses
    from harness.proto import dialects
    from harness.proto.behaviour import APP, PARTIAL, RdmaGeneration
    generations = {(d.rdma.recv_policy, d.rdma.read_calls) for d in dialects.DIALECTS.values()
                   if d.primary}
    assert {(v["recv_policy"], v["read_calls"]) for v in p.RECEIVERS.values()} == generations
    # a primary row with a receive generation of its own is predicted too
    row = dataclasses.replace(dialects.D900, name="9.9.0", version=(9, 9, 0), alias=None,
                              rdma=RdmaGeneration("app-reads", 1, PARTIAL, "writes", APP))
    monkeypatch.setitem(dialects.DIALECTS, row.name, row)
    assert p._receivers()["9.9.0 (partial receive)"] == {"recv_policy": PARTIAL, "read_calls": APP}
