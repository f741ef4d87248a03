"""The scenario registry, strict skips, and every stricter check failing on a planted fault.

Cells run on reference peers only (no real build needed); each planted fault is a lying
reference client (a knob in matrix.yaml's client_knobs), a client whose label is not what it
speaks, or a scenario fed the wrong expected data.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import harness.scenario as api
import scenarios.compute
import scenarios.copy_memset
import scenarios.load
import scenarios.two_clients
import scenarios.weights_cache
from harness.impls.adapters import Adapter
from harness.impls.ref_driver import RefClientDriver
from harness.matrix.cells import expand
from harness.matrix.execute import PlannedCell, Timeouts, plan, run_cell, run_cells
from harness.matrix.model import load_matrix
from harness.matrix.skips import AllowSkip, exit_code, refused_skips
from harness.scenario import (PEER_MISSING, SCENARIOS, WORKS, Check, Ended, Observation, Scenario,
                              run_steps, scenario)
from test_matrix import write_matrix

ROOT = Path(__file__).resolve().parents[1]


def one_design(impls: dict, roles: dict, scenarios_: list[str], expectations=None) -> dict:
    return {"version": 1, "defaults": {"deadline": 60, "idle_timeout": 20, "workers": 2},
            "implementations": impls, "designs": {"d": {"roles": roles}},
            "scenarios": scenarios_, "expectations": expectations or [{"outcome": "works"}]}


REF7 = {"ref-7": {"kind": "ref", "proto": "7.0.0"}}
ALL_REF7 = {r: "ref-7" for r in ("old-client", "new-client", "old-server", "new-server")}


def run_one(tmp_path, data: dict, *, pair=("old-client", "old-server")) -> dict:
    """The single cell of ``pair`` for every scenario of ``data``; their rows."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    m = load_matrix(write_matrix(tmp_path, data))
    cells = expand(m, client_role=pair[0], server_role=pair[1])
    rows = run_cells(m, cells, tmp_path / "out", run_id="t", workers=1)
    return rows[0] if len(rows) == 1 else rows


# ------------------------------------------------------------------ the registry

def test_every_scenario_module_registers_itself():
    ids = {p.stem.replace("_", "-") for p in (ROOT / "scenarios").glob("[!_]*.py")}
    assert ids == set(SCENARIOS)
    assert all(isinstance(s, Scenario) for s in SCENARIOS.values())


def test_a_scenario_defined_here_registers_and_runs_in_a_cell(tmp_path):
    @scenario
    class Echo(Scenario):
        id = "throwaway-echo"
        title = "A scenario no other file knows"
        description = "Connect, read the device count."
        evidence = ("DEVICE_COUNT",)

        def run(self, ctx):
            try:
                (n,) = run_steps(ctx, [{"op": "device_count"}])
            except Ended as e:
                return e.observation
            return Observation(WORKS, checks=[Check("a device", n["count"] >= 1, str(n))])

    try:
        assert SCENARIOS["throwaway-echo"].__class__ is Echo
        row = run_one(tmp_path, one_design(REF7, ALL_REF7, ["throwaway-echo"]))
        assert (row["scenario"], row["verdict"]) == ("throwaway-echo", "pass"), row["reason"]
        assert row["checks"][0] == {"name": "a device", "ok": True, "evidence": "{'count': 1}"}
        # then what the verdict rests on, from the cell's wire
        assert [c["name"] for c in row["checks"][1:]] == [
            "wire evidence: the client's connections reached the server",
            "wire evidence: every connection opened with HELLO",
            "wire evidence: DEVICE_COUNT crossed the wire"]
    finally:
        del SCENARIOS["throwaway-echo"]


def test_a_taken_id_is_refused():
    with pytest.raises(ValueError, match="taken"):
        @scenario
        class Again(Scenario):
            id, title, description, evidence = "handshake", "t", "d", ("HELLO",)


