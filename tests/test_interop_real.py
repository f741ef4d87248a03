"""The reference peer against the real 7.0.0 and 8.0.0 peers, and the conformance catalogue."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from harness.data import shipped
from harness.capture.canonical import canonical, first_divergence, unified_diff
from harness.capture.proxy import RecordingProxy
from harness.conformance.cases import CASES
from harness.conformance.raw import RawSession
from harness.conformance.check import VECTOR_OUTCOMES, run_all
from harness.impls.ref_driver import RefClientDriver
from harness.impls.registry import PeerError, get_peer
from harness.impls.supervisor import start_peer_server, start_reference_server
from harness.reference.server import ReferenceServer
from harness.reference.server_core import ServerConfig
from harness.proto import get_dialect


# One session touching every 7.0.0 command a client library sends.
STEPS = [
    {"op": "buffer_type"}, {"op": "device_memory"}, {"op": "device_count"},
    {"op": "alloc_buffer", "name": "w", "size": 1 << 16, "usage": "weights"},
    {"op": "alloc_buffer", "name": "act", "size": 1 << 16, "usage": "compute"},
    {"op": "tensor", "name": "a", "buffer": "w", "offset": 0, "ne": [64]},
    {"op": "tensor", "name": "b", "buffer": "w", "offset": 1024, "ne": [64]},
    {"op": "tensor", "name": "W", "buffer": "w", "offset": 2048, "type": "f16", "ne": [32, 16]},
    {"op": "tensor", "name": "X", "buffer": "w", "offset": 4096, "ne": [32, 4]},
    {"op": "tensor", "name": "I", "buffer": "w", "offset": 8192, "type": "i32", "ne": [4]},
    {"op": "set", "tensor": "a", "fill": {"pattern": "random", "seed": 1}},
    {"op": "set", "tensor": "b", "fill": {"pattern": "random", "seed": 2}},
    {"op": "set", "tensor": "W", "fill": {"pattern": "random", "seed": 3, "dtype": "f16"}},
    {"op": "set", "tensor": "X", "fill": {"pattern": "random", "seed": 4}},
    {"op": "set", "tensor": "I", "fill": {"pattern": "arange", "dtype": "i32"}},
    {"op": "node", "name": "s", "kind": "add", "inputs": ["a", "b"], "buffer": "act", "offset": 0},
    {"op": "node", "name": "p", "kind": "mul", "inputs": ["s", "b"], "buffer": "act", "offset": 1024},
    {"op": "node", "name": "q", "kind": "scale", "inputs": ["p"], "buffer": "act", "offset": 2048,
     "params": {"s": 0.25}},
    {"op": "tensor", "name": "h", "buffer": "act", "offset": 3072, "type": "f16", "ne": [64]},
    {"op": "node", "name": "c", "kind": "cpy", "inputs": ["q", "h"]},
    {"op": "node", "name": "Y", "kind": "mul_mat", "inputs": ["W", "X"], "buffer": "act",
     "offset": 4096},
    {"op": "node", "name": "R", "kind": "get_rows", "inputs": ["W", "I"], "buffer": "act",
     "offset": 8192},
    {"op": "view", "name": "v", "src": "a", "ne": [16], "offset": 64},
    {"op": "compute", "outputs": ["c", "Y", "R"]},
    {"op": "get", "tensor": "q"}, {"op": "get", "tensor": "h"}, {"op": "get", "tensor": "Y"},
    {"op": "get", "tensor": "R"}, {"op": "get", "tensor": "v"},
    {"op": "set", "tensor": "a", "offset": 16, "size": 32, "fill": {"pattern": "const", "value": 3}},
    {"op": "get", "tensor": "a", "offset": 8, "size": 64},
    {"op": "copy", "src": "a", "dst": "b"},
    {"op": "memset", "tensor": "b", "offset": 8, "size": 16, "value": 0},
    {"op": "get", "tensor": "b"}, {"op": "clear", "buffer": "act", "value": 0},
    {"op": "get", "tensor": "q"},
    {"op": "free_buffer", "buffer": "act"}, {"op": "free_buffer", "buffer": "w"},
]


# 2D transfers (the -sm tensor upload path) and graphs kept and reused by uid, as a program
# that reuses its graphs does: what 8.0.0 changed, and how 7.0.0 clients do the same calls.
GRAPH_STEPS = [
    {"op": "alloc_buffer", "name": "w", "size": 1 << 16, "usage": "weights"},
    {"op": "alloc_buffer", "name": "act", "size": 1 << 16, "usage": "compute"},
    {"op": "tensor", "name": "a", "buffer": "w", "offset": 0, "ne": [64, 4]},
    {"op": "tensor", "name": "b", "buffer": "w", "offset": 4096, "ne": [64, 4]},
    {"op": "set", "tensor": "a", "fill": {"pattern": "const", "value": 1}},  # no byte unset
    {"op": "set_2d", "tensor": "a", "offset": 0, "size": 128, "n_copies": 4, "stride": 256,
     "fill": {"pattern": "arange"}},
    {"op": "set_2d", "tensor": "b", "offset": 512, "size": 256, "n_copies": 1, "stride": 256,
     "fill": {"pattern": "random", "seed": 5}},
    {"op": "set", "tensor": "b", "size": 512, "fill": {"pattern": "random", "seed": 2}},
    {"op": "get_2d", "tensor": "a", "offset": 64, "size": 64, "n_copies": 3, "stride": 256},
    {"op": "get_2d", "tensor": "b", "offset": 256, "size": 256, "n_copies": 1, "stride": 64},
    {"op": "node", "name": "s", "kind": "add", "inputs": ["a", "b"], "buffer": "act", "offset": 0},
    {"op": "node", "name": "p", "kind": "mul", "inputs": ["s", "b"], "buffer": "act",
     "offset": 2048},
    {"op": "compute", "outputs": ["s"], "graph": "g1"},
    {"op": "get", "tensor": "s"},
    {"op": "set", "tensor": "a", "fill": {"pattern": "const", "value": 2}},
    {"op": "compute", "graph": "g1"},  # same uid: GRAPH_RECOMPUTE
    {"op": "get", "tensor": "s"},
    {"op": "compute", "outputs": ["p"], "graph": "g2"},
    {"op": "compute", "graph": "g1"},  # 8.0.0 caches both uids; 7.0.0 only the last one
    {"op": "compute", "graph": "g2"},
    {"op": "compute", "outputs": ["p"]},  # uid 0: never reused
    {"op": "get", "tensor": "p"},
    {"op": "free_buffer", "buffer": "act"},
    {"op": "free_buffer", "buffer": "w"},
]

# The real builds the reference is held to byte for byte, with the dialect each speaks.
REAL = {"7.0.0": "p7", "8.0.0": "p8"}


def real_peer(name: str = "p7"):
    """A built pin; `make test` builds them all, so a missing one fails rather than skips."""
    try:
        peer = get_peer(name)
    except PeerError as e:
        pytest.fail(f"{name} is one of the test peers (make peers): {e}")
    if not peer.available:
        pytest.fail(f"{name} is not built (make peers): {peer.reason}")
    return peer


def run_session(driver, server, workdir: Path, steps=STEPS):
    """Run ``steps`` through a recording proxy; returns (results, canonical session)."""
    proxy = RecordingProxy(("127.0.0.1", server.port)).start()
    try:
        driver.run({"op": "connect", "endpoint": f"127.0.0.1:{proxy.port}"})
        results = [driver.run(s).result for s in steps]
        driver.run({"op": "close"})
    finally:
        driver.close()
        proxy.wait_quiet()
        transcripts = proxy.stop()
    assert len(transcripts) == 1
    return results, canonical(transcripts[0].decode())


MUL_MAT_GET = next(i for i, s in enumerate(STEPS) if s == {"op": "get", "tensor": "Y"})


def digests(results, exact_mul_mat: bool = True):
    """Digests of every read. MUL_MAT sums in a backend-specific order, so across servers its
    output is compared by value (``close``) instead of bit for bit."""
    return [(r.get("fnv"), r.get("size")) for i, r in enumerate(results)
            if "fnv" in r and (exact_mul_mat or i != MUL_MAT_GET)]


def close(a: dict, b: dict) -> bool:
    import numpy as np
    x = np.frombuffer(bytes.fromhex(a["head"]), np.float32)
    y = np.frombuffer(bytes.fromhex(b["head"]), np.float32)
    return bool(np.allclose(x, y, rtol=1e-5, atol=1e-6))


@pytest.mark.realpeer
@pytest.mark.parametrize("proto", sorted(REAL))
def test_ref_client_sends_what_the_c_client_sends(tmp_path, proto):
    """Same steps, same real server: the canonical bytes of both clients are equal."""
    from harness.impls.ctypes_driver import CtypesClientDriver
    peer = real_peer(REAL[proto])
    with start_peer_server(peer, workdir=tmp_path / "a") as srv:
        c_results, c_wire = run_session(CtypesClientDriver(peer.lib_dir, proto=proto), srv, tmp_path)
    with start_peer_server(peer, workdir=tmp_path / "b") as srv:
        r_results, r_wire = run_session(RefClientDriver(proto), srv, tmp_path)
    div = first_divergence(c_wire, r_wire)
    assert div is None, f"{div}\n" + "\n".join(unified_diff(c_wire, r_wire, "C", "ref")[:20])
    assert digests(c_results) == digests(r_results)
    assert [e["cmd"] for e in c_wire].count("GRAPH_COMPUTE") == 1


@pytest.mark.realpeer
@pytest.mark.parametrize("proto", sorted(REAL))
def test_ref_client_reuses_graphs_and_splits_uploads_as_the_c_client(tmp_path, proto):
    """2D transfers and graph reuse by uid: the same canonical bytes as the real client, the
    same results from the real server and from the reference server."""
    from harness.impls.ctypes_driver import CtypesClientDriver
    peer = real_peer(REAL[proto])
    with start_peer_server(peer, workdir=tmp_path / "a") as srv:
        c_results, c_wire = run_session(CtypesClientDriver(peer.lib_dir, proto=proto), srv,
                                        tmp_path, GRAPH_STEPS)
    with start_peer_server(peer, workdir=tmp_path / "b") as srv:
        r_results, r_wire = run_session(RefClientDriver(proto), srv, tmp_path, GRAPH_STEPS)
    with start_reference_server(proto, workdir=tmp_path / "ref") as srv:
        s_results, _ = run_session(CtypesClientDriver(peer.lib_dir, proto=proto), srv, tmp_path,
                                   GRAPH_STEPS)
    div = first_divergence(c_wire, r_wire)
    assert div is None, f"{div}\n" + "\n".join(unified_diff(c_wire, r_wire, "C", "ref")[:20])
    assert digests(c_results) == digests(r_results) == digests(s_results)
    cmds = [e["cmd"] for e in c_wire]
    if proto == "8.0.0":  # the 8.0.0 client keeps both uids; the C client's own uid went out
        assert cmds.count("SET_TENSOR_2D") == 1 and cmds.count("GET_TENSOR_2D") == 1
        assert cmds.count("GRAPH_RECOMPUTE") == 3 and cmds.count("GRAPH_COMPUTE") == 3
        uids = [r["uid"] for r in c_results if "uid" in r]
        sent = [e["request"]["uid"] for e in c_wire if e["cmd"].startswith("GRAPH_")]
        assert uids[:3] != [0, 0, 0] and sent[0] == "G1" and sent[2] == "G2" and sent[-1] == 0
    else:  # 7.0.0: row by row, and only the last uid is reused
        assert "SET_TENSOR_2D" not in cmds and cmds.count("GRAPH_RECOMPUTE") == 1


@pytest.mark.realpeer
def test_graph_cache_limit_is_the_c_clients(tmp_path):
    """1025 kept graphs: the 8.0.0 client clears its uid cache at the 1025th, so the first
    graph goes out again as GRAPH_COMPUTE; the reference client does the same."""
    from harness.impls.ctypes_driver import CtypesClientDriver
    from harness.proto.constants import GRAPH_CACHE_MAX
    peer = real_peer("p8")
    steps = GRAPH_STEPS[:4] + [{"op": "node", "name": "s", "kind": "add", "inputs": ["a", "b"],
                                "buffer": "act", "offset": 0}]
    steps += [{"op": "compute", "outputs": ["s"], "graph": f"g{i}"}
              for i in range(GRAPH_CACHE_MAX + 1)]
    steps += [{"op": "compute", "graph": "g0"}, {"op": "compute", "graph": f"g{GRAPH_CACHE_MAX}"}]
    wires = []
    for driver in (CtypesClientDriver(peer.lib_dir, proto="8.0.0"), RefClientDriver("8.0.0")):
        with start_peer_server(peer, workdir=tmp_path / driver.name) as srv:
            wires.append(run_session(driver, srv, tmp_path, steps)[1])
    c_wire, r_wire = wires
    assert first_divergence(c_wire, r_wire) is None
    assert [e["cmd"] for e in c_wire[-2:]] == ["GRAPH_COMPUTE", "GRAPH_RECOMPUTE"]


@pytest.mark.realpeer
@pytest.mark.parametrize("proto", sorted(REAL))
def test_reference_server_gives_the_real_servers_results(tmp_path, proto):
    """The real C client against `harness serve --proto P` and against the real server."""
    from harness.impls.ctypes_driver import CtypesClientDriver
    peer = real_peer(REAL[proto])
    with start_peer_server(peer, workdir=tmp_path / "real") as srv:
        real, real_wire = run_session(CtypesClientDriver(peer.lib_dir, proto=proto), srv, tmp_path)
    with start_reference_server(proto, workdir=tmp_path / "ref") as srv:
        ref, ref_wire = run_session(CtypesClientDriver(peer.lib_dir, proto=proto), srv, tmp_path)
    assert digests(real, False) == digests(ref, False)
    assert close(real[MUL_MAT_GET], ref[MUL_MAT_GET])
    # the same client said the same things to both servers; the answers match too (device
    # memory aside: the reference reports its budget, the CPU backend the host's RAM)
    for i, (a, b) in enumerate(zip(real_wire, ref_wire)):
        assert a["cmd"] == b["cmd"]
        if a["cmd"] == "GET_DEVICE_MEMORY" or a.get("response", {}) and \
                a["request"].get("tensor", {}).get("name") == "Y":
            continue
        assert a == b, (i, a["cmd"], first_divergence([a], [b]))


@pytest.mark.realpeer
@pytest.mark.parametrize("proto", sorted(REAL))
def test_ref_client_against_real_server_matches_reference_server(tmp_path, proto):
    peer = real_peer(REAL[proto])
    with start_peer_server(peer, workdir=tmp_path / "real") as srv:
        real, _ = run_session(RefClientDriver(proto), srv, tmp_path)
    with start_reference_server(proto, workdir=tmp_path / "ref") as srv:
        ref, _ = run_session(RefClientDriver(proto), srv, tmp_path)
    assert digests(real, False) == digests(ref, False)
    assert close(real[MUL_MAT_GET], ref[MUL_MAT_GET])


# ---------------------------------------------------------------- conformance

def test_every_recorded_case_has_a_conformance_case():
    recorded = json.loads(shipped("vectors", "errors.json").read_text())
    by_vector = {c.vector: c for c in CASES}
    for rec in recorded:
        case = by_vector.get(rec["case"])
        assert case is not None, f"no conformance case for {rec['case']!r}"
        assert case.expect == VECTOR_OUTCOMES[rec["after"]], rec["case"]
    state = json.loads(shipped("vectors", "state.json").read_text())
    assert by_vector["stale_handle_from_prev_conn"].expect == VECTOR_OUTCOMES[
        state["stale_handle_from_prev_conn"]]


def _assert_conformance(host: str, port: int):
    results = run_all(host, port, observe_wait=0.3)
    wrong = [(r.case.id, r.case.expect, r.outcome, r.detail) for r in results if not r.ok]
    assert not wrong
    with RawSession(host, port) as s:  # and it still serves the next client
        assert s.hello().version == (7, 0, 0)


def test_reference_server_closes_where_the_real_one_does():
    srv = ReferenceServer(ServerConfig(get_dialect("7.0.0")), serial=True, out=io.StringIO(),
                          err=io.StringIO())
    srv.start()
    try:
        _assert_conformance(srv.host, srv.port)
    finally:
        srv.stop()


@pytest.mark.realpeer
def test_real_server_still_behaves_as_recorded(tmp_path):
    with start_peer_server(real_peer("p7"), workdir=tmp_path) as srv:
        _assert_conformance("127.0.0.1", srv.port)
