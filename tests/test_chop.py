"""Fault-injecting delivery: re-segmentation, rewrites, truncation, and the matrix under it."""

from __future__ import annotations

import io
import time

import numpy as np
import pytest

from harness.capture.canonical import canonical, first_divergence
from harness.capture.proxy import RecordingProxy
from harness.reference.client import RefClient
from harness.reference.server import ReferenceServer
from harness.reference.server_core import ServerConfig
from harness.proto import RpcTensor, get_dialect, ggml
from harness.proto import messages as m
from harness.proto.codec import pack_request
from harness.proto.constants import HASH_THRESHOLD
from harness.proto.wire import FrameHead, FrameWalker
from harness.transport.chop import Delivery, FaultProxy, _boundaries


def test_delivery_specs():
    assert Delivery.parse("chop").mode == "boundaries"
    d = Delivery.parse("chop:3,delay=2,truncate=100")
    assert (d.mode, d.size, d.delay, d.truncate_at) == ("fixed", 3, 0.002, 100)
    d = Delivery.parse("random:7:64,hello_flags=0x01,cache_flag=255")
    assert (d.mode, d.seed, d.size, d.rewrites) == ("random", 7, 64, {"hello_flags": 1,
                                                                       "cache_flag": 255})
    with pytest.raises(ValueError):
        Delivery.parse("shred")


def test_the_frame_walker_finds_frames_across_reads():
    frames = [bytes([14]) + (24).to_bytes(8, "little") + bytes(24),
              bytes([15]) + bytes(8), bytes([6]) + (310).to_bytes(8, "little") + bytes(310)]
    stream = b"".join(frames)
    walker = FrameWalker(requests=True)
    found = []
    for i in range(0, len(stream), 5):
        found += [p.frame for p in walker.feed(stream[i:i + 5]) if p.header and p.frame]
    assert [(f.start, f.end, f.cmd) for f in found] == [(0, 33, 14), (33, 42, 15), (42, 361, 6)]
    cuts = _boundaries(FrameHead(42, 51, 361, 6, 2), limit=64)
    assert 51 + 296 in cuts and 51 + 297 in cuts  # the cache_flag byte is isolated


def _session(port, dialect="7.0.0", size=3 * (1 << 20)):
    with RefClient.connect("127.0.0.1", port, dialect, timeout=10) as c:
        ptr, _ = c.alloc_buffer(size)
        t = RpcTensor.make(id=1, type=ggml.TYPE_I8, ne=(size,), buffer=ptr,
                           data=c.buffer_get_base(ptr))
        data = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8)
        c.set_tensor(t, data, weights=True)
        assert bytes(c.get_tensor(t, 0, size)) == data.tobytes()
        assert c.device_count() == 1
        return c.stats


def _server(serial=False, **kw):
    srv = ReferenceServer(ServerConfig(get_dialect(kw.pop("dialect", "7.0.0")), **kw),
                          serial=serial, out=io.StringIO(), err=io.StringIO())
    srv.start()
    return srv


@pytest.mark.parametrize("spec", ["chop", "chop:7", "random:3:900"])
def test_resegmented_delivery_changes_nothing_above_tcp(spec):
    srv = _server()
    try:
        with RecordingProxy(("127.0.0.1", srv.port)) as direct:
            _session(direct.port)
            direct.wait_quiet()
        plan = Delivery.parse(spec)
        with RecordingProxy(("127.0.0.1", srv.port)) as rec, \
                FaultProxy(("127.0.0.1", rec.port), c2s=plan, s2c=plan) as fp:
            _session(fp.port, size=64 << 10 if spec == "chop:7" else 3 << 20)
            rec.wait_quiet()
        a = canonical(direct.transcripts[0].decode())
        b = canonical(rec.transcripts[0].decode())
        if spec == "chop:7":  # smaller upload, so only compare the commands
            assert [e["cmd"] for e in a] == [e["cmd"] for e in b]
        else:
            assert first_divergence(a, b) is None
    finally:
        srv.stop()


def test_rewriting_the_flags_byte_makes_a_new_client_hash(tmp_path):
    big = HASH_THRESHOLD + 4096
    srv = _server(dialect="9.0.0")  # no cache: flags byte 0
    try:
        assert _session(srv.port, "9.0.0", big).hash_requests == 0
        with FaultProxy(("127.0.0.1", srv.port), s2c=Delivery.parse("pass,hello_flags=0x01")) as fp:
            stats = _session(fp.port, "9.0.0", big)
        assert stats.hash_requests == 1  # the client trusted the forged cache bit
        assert any("byte 11 rewritten to 0x01" in line for line in fp.log)
    finally:
        srv.stop()


def test_stopping_the_proxy_ends_its_threads_while_the_connection_is_still_open():
    """A direction thread blocks in recv (up to the proxy's 60 s idle): stop() must wake it.
    Planted (a close without the shutdown, as before): every session through a FaultProxy
    took two 5 s joins to stop, and the threads were left behind."""
    import socket
    srv = _server()
    try:
        fp = FaultProxy(("127.0.0.1", srv.port), c2s=Delivery.parse("chop")).start()
        client = socket.create_connection(("127.0.0.1", fp.port), timeout=5)
        try:
            client.sendall(pack_request(get_dialect("7.0.0"), m.HelloRequest()))
            assert len(client.recv(64)) > 0  # both directions are running
            fp.stop(timeout=2.0)
            assert fp._threads and not [t.name for t in fp._threads if t.is_alive()]
        finally:
            client.close()
    finally:
        srv.stop()


def test_rewriting_cache_flag_makes_the_server_save(tmp_path):
    srv = _server(cache_dir=tmp_path)
    try:
        with FaultProxy(("127.0.0.1", srv.port), c2s=Delivery.parse("pass,cache_flag=0xff")) as fp:
            _session(fp.port, size=4096)
        assert len(list(tmp_path.iterdir())) == 1  # a small compute upload was cached
    finally:
        srv.stop()


def test_truncation_closes_and_the_server_survives():
    srv = _server(serial=True)
    try:
        with FaultProxy(("127.0.0.1", srv.port), c2s=Delivery.parse("pass,truncate=500")) as fp:
            with pytest.raises(Exception):
                _session(fp.port, size=4096)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not (srv.connections and srv.connections[0].ended):
            time.sleep(0.02)
        assert srv.connections[0].close_reason
        assert _session(srv.port, size=4096).commands["SET_TENSOR"] == 1
    finally:
        srv.stop()


def test_matrix_verdicts_are_the_same_under_chopped_delivery(tmp_path, reference_matrix_run):
    from harness.matrix.cells import expand
    from harness.matrix.model import load_matrix
    from harness.matrix.execute import run_cells
    from test_matrix import REF_MATRIX, write_matrix

    m = load_matrix(write_matrix(tmp_path, REF_MATRIX))
    _, plain = reference_matrix_run  # the same cells delivered as sent, run once (conftest)
    chopped = run_cells(m, expand(m), tmp_path / "chop", run_id="c", workers=2, deliver="chop")
    assert [(r["cell_id"], r["verdict"], r["observed"]) for r in plain] == \
        [(r["cell_id"], r["verdict"], r["observed"]) for r in chopped]
    assert all(r["verdict"] == "pass" for r in chopped)
