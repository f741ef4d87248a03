"""Differential transcripts: the diff names the HELLO flags byte and the missing hash calls."""

from __future__ import annotations

import subprocess
import sys

from harness.data import default_matrix
from harness.capture.canonical import command_differences, first_divergence
from harness.capture.differ import diff_cells
from harness.matrix.cells import expand
from harness.matrix.model import load_matrix
from harness.matrix.execute import run_cells


def test_silent_cache_loss_shows_in_the_diff(tmp_path):
    m = load_matrix(default_matrix())
    m.designs["no-bump-ref"].transports = ["tcp"]
    cells = [c for c in expand(m, designs=["no-bump-ref"], scenarios=["weights-cache"])
             if c.cache and c.client_role == "new-client"]
    rows = {r["pair"]: r for r in run_cells(m, cells, tmp_path, run_id="d", workers=2)}
    old = tmp_path / rows["new-client/old-server"]["folder"]
    new = tmp_path / rows["new-client/new-server"]["folder"]
    d = diff_cells(old, new)
    assert not d.same
    assert d.divergence.cmd == "HELLO" and d.divergence.path == "response.flags"
    assert (d.divergence.a, d.divergence.b) == (0, 1)
    assert any("only in b" in c and "SET_TENSOR_HASH" in c for c in d.commands)
    proc = subprocess.run([sys.executable, "-m", "harness", "diff", str(old), str(new)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1  # like diff(1): different
    assert "response.flags: 0 != 1" in proc.stdout and "SET_TENSOR_HASH" in proc.stdout
    assert diff_cells(new, new).same


def test_first_divergence_and_command_alignment():
    a = [{"cmd": "HELLO", "request": {}, "response": {"flags": 0}},
         {"cmd": "SET_TENSOR", "request": {"tensor": {"ne": [4, 1]}}}]
    b = [{"cmd": "HELLO", "request": {}, "response": {"flags": 1}},
         {"cmd": "SET_TENSOR_HASH", "request": {}},
         {"cmd": "SET_TENSOR", "request": {"tensor": {"ne": [4, 2]}}}]
    d = first_divergence(a, b)
    assert (d.index, d.path, d.a, d.b) == (0, "response.flags", 0, 1)
    assert command_differences(a, b) == ["only in b at 1..1: SET_TENSOR_HASH"]
    assert first_divergence(a, a) is None