# ------------------------------------------------------------------ strict skips

def _skip_row(code, reason, missing=None) -> dict:
    return {"verdict": "skip", "skip_code": code, "reason": reason, "skip_missing": missing}


def test_allow_skip_matches_a_code_or_a_substring():
    missing = _skip_row(PEER_MISSING, "p8: not built: run harness peers build p8", "p8")
    by_design = _skip_row("not-applicable", "needs a real llama.cpp program as the client")
    rows = [missing, by_design, {"verdict": "pass"}]
    assert exit_code(rows, AllowSkip()) == 1
    assert refused_skips(rows, AllowSkip()) == [missing]
    for accepted in (["peer-missing"], ["p8"], ["program-missing,P8"]):
        assert exit_code(rows, AllowSkip.parse(accepted)) == 0, accepted
    for refused in (["program-missing"], ["p3"], ["missing"]):
        assert exit_code(rows, AllowSkip.parse(refused)) == 1, refused
    # a row written without a code (an older verdict.json) is never accepted silently
    assert not AllowSkip().allows({"verdict": "skip", "reason": "?"})


def _harness(args, cache: Path, tmp_path) -> subprocess.CompletedProcess:
    env = {**os.environ, "GGML_RPC_HARNESS_CACHE": str(cache)}
    return subprocess.run([sys.executable, "-m", "harness", *args, "--out", str(tmp_path / "r")],
                          capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)


def test_matrix_with_an_empty_peer_cache_fails_naming_the_missing_peers(tmp_path):
    cache = tmp_path / "empty-cache"
    cache.mkdir()
    # handshake only: every real-peer cell skips, the reference cells still run
    proc = _harness(["matrix", "--scenario", "handshake", "--no-build"], cache, tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "skipped because something is missing here" in out
    for pin in ("p3", "p4", "p5", "p6", "p7", "p8"):
        assert f"{pin} (peer-missing" in out, pin
    allowed = _harness(["matrix", "--scenario", "handshake", "--allow-skip", "peer-missing",
                        "--no-build"], cache, tmp_path)
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr


def test_pytest_plugin_fails_a_missing_peer_unless_allowed(tmp_path):
    data = one_design({**REF7, "llama-7": {"kind": "pin", "pin": "p7", "proto": "7.0.0"}},
                      {**ALL_REF7, "old-server": "llama-7"}, ["handshake"])
    path = write_matrix(tmp_path, data)
    cache = tmp_path / "empty-cache"
    cache.mkdir()
    env = {**os.environ, "GGML_RPC_HARNESS_CACHE": str(cache)}

    def pytest_run(*extra):
        return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                               "--matrix", str(path), "--matrix-out", str(tmp_path / "r"),
                               "-k", "ref-7_llama-7", str(path), *extra], capture_output=True,
                              text=True, timeout=600, cwd=tmp_path, env=env)

    strict = pytest_run()
    assert strict.returncode == 1 and "--matrix-allow-skip does not accept it" in strict.stdout, \
        strict.stdout
    allowed = pytest_run("--matrix-allow-skip", "p7")
    assert allowed.returncode == 0 and "2 skipped" in allowed.stdout, allowed.stdout


# ------------------------------------------------------------------ planted faults

@pytest.mark.parametrize("transport", ["tcp", "rdma-emu"])
def test_honest_reference_cells_pass_every_stricter_check(transport, tmp_path):
    """The baseline for the faults below: the same checks pass when nobody lies (disconnect's
    cut-off upload and the RDMA recording's unkept payload included)."""
    data = one_design(REF7, ALL_REF7, ["handshake", "alloc", "roundtrip", "weights-cache",
                                       "weights-only", "compute", "copy-memset", "disconnect",
                                       "two-clients"])
    data["transports"] = [transport]
    rows = run_one(tmp_path, data)
    assert [(r["scenario"], r["verdict"], r["reason"]) for r in rows
            if r["verdict"] != "pass"] == []

