"""Reference client <-> reference server, for every primary dialect."""

from __future__ import annotations

import io
import struct
import threading
import time
from contextlib import contextmanager

import numpy as np
import pytest

from harness.impls.driver import ClientAborted, fingerprint, make_fill
from harness.impls.ref_driver import RefClientDriver
from harness.reference.client import RefClient, VersionRejected
from harness.reference.knobs import Misbehaviour
from harness.reference.server import ReferenceServer
from harness.reference.server_core import ServerConfig
from harness.proto import PRIMARY, RpcTensor, cache_file_name, fnv1a64, get_dialect, ggml
from harness.proto.constants import HASH_THRESHOLD, SERVER_FLAG_CACHE
from harness.proto.messages import SetTensorRequest

MiB = 1 << 20


@contextmanager
def ref_server(dialect="7.0.0", *, cache_dir=None, serial=False, knobs=None, **kw):
    cfg = ServerConfig(dialect=get_dialect(dialect), cache_dir=cache_dir,
                       knobs=knobs or Misbehaviour(), **kw)
    srv = ReferenceServer(cfg, serial=serial, idle_timeout=10, out=io.StringIO(),
                          err=io.StringIO())
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def connect(srv, dialect=None, **kw) -> RefClient:
    return RefClient.connect(srv.host, srv.port, dialect or srv.config.dialect, timeout=10, **kw)


