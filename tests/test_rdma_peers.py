"""Reference client and server over the emulated RDMA transport.

Every primary dialect runs a real session (HELLO and the switch, device queries, buffers,
SET/GET up to 3 MiB spanning many 256 KiB SENDs, a graph, copy/memset/clear/free) for each
pair of RDMA generations. The application transcript must equal the TCP one for the same
session (pointers and the conn_caps themselves aside), and the RDMA-specific checks hold.
"""

from __future__ import annotations

import io
import threading
from dataclasses import dataclass

import numpy as np
import pytest

from harness.capture.canonical import canonical, first_divergence
from harness.capture.transcript import C2S, S2C
from harness.impls.driver import ClientAborted, fingerprint, make_fill
from harness.impls.ref_driver import RefClientDriver
from harness.matrix.rdma import rdma_checks
from harness.reference.knobs import Misbehaviour
from harness.reference.server import ConnectionRecord, ReferenceServer
from harness.reference.server_core import ServerConfig
from harness.proto import PRIMARY, get_dialect
from harness.transport import caps
from harness.proto.behaviour import WRITES
from harness.transport.rdma_core import OLD, SEED000, V9, RdmaConfig
from harness.transport.rdma_endpoint import EmuPair, emu_pair
from harness.transport.rdma_wires import MEMORY, SOCKET

MiB = 1 << 20
GENS = {"old": OLD, "seed-000": SEED000, "9.0.0": V9}
GEN_PAIRS = [("old", "old"), ("old", "seed-000"), ("seed-000", "old"),
             ("seed-000", "seed-000"), ("9.0.0", "9.0.0")]


@dataclass
class Run:
    results: list
    pair: EmuPair
    record: ConnectionRecord
    driver: RefClientDriver
    error: ClientAborted | None = None


def run_session(steps, *, client_dialect: str, server_dialect: str | None = None,
                client_cfg: RdmaConfig = OLD, server_cfg: RdmaConfig = OLD, tcp: bool = False,
                fabric: str = MEMORY, client_policy: str | None = None,
                server_policy: str | None = None, client_knobs: Misbehaviour | None = None,
                server_knobs: Misbehaviour | None = None, timeout: float = 10.0) -> Run:
    """One connection: ReferenceServer.serve_transport in a thread, the driver here."""
    policy = caps.WITHHOLD if tcp else caps.ADVERTISE  # withheld on both sides = plain TCP
    pair = emu_pair(client_cfg, server_cfg, fabric=fabric, timeout=timeout, record=True,
                    client_policy=client_policy or policy, server_policy=server_policy or policy)
    srv = ReferenceServer(ServerConfig(dialect=get_dialect(server_dialect or client_dialect),
                                       knobs=server_knobs or Misbehaviour()),
                          idle_timeout=timeout, out=io.StringIO(), err=io.StringIO())
    th = threading.Thread(target=srv.serve_transport, args=(pair.server, "emu"), daemon=True)
    th.start()
    # The driver's transport hook (what the matrix's RDMA cells use): the pair's endpoint.
    drv = RefClientDriver(client_dialect, transport_factory=lambda host, port: pair.client,
                          knobs=client_knobs, timeout=timeout)
    results, error = [], None
    try:
        results.append(drv.run({"op": "connect", "endpoint": "emu:0"}).result)
        results += [drv.run(s).result for s in steps]
    except ClientAborted as e:
        error = e
    finally:
        drv.close()
        th.join(timeout + 5)
        pair.close()
    assert not th.is_alive()
    return Run(results, pair, srv.connections[0], drv, error)


SIZES = (1, 4099, 3 * MiB + 7)


def session_steps() -> list[dict]:
    n = 64
    steps = []
    for i, size in enumerate(SIZES):
        fill = {"pattern": "random", "seed": 10 + i, "dtype": "u8"}
        steps += [{"op": "alloc_buffer", "name": f"b{i}", "size": max(size, 64)},
                  {"op": "tensor", "name": f"t{i}", "buffer": f"b{i}", "type": "i8", "ne": [size]},
                  {"op": "set", "tensor": f"t{i}", "fill": fill},
                  {"op": "get", "tensor": f"t{i}"}]
    fa, fb = {"pattern": "random", "seed": 1}, {"pattern": "random", "seed": 2}
    steps += [
        {"op": "device_memory"}, {"op": "buffer_type"},
        {"op": "alloc_buffer", "name": "w", "size": 1 << 16, "usage": "weights"},
        {"op": "alloc_buffer", "name": "act", "size": 1 << 16, "usage": "compute"},
        {"op": "tensor", "name": "a", "buffer": "w", "offset": 0, "ne": [n]},
        {"op": "tensor", "name": "b", "buffer": "w", "offset": 4096, "ne": [n]},
        {"op": "set", "tensor": "a", "fill": fa},
        {"op": "set", "tensor": "b", "fill": fb},
        {"op": "node", "name": "sum", "kind": "add", "inputs": ["a", "b"], "buffer": "act"},
        {"op": "node", "name": "prod", "kind": "mul", "inputs": ["sum", "b"], "buffer": "act",
         "offset": 4096},
        {"op": "compute", "outputs": ["prod"]},
        {"op": "get", "tensor": "prod"},
        {"op": "copy", "src": "a", "dst": "b"},
        {"op": "memset", "tensor": "b", "offset": 8, "size": 16, "value": 0xEE},
        {"op": "get", "tensor": "b"},
        {"op": "clear", "buffer": "b1", "value": 0xAB},
        {"op": "get", "tensor": "t1"},
        {"op": "free_buffer", "buffer": "b2"},
        {"op": "device_count"},
    ]
    return steps


