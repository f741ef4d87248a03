"""The real client library (ctypes agent) against a real 7.0.0 server and fake servers."""

from __future__ import annotations

import signal
import time

import numpy as np
import pytest

from harness.impls.driver import ClientAborted, StepFailed, fingerprint, make_fill
from harness.impls.ctypes_driver import ClientHung, CtypesClientDriver, classify_exit, last_error

from test_realclient_support import FakeServer, RealServer, realpeer, require_peer_dir

F32 = np.float32


def expect(arr: np.ndarray) -> dict:
    return fingerprint(np.ascontiguousarray(arr).view(np.uint8))


def fill(fill_spec: dict, n: int, dtype=F32) -> np.ndarray:
    return make_fill(fill_spec, n * np.dtype(dtype).itemsize).view(dtype)


@pytest.fixture
def peer(tmp_path):
    return require_peer_dir()


@pytest.fixture
def server(peer, tmp_path):
    with RealServer(peer, tmp_path / "server.log", env={"GGML_RPC_DEBUG": "1"}) as srv:
        yield srv


@pytest.fixture
def client(peer):
    drv = CtypesClientDriver(peer, proto="7.0.0", step_timeout=30, session_timeout=120)
    yield drv
    drv.close()


@realpeer
def test_full_session(server, client):
    d = client
    d.do("connect", endpoint=server.endpoint)
    assert d.do("device_count") == {"count": 1}
    bt = d.do("buffer_type")
    assert bt["alignment"] > 0 and bt["alignment"] & (bt["alignment"] - 1) == 0
    assert bt["max_size"] > 0
    mem = d.do("device_memory")
    assert 0 < mem["free"] <= mem["total"]

    n = 64
    w = d.do("alloc_buffer", name="w", size=4096, usage="weights")
    c = d.do("alloc_buffer", name="c", size=4096, usage="compute")
    assert w["size"] == 4096 and w["base"] and c["base"] and w["base"] != c["base"]

    a = d.do("tensor", name="a", buffer="w", offset=0, type="f32", ne=[n])
    b = d.do("tensor", name="b", buffer="w", offset=256, type="f32", ne=[n])
    assert a["nbytes"] == 4 * n and a["data"] == w["base"] and b["data"] == w["base"] + 256

    fa, fb = {"pattern": "arange"}, {"pattern": "random", "seed": 7}
    assert d.do("set", tensor="a", fill=fa)["fnv"] == expect(fill(fa, n))["fnv"]
    d.do("set", tensor="b", fill=fb)
    assert d.do("get", tensor="a") == expect(fill(fa, n))
    assert d.do("get", tensor="b") == expect(fill(fb, n))
    # A partial read at an offset
    assert d.do("get", tensor="a", offset=8, size=16) == expect(fill(fa, n)[2:6])

    d.do("node", name="s", kind="add", inputs=["a", "b"], buffer="c", offset=0)
    d.do("node", name="p", kind="mul", inputs=["s", "b"], buffer="c", offset=256)
    assert d.do("compute", outputs=["p"]) == {"status": 0, "uid": 0}
    xa, xb = fill(fa, n), fill(fb, n)
    assert d.do("get", tensor="p") == expect((xa + xb) * xb)

    d.do("tensor", name="e", buffer="c", offset=512, type="f32", ne=[n])
    assert d.do("copy", src="a", dst="e") == {"ok": True}
    assert d.do("get", tensor="e")["fnv"] == expect(xa)["fnv"]

    d.do("memset", tensor="e", offset=16, size=32, value=0)
    ye = xa.copy()
    ye[4:12] = 0
    assert d.do("get", tensor="e") == expect(ye)

    d.do("clear", buffer="c", value=0)
    assert d.do("get", tensor="p") == expect(np.zeros(n, F32))
    d.do("free_buffer", buffer="c")
    d.do("free_buffer", buffer="w")
    info = d.close()
    assert info.returncode == 0 and not info.aborted

    # The server saw exactly the commands these steps stand for. It logs a fire-and-forget
    # command after the client has moved on, so give its last line a moment to arrive.
    deadline = time.monotonic() + 10
    while "[free_buffer]" not in server.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    log = server.log()
    for cmd in ("[hello] version: 7.0.0", "[get_alignment]", "[get_device_memory]",
                "[alloc_buffer]", "[set_tensor]", "[graph_compute] device: 0, n_nodes: 2",
                "[get_tensor]", "[memset_tensor]", "[buffer_clear]", "[free_buffer]"):
        assert cmd in log, cmd
    assert "[copy_tensor]" in log or "copy_tensor" in log
    assert "set_tensor_hash" not in log  # small tensors never hash


