"""The conformance catalogue on every row: expectations held to the recordings of the real
builds (3.6.1 .. 6.0.0 and 8.0.0 here; 7.0.0's in tests/test_interop_real.py), the real builds
held to the expectations, and every row's reference server held to them."""

from __future__ import annotations

import dataclasses
import io
import json

import pytest

from harness.data import shipped
from harness.conformance import feature_cases
from harness.conformance.raw import CLOSED, OPEN, RawSession
from harness.conformance.cases import by_id
from harness.conformance.check import cases_for, run_all, run_case
from harness.impls.registry import PeerError, get_peer
from harness.impls.supervisor import start_peer_server
from harness.reference.server import ReferenceServer
from harness.reference.server_core import ServerConfig
from harness.proto import DIALECTS, get_dialect

# What each real build did with its row's catalogue (python -m harness.conformance.record):
# 3.6.1 .. 6.0.0 and 8.0.0; 7.0.0's is errors.json / state.json (tests/test_interop_real.py).
RECORDINGS = {rec["recorded_from"]["dialect"]: rec for rec in (
    json.loads(p.read_text())
    for p in sorted(shipped("vectors").glob("conformance-[0-9]*.json")))}


def _is_feature_case(case) -> bool:
    return case.run.__module__ == feature_cases.__name__


def _wrong(results):
    return [(r.case.id, r.expected, r.outcome, r.detail) for r in results if not r.ok]


def test_every_release_row_but_7_0_0_has_a_recording():
    releases = {d.name for d in DIALECTS.values() if d.evidence.startswith("[V]")}
    assert releases - set(RECORDINGS) == {"7.0.0"}


@pytest.mark.parametrize("dialect", sorted(RECORDINGS))
def test_expectations_are_the_recorded_outcomes(dialect):
    recording = RECORDINGS[dialect]
    recorded, peer = recording["cases"], recording["recorded_from"]["peer"]
    assert recording["recorded_from"]["proto"] == dialect
    ids = {c.id for c in cases_for(dialect)}
    assert ids == set(recorded), (
        f"re-record: python -m harness.conformance.record --peer {peer} --dialect {dialect}")
    wrong = [(c.id, c.expect_for(dialect), recorded[c.id]["outcome"])
             for c in cases_for(dialect) if c.expect_for(dialect) != recorded[c.id]["outcome"]]
    assert not wrong


def test_the_catalogue_covers_every_8_0_0_command():
    commands = {c.command for c in cases_for("8.0.0") if _is_feature_case(c)}
    for name in ("SET_TENSOR_2D", "GET_TENSOR_2D", "GRAPH_RECOMPUTE", "GRAPH_COMPUTE",
                 "COMM_FREE", "COMM_ALLREDUCE", "SET_TENSOR_HASH"):
        assert name in commands


def test_7_0_0_cases_keep_their_7_0_0_expectations():
    hash_null = next(c for c in cases_for("7.0.0") if c.id == "set-tensor-hash-null")
    assert hash_null.expect_for("7.0.0") == OPEN
    assert hash_null.expect_for("7.0.0+flags") == OPEN
    assert hash_null.expect_for("8.0.0") == CLOSED
    assert hash_null.expect_for("9.0.0") == CLOSED
    assert not any(_is_feature_case(c) for c in cases_for("7.0.0"))


def _trial_row():
    """A throw-away "7.1.0": 7.0.0 with one behaviour of 8.0.0 (SET_TENSOR_HASH validates its
    tensor). Nothing in the catalogue names a version, so the row alone must decide."""
    d7 = get_dialect("7.0.0")
    return dataclasses.replace(d7, name="7.1.0", version=(7, 1, 0), primary=False, alias=None,
                               peer=dataclasses.replace(d7.peer, server_hash_checks_tensor=True))


