"""`--json` on the commands that print tables: standard output is one JSON document (what a
CI script parses), the tables and progress go to standard error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from harness.suite.profile import SuiteProfile, TestTime, write_profile
from needs import peer

ROOT = Path(__file__).resolve().parents[1]


def _harness(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_run_and_report_print_their_cells_as_json(tmp_path):
    out = tmp_path / "r"
    done = _harness("run", "new-client", "new-server", "--design", "no-bump", "--scenario",
                    "handshake", "--out", str(out), "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout)  # nothing else on stdout
    assert doc["exit"] == 0 and len(doc["cells"]) == 2
    assert {c["verdict"] for c in doc["cells"]} == {"pass"}
    assert "new-client x new-server" in done.stderr  # the progress and the grid: stderr
    again = _harness("report", doc["run_dir"], "--json", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    assert sorted(c["cell_id"] for c in json.loads(again.stdout)["cells"]) == \
        sorted(c["cell_id"] for c in doc["cells"])
    # planted: without --json the same run's stdout is the tables, which no parser reads
    plain = _harness("report", doc["run_dir"], cwd=tmp_path)
    try:
        json.loads(plain.stdout)
        parsed = True
    except ValueError:
        parsed = False
    assert not parsed and "pass" in plain.stdout


def test_peers_build_and_suite_show_print_json(tmp_path):
    peer("p8")
    built = _harness("peers", "build", "p8", "--json", cwd=tmp_path)
    assert built.returncode == 0, built.stderr[-2000:]
    [row] = json.loads(built.stdout)
    assert row["pin"] == "p8" and row["result"] == "cached" and row["proto"] == "8.0.0"
    profile = SuiteProfile(run_id="r", started=0, wall=12.0, tests=[
        TestTime(id="tests/test_a.py::test_slow", area="fuzz campaigns", outcome="passed",
                 call=9.0),
        TestTime(id="tests/test_a.py::test_quick", area="unit and properties",
                 outcome="passed", call=1.0)])
    folder = tmp_path / "suite"
    folder.mkdir()
    write_profile(profile, folder)
    shown = _harness("suite", "show", str(folder), "--json", "--slowest", "1", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr[-2000:]
    doc = json.loads(shown.stdout)
    assert doc["tests"] == 2 and doc["slowest"] == [
        {"id": "tests/test_a.py::test_slow", "seconds": 9.0, "setup": 0.0, "call": 9.0,
         "area": "fuzz campaigns"}]