@realpeer
def test_ops_views_and_types(server, client):
    d = client
    d.do("connect", endpoint=server.endpoint)
    d.do("alloc_buffer", name="buf", size=1 << 16, usage="compute")
    K, M, N = 4, 3, 2
    ar = {"pattern": "arange"}
    # mul_mat: a ne [K, M], b ne [K, N] -> ne [M, N], result[n, m] = sum_k a[m, k] * b[n, k]
    d.do("tensor", name="ma", buffer="buf", offset=0, ne=[K, M])
    d.do("tensor", name="mb", buffer="buf", offset=256, ne=[K, N])
    d.do("set", tensor="ma", fill=ar)
    d.do("set", tensor="mb", fill={"pattern": "const", "value": 2.0})
    mm = d.do("node", name="mm", kind="mul_mat", inputs=["ma", "mb"], buffer="buf", offset=512)
    assert mm["nbytes"] == 4 * M * N
    # get_rows: rows [0, 1, 2] of a 4x5 table
    d.do("tensor", name="tab", buffer="buf", offset=1024, ne=[4, 5])
    d.do("tensor", name="idx", buffer="buf", offset=1280, type="i32", ne=[3])
    d.do("set", tensor="tab", fill=ar)
    d.do("set", tensor="idx", fill={"pattern": "arange", "dtype": "i32"})
    d.do("node", name="rows", kind="get_rows", inputs=["tab", "idx"], buffer="buf", offset=1536)
    # scale, a view, and cpy into an f16 tensor
    d.do("node", name="half", kind="scale", inputs=["tab"], buffer="buf", offset=2048,
         params={"s": 0.5})
    v = d.do("view", name="v", src="tab", ne=[4], offset=16)
    d.do("tensor", name="h16", buffer="buf", offset=4096, type="f16", ne=[20])
    d.do("node", name="cp", kind="cpy", inputs=["tab", "h16"])
    assert v["nbytes"] == 16
    # A 2-D view keeps the source's row stride: rows 0-2, columns 1-2 of the table.
    v2 = d.do("view", name="v2", src="tab", ne=[2, 3], offset=4)
    assert v2["nbytes"] == 2 * 4 + 2 * 16
    d.do("tensor", name="dense", buffer="buf", offset=4352, ne=[2, 3])
    d.do("node", name="cp2", kind="cpy", inputs=["v2", "dense"])
    assert d.do("compute", outputs=["mm", "rows", "half", "cp", "cp2"]) == {"status": 0, "uid": 0}

    A = fill(ar, K * M).reshape(M, K)
    B = np.full((N, K), 2.0, F32)
    assert d.do("get", tensor="mm") == expect(B @ A.T)
    tab = fill(ar, 20).reshape(5, 4)
    assert d.do("get", tensor="rows") == expect(tab[[0, 1, 2]])
    assert d.do("get", tensor="half") == expect(tab * F32(0.5))
    assert d.do("get", tensor="v") == expect(tab.reshape(-1)[4:8])
    assert d.do("get", tensor="h16") == expect(tab.reshape(-1).astype(np.float16))
    assert d.do("get", tensor="cp") == expect(tab.reshape(-1).astype(np.float16))
    assert d.do("get", tensor="v2") == expect(tab.reshape(-1)[1:11])  # raw span, gaps included
    assert d.do("get", tensor="dense") == expect(tab[0:3, 1:3])