def expected_digests() -> dict:
    n = 64
    xa = make_fill({"pattern": "random", "seed": 1}, 4 * n).view(np.float32)
    xb = make_fill({"pattern": "random", "seed": 2}, 4 * n).view(np.float32)
    out = {f"t{i}": fingerprint(make_fill({"pattern": "random", "seed": 10 + i, "dtype": "u8"}, size))
           for i, size in enumerate(SIZES)}
    out["prod"] = fingerprint(((xa + xb) * xb).astype(np.float32))
    b = bytearray(xa.tobytes())
    b[8:24] = b"\xee" * 16
    out["b"] = fingerprint(bytes(b))
    out["t1 cleared"] = fingerprint(b"\xab" * 4099)
    return out


def canonical_without_caps(run: Run) -> list[dict]:
    c = canonical(run.pair.client.transcript.decode())
    for item in c:
        if item["cmd"] == "HELLO":
            item["request"]["conn_caps"] = item["response"]["conn_caps"] = "(caps)"
    return c


def hello_caps(run: Run) -> tuple[bytes, bytes]:
    ex = run.pair.client.transcript.decode().exchanges[0]
    return ex.request.conn_caps, ex.response.conn_caps


_tcp_baselines: dict[str, Run] = {}


def tcp_baseline(dialect: str) -> Run:
    if dialect not in _tcp_baselines:
        _tcp_baselines[dialect] = run_session(session_steps(), client_dialect=dialect, tcp=True)
    return _tcp_baselines[dialect]


def check_session(run: Run, dialect: str) -> None:
    assert run.error is None, run.error.exit_info
    assert run.record.close_reason is None, run.record.close_reason
    r = run.results
    want = expected_digests()
    for i in range(len(SIZES)):
        assert r[1 + 4 * i + 3] == want[f"t{i}"]
    assert r[-8] == want["prod"] and r[-5] == want["b"] and r[-3] == want["t1 cleared"]
    assert r[-1] == {"count": 1}


@pytest.mark.parametrize("dialect", PRIMARY)
def test_tcp_baseline_session(dialect):
    run = tcp_baseline(dialect)
    check_session(run, dialect)
    assert run.driver.client.rdma_active is False and run.record.rdma_active is False
    assert hello_caps(run) == (bytes(24), bytes(24))  # neither side offers RDMA


@pytest.mark.parametrize("client_gen, server_gen", GEN_PAIRS)
@pytest.mark.parametrize("dialect", PRIMARY)
def test_session_over_emulated_rdma_equals_tcp(dialect, client_gen, server_gen):
    run = run_session(session_steps(), client_dialect=dialect, client_cfg=GENS[client_gen],
                      server_cfg=GENS[server_gen])
    check_session(run, dialect)
    # the switch happened on both sides, right after HELLO
    assert run.driver.client.rdma_active and run.record.rdma_active
    c_caps, s_caps = hello_caps(run)
    assert caps.unpack_linux(c_caps).qpn == run.pair.client.qpn
    assert caps.unpack_linux(s_caps).qpn == run.pair.server.qpn
    # RDMA-specific checks: no overrun, no wait ran out, SEND and ring bounds
    bad = [c for c in rdma_checks(run.pair.client, run.pair.server) if not c.ok]
    assert not bad, bad
    assert run.pair.client.stats.largest_send == 256 * 1024  # 3 MiB went out in chunks
    assert run.pair.client.stats.sends > 3 * MiB // (256 * 1024)
    # both ends saw the same bytes, and the application transcript equals the TCP one
    ct, st = run.pair.client.transcript, run.pair.server.transcript
    assert ct.bytes_of(C2S) == st.bytes_of(C2S) and ct.bytes_of(S2C) == st.bytes_of(S2C)
    assert first_divergence(canonical_without_caps(tcp_baseline(dialect)),
                            canonical_without_caps(run)) is None
    assert run.results[1:] == tcp_baseline(dialect).results[1:]


@pytest.mark.parametrize("client_gen, server_gen", [("old", "old"), ("seed-000", "seed-000")])
@pytest.mark.parametrize("dialect", ["7.0.0", "9.0.0"])
def test_session_over_the_socketpair_fabric(dialect, client_gen, server_gen):
    run = run_session(session_steps(), client_dialect=dialect, client_cfg=GENS[client_gen],
                      server_cfg=GENS[server_gen], fabric=SOCKET)
    check_session(run, dialect)
    assert all(c.ok for c in rdma_checks(run.pair.client, run.pair.server))
    assert first_divergence(canonical_without_caps(tcp_baseline(dialect)),
                            canonical_without_caps(run)) is None


