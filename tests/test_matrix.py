"""The matrix machinery: schema, expectations, verdicts, the runner on reference peers, reports."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from harness.data import default_matrix
from harness.matrix.cells import expand, expectation_for
from harness.matrix.model import MatrixError, load_matrix
from harness.matrix.releases import predict
from harness.matrix.execute import run_cells
from harness.scenario import PEER_MISSING, Check, Observation, Skip
from harness.matrix.verdict import judge
from harness.impls.driver import ExitInfo
from harness.matrix.model import Expectation
from harness.report.writers import write_all
from needs import peer

ROOT = Path(__file__).resolve().parents[1]

REF_MATRIX = {
    "version": 1,
    "defaults": {"deadline": 60, "idle_timeout": 20, "workers": 2},
    "implementations": {
        "ref-7": {"kind": "ref", "proto": "7.0.0"},
        "ref-7f": {"kind": "ref", "proto": "7.0.0+flags"},
        "ref-9": {"kind": "ref", "proto": "9.0.0"},
    },
    "designs": {
        "bump": {"roles": {"old-client": "ref-7", "new-client": "ref-9",
                           "old-server": "ref-7", "new-server": "ref-9"}},
        "no-bump": {"roles": {"old-client": "ref-7", "new-client": "ref-7f",
                              "old-server": "ref-7", "new-server": "ref-7f"}},
    },
    "scenarios": ["handshake", "weights-cache"],
    "cache_options": {"handshake": [False], "weights-cache": [True]},
    "expectations": [
        {"design": "bump", "cell": "old-client/new-server", "outcome": "rejected-at-hello",
         "side": "client", "message": "version mismatch: 9.0.0"},
        {"design": "bump", "cell": "new-client/old-server", "outcome": "rejected-at-hello",
         "side": "client", "message": "version mismatch: 7.0.0"},
        {"design": "no-bump", "cell": "new-client/old-server", "cache": True,
         "scenario": "weights-cache", "outcome": "works-degraded",
         "degraded": ["server cache never used"]},
        {"outcome": "works"},
    ],
}


def write_matrix(tmp_path: Path, data: dict) -> Path:
    p = tmp_path / "matrix.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


def test_repository_matrix_is_valid():
    m = load_matrix(default_matrix())
    assert {"bump", "no-bump"} <= set(m.designs)
    cells = expand(m, designs=["bump", "no-bump"])
    assert {c.pair for c in cells} == {"old-client/old-server", "old-client/new-server",
                                       "new-client/old-server", "new-client/new-server"}
    degraded = [c for c in cells if expectation_for(m, c).outcome == "works-degraded"]
    assert [(c.design, c.pair, c.cache, c.scenario) for c in degraded] == [
        ("no-bump", "new-client/old-server", True, "weights-cache")]


def test_errors_name_the_line(tmp_path):
    bad = json.loads(json.dumps(REF_MATRIX))
    bad["expectations"][3]["outcome"] = "workz"
    bad["designs"]["bump"]["roles"]["old-client"] = "nobody"
    p = write_matrix(tmp_path, bad)
    with pytest.raises(MatrixError) as ei:
        load_matrix(p)
    text = str(ei.value)
    line = next(i for i, ln in enumerate(p.read_text().splitlines(), 1) if "workz" in ln)
    assert f"matrix.yaml:{line}: expectations.3.outcome" in text


def test_unknown_implementation_is_reported(tmp_path):
    bad = json.loads(json.dumps(REF_MATRIX))
    bad["designs"]["bump"]["roles"]["old-client"] = "nobody"
    p = write_matrix(tmp_path, bad)
    with pytest.raises(MatrixError, match="unknown implementation 'nobody'") as ei:
        load_matrix(p)
    line = next(i for i, ln in enumerate(p.read_text().splitlines(), 1) if "nobody" in ln)
    assert f"matrix.yaml:{line}: designs.bump.roles.old-client" in str(ei.value)


@pytest.mark.parametrize("client,server,outcome,side", [
    ("7.0.0", "7.0.0", "works", None), ("7.0.1", "7.0.0", "works", None),
    ("7.0.0", "9.0.0", "rejected-at-hello", "client"),
    ("4.0.2", "5.0.0", "rejected-at-hello", "client"),
    ("3.6.1", "4.0.2", "rejected-at-hello", "server"),
    ("8.0.0", "3.6.1", "rejected-at-hello", "server"),
])
def test_version_rule_model(client, server, outcome, side):
    e = predict(client, server)
    assert (e.outcome, e.side) == (outcome, side)


def _obs(outcome, **kw):
    return Observation(outcome, **kw)


def test_judge_covers_every_verdict():
    works = Expectation(outcome="works")
    rej = Expectation(outcome="rejected-at-hello", side="client", message="mismatch: 9.0.0")
    assert judge(works, _obs("works")).verdict == "pass"
    v = judge(works, _obs("rejected-at-hello", message="RPC server version mismatch: 9.0.0"))
    assert v.verdict == "fail" and "expected works, observed rejected-at-hello" in v.reason
    assert judge(rej, _obs("rejected-at-hello", rejected_by="client",
                           message="RPC server version mismatch: 9.0.0")).verdict == "pass"
    assert "rejection by the client" in judge(rej, _obs("rejected-at-hello",
                                                          rejected_by="server")).reason
    assert judge(works, _obs("works", checks=[Check("x", False, "ev")])).verdict == "fail"
    assert judge(works, None, skip=Skip("no peer", PEER_MISSING)).verdict == "skip"
    assert judge(works, None, error="boom").verdict == "error"
    assert judge(works, _obs("works"), hang="stalled").verdict == "hang"
    crash = ExitInfo(returncode=-11, signal=11, log_tail=["segfault"])
    assert judge(works, _obs("works"), server_exit=crash).verdict == "crash"
    mis = _obs("works", misconfigured="server labelled 9.0.0 announced 7.0.0")
    assert "misconfigured" in judge(works, mis).reason


def _run(tmp_path, data):
    m = load_matrix(write_matrix(tmp_path, data))
    return run_cells(m, expand(m), tmp_path / "out", run_id="t", workers=2)


def test_reference_matrix_passes_and_reports(tmp_path, reference_matrix_run):
    out, rows = reference_matrix_run  # REF_MATRIX's cells, run once for this and test_chop
    bad = [(r["cell_id"], r["verdict"], r["reason"]) for r in rows if r["verdict"] != "pass"]
    assert not bad
    by = {(r["design"], r["pair"], r["scenario"]): r for r in rows}
    cut = by[("no-bump", "new-client/old-server", "weights-cache")]
    assert cut["observed"] == "works-degraded" and cut["degraded"] == ["server cache never used"]
    assert by[("bump", "old-client/new-server", "handshake")]["rejected_by"] == "client"
    # evidence on disk: transcript, pcap, logs, verdict
    folder = out / cut["folder"]
    for name in ("wire.pcap", "transcript.txt", "server.log", "client.log", "verdict.json"):
        assert (folder / name).is_file(), name
    assert "SET_TENSOR" in (folder / "transcript.txt").read_text()
    df = write_all(rows, tmp_path / "report", "t")
    for name in ("results.jsonl", "results.csv", "matrix.md", "matrix.html", "junit.xml"):
        assert (tmp_path / "report" / name).is_file()
    suites = ET.parse(tmp_path / "report" / "junit.xml").getroot()
    assert sum(int(s.get("tests")) for s in suites) == len(df)
    assert "server cache never used" in (tmp_path / "report" / "matrix.md").read_text()


def test_breaking_one_expectation_turns_exactly_that_cell_red(tmp_path):
    data = json.loads(json.dumps(REF_MATRIX))
    data["expectations"].insert(0, {"design": "no-bump", "cell": "old-client/new-server",
                                    "scenario": "handshake", "outcome": "rejected-at-hello"})
    rows = _run(tmp_path, data)
    red = [r for r in rows if r["verdict"] != "pass"]
    assert [r["cell_id"] for r in red] == ["no-bump:ref-7_ref-7f:handshake"]
    assert red[0]["verdict"] == "fail"
    assert "expected rejected-at-hello by the either side, observed works" in red[0]["reason"]


def test_mislabelled_server_is_misconfigured_not_incompatible(tmp_path):
    data = json.loads(json.dumps(REF_MATRIX))
    data["implementations"]["liar"] = {"kind": "ref", "proto": "9.0.0",
                                       "server_args": ["--knob", "hello_version=7.0.0"]}
    data["designs"] = {"bump": {"roles": {"old-client": "ref-7", "new-client": "ref-9",
                                          "old-server": "ref-7", "new-server": "liar"}}}
    data["scenarios"] = ["handshake"]
    data["expectations"] = [e for e in data["expectations"] if e.get("design") != "no-bump"]
    rows = _run(tmp_path, data)
    liar = [r for r in rows if r["server"] == "liar" and r["client"] == "ref-7"][0]
    assert liar["verdict"] == "error"
    assert "misconfigured: server labelled 9.0.0 announced 7.0.0" in liar["reason"]


@pytest.mark.realpeer
@pytest.mark.slow
def test_harness_run_cli_on_real_peers(tmp_path):
    peer("p7")
    proc = subprocess.run([sys.executable, "-m", "harness", "run", "old-client", "new-server",
                           "--design", "bump", "--scenario", "handshake", "--scenario",
                           "weights-cache", "--out", str(tmp_path), "--matrix",
                           str(default_matrix())], capture_output=True, text=True,
                          timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rejected" in proc.stdout
    (run_dir,) = tmp_path.glob("run-*")  # beside it: the history store
    rows = [json.loads(ln) for ln in (run_dir / "results.jsonl").read_text().splitlines()]
    assert rows and all(r["verdict"] == "pass" for r in rows)
    assert all("version mismatch: 9.0.0" in r["message"] for r in rows)