@realpeer
def test_weights_usage_turns_on_hash_path(peer, client, tmp_path):
    # With -c the server stores what the client flags for caching under the FNV-1a of the
    # data: only a WEIGHTS buffer's tensor above 10 MiB takes that path (spec 9).
    cache = tmp_path / "llama-cache"
    with RealServer(peer, tmp_path / "server.log", args=("-c",),
                    env={"GGML_RPC_DEBUG": "1", "LLAMA_CACHE": str(cache)}) as server:
        d = client
        d.do("connect", endpoint=server.endpoint)
        n = 3_000_000  # 12 MB > HASH_THRESHOLD
        fnv = {}
        for usage in ("compute", "weights"):
            d.do("alloc_buffer", name=usage, size=4 * n + 64, usage=usage)
            d.do("tensor", name=f"t_{usage}", buffer=usage, offset=0, ne=[n])
            seed = {"compute": 1, "weights": 2}[usage]
            fnv[usage] = d.do("set", tensor=f"t_{usage}",
                              fill={"pattern": "random", "seed": seed})["fnv"]
            d.do("get", tensor=f"t_{usage}", size=4)  # a round trip: the server is done
        assert sorted(p.name for p in (cache / "rpc").iterdir()) == [fnv["weights"]]
        # The same bytes again: SET_TENSOR_HASH hits, and the data is not sent a second time.
        d.do("tensor", name="again", buffer="weights", offset=0, ne=[n])
        d.do("set", tensor="again", fill={"pattern": "random", "seed": 2})
        assert d.do("get", tensor="again") == expect(fill({"pattern": "random", "seed": 2}, n))
        log = server.log()
        assert log.count("[set_tensor_hash]") == 1
        assert log.count("[set_tensor] buffer:") == 2
        assert f"[set_tensor] saved to '{cache / 'rpc' / fnv['weights']}'" in log


@realpeer
def test_refusals_keep_the_session(server, client):
    d = client
    d.do("connect", endpoint=server.endpoint)
    d.do("alloc_buffer", name="b", size=256)
    d.do("tensor", name="t", buffer="b", offset=0, ne=[16])
    bad = [
        {"op": "no_such_op"},
        {"op": "get", "tensor": "missing"},
        {"op": "tensor", "name": "big", "buffer": "b", "offset": 200, "ne": [16]},
        {"op": "tensor", "name": "t", "buffer": "b", "offset": 0, "ne": [1]},  # duplicate
        {"op": "tensor", "name": "q", "buffer": "b", "offset": 0, "type": "q4_0", "ne": [3]},
        {"op": "set", "tensor": "t", "offset": 60, "size": 8},
        {"op": "node", "name": "n", "kind": "add", "inputs": ["t"]},
        {"op": "node", "name": "n", "kind": "mul_mat", "inputs": ["t", "t"], "buffer": "b",
         "offset": 10_000},
        {"op": "memset", "tensor": "t", "value": 300},
        {"op": "alloc_buffer", "name": "x", "size": 1, "usage": "bogus"},
        {"op": "tensor", "name": "y", "buffer": "b"},  # no offset/ne
    ]
    for step in bad:
        with pytest.raises(StepFailed) as ei:
            d.run(step)
        assert ei.value.result.error, step
    # still alive and serving
    d.do("set", tensor="t", fill={"pattern": "const", "value": 1.5})
    assert d.do("get", tensor="t") == expect(np.full(16, 1.5, F32))
    d.do("free_buffer", buffer="b")
    with pytest.raises(StepFailed, match="freed"):
        d.do("get", tensor="t")
    assert d.close().returncode == 0


@realpeer
def test_memset_refused_for_pre5_library(server, peer):
    # The agent trusts the registry's proto: a proto-4 library has no MEMSET_TENSOR and would
    # assert, so the step is refused instead.
    d = CtypesClientDriver(peer, proto="4.0.2", step_timeout=30)
    try:
        d.do("connect", endpoint=server.endpoint)
        d.do("alloc_buffer", name="b", size=256)
        d.do("tensor", name="t", buffer="b", offset=0, ne=[16])
        with pytest.raises(StepFailed, match="unsupported by this client library"):
            d.do("memset", tensor="t", offset=0, size=16, value=0)
        d.do("get", tensor="t")
    finally:
        assert d.close().returncode == 0