# ---------------------------------------------------------------- negotiation through the peers

ASYMMETRIC = [
    # the client puts non-zero caps in HELLO without RDMA: the server switches alone
    dict(client_policy=caps.WITHHOLD, client_knobs=Misbehaviour(client_caps=caps.LIE_CAPS)),
    # the server lies in its HELLO response: the client switches alone
    dict(server_policy=caps.WITHHOLD, server_knobs=Misbehaviour(hello_caps=caps.LIE_CAPS)),
    # the client hides its caps but still activates on the server's
    dict(client_knobs=Misbehaviour(client_caps=bytes(24))),
    # transport-level lies, no knobs
    dict(client_policy=caps.LIE_CAPABLE),
    dict(server_policy=caps.HIDE_AND_ACTIVATE),
]


@pytest.mark.parametrize("case", range(len(ASYMMETRIC)))
def test_asymmetric_activation_hangs_with_a_clear_reason(case):
    kw = ASYMMETRIC[case]
    run = run_session([{"op": "device_count"}], client_dialect="7.0.0", timeout=0.5, **kw)
    client_on, server_on = run.driver.client.rdma_active, run.record.rdma_active
    assert client_on != server_on  # exactly one side switched
    predicted = caps.negotiate(kw.get("client_policy", caps.ADVERTISE),
                               kw.get("server_policy", caps.ADVERTISE),
                               client_caps=(kw.get("client_knobs") or Misbehaviour()).client_caps,
                               server_caps=(kw.get("server_knobs") or Misbehaviour()).hello_caps)
    assert (predicted.client_activates, predicted.server_activates) == (client_on, server_on)
    assert run.error is not None  # the client gives up (the C client would abort)
    reasons = " | ".join(d for d in (run.pair.client.diagnosis, run.pair.server.diagnosis) if d)
    assert "asymmetric activation" in reasons, reasons
    switched = "server" if server_on else "client"
    assert f"the {switched} switched to RDMA" in reasons or \
        f"the {'client' if server_on else 'server'} stayed on TCP" in reasons


def test_peer_without_rdma_answers_zero_caps_and_both_stay_on_tcp():
    run = run_session([{"op": "device_count"}], client_dialect="7.0.0",
                      server_policy=caps.WITHHOLD)
    assert run.error is None and run.results[-1] == {"count": 1}
    c_caps, s_caps = hello_caps(run)
    assert caps.supports_rdma(c_caps) and s_caps == bytes(24)
    assert run.driver.client.rdma_active is False and run.record.rdma_active is False


def test_version_rejection_after_the_server_switched():
    # spec 10.4: the 9.0.0 server switches right after HELLO; the 7.0.0 client rejects the
    # version, never switches and closes TCP; the server only notices through TCP liveness.
    run = run_session([], client_dialect="7.0.0", server_dialect="9.0.0", timeout=3)
    assert run.error is not None and "version mismatch: 9.0.0" in run.error.exit_info.message
    assert run.record.rdma_active is True and not run.pair.client.active
    assert run.record.close_reason is None and "right after HELLO" in (run.record.note or "")
    assert run.pair.server.stats.tcp_hangup_seen


@pytest.mark.parametrize("server_gen, overruns", [("old", True), ("seed-000", False),
                                                   ("9.0.0", False)])
def test_a_sender_that_frames_differently(server_gen, overruns):
    # The reference client's own writes as SENDs: each request frame (and the staged
    # SET_TENSOR of the old profile) is one SEND, not the C peer's [1][8][payload].
    coalescing = OLD.with_(send_framing=WRITES)
    run = run_session(session_steps()[:4], client_dialect="7.0.0", client_cfg=coalescing,
                      server_cfg=GENS[server_gen], timeout=3)
    if overruns:
        assert run.error is not None
        assert "RDMA overrun" in run.record.close_reason
        assert "cmd read (recv_data of 1 bytes)" in run.record.close_reason
    else:
        assert run.error is None and run.record.close_reason is None
        assert run.results[4] == expected_digests()["t0"]


@pytest.mark.slow
@pytest.mark.parametrize("client_gen, server_gen", [("old", "seed-000"), ("seed-000", "old")])
def test_large_upload_and_download(client_gen, server_gen):
    size = 20 * MiB + 5
    fill = {"pattern": "random", "seed": 99, "dtype": "u8"}
    steps = [{"op": "alloc_buffer", "name": "b", "size": size},
             {"op": "tensor", "name": "t", "buffer": "b", "type": "i8", "ne": [size]},
             {"op": "set", "tensor": "t", "fill": fill},
             {"op": "get", "tensor": "t"}]
    run = run_session(steps, client_dialect="7.0.0+flags", client_cfg=GENS[client_gen],
                      server_cfg=GENS[server_gen], timeout=30)
    assert run.error is None and run.results[-1] == fingerprint(make_fill(fill, size))
    assert all(c.ok for c in rdma_checks(run.pair.client, run.pair.server))
    # 80 chunks each way through a 24-deep ring
    assert run.pair.client.stats.sends >= 80 and run.pair.server.stats.sends >= 80
