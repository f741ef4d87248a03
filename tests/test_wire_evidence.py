"""Every verdict rests on wire evidence (harness/matrix/evidence.py): a scenario that reports
success without the traffic its verdict rests on fails its cell."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import scenarios  # noqa: F401 - registers the scenarios
from harness.data import default_matrix
from harness.matrix.cells import expand
from harness.matrix.execute import Timeouts, plan, run_cell
from harness.matrix.model import Matrix
from harness.scenario import SCENARIOS, WORKS, Observation, Scenario, scenario


def _ref_matrix() -> Matrix:
    m = yaml.safe_load(default_matrix().read_text())
    m["designs"] = {"refs": {"transports": ["tcp"], "roles": {
        "old-client": "ref-7", "new-client": "ref-7", "old-server": "ref-7",
        "new-server": "ref-7"}}}
    m["expectations"] = [{"outcome": "works", "because": "same dialect"}]
    m["cache_options"] = {}
    m.pop("releases")
    return Matrix.model_validate(m)


def _cell(matrix: Matrix, name: str, tmp_path: Path) -> dict:
    cell = next(c for c in expand(matrix, scenarios=[name]) if c.pair == "old-client/old-server")
    return run_cell(plan(matrix, [cell])[0], tmp_path, Timeouts(60, 30), "t")


def test_an_honest_scenario_passes_with_its_evidence_named(tmp_path):
    row = _cell(_ref_matrix(), "compute", tmp_path)
    assert row["verdict"] == "pass", row["reason"]
    names = {c["name"] for c in row["checks"] if c["ok"]}
    assert {"wire evidence: GRAPH_COMPUTE crossed the wire",
            "wire evidence: every connection opened with HELLO"} <= names


def test_a_scenario_that_reports_success_without_traffic_fails(tmp_path, monkeypatch):
    # planted: the scenario says "works" and sends nothing but the client's HELLO
    def lying(ctx):
        ctx.ref_client().close()
        return Observation(WORKS)
    monkeypatch.setattr(SCENARIOS["compute"], "run", lying)
    row = _cell(_ref_matrix(), "compute", tmp_path)
    assert row["verdict"] == "fail", row
    assert "wire evidence: GRAPH_COMPUTE crossed the wire" in row["reason"]


def test_a_scenario_that_connects_to_nothing_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(SCENARIOS["roundtrip"], "run", lambda ctx: Observation(WORKS))
    row = _cell(_ref_matrix(), "roundtrip", tmp_path)
    assert row["verdict"] == "fail" and "connections reached the server" in row["reason"], row


def test_every_scenario_names_its_evidence_and_one_without_cannot_register():
    assert all(s.evidence for s in SCENARIOS.values())
    with pytest.raises(TypeError, match="needs `evidence`"):
        @scenario
        class NoEvidence(Scenario):  # noqa: F841 - the registration is the test
            id = "no-evidence"
            title = "x"
            description = "x"
    with pytest.raises(TypeError, match="needs `evidence`"):
        @scenario
        class BadName(Scenario):  # noqa: F841
            id = "bad-evidence"
            title = "x"
            description = "x"
            evidence = ("NOT_A_COMMAND",)
    assert "no-evidence" not in SCENARIOS and "bad-evidence" not in SCENARIOS