@realpeer
def test_unchecked_step_reaches_the_library_assert(server, client):
    d = client
    d.do("connect", endpoint=server.endpoint)
    d.do("alloc_buffer", name="b", size=64)
    with pytest.raises(ClientAborted) as ei:
        d.run({"op": "tensor", "name": "t", "buffer": "b", "offset": 0, "ne": [64],
               "unchecked": True})
    info = ei.value.exit_info
    assert info.aborted and info.signal == signal.SIGABRT
    assert "GGML_ASSERT" in info.message
    assert ei.value.step["op"] == "tensor"


@realpeer
def test_server_lost_mid_session(server, client):
    d = client
    d.do("connect", endpoint=server.endpoint)
    server.stop()
    with pytest.raises(ClientAborted) as ei:
        d.do("alloc_buffer", name="b", size=64)
    info = ei.value.exit_info
    assert info.aborted
    assert "Remote RPC server crashed or returned malformed response" in info.message


@realpeer
def test_version_mismatch_aborts(peer):
    with FakeServer(FakeServer.hello_reply(9)) as fake:
        d = CtypesClientDriver(peer, step_timeout=30)
        with pytest.raises(ClientAborted) as ei:
            d.do("connect", endpoint=fake.endpoint)
        info = ei.value.exit_info
        assert not isinstance(ei.value, ClientHung)
        assert info.aborted and info.signal == signal.SIGABRT and info.returncode == -6
        assert "version mismatch" in info.message and "9.0.0" in info.message
        assert any("handshake failed" in ln for ln in info.log_tail)
        assert fake.received[:1] == b"\x0e"  # it did send HELLO
        assert d.close() is info  # close() reports the same end, no second process
        with pytest.raises(ClientAborted):
            d.do("device_count")


@realpeer
def test_hung_server_is_a_hang(peer):
    with FakeServer(None) as fake:
        d = CtypesClientDriver(peer, step_timeout=1.5)
        t0 = time.monotonic()
        with pytest.raises(ClientHung) as ei:
            d.do("connect", endpoint=fake.endpoint)
        assert time.monotonic() - t0 < 10
        info = ei.value.exit_info
        assert info.returncode is None and not info.aborted
        assert info.message == "hang: no answer to connect within 1.5 s"
        assert d.proc.poll() is not None  # killed and reaped
        assert d.close() is info


@realpeer
def test_session_deadline(tmp_path):
    # The overall deadline caps a step's own timeout.
    d = CtypesClientDriver(require_peer_dir(server=False), step_timeout=30, session_timeout=2)
    with FakeServer(None) as fake:
        with pytest.raises(ClientHung, match="session deadline of 2 s"):
            d.do("connect", endpoint=fake.endpoint)


def test_agent_start_failure_is_reported(tmp_path):
    d = CtypesClientDriver(tmp_path)  # no libraries here
    with pytest.raises(ClientAborted) as ei:
        d.do("device_count")
    assert ei.value.step is None
    assert "libggml-base.so not found" in ei.value.exit_info.message
    assert ei.value.exit_info.returncode == 2


def test_classify_exit():
    log = ["RPC server version mismatch: 9.0.0",
           "/src/ggml/src/ggml-rpc/ggml-rpc.cpp:550: RPC handshake failed for 127.0.0.1:1", ""]
    info = classify_exit(-6, log)
    assert info.aborted and info.signal == 6 and not info.crashed
    assert info.message == "RPC server version mismatch: 9.0.0"
    assert classify_exit(134, log).signal == 6  # via a shell
    seg = classify_exit(-11, ["something"])
    assert seg.crashed and not seg.aborted
    ok = classify_exit(0, ["llama_perf_context_print: total time = 1 ms"])
    assert ok.message == "" and not ok.aborted
    assert last_error(["x.cpp:12: GGML_ASSERT(a) failed"]) == "GGML_ASSERT(a) failed"
    assert last_error(["/a/b/ggml.c:9: fatal thing"]) == "fatal thing"
