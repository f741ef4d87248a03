"""comm-allreduce in matrix cells of reference peers: it passes on 9.0.0 servers, its sum
check fails on a planted wrong expectation, and it does not apply where COMM_* cannot run."""

from __future__ import annotations

import scenarios.comm_allreduce as comm_allreduce
from test_scenarios import one_design, run_one

REF9 = {"ref-9": {"kind": "ref", "proto": "9.0.0"}}
ALL_REF9 = {r: "ref-9" for r in ("old-client", "new-client", "old-server", "new-server")}


def _row(tmp_path, impls=REF9, roles=ALL_REF9, **extra) -> dict:
    data = one_design(impls, roles, ["comm-allreduce"])
    data.update(extra)
    return run_one(tmp_path, data)


def test_reference_9_cell_passes(tmp_path):
    row = _row(tmp_path)
    assert row["verdict"] == "pass" and row["observed"] == "works"
    # the scenario's four checks, then the wire evidence its verdict rests on
    assert all(c["ok"] for c in row["checks"]) and len(row["checks"]) == 4 + 4
    assert {c["name"] for c in row["checks"][4:]} == {
        "wire evidence: the client's connections reached the server",
        "wire evidence: every connection opened with HELLO",
        "wire evidence: COMM_INIT crossed the wire", "wire evidence: COMM_ALLREDUCE crossed the wire"}
    assert row["facts"]["max_error_4"] == 0.0 and row["facts"]["max_error_32768"] > 0


def test_a_wrong_expected_sum_fails_the_large_check(tmp_path, monkeypatch):
    monkeypatch.setattr(comm_allreduce, "_expected", lambda own, peer: own + peer)
    row = _row(tmp_path)
    failed = [c["name"] for c in row["checks"] if not c["ok"]]
    assert row["verdict"] == "fail" and failed == ["32768 elements: own values plus the peer's "
                                                   "bf16 values"]


def test_not_applicable_before_8_or_off_tcp(tmp_path):
    ref7 = {"ref-7": {"kind": "ref", "proto": "7.0.0"}}
    row = _row(tmp_path / "7", ref7, {r: "ref-7" for r in ALL_REF9})
    assert row["skip_code"] == "not-applicable" and "no COMM_* commands" in row["reason"]
    row = _row(tmp_path / "rdma", transports=["rdma-emu"])
    assert row["skip_code"] == "not-applicable" and "TCP" in row["reason"]
