"""The four-way matrix over emulated RDMA gives the TCP verdicts, plus the RDMA checks.

matrix.yaml's reference designs (bump-ref, no-bump-ref) are run through the matrix runner
twice, once with ``transport: tcp`` and once with ``rdma-emu``: every cell must have the same
verdict on both, pass, and on RDMA carry the transport checks (both sides switched after
HELLO, or only the server after a HELLO rejection; no overrun; ring bounds kept).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.data import default_matrix
from harness.matrix.cells import expand
from harness.matrix.model import load_matrix
from harness.matrix.rdma import InProcessRdmaServer
from harness.matrix.execute import run_cells

HEAVY = ["roundtrip", "weights-cache", "weights-only"]  # tens of MiB per connection
LIGHT = ["handshake", "device-info", "alloc", "compute", "copy-memset", "disconnect",
         "two-clients"]


def _cells(transport: str, scenarios: list[str]):
    m = load_matrix(default_matrix())
    for name in ("bump-ref", "no-bump-ref"):
        m.designs[name].transports = [transport]
    return m, expand(m, designs=["bump-ref", "no-bump-ref"], scenarios=scenarios)


def _compare(tmp_path: Path, scenarios: list[str], emulated=None):
    """``emulated``: the rdma-emu cells run already (conftest's emulated_reference_cells, a
    superset); else they are run here."""
    m, tcp_cells = _cells("tcp", scenarios)
    tcp = run_cells(m, tcp_cells, tmp_path / "tcp", run_id="tcp", workers=3)
    if emulated is None:
        m, rdma_cells = _cells("rdma-emu", scenarios)
        folder = tmp_path / "rdma"
        rdma = run_cells(m, rdma_cells, folder, run_id="rdma", workers=3)
    else:
        folder, rows = emulated
        rdma = [r for r in rows if r["scenario"] in scenarios]
    assert len(tcp) == len(rdma) == 2 * 4 * sum(
        len(m.cache_options.get(s, [False])) for s in scenarios)
    by_id = {r["cell_id"]: r for r in rdma}
    for a in tcp:
        b = by_id[a["cell_id"] + "@rdma-emu"]
        assert (b["verdict"], b["observed"]) == (a["verdict"], a["observed"]), \
            (b["cell_id"], b["reason"])
        assert a["verdict"] == "pass", (a["cell_id"], a["reason"])
        rdma_checks = [c for c in b["checks"] if c["name"].startswith("conn ")]
        assert rdma_checks and all(c["ok"] for c in rdma_checks), b["cell_id"]
        if b["observed"] == "rejected-at-hello":
            assert any("only the server switched" in c["name"] for c in rdma_checks)
        assert (folder / b["folder"] / "rdma.json").is_file()


def test_light_scenarios_same_verdicts_over_rdma(tmp_path):
    _compare(tmp_path, LIGHT)  # its own rdma-emu cells: a quick test (make test-fast)


@pytest.mark.slow
def test_heavy_scenarios_same_verdicts_over_rdma(tmp_path, emulated_reference_cells):
    _compare(tmp_path, HEAVY, emulated_reference_cells)


def test_real_peers_are_skipped_over_emulated_rdma_with_the_reason(tmp_path):
    m = load_matrix(default_matrix())
    m.designs["bump-7"].transports = ["rdma-emu"]
    cells = expand(m, designs=["bump-7"], scenarios=["handshake"])
    rows = run_cells(m, cells, tmp_path, run_id="x", workers=2)
    real = [r for r in rows if "llama-7" in (r["client"], r["server"])]
    assert real and all(r["verdict"] == "skip" and "reference peers in both roles" in r["reason"]
                        for r in real)


@pytest.fixture
def inprocess_server():
    srv = InProcessRdmaServer("rdma-emu", "9.0.0", None, idle=5)
    srv.probe_timeout = 0.5  # the planted faults below make the probe wait this long
    yield srv
    srv.stop()


def test_inprocess_server_liveness_is_a_fresh_connection(inprocess_server):
    srv = inprocess_server
    served = len(srv.server.connections)
    assert srv.poll() is None
    assert len(srv.server.connections) == served + 1  # the probe was served
    assert srv.server.connections[-1].commands == 2


def test_liveness_fails_when_nobody_accepts(inprocess_server):
    """Planted: the accept loop has ended but the socket still listens, so a TCP connect
    alone would succeed (the kernel completes the handshake)."""
    srv = inprocess_server
    srv.listener._stop.set()
    srv.listener._accept.join(5)
    dead = srv.poll()
    assert dead is not None and "did not serve a fresh connection" in dead.message


def test_liveness_fails_when_the_server_is_gone(inprocess_server):
    srv = inprocess_server
    srv.listener.stop()  # planted: closed under the cell, not through srv.stop()
    dead = srv.poll()
    assert dead is not None and "ConnectionRefusedError" in dead.message
