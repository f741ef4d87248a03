"""The server-to-server link (COMM_*): the two-server catalogue held to its recording from two
real p8 servers, the reference pair held to the real pair (outcomes and bit-exact allreduce
digests), mixed pairs, and the loopback guard that lets a real server open a communicator."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from harness.data import shipped
from harness.conformance import comm
from harness.conformance.comm import (PAIR_CASES, mixed_servers, real_pair, real_servers,
                                      reference_servers, run_pair_case)
from harness.impls import loopback
from harness.impls.registry import PeerError, get_peer
from harness.impls.supervisor import free_fixed_port, start_peer_server
from harness.reference import comm as link
from harness.reference.server import ReferenceServer
from harness.reference.server_core import ServerConfig
from harness.proto import get_dialect

RECORDING = json.loads(shipped("vectors", "conformance-comm-8.0.0.json").read_text())
CASES = {c.id: c for c in PAIR_CASES}


def _run(case, servers):
    return run_pair_case(case, servers, free_port=free_fixed_port, observe_wait=0.3)


def _against_recording(result) -> list:
    recorded = RECORDING["cases"][result.case.id]
    wrong = []
    if list(result.outcomes) != recorded["outcomes"]:
        wrong.append(("outcomes", result.outcomes, recorded["outcomes"], result.detail))
    if result.facts != recorded["facts"]:
        wrong.append(("facts", result.facts, recorded["facts"]))
    return wrong


def _p8():
    try:
        return get_peer("p8")
    except PeerError as e:
        pytest.fail(f"p8 is part of the test peers (make peers): {e}")


def test_expectations_are_the_recorded_outcomes():
    assert RECORDING["recorded_from"]["proto"] == "8.0.0"
    assert set(CASES) == set(RECORDING["cases"]), \
        "re-record: python -m harness.conformance.record --peer p8 --dialect 8.0.0 --comm"
    for cid, case in CASES.items():
        assert list(case.expect) == RECORDING["cases"][cid]["outcomes"], cid


def test_the_catalogue_covers_every_comm_command():
    assert {c.command for c in PAIR_CASES} == {"COMM_INIT", "COMM_ALLREDUCE", "COMM_FREE"}


@pytest.mark.parametrize("dialect", ["8.0.0", "9.0.0"])
@pytest.mark.parametrize("cid", sorted(CASES))
def test_reference_pair_gives_the_real_pairs_results(cid, dialect):
    result = _run(CASES[cid], lambda: reference_servers(dialect, comm_timeout=2.0))
    assert not _against_recording(result)


def test_a_planted_difference_is_found(monkeypatch):
    """The comparison can fail: a reference that sends raw f32 where p8 sends bf16."""
    monkeypatch.setattr(link, "BF16_MIN_ELEMENTS", 1 << 20)
    result = _run(CASES["allreduce-f32-32768"], reference_servers)
    assert result.ok  # same close points ...
    assert [w[0] for w in _against_recording(result)] == ["facts"]  # ... different sums


def test_bf16_rounding_is_ggmls():
    x = np.array([1.0, 1.00390625, 1.01171875, -2.5, np.inf, np.nan], np.float32)
    got = link.fp32_to_bf16(x)
    # 1 + 2^-8 is a tie: rounds to even (down); 1 + 3*2^-8 rounds up; NaN stays a quiet NaN
    assert list(got[:5]) == [0x3F80, 0x3F80, 0x3F82, 0xC020, 0x7F80]
    assert np.isnan(link.bf16_to_fp32(got[5:]))[0]


def test_reference_rank1_refuses_a_non_loopback_peer():
    with reference_servers("8.0.0", count=1) as (ep,):
        with comm.RawSession(*ep, dialect="8.0.0") as s:
            s.hello()
            r = comm.m.CommInitRequest(0, 1, 2, 9, b"192.0.2.1".ljust(64, b"\0"))
            assert s.call(r).ok == 0  # at once: no connect is tried
            assert s.still_serving()


def _listening_child(shim: Path | None):
    """A child process that binds the wildcard address and listens (port printed)."""
    code = ("import socket,sys,time; s=socket.socket(); s.bind(('0.0.0.0', 0)); s.listen(1); "
            "print(s.getsockname()[1], flush=True); time.sleep(30)")
    env = loopback.preload_env({}, shim) if shim else {}
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env=env)


def test_shim_turns_a_wildcard_listener_into_a_loopback_one(tmp_path):
    shim = loopback.ensure_loopback_shim(out_dir=tmp_path)
    assert loopback.ensure_loopback_shim(out_dir=tmp_path) == shim  # cached
    child = _listening_child(shim)
    try:
        port = int(child.stdout.readline())
        handle = SimpleNamespace(pid=child.pid, name="child")
        assert loopback.require_loopback_only(handle) == [("127.0.0.1", port)]
    finally:
        child.kill()
        child.wait()


def test_without_the_shim_the_guard_refuses():
    """No wildcard listener is opened here (network rule): a process without the shim is
    refused on that alone, and a wide listener is refused whatever is mapped."""
    handle = SimpleNamespace(pid=os.getpid(), name="harness")
    with pytest.raises(loopback.NotLoopbackOnly, match="without"):
        loopback.require_loopback_only(handle)


def test_a_wide_listener_is_refused(monkeypatch):
    monkeypatch.setattr(loopback, "shim_mapped", lambda pid: True)
    monkeypatch.setattr(loopback, "listeners_of", lambda pid: [("127.0.0.1", 1), ("0.0.0.0", 2)])
    with pytest.raises(loopback.NotLoopbackOnly, match="beyond loopback"):
        loopback.require_loopback_only(SimpleNamespace(pid=1, name="x"))


@pytest.mark.realpeer
def test_real_pair_still_behaves_as_recorded():
    peer = _p8()
    wrong = {cid: w for cid, case in CASES.items()
             if (w := _against_recording(_run(case, real_pair(peer))))}
    assert not wrong


@pytest.mark.realpeer
@pytest.mark.parametrize("real_rank", [0, 1])
@pytest.mark.parametrize("cid", ["allreduce-f32-4", "allreduce-f32-32768", "allreduce-f16-4",
                                 "free-then-allreduce", "allreduce-one-side"])
def test_mixed_pair_gives_the_real_pairs_results(cid, real_rank):
    peer = _p8()
    result = _run(CASES[cid], lambda: mixed_servers(peer, real_rank))
    assert not _against_recording(result)


@pytest.mark.realpeer
def test_real_rank0_listens_on_loopback_only():
    peer = _p8()
    with real_servers(peer) as (a, b), comm.Pair((("127.0.0.1", a.port), ("127.0.0.1", b.port)),
                                                 "8.0.0", free_fixed_port) as pair:
        port = free_fixed_port()
        r0 = comm.m.CommInitRequest(0, 0, 2, port, comm.LOOPBACK)
        pair.s[0].request(r0)
        deadline = time.monotonic() + 5
        while port not in [p for _, p in loopback.listeners_of(a.pid)]:
            assert time.monotonic() < deadline, "rank 0 never listened"
            time.sleep(0.05)
        assert (("127.0.0.1", port) in loopback.require_loopback_only(a))
        assert f"{loopback.REWRITE_LOG} 0.0.0.0:{port} -> 127.0.0.1:{port}" in a.log_text()
        pair.s[1].request(comm.m.CommInitRequest(0, 1, 2, port, comm.LOOPBACK))
        assert pair.s[0].read_response(r0).ok == 1


@pytest.mark.realpeer
def test_real_server_without_the_shim_is_refused(tmp_path):
    with start_peer_server(_p8(), workdir=tmp_path) as srv:
        with pytest.raises(loopback.NotLoopbackOnly, match="without"):
            loopback.require_loopback_only(srv)


@pytest.mark.realpeer
def test_the_real_client_links_two_reference_servers():
    """ggml_backend_comm_init of the real 8.0.0 client library: rank 0 gets the port of its
    endpoint + 1000, and the reference pair answers so that the library makes a communicator."""
    servers = [ReferenceServer(ServerConfig(get_dialect("8.0.0"), comm_timeout=5.0), serial=True,
                               out=io.StringIO(), err=io.StringIO()) for _ in range(2)]
    try:
        ports = [srv.start()[1] for srv in servers]
        done = comm.real_client_comm_init(_p8().lib_dir, [f"127.0.0.1:{p}" for p in ports])
        assert done.stdout.strip().endswith("comm ok"), done.stderr[-2000:]
        log0, log1 = (srv.err.getvalue() for srv in servers)
        assert f"rank 0 listening on 127.0.0.1:{ports[0] + 1000}" in log0
        assert "joined pairwise comm as rank 0" in log0 and "as rank 1" in log1
    finally:
        for srv in servers:
            srv.stop()


@pytest.mark.realpeer
def test_the_real_client_links_two_real_servers():
    with real_servers(_p8()) as (a, b):
        done = comm.real_client_comm_init(_p8().lib_dir, [a.endpoint, b.endpoint])
        assert done.stdout.strip().endswith("comm ok"), done.stderr[-2000:]
        assert f"0.0.0.0:{a.port + 1000} -> 127.0.0.1:{a.port + 1000}" in a.log_text()