def test_client_that_sends_after_the_hello_it_rejects_fails_that_check(tmp_path):
    # the lying client appends a whole DEVICE_COUNT frame to its HELLO, then rejects 9.0.0
    impls = {"ref-7": {"kind": "ref", "proto": "7.0.0"}, "ref-9": {"kind": "ref", "proto": "9.0.0"},
             "liar-7": {"kind": "ref", "proto": "7.0.0",
                        "client_knobs": ["trailing_bytes=0f0000000000000000"]}}
    expect = [{"cell": "old-client/new-server", "outcome": "rejected-at-hello", "side": "client"},
              {"outcome": "works"}]
    roles = {"old-client": "ref-7", "new-client": "ref-7", "old-server": "ref-7",
             "new-server": "ref-9"}
    honest = run_one(tmp_path / "a", one_design(impls, roles, ["handshake"], expect),
                     pair=("old-client", "new-server"))
    assert honest["verdict"] == "pass", honest["reason"]
    lying = run_one(tmp_path / "b", one_design(impls, {**roles, "old-client": "liar-7"},
                                               ["handshake"], expect),
                    pair=("old-client", "new-server"))
    assert lying["observed"] == "rejected-at-hello"
    assert lying["verdict"] == "fail"
    assert "client sent nothing after the HELLO it rejected (1 commands after HELLO)" in \
        lying["reason"]


def test_two_clients_each_read_back_their_own_pattern(tmp_path, monkeypatch):
    honest = run_one(tmp_path / "a", one_design(REF7, ALL_REF7, ["two-clients"]))
    assert honest["verdict"] == "pass", honest["reason"]
    # planted: B writes A's pattern (both read back identical data, which the old check,
    # A's digest against B's, accepted)
    steps = scenarios.two_clients.steps
    monkeypatch.setattr(scenarios.two_clients, "steps",
                        lambda fill: steps(scenarios.two_clients.FILLS["A"]))
    row = run_one(tmp_path / "b", one_design(REF7, ALL_REF7, ["two-clients"]))
    failed = [c["name"] for c in row["checks"] if not c["ok"]]
    assert row["verdict"] == "fail" and failed == ["B reads back its pattern"], row["reason"]


def _wrong_fill(make_fill):
    def fill(spec: dict, nbytes: int) -> np.ndarray:
        out = make_fill(spec, nbytes).copy()
        out[-1] ^= 0xFF  # one byte off, at the end: a check of the first bytes misses it
        return out
    return fill


DATA_CHECKS = {
    "roundtrip": {"1 bytes come back", "4099 bytes come back", "1048576 bytes come back",
                  "67108864 bytes come back", "offset window", "view"},
    "copy-memset": {"copy result", "memset result"},
    "weights-only": {"data reads back"},
    "weights-cache": {"data reads back (first connection)", "data reads back (second connection)"},
    "two-clients": {"A reads back its pattern", "B reads back its pattern"},
    "compute": {"add/mul/scale", "cpy to f16", "mul_mat", "get_rows"},
}


@pytest.mark.parametrize("scenario_id", sorted(DATA_CHECKS))
def test_every_data_check_fails_on_wrong_expected_bytes(scenario_id, tmp_path, monkeypatch):
    wrong = _wrong_fill(api.make_fill)
    monkeypatch.setattr(api, "make_fill", wrong)
    for module in (scenarios.compute, scenarios.copy_memset, scenarios.weights_cache):
        monkeypatch.setattr(module, "make_fill", wrong)
    row = run_one(tmp_path, one_design(REF7, ALL_REF7, [scenario_id]))
    failed = {c["name"] for c in row["checks"] if not c["ok"]}
    assert row["verdict"] == "fail", row["reason"]
    assert failed and failed <= DATA_CHECKS[scenario_id], failed