def test_expectations_follow_the_row_not_the_version():
    trial = _trial_row()
    by = {c.id: c for c in cases_for(trial)}
    assert by["set-tensor-hash-null"].expect_for(trial) == CLOSED
    assert {"hash-buffer-0", "hash-type-43"} <= set(by)  # the validation cases apply
    assert "2d-roundtrip" not in by and "recompute-unknown-uid" not in by  # no 2D, no uid
    # and the reference server of that row answers as the catalogue expects
    srv = ReferenceServer(ServerConfig(trial), out=io.StringIO(), err=io.StringIO())
    srv.start()
    try:
        assert not _wrong(run_all(srv.host, srv.port, list(by.values()), dialect=trial,
                                  workers=8, observe_wait=0.2))
    finally:
        srv.stop()


def _reference(dialect: str) -> ReferenceServer:
    srv = ReferenceServer(ServerConfig(get_dialect(dialect)), serial=True, out=io.StringIO(),
                          err=io.StringIO())
    srv.start()
    return srv


def _catalogue_on_the_reference(dialect: str) -> tuple[int, list]:
    """(cases run, the wrong ones) of the row's catalogue against the row's reference server,
    which still serves afterwards."""
    srv = ReferenceServer(ServerConfig(get_dialect(dialect)), out=io.StringIO(),
                          err=io.StringIO())  # concurrent: the cases run side by side
    srv.start()
    try:
        cases = cases_for(dialect)
        wrong = _wrong(run_all(srv.host, srv.port, cases, dialect=dialect, workers=8,
                               observe_wait=0.2)) if cases else []
        with RawSession(srv.host, srv.port, dialect=dialect) as s:  # still serving
            assert s.hello().version == get_dialect(dialect).version
    finally:
        srv.stop()
    return len(cases), wrong


# Every row of the table (a row added since is collected too): the reference server of that row
# answers the catalogue as the row's fields say the real servers do.
@pytest.mark.parametrize("dialect", list(DIALECTS))
def test_every_row_meets_the_catalogue_on_its_reference_server(dialect):
    ran, wrong = _catalogue_on_the_reference(dialect)
    assert not wrong
    assert ran > 0, dialect  # every case speaks the row's own wire


def test_a_reference_server_off_its_row_fails_the_catalogue(monkeypatch):
    # planted: the 8.0.0 reference looks the hash up before validating its tensor (7.0.0's way)
    from harness.reference import server_core
    original = server_core.ServerSession.__init__

    def lookup_first(self, state, behaviour=None):
        original(self, state, behaviour)
        self.behaviour = self.behaviour.with_(server_hash_checks_tensor=False)
    monkeypatch.setattr(server_core.ServerSession, "__init__", lookup_first)
    ran, wrong = _catalogue_on_the_reference("8.0.0")
    assert ran and "set-tensor-hash-null" in {w[0] for w in wrong}


def test_a_wrong_expectation_is_reported():
    """The runner's verdict can fail: the same case with the other outcome expected."""
    case = next(c for c in cases_for("8.0.0") if c.id == "recompute-known-uid")
    planted = dataclasses.replace(case, expect=CLOSED)
    srv = _reference("8.0.0")
    try:
        result = run_case(planted, srv.host, srv.port, dialect="8.0.0", observe_wait=0.2,
                          close_wait=0.5)
    finally:
        srv.stop()
    assert result.outcome == OPEN and not result.ok


@pytest.mark.realpeer
@pytest.mark.parametrize("dialect", sorted(RECORDINGS))
def test_the_real_build_still_behaves_as_recorded(tmp_path, dialect):
    name = RECORDINGS[dialect]["recorded_from"]["peer"]
    try:
        peer = get_peer(name)
    except PeerError as e:
        pytest.fail(f"{name} is part of the test peers (make peers): {e}")
    with start_peer_server(peer, workdir=tmp_path) as srv:
        assert not _wrong(run_all("127.0.0.1", srv.port, dialect=dialect, observe_wait=0.3))
        assert srv.poll() is None


