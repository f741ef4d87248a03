"""Real llama.cpp RDMA code over the soft verbs device: the 7.0.0 RDMA build's client library
(ctypes agent) and server negotiate RDMA in HELLO, switch transports and carry the payload
over queue pairs; the reference peer's pyverbs transport does the same against the real
server. The device's per-QP counters and the server's own log prove it was RDMA, not TCP."""

from __future__ import annotations

import numpy as np
import pytest

from harness.impls.driver import fingerprint, make_fill
from harness.impls.ctypes_driver import CtypesClientDriver
from harness.transport.softverbs import ACTIVATED_RE, softverbs_env

from softverbs_support import (
    PyverbsServer,
    assert_rdma_carried,
    pyverbs_session,
    qp_of,
    rdma_peer_dir,
    softverbs_lib_dir,
)
from test_realclient_support import RealServer, realpeer

pytestmark = [realpeer, pytest.mark.slow]

PAYLOAD = 3 * (1 << 20) + 7  # several 256 KiB RDMA chunks and a ragged tail
SV_VARS = ("LD_LIBRARY_PATH", "SOFTVERBS_STATS_DIR", "SOFTVERBS_LOG")


@pytest.fixture(scope="module")
def lib_dir():
    return softverbs_lib_dir()


@pytest.fixture(scope="module")
def rdma_bin():
    return rdma_peer_dir()


def _device_env(lib_dir, stats_dir, **extra) -> dict[str, str]:
    env = softverbs_env(lib_dir, stats_dir=stats_dir, log=True)
    return {k: env[k] for k in SV_VARS} | extra


def _serve(rdma_bin, lib_dir, tmp_path, **extra):
    stats = tmp_path / "server-qps"
    stats.mkdir()
    return RealServer(rdma_bin, tmp_path / "server.log",
                      env=_device_env(lib_dir, stats, **extra)), stats


def _real_client_session(rdma_bin, lib_dir, endpoint, stats) -> list[str]:
    """One session of the real client library: upload PAYLOAD bytes, read them back."""
    drv = CtypesClientDriver(rdma_bin, proto="7.0.0", step_timeout=60, session_timeout=180,
                             env=_device_env(lib_dir, stats))
    try:
        drv.do("connect", endpoint=endpoint)
        drv.do("alloc_buffer", name="w", size=PAYLOAD, usage="weights")
        drv.do("tensor", name="t", buffer="w", offset=0, type="i8", ne=[PAYLOAD])
        fill = {"pattern": "random", "seed": 3}
        drv.do("set", tensor="t", fill=fill)
        assert drv.do("get", tensor="t") == fingerprint(make_fill(fill, PAYLOAD).view(np.uint8))
    finally:
        drv.close()
    return drv.log_tail(200)


def test_real_client_and_server_switch_to_rdma_and_carry_the_payload(rdma_bin, lib_dir,
                                                                      tmp_path):
    client_stats = tmp_path / "client-qps"
    client_stats.mkdir()
    srv, server_stats = _serve(rdma_bin, lib_dir, tmp_path)
    with srv:
        client_log = _real_client_session(rdma_bin, lib_dir, srv.endpoint, client_stats)
        log = srv.log()
    assert "RDMA auto-negotiate enabled" in log and "RDMA probed: dev=softverbs0" in log, log
    assert any(ACTIVATED_RE.search(line) for line in client_log), client_log
    cq, sq = assert_rdma_carried(client_stats, server_stats, PAYLOAD, log)
    assert cq.max_send == sq.max_send == 256 * 1024  # 7.0.0 cuts sends into 256 KiB chunks
    assert sq.inline_sends > 0  # short responses go inline (max_inline 256)


def test_the_rdma_check_fails_when_the_session_stays_on_tcp(rdma_bin, lib_dir, tmp_path):
    """Planted fault: the server withholds RDMA (GGML_RPC_NO_RDMA), so the session works
    over TCP and the check must say so."""
    client_stats = tmp_path / "client-qps"
    client_stats.mkdir()
    srv, server_stats = _serve(rdma_bin, lib_dir, tmp_path, GGML_RPC_NO_RDMA="1")
    with srv:
        _real_client_session(rdma_bin, lib_dir, srv.endpoint, client_stats)
        log = srv.log()
    with pytest.raises(AssertionError, match="expected one queue pair in .*server-qps"):
        assert_rdma_carried(client_stats, server_stats, PAYLOAD, log)  # the server never probed
    assert "RDMA activated" not in log
    # the client probed (one QP) but never sent on it
    assert qp_of(client_stats).sends == 0


def test_pyverbs_transport_talks_to_the_real_rdma_server(rdma_bin, lib_dir, tmp_path):
    client_stats = tmp_path / "client-qps"
    client_stats.mkdir()
    srv, server_stats = _serve(rdma_bin, lib_dir, tmp_path)
    with srv:
        out = pyverbs_session(lib_dir, client_stats, PAYLOAD, "client",
                              *srv.endpoint.rsplit(":", 1))
        log = srv.log()
    assert out["rdma_active"] and out["device"] == "softverbs0" and out["round_trip_ok"], out
    assert out["overruns"] == 0 and out["largest_send"] == 256 * 1024, out
    cq, sq = assert_rdma_carried(client_stats, server_stats, PAYLOAD, log)
    assert (cq.qpn, sq.qpn) == (out["qpn"], out["peer_qpn"])


def test_real_rdma_client_against_the_pyverbs_reference_server(rdma_bin, lib_dir, tmp_path):
    """The other direction: the real client library's RDMA code against the reference
    server's pyverbs transport, real code on both sides of the queue pair."""
    client_stats, server_stats = tmp_path / "client-qps", tmp_path / "server-qps"
    client_stats.mkdir()
    server_stats.mkdir()
    with PyverbsServer(lib_dir, server_stats) as srv:
        client_log = _real_client_session(rdma_bin, lib_dir, srv.endpoint, client_stats)
        out = srv.result()
    assert out["connections"] == [{"rdma_active": True, "close_reason": None}], out
    assert out["devices"] == ["softverbs0"] and not out["notes"], out
    m = [ACTIVATED_RE.search(line) for line in client_log]
    assert any(m), client_log
    assert_rdma_carried(client_stats, server_stats, PAYLOAD, None)