def wait_closed(srv, n=1, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(srv.connections) >= n and all(c.ended for c in srv.connections[:n]):
            return srv.connections
        time.sleep(0.01)
    raise AssertionError(f"server saw {len(srv.connections)} connections, not all ended")


def tensor_in(client, size, *, type=ggml.TYPE_F32, ne=None, id=0x1000, name="t"):
    ptr, got = client.alloc_buffer(size)
    assert ptr and got == size
    base = client.buffer_get_base(ptr)
    if ne is None:
        ne = (size // ggml.TYPES[type].type_size,)
    return ptr, RpcTensor.make(id=id, type=type, ne=ne, buffer=ptr, data=base, name=name)


@pytest.mark.parametrize("dialect", PRIMARY)
def test_hello_and_device_queries(dialect):
    with ref_server(dialect, cache_dir=None) as srv, connect(srv) as c:
        d = get_dialect(dialect)
        assert c.server_hello.version == d.version
        assert c.server_hello.flags == 0  # no cache: no flag even where byte 3 is flags
        assert c.device_count() == 1
        assert c.get_alignment() == 32
        assert c.get_max_size() == 2**64 - 1
        free, total = c.get_device_memory()
        assert 0 < free <= total


@pytest.mark.parametrize("dialect", PRIMARY)
@pytest.mark.parametrize("size", [1, 3, 4096, MiB + 7, 16 * MiB])
def test_set_get_roundtrip(dialect, size):
    data = make_fill({"pattern": "random", "seed": size, "dtype": "u8"}, size)
    with ref_server(dialect) as srv, connect(srv) as c:
        _, t = tensor_in(c, size, type=ggml.TYPE_I8, ne=(size,))
        assert c.set_tensor(t, data) == "sent"
        back = c.get_tensor(t, 0, size)
        assert bytes(back) == data.tobytes()


@pytest.mark.slow
@pytest.mark.parametrize("dialect", ["7.0.0", "9.0.0"])
def test_set_get_64MiB(dialect):
    size = 64 * MiB
    data = make_fill({"pattern": "random", "seed": 1, "dtype": "u8"}, size)
    with ref_server(dialect) as srv, connect(srv) as c:
        _, t = tensor_in(c, size, type=ggml.TYPE_I8, ne=(size,))
        c.set_tensor(t, data)
        out = np.empty(size, np.uint8)
        c.get_tensor(t, 0, size, out=out)
        assert np.array_equal(out, data)


@pytest.mark.parametrize("dialect", PRIMARY)
def test_offsets_and_windows(dialect):
    with ref_server(dialect) as srv, connect(srv) as c:
        _, t = tensor_in(c, 256, type=ggml.TYPE_I8, ne=(256,))
        c.set_tensor(t, bytes(256))
        c.set_tensor(t, b"\x01\x02\x03", offset=5)
        assert bytes(c.get_tensor(t, 4, 5)) == b"\x00\x01\x02\x03\x00"
        # a tensor placed inside the buffer at an offset (a view of the same memory)
        inner = t.with_(id=0x2000, ne=(16, 1, 1, 1), data=t.data + 64)
        c.set_tensor(inner, bytes(range(16)))
        assert bytes(c.get_tensor(t, 64, 16)) == bytes(range(16))
        assert bytes(c.get_tensor(t, 0, 0)) == b""


@pytest.mark.parametrize("dialect", PRIMARY)
def test_copy_memset_clear_free(dialect):
    with ref_server(dialect) as srv, connect(srv) as c:
        ptr, a = tensor_in(c, 64, ne=(16,))
        b = a.with_(id=0x2000, data=a.data + 32, ne=(8, 1, 1, 1))
        a8 = a.with_(ne=(8, 1, 1, 1))
        c.set_tensor(a8, np.arange(8, dtype=np.float32))
        assert c.copy_tensor(a8, b)
        assert np.array_equal(np.frombuffer(c.get_tensor(b, 0, 32), np.float32), np.arange(8))
        c.memset_tensor(b, 4, 8, 0xFF)
        raw = bytes(c.get_tensor(b, 0, 32))
        assert raw[4:12] == b"\xff" * 8 and raw[:4] == struct.pack("<f", 0)
        c.buffer_clear(ptr, 0xAB)
        assert bytes(c.get_tensor(a, 0, 64)) == b"\xab" * 64
        c.free_buffer(ptr)
        assert c.device_count() == 1  # still serving after the free
    rec = wait_closed(srv)[0]
    assert rec.close_reason is None


def _graph_session(dialect, steps):
    with ref_server(dialect) as srv:
        drv = RefClientDriver(dialect)
        drv.run({"op": "connect", "endpoint": f"{srv.host}:{srv.port}"})
        results = [drv.run(s).result for s in steps]
        drv.close()
    return results


@pytest.mark.parametrize("dialect", PRIMARY)
def test_graph_compute_matches_numpy(dialect):
    n = 64
    fa = {"pattern": "random", "seed": 1}
    fb = {"pattern": "random", "seed": 2}
    xa = make_fill(fa, 4 * n).view(np.float32)
    xb = make_fill(fb, 4 * n).view(np.float32)
    steps = [
        {"op": "alloc_buffer", "name": "w", "size": 1 << 16, "usage": "weights"},
        {"op": "alloc_buffer", "name": "act", "size": 1 << 16, "usage": "compute"},
        {"op": "tensor", "name": "a", "buffer": "w", "offset": 0, "ne": [n]},
        {"op": "tensor", "name": "b", "buffer": "w", "offset": 4096, "ne": [n]},
        {"op": "set", "tensor": "a", "fill": fa},
        {"op": "set", "tensor": "b", "fill": fb},
        {"op": "node", "name": "sum", "kind": "add", "inputs": ["a", "b"], "buffer": "act", "offset": 0},
        {"op": "node", "name": "prod", "kind": "mul", "inputs": ["sum", "b"], "buffer": "act", "offset": 4096},
        {"op": "node", "name": "scaled", "kind": "scale", "inputs": ["prod"], "buffer": "act",
         "offset": 8192, "params": {"s": 0.5}},
        {"op": "tensor", "name": "h", "buffer": "act", "offset": 12288, "type": "f16", "ne": [n]},
        {"op": "node", "name": "to_f16", "kind": "cpy", "inputs": ["scaled", "h"]},
        {"op": "compute", "outputs": ["to_f16"]},
        {"op": "get", "tensor": "scaled"},
        {"op": "get", "tensor": "h"},
    ]
    res = _graph_session(dialect, steps)
    expect = ((xa + xb) * xb * np.float32(0.5)).astype(np.float32)
    assert res[-2] == fingerprint(expect)
    assert res[-1] == fingerprint(expect.astype(np.float16))


@pytest.mark.parametrize("dialect", ["7.0.0", "9.0.0"])
@pytest.mark.parametrize("wtype", ["f32", "f16"])
def test_mul_mat_and_get_rows(dialect, wtype):
    k, m_, n = 16, 8, 4
    fw = {"pattern": "random", "seed": 3, "dtype": wtype}
    fx = {"pattern": "random", "seed": 4}
    wsize = k * m_ * (4 if wtype == "f32" else 2)
    w = make_fill(fw, wsize).view(np.float32 if wtype == "f32" else np.float16).reshape(m_, k)
    x = make_fill(fx, 4 * k * n).view(np.float32).reshape(n, k)
    steps = [
        {"op": "alloc_buffer", "name": "w", "size": 1 << 16, "usage": "weights"},
        {"op": "tensor", "name": "W", "buffer": "w", "offset": 0, "type": wtype, "ne": [k, m_]},
        {"op": "tensor", "name": "X", "buffer": "w", "offset": 4096, "ne": [k, n]},
        {"op": "tensor", "name": "I", "buffer": "w", "offset": 8192, "type": "i32", "ne": [4]},
        {"op": "set", "tensor": "W", "fill": fw},
        {"op": "set", "tensor": "X", "fill": fx},
        {"op": "set", "tensor": "I", "fill": {"pattern": "arange", "dtype": "i32"}},
        {"op": "node", "name": "Y", "kind": "mul_mat", "inputs": ["W", "X"], "buffer": "w", "offset": 12288},
        {"op": "node", "name": "R", "kind": "get_rows", "inputs": ["W", "I"], "buffer": "w", "offset": 16384},
        {"op": "compute", "outputs": ["Y", "R"]},
        {"op": "get", "tensor": "Y"},
        {"op": "get", "tensor": "R"},
    ]
    res = _graph_session(dialect, steps)
    # ggml: dst[n][m] = sum_k W[m,k] X[n,k]; with f16 weights X is rounded to f16 first
    xq = x.astype(np.float16).astype(np.float32) if wtype == "f16" else x
    y = (xq @ w.astype(np.float32).T).astype(np.float32)
    assert res[-2] == fingerprint(y)
    assert res[-1] == fingerprint(w.astype(np.float32)[[0, 1, 2, 3]])  # arange fill: rows 0..3


@pytest.mark.parametrize("dialect", PRIMARY)
def test_recompute_uses_new_inputs(dialect):
    with ref_server(dialect) as srv, connect(srv) as c:
        ptr, a = tensor_in(c, 1024, ne=(4,), id=0x10, name="a")
        b = a.with_(id=0x20, data=a.data + 64, name=b"b".ljust(64, b"\0"))
        out = a.with_(id=0x30, data=a.data + 128, op=ggml.OP["ADD"], flags=ggml.FLAG_COMPUTE,
                      src=(0x10, 0x20) + (0,) * 8)
        c.set_tensor(a, np.array([1, 2, 3, 4], np.float32))
        c.set_tensor(b, np.array([10, 20, 30, 40], np.float32))
        c.graph_compute([0x30], [a, b, out], uid=7)
        assert np.frombuffer(c.get_tensor(out, 0, 16), np.float32).tolist() == [11, 22, 33, 44]
        c.set_tensor(a, np.array([100, 200, 300, 400], np.float32))
        c.graph_recompute(uid=7)
        assert np.frombuffer(c.get_tensor(out, 0, 16), np.float32).tolist() == [110, 220, 330, 440]


# ---------------------------------------------------------------- hash cache

BIG = HASH_THRESHOLD + 4096


def _upload_weights(srv, data, dialect=None):
    with connect(srv, dialect) as c:
        _, t = tensor_in(c, len(data), type=ggml.TYPE_I8, ne=(len(data),), name="w")
        how = c.set_tensor(t, data, weights=True)
        assert bytes(c.get_tensor(t, 0, 64)) == data[:64].tobytes()
        assert fnv1a64(c.get_tensor(t, 0, len(data))) == fnv1a64(data)
        return how, c.stats


@pytest.mark.parametrize("dialect", PRIMARY)
def test_hash_path_with_cache_miss_save_hit(dialect, tmp_path):
    data = make_fill({"pattern": "random", "seed": 9, "dtype": "u8"}, BIG)
    name = cache_file_name(fnv1a64(data))
    with ref_server(dialect, cache_dir=tmp_path) as srv:
        how, stats = _upload_weights(srv, data)
        assert (how, stats.hash_requests, stats.commands.get("SET_TENSOR")) == ("sent", 1, 1)
        assert (tmp_path / name).read_bytes() == data.tobytes()  # saved on the miss
        how, stats = _upload_weights(srv, data)  # a new connection: the cache outlives it
        assert (how, stats.hash_requests, stats.hash_hits) == ("cached", 1, 1)
        assert "SET_TENSOR" not in stats.commands  # the hit replaced the upload


@pytest.mark.parametrize("dialect", PRIMARY)
def test_hash_path_without_cache(dialect, tmp_path):
    data = make_fill({"pattern": "random", "seed": 9, "dtype": "u8"}, BIG)
    with ref_server(dialect, cache_dir=None) as srv:
        how, stats = _upload_weights(srv, data)
    assert how == "sent"
    if get_dialect(dialect).server_flags:
        assert stats.hash_requests == 0  # new clients skip the useless hash (seed 000 / 9.0.0)
    else:
        assert stats.hash_requests == 1  # old clients hash anyway and get a miss


@pytest.mark.parametrize("dialect", PRIMARY)
def test_compute_buffers_are_never_hashed(dialect, tmp_path):
    data = make_fill({"pattern": "random", "seed": 5, "dtype": "u8"}, BIG)
    with ref_server(dialect, cache_dir=tmp_path) as srv, connect(srv) as c:
        _, t = tensor_in(c, BIG, type=ggml.TYPE_I8, ne=(BIG,))
        assert c.set_tensor(t, data, weights=False) == "sent"
        assert c.stats.hash_requests == 0
    assert list(tmp_path.iterdir()) == []


def test_new_client_old_server_with_cache_loses_the_cache_silently(tmp_path):
    """Seed 000's 7f client against a real-7 style server started with -c: byte 3 is 0."""
    data = make_fill({"pattern": "random", "seed": 2, "dtype": "u8"}, BIG)
    with ref_server("7.0.0", cache_dir=tmp_path) as srv:
        for _ in range(2):
            how, stats = _upload_weights(srv, data, dialect="7.0.0+flags")
            assert (how, stats.hash_requests) == ("sent", 0)
    assert list(tmp_path.iterdir()) == []  # neither filled nor used


def test_flag_byte_set_only_with_cache(tmp_path):
    for dialect, cache, flags in [("7.0.0", tmp_path, 0), ("8.0.0", tmp_path, 0),
                                  ("7.0.0+flags", tmp_path, SERVER_FLAG_CACHE),
                                  ("9.0.0", tmp_path, SERVER_FLAG_CACHE), ("9.0.0", None, 0)]:
        with ref_server(dialect, cache_dir=cache) as srv, connect(srv) as c:
            assert c.server_hello.flags == flags, dialect


# ---------------------------------------------------------------- version rule

@pytest.mark.parametrize("client,server,ok", [
    ("7.0.0", "9.0.0", False), ("9.0.0", "7.0.0", False), ("9.0.0", "7.0.0+flags", False),
    ("7.0.0+flags", "9.0.0", False), ("8.0.0", "9.0.0", False), ("7.0.0", "8.0.0", False),
    ("7.0.0", "7.0.0+flags", True), ("7.0.0+flags", "7.0.0", True), ("9.0.0", "9.0.0", True),
    ("7.0.1", "7.0.0", True), ("7.0.0", "7.0.1", True),
])
def test_version_rule_between_dialects(client, server, ok):
    with ref_server(server) as srv:
        if ok:
            with connect(srv, client) as c:
                assert c.device_count() == 1
            assert wait_closed(srv)[0].note is None
            return
        with pytest.raises(VersionRejected) as ei:
            connect(srv, client)
        assert f"version mismatch: {get_dialect(server).version_str}" in str(ei.value)
        rec = wait_closed(srv)[0]
        assert rec.commands == 1 and rec.close_reason is None
        assert "right after HELLO" in rec.note  # the server side says why, too


def test_driver_reports_version_rejection_like_an_aborting_client():
    with ref_server("9.0.0") as srv:
        drv = RefClientDriver("7.0.0")
        with pytest.raises(ClientAborted) as ei:
            drv.run({"op": "connect", "endpoint": f"{srv.host}:{srv.port}"})
        assert ei.value.exit_info.aborted
        assert "version mismatch: 9.0.0" in ei.value.exit_info.message


# ---------------------------------------------------------------- robustness

def test_disconnect_mid_set_tensor_then_next_client_is_served():
    with ref_server("7.0.0", serial=True) as srv:
        c = connect(srv, knobs=Misbehaviour(truncate_set_tensor_at=1000))
        _, t = tensor_in(c, 4096, type=ggml.TYPE_I8, ne=(4096,))
        c.set_tensor(t, bytes(4096))
        c.close()
        with connect(srv) as c2:
            assert c2.device_count() == 1
        recs = wait_closed(srv, 2)
    assert "after 1000 of 4096" in recs[0].close_reason
    assert recs[1].close_reason is None


@pytest.mark.parametrize("dialect,reads_payload", [("7.0.0", True), ("9.0.0", False)])
def test_receive_policy_decides_when_a_bad_header_is_rejected(dialect, reads_payload):
    """An old server reads a bad SET_TENSOR's whole payload before closing; a new one closes
    at the header. Seen from the client: the old one lets the whole payload in."""
    payload = 8 * MiB
    with ref_server(dialect) as srv, connect(srv) as c:
        _, t = tensor_in(c, 256, type=ggml.TYPE_I8, ne=(256,))
        before = c.tr.bytes_sent
        c.tr.sendall(c.conn.send_head(SetTensorRequest(t.with_(type=43), 0, 0), payload))
        try:
            for _ in range(8):
                c.tr.sendall(bytes(MiB))
        except OSError:
            pass  # the streaming server closed at the header
        rec = wait_closed(srv)[0]
    assert "invalid tensor type" in rec.close_reason
    read_after_header = rec.bytes_in - (before + 9 + 305)
    assert read_after_header == (payload if reads_payload else 0)


def test_two_clients_at_once_concurrent_and_serial():
    with ref_server("7.0.0") as srv, connect(srv) as a, connect(srv) as b:
        assert a.device_count() == b.device_count() == 1  # neither blocks the other
    with ref_server("7.0.0", serial=True) as srv:
        a = connect(srv)
        got = {}

        def second():
            got["b"] = connect(srv).device_count()

        t = threading.Thread(target=second, daemon=True)
        t.start()
        t.join(0.5)
        assert "b" not in got  # served one at a time, like the real server
        a.close()
        t.join(5)
        assert got.get("b") == 1


def test_memory_budget_is_enforced_with_a_zero_answer():
    with ref_server("7.0.0", memory_budget=64 * MiB) as srv, connect(srv) as c:
        assert c.alloc_buffer(1 << 40) == (0, 0)
        ptr, size = c.alloc_buffer(32 * MiB)
        assert ptr and size == 32 * MiB
        assert c.alloc_buffer(48 * MiB) == (0, 0)


def test_hostile_graph_is_closed_not_crashed():
    with ref_server("7.0.0") as srv, connect(srv) as c:
        _, a = tensor_in(c, 256, ne=(4,), id=0x10)
        node = a.with_(id=0x20, op=200, flags=ggml.FLAG_COMPUTE, data=a.data + 64)
        c.graph_compute([0x20], [a, node])
        rec = wait_closed(srv)[0]
    assert "not supported" in rec.close_reason


def test_misbehaviour_knobs_reach_the_wire():
    with ref_server("7.0.0", knobs=Misbehaviour(hello_version=(9, 0, 0), hello_flags=0x80)) as srv:
        c = RefClient.connect(srv.host, srv.port, "9.0.0", timeout=5)
        assert c.server_hello.version == (9, 0, 0) and c.server_hello.flags == 0x80
        c.close()