def test_a_2d_read_far_larger_than_its_buffer_closes_instead_of_hanging():
    """stride 0 repeats one row n_copies times: the real 8.0.0 server cannot allocate a
    2^40-byte answer (bad_alloc, close); the reference must close too, not build it."""
    from harness.proto import messages as m
    from harness.proto.tensor import RpcTensor
    srv = _reference("8.0.0")
    try:
        with RawSession(srv.host, srv.port, dialect="8.0.0", timeout=10) as s:
            s.hello()
            h, base = s.alloc(256)
            t = RpcTensor.make(id=1, ne=(64,), buffer=h, data=base)
            s.request(m.GetTensor2DRequest(t, 0, 64, 1 << 34, 0))
            assert s.observe(5.0)[0] == CLOSED
    finally:
        srv.stop()


def test_a_late_close_is_a_close_and_a_short_wait_would_call_it_open():
    """A case that expects a close waits for it (close_wait): on a loaded machine the reference
    closed after the 0.2 s a case expecting 'open' waits, and the catalogue called it open."""
    import socket
    import threading
    import time
    from types import SimpleNamespace
    from harness.conformance.raw import CLOSED as RAW_CLOSED, OPEN as RAW_OPEN

    listener = socket.create_server(("127.0.0.1", 0))

    def late_closer():
        for _ in range(2):
            conn, _ = listener.accept()
            time.sleep(0.6)
            conn.close()
    threading.Thread(target=late_closer, daemon=True).start()
    port = listener.getsockname()[1]
    case = SimpleNamespace(id="late-close", run=lambda new: new(),
                           expect_for=lambda dialect: RAW_CLOSED)
    try:
        assert run_case(case, "127.0.0.1", port, observe_wait=0.2).outcome == RAW_CLOSED
        # planted: the old rule, one short wait whatever the case expects
        assert run_case(case, "127.0.0.1", port, observe_wait=0.2,
                        close_wait=0.2).outcome == RAW_OPEN
    finally:
        listener.close()


def _recompute_after_free(peer_name: str, dialect: str, workdir, *,
                          dies: bool = False) -> tuple[str, str]:
    """(outcome, server log) of GRAPH_RECOMPUTE after a FREE_BUFFER of its graph's buffer."""
    try:
        peer = get_peer(peer_name)
    except PeerError as e:
        pytest.fail(f"{peer_name} is part of the test peers (make peers): {e}")
    with start_peer_server(peer, workdir=workdir) as srv:
        result = run_case(by_id("recompute-after-free"), "127.0.0.1", srv.port,
                          dialect=dialect, observe_wait=1.0)
        if dies:
            srv.popen.wait(10)  # a sanitizer report is complete once the process is gone
        return result.outcome, srv.log_text()


# The row field the reference does not reproduce, held to the real builds of each side.
@pytest.mark.realpeer
@pytest.mark.parametrize("pin, dialect", [("p3", "3.6.1"), ("p4", "4.0.2"), ("p5", "5.0.0"),
                                          ("p6", "6.0.0"), ("p7", "7.0.0"), ("p8", "8.0.0")])
def test_a_recompute_after_free_stays_open_exactly_where_the_row_keeps_the_graph(tmp_path, pin,
                                                                                 dialect):
    outcome, _ = _recompute_after_free(pin, dialect, tmp_path)
    keeps = not get_dialect(dialect).peer.server_free_drops_graphs
    assert outcome == (OPEN if keeps else CLOSED), (pin, outcome)
    assert any(c.id == "recompute-after-free" for c in cases_for(dialect)) != keeps


@pytest.mark.realpeer
def test_before_7_0_0_a_recompute_after_free_is_a_use_after_free(tmp_path):
    """The open connection of 3.6.1 .. 6.0.0 is the stored graph run over the freed buffer:
    the sanitizer build of 5.0.0 says so (7.0.0 drops the graph on free)."""
    outcome, log = _recompute_after_free("p5+asan+ubsan", "5.0.0", tmp_path, dies=True)
    assert outcome == CLOSED  # the sanitizer ends the process the plain build survives
    assert "heap-use-after-free" in log and "graph_recompute" in log, log[-3000:]