def test_load_checks_every_byte_of_every_tensor(tmp_path, monkeypatch):
    monkeypatch.setenv("GGML_RPC_HARNESS_LOAD_BYTES", str(48 << 20))
    data = one_design(REF7, ALL_REF7, ["load"])
    data["cache_options"] = {"load": [False]}
    honest = run_one(tmp_path / "a", data)
    assert honest["verdict"] == "pass", honest["reason"]
    # planted: the last byte of the first tensor (the old check read 64 bytes of the last one)
    make_fill = scenarios.load.make_fill
    first = scenarios.load.weight_sizes(48 << 20)[0][1]
    monkeypatch.setattr(scenarios.load, "make_fill", lambda spec, n: _wrong_fill(make_fill)(
        spec, n) if n == first and spec["value"] == 1 else make_fill(spec, n))
    row = run_one(tmp_path / "b", data)
    assert row["verdict"] == "fail"
    assert "every tensor reads back in full (first connection)" in row["reason"]
    assert "1 of " in row["reason"] and "token_embd" in row["reason"]


@pytest.mark.parametrize("proto,knob,why", [
    ("7.0.0", "hash_policy=never", "without SET_TENSOR_HASH first"),
    ("7.0.0+flags", "hash_policy=always", "although the server's HELLO announced no cache"),
])
def test_a_client_that_hashes_unlike_its_label_is_misconfigured(proto, knob, why, tmp_path):
    impls = {**REF7, "liar": {"kind": "ref", "proto": proto, "client_knobs": [knob]}}
    row = run_one(tmp_path, one_design(impls, {**ALL_REF7, "old-client": "liar"},
                                       ["weights-cache"]))
    assert row["verdict"] == "error"
    assert f"misconfigured: client labelled {proto}, connection 0: " in row["reason"]
    assert why in row["reason"]


class _Mislabelled(Adapter):
    """Labelled ``dialect`` in the cell, but its client speaks ``speaks``."""

    speaks: str = "7.0.0"

    def new_client(self, *, step_timeout=60.0, knobs=None, transport_factory=None):
        return RefClientDriver(self.speaks, knobs=knobs, timeout=step_timeout)


@pytest.mark.parametrize("label,speaks,server,scenario_id,why", [
    ("3.6.1", "4.0.2", "4.0.2", "handshake", "sent a 24-byte HELLO, its dialect sends 0 bytes"),
    ("6.0.0", "7.0.0", "7.0.0", "roundtrip", "sent what 6.0.0 cannot parse"),
])
def test_a_client_speaking_another_dialect_than_its_label_is_misconfigured(
        label, speaks, server, scenario_id, why, tmp_path):
    m = load_matrix(write_matrix(tmp_path, one_design(
        {"s": {"kind": "ref", "proto": server}}, {r: "s" for r in ALL_REF7}, [scenario_id])))
    job = plan(m, expand(m, client_role="old-client", server_role="old-server"))[0]
    client = _Mislabelled(name="liar", kind="ref", dialect=label)
    client.speaks = speaks
    row = run_cell(PlannedCell(job.cell, job.expect, client, job.server), tmp_path / "out",
                   Timeouts(60, 20), "t")
    assert row["verdict"] == "error", row["reason"]
    assert f"misconfigured: client labelled {label}, connection 0: {why}" in row["reason"]


def test_verdict_json_records_the_skip_code(tmp_path):
    data = one_design({**REF7, "gone": {"kind": "pin", "pin": "no-such-pin", "proto": "7.0.0"}},
                      {**ALL_REF7, "old-server": "gone"}, ["handshake"])
    row = run_one(tmp_path, data)
    assert (row["verdict"], row["skip_code"], row["skip_missing"]) == \
        ("skip", PEER_MISSING, "no-such-pin")
    saved = json.loads((tmp_path / "out" / row["folder"] / "verdict.json").read_text())
    assert saved["skip_code"] == PEER_MISSING
