"""The matrix over llama.cpp's own RDMA transport (``rdma-soft``), and the emulation held to it.

matrix.yaml's no-bump-rdma design runs the RDMA builds of p7 and p7f (seed 000) in all four
roles on softverbs; its cells are judged from the device's capture of the queue pairs plus the
per-connection RDMA checks. Its ``emulation`` design (no-bump-ref on rdma-emu: reference peers
of the same dialects over the emulated transport) must give the same verdict, outcome and
per-connection RDMA facts (both switched, no overrun, ring bounds, and the number of SENDs and
bytes each side put on its QP) in every shared cell. Planted faults (GGML_RPC_NO_RDMA on either
side; the server's counters hidden from the cell) turn a passing cell red.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.data import default_matrix
from harness.capture.transcript import C2S, S2C, Transcript
from harness.matrix.cells import expand
from harness.matrix.execute import Timeouts, plan, run_cell, run_cells
from harness.matrix.model import MatrixError, load_matrix
from harness.matrix.rdma import RDMA_FACTS
from harness.matrix.rdma_soft import SoftRdmaCell
from harness.proto import get_dialect
from harness.proto import messages as msgs
from harness.proto.codec import pack_request, pack_response
from harness.transport.caps import gid_for_ipv4, pack_linux

from test_realclient_support import realpeer

SOFT_DESIGN = "no-bump-rdma"
# a scenario that opens its own connection with the harness's TCP reference client (it cuts a
# SET_TENSOR short): in a real-peer cell that client has no RDMA, so its connection is a TCP
# session and has no RDMA facts to compare; in the emulation's cell the client is on RDMA
TCP_CLIENT_SCENARIOS = {"disconnect"}


def _matrix():
    return load_matrix(default_matrix())


SOFT_DESIGNS = {"no-bump-rdma": "no-bump-ref", "no-bump-rdma-py": "no-bump-ref",
                "bump-7-rdma-py": "bump-ref"}  # -> the emulation design


def _key(design: str, row: dict) -> tuple:
    return design, row["pair"], row["scenario"], row["cache"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, emulated_reference_cells):
    """Every rdma-soft cell, and every cell of the emulation designs (run once for this
    module and test_rdma_matrix: conftest's emulated_reference_cells)."""
    m = _matrix()
    assert {d: m.designs[d].emulation for d in m.designs
            if "rdma-soft" in (m.designs[d].transports or [])} == SOFT_DESIGNS
    assert set(SOFT_DESIGNS.values()) == {"bump-ref", "no-bump-ref"}  # what the fixture runs
    tmp = tmp_path_factory.mktemp("rdma-soft-matrix")
    soft = run_cells(m, expand(m, transports=["rdma-soft"]), tmp / "soft", run_id="soft",
                     workers=2)
    _, emu = emulated_reference_cells
    return {"dir": tmp / "soft", "soft": soft,
            "emu": {_key(r["design"], r): r for r in emu}}


@realpeer
@pytest.mark.slow
def test_every_rdma_soft_cell_passes_over_the_queue_pairs(runs):
    rows = runs["soft"]
    assert len(rows) == 48 * len(SOFT_DESIGNS), [r["cell_id"] for r in rows]
    for r in rows:
        assert r["verdict"] == "pass", (r["cell_id"], r["reason"])
        rdma = [c for c in r["checks"] if c["name"].startswith("conn ")]
        assert rdma and all(c["ok"] for c in rdma), r["cell_id"]
        facts = json.loads((runs["dir"] / r["folder"] / "rdma.json").read_text())
        for f in facts:
            if f["tcp_client"]:
                assert r["scenario"] in TCP_CLIENT_SCENARIOS, r["cell_id"]
                continue
            assert f["tcp_bytes_after_hello"] == 0, (r["cell_id"], f)
            assert f["captured"] == [f["client_send_bytes"], f["server_send_bytes"]]
            if r["observed"] == "rejected-at-hello":  # the client refused: nothing crossed
                assert f["client_send_bytes"] == 0, (r["cell_id"], f)
            else:
                assert f["switched"], (r["cell_id"], f)
        if r["scenario"] == "roundtrip" and r["observed"] != "rejected-at-hello":
            # 64 MiB and more went over the QPs, not TCP
            assert min(facts[0]["client_send_bytes"], facts[0]["server_send_bytes"]) > 64 << 20
        folder = runs["dir"] / r["folder"]
        assert list(folder.glob("qps-server/qp-*.json")), r["cell_id"]  # the evidence stays
        assert not list(folder.glob("qps-*/rx-*.bin")), r["cell_id"]  # the capture is cleaned


@realpeer
@pytest.mark.slow
def test_the_emulation_agrees_with_the_real_transport_cell_by_cell(runs):
    """Same verdict, outcome and per-connection RDMA facts in every shared cell."""
    compared = 0
    for r in runs["soft"]:
        e = runs["emu"][_key(SOFT_DESIGNS[r["design"]], r)]
        assert (e["verdict"], e["observed"]) == (r["verdict"], r["observed"]), r["cell_id"]
        real, emulated = r["facts"]["rdma"], e["facts"]["rdma"]
        assert len(real) == len(emulated), r["cell_id"]
        tcp_clients = json.loads((runs["dir"] / r["folder"] / "rdma.json").read_text())
        for i, (a, b, raw) in enumerate(zip(real, emulated, tcp_clients)):
            if raw["tcp_client"]:
                continue
            diff = {k: (a[k], b[k]) for k in RDMA_FACTS if a[k] != b[k]}
            assert not diff, f"{r['cell_id']} conn {i}: real vs emulated {diff}"
            compared += 1
    assert compared >= 44 * len(SOFT_DESIGNS)


# ------------------------------------------------------------------------------ planted faults
def _one_cell(tmp_path: Path, **envs) -> dict:
    m = _matrix()
    cell, = expand(m, designs=[SOFT_DESIGN], client_role="old-client", server_role="new-server",
                   scenarios=["roundtrip"], transports=["rdma-soft"])
    job, = plan(m, [cell])
    return run_cell(replace(job, **envs), tmp_path, Timeouts(120, 30), "planted")


def _failed(row: dict) -> list[str]:
    return [c["name"] for c in row["checks"] if not c["ok"]]


@realpeer
@pytest.mark.slow
def test_the_cell_passes_without_a_plant(tmp_path):
    row = _one_cell(tmp_path)
    assert row["verdict"] == "pass", row["reason"]


@realpeer
@pytest.mark.slow
@pytest.mark.parametrize("side", ["client", "server"])
def test_no_rdma_on_one_side_turns_the_cell_red(tmp_path, side):
    """GGML_RPC_NO_RDMA=1: the session still works over TCP, the cell must fail."""
    row = _one_cell(tmp_path, **{f"{side}_env": {"GGML_RPC_NO_RDMA": "1"}})
    assert row["verdict"] == "fail", row["reason"]
    failed = _failed(row)
    assert "conn 0: both sides switched to RDMA after HELLO" in failed, failed
    if side == "server":  # the server's zero caps: the client stays on TCP too
        assert "conn 0: no RPC byte on TCP after HELLO" in failed, failed
    assert [c["name"] for c in row["checks"] if not c["name"].startswith("conn ")
            and not c["ok"]] == []  # the scenario itself worked: only the RDMA checks fail


@realpeer
@pytest.mark.slow
def test_counters_the_cell_cannot_see_turn_it_red(tmp_path):
    """The server's QP counters and capture go elsewhere: to the cell they are zero."""
    row = _one_cell(tmp_path, server_env={"SOFTVERBS_STATS_DIR": str(tmp_path / "elsewhere"),
                                          "SOFTVERBS_CAPTURE_DIR": str(tmp_path / "elsewhere")})
    _red_on_rdma_checks(row)
    facts = json.loads((tmp_path / row["folder"] / "rdma.json").read_text())
    assert facts[0]["problems"] == ["no queue pair of this connection on the device"]


def _red_on_rdma_checks(row: dict) -> None:
    """The cell ran and failed on its per-connection RDMA checks: a fail, not a skip or an
    error (which would say nothing about what the cell can see). (The capture it cannot see
    fails its wire evidence too.)"""
    assert row["verdict"] == "fail", (row["verdict"], row["reason"])
    failed = _failed(row)
    assert "conn 0: both sides switched to RDMA after HELLO" in failed, failed


@pytest.mark.parametrize("verdict", ["skip", "error", "hang", "crash"])
def test_a_cell_that_did_not_run_its_checks_is_not_red_on_them(verdict):
    """Planted: the outcomes `verdict != "pass"` accepted before."""
    row = {"verdict": verdict, "reason": "planted", "checks": []}
    with pytest.raises(AssertionError):
        _red_on_rdma_checks(row)
    with pytest.raises(AssertionError):  # and a fail on another check than the RDMA ones
        _red_on_rdma_checks({"verdict": "fail", "reason": "planted",
                             "checks": [{"name": "scenario step", "ok": False}]})


# ------------------------------------------------------------------------------ without peers
D7 = get_dialect("7.0.0")


def _tcp_hello(client_qpn: int, server_qpn: int) -> Transcript:
    gid = gid_for_ipv4("127.0.0.1")
    tr = Transcript()
    tr.add(1.0, C2S, pack_request(D7, msgs.HelloRequest(conn_caps=pack_linux(client_qpn, gid))))
    tr.add(1.1, S2C, pack_response(D7, msgs.HelloResponse(
        major=7, conn_caps=pack_linux(server_qpn, gid))))
    return tr


def _capture(path: Path, sends: list[tuple[float, bytes]]) -> None:
    import struct
    path.write_bytes(b"".join(struct.pack("<dI", t, len(d)) + d for t, d in sends))


def test_merge_puts_each_connections_qp_bytes_into_its_transcript(tmp_path):
    """Device captures become the transcript's c2s (what the server's QP received) and s2c
    (the client's), in time order; a record cut short (a killed process) is dropped."""
    soft = SoftRdmaCell(tmp_path)
    _capture(soft.server_qps / "rx-10-222.bin",
             [(2.0, pack_request(D7, msgs.DeviceCountRequest()))])
    _capture(soft.client_qps / "rx-11-111.bin",
             [(2.5, pack_response(D7, msgs.DeviceCountResponse(device_count=1)))])
    with (soft.client_qps / "rx-11-111.bin").open("ab") as f:
        f.write(b"\0" * 7)  # half a record header
    merged, = soft.merge([_tcp_hello(111, 222)])
    assert [(c.t, c.direction) for c in merged.chunks] == [(1.0, C2S), (1.1, S2C),
                                                           (2.0, C2S), (2.5, S2C)]
    session = merged.decode()
    assert [e.cmd.name for e in session.exchanges] == ["HELLO", "DEVICE_COUNT"]
    assert session.exchanges[1].response.device_count == 1
    other, = soft.merge([_tcp_hello(333, 444)])  # another connection's QPs: nothing added
    assert len(other.chunks) == 2


def _facts(**kw) -> dict:
    base = {"switched": True, "no_overrun": True, "ring_kept": True, "client_sends": 2,
            "server_sends": 2, "client_send_bytes": 100, "server_send_bytes": 50,
            "tcp_client": False, "server_activated": True, "client_qpn": 1, "server_qpn": 2,
            "tcp_bytes_after_hello": 0, "captured": [100, 50], "problems": []}
    return base | kw


@pytest.mark.parametrize("plant,failing", [
    ({}, []),
    ({"switched": False}, ["both sides switched"]),
    ({"tcp_bytes_after_hello": 9}, ["no RPC byte on TCP"]),
    ({"captured": [100, 0]}, ["every byte sent over a QP"]),
    ({"problems": ["bytes lost"]}, ["every byte sent over a QP"]),
    ({"ring_kept": False}, ["every SEND <= chunk"]),
])
def test_each_rdma_check_fails_on_its_planted_fact(tmp_path, plant, failing):
    checks = SoftRdmaCell(tmp_path).checks([_facts(**plant)], rejected=False)
    assert [next(f for f in failing if f in c.name) for c in checks if not c.ok] == failing


@pytest.mark.parametrize("plant,failing", [
    ({}, []),
    ({"server_activated": False}, ["only the server switched"]),
    ({"switched": True}, ["only the server switched"]),
    ({"client_sends": 1}, ["nothing after the rejected HELLO"]),
    ({"tcp_bytes_after_hello": 9}, ["nothing after the rejected HELLO"]),
])
def test_a_rejected_hello_checks_its_planted_fact(tmp_path, plant, failing):
    rejected = {"switched": False, "client_sends": 0, "server_sends": 0,
                "client_send_bytes": 0, "server_send_bytes": 0, "captured": [0, 0]}
    checks = SoftRdmaCell(tmp_path).checks([_facts(**rejected | plant)], rejected=True)
    assert [next(f for f in failing if f in c.name) for c in checks if not c.ok] == failing


def test_the_harness_tcp_client_must_leave_the_server_on_tcp(tmp_path):
    soft = SoftRdmaCell(tmp_path)
    ok = _facts(tcp_client=True, server_activated=False, server_sends=0)
    assert all(c.ok for c in soft.checks([ok], rejected=False))
    bad = soft.checks([_facts(tcp_client=True)], rejected=False)
    assert [c.name for c in bad if not c.ok] == ["conn 0: the harness's TCP client stays on TCP"]
    # a cell's own client without caps (GGML_RPC_NO_RDMA) is no TCP client: it must switch
    no_caps = soft.checks([_facts(switched=False, client_qpn=0)], rejected=False)
    assert [c.name for c in no_caps if not c.ok] == [
        "conn 0: both sides switched to RDMA after HELLO"]


def test_an_emulation_design_must_speak_the_same_dialects(tmp_path):
    text = default_matrix().read_text().replace("emulation: no-bump-ref",
                                                      "emulation: bump-ref")
    (tmp_path / "m.yaml").write_text(text)
    with pytest.raises(MatrixError, match=r"emulation: new-client speaks 7.0.0\+flags here, "
                                          r"9.0.0 in bump-ref"):
        load_matrix(tmp_path / "m.yaml")


def test_transport_option_narrows_and_refuses_unknown_names():
    from harness.cli import app
    soft = expand(_matrix(), transports=["rdma-soft"])
    assert soft and {c.transport for c in soft} == {"rdma-soft"}
    assert {c.design for c in soft} == set(SOFT_DESIGNS)
    r = CliRunner().invoke(app, ["run", "old-client", "new-server", "--transport", "rdma-x"])
    assert r.exit_code == 2 and "rdma-x" in r.output
