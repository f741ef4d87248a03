"""The reference client and server through bytes in memory (harness.reference.pair): no sockets,
no threads, no sleeps. The socket tests (test_refpeer.py) stay for the I/O layer; here the
same sessions run single-threaded and must put the same bytes on the wire as over TCP."""

from __future__ import annotations

import io

import numpy as np
import pytest

from harness.impls.driver import make_fill
from harness.reference.client import RefClient, ServerClosed, VersionRejected
from harness.reference.knobs import Misbehaviour
from harness.reference.pair import ConnectionPair
from harness.reference.server import ReferenceServer
from harness.reference.server_core import ServerConfig
from harness.proto import PRIMARY, RpcTensor, cache_file_name, fnv1a64, get_dialect, ggml
from harness.proto.constants import HASH_THRESHOLD
from harness.transport.tcp import TcpTransport

MiB = 1 << 20


def session(c: RefClient) -> list:
    """Every command family once; returns what the client saw."""
    seen = [c.server_hello.version, c.device_count(), c.get_alignment(), c.get_max_size(),
            c.get_device_memory()]
    ptr, size = c.alloc_buffer(4096)
    base = c.buffer_get_base(ptr)
    a = RpcTensor.make(id=0x10, type=ggml.TYPE_F32, ne=(4,), buffer=ptr, data=base, name="a")
    b = a.with_(id=0x20, data=base + 64)
    out = a.with_(id=0x30, data=base + 128, op=ggml.OP["ADD"], flags=ggml.FLAG_COMPUTE,
                  src=(0x10, 0x20) + (0,) * 8)
    big = RpcTensor.make(id=0x40, type=ggml.TYPE_I8, ne=(2048,), buffer=ptr, data=base + 2048)
    c.init_tensor(a)
    c.set_tensor(a, np.array([1, 2, 3, 4], np.float32))
    c.set_tensor(b, np.array([10, 20, 30, 40], np.float32))
    c.set_tensor(big, make_fill({"pattern": "random", "seed": 3, "dtype": "u8"}, 2048))
    c.graph_compute([0x30], [a, b, out], uid=7)
    seen.append(np.frombuffer(c.get_tensor(out, 0, 16), np.float32).tolist())
    seen.append(c.copy_tensor(a, b))
    c.memset_tensor(a, 0, 8, 0xFF)
    seen.append(bytes(c.get_tensor(a, 0, 16)))
    seen.append(fnv1a64(c.get_tensor(big, 0, 2048)))
    seen.append(c.get_alloc_size(a))
    c.buffer_clear(ptr, 0)
    seen.append(bytes(c.get_tensor(a, 0, 16)))
    c.free_buffer(ptr)
    return seen


class Recording:
    """A transport that keeps both directions' bytes (the TCP run's wire)."""

    def __init__(self, tr):
        self.tr, self.c2s, self.s2c = tr, bytearray(), bytearray()

    def sendall(self, data):
        self.c2s += memoryview(data).cast("B")
        self.tr.sendall(data)

    def sendall_parts(self, parts):
        for p in parts:
            self.sendall(p)

    def recv_into(self, buf):
        n = self.tr.recv_into(buf)
        self.s2c += memoryview(buf).cast("B")[:n]
        return n

    def __getattr__(self, name):
        return getattr(self.tr, name)


def tcp_run(dialect: str):
    srv = ReferenceServer(ServerConfig(dialect=get_dialect(dialect)), idle_timeout=10,
                          out=io.StringIO(), err=io.StringIO())
    srv.start()
    try:
        rec = Recording(TcpTransport.connect(srv.host, srv.port, timeout=10))
        c = RefClient(rec, dialect)
        c.hello()
        seen = session(c)
        c.close()
        return seen, rec
    finally:
        srv.stop()


@pytest.mark.parametrize("dialect", PRIMARY)
def test_full_session_in_memory_matches_tcp_byte_for_byte(dialect):
    with ConnectionPair(dialect) as pair:
        seen = session(pair.client)
    rec = pair.record
    assert rec.close_reason is None and rec.ended is not None
    assert rec.commands == 21 and rec.bytes_in == len(pair.transport.c2s)
    assert seen[0] == get_dialect(dialect).version
    assert seen[5] == [11, 22, 33, 44]
    assert seen[7] == b"\xff" * 8 + bytes(np.array([3, 4], np.float32).tobytes())
    assert seen[10] == bytes(16)
    tcp_seen, wire = tcp_run(dialect)
    assert seen == tcp_seen
    assert bytes(pair.transport.c2s) == bytes(wire.c2s)
    assert bytes(pair.transport.s2c) == bytes(wire.s2c)


@pytest.mark.parametrize("client, server", [("9.0.0", "7.0.0"), ("7.0.0", "9.0.0"),
                                            ("8.0.0", "9.0.0"), ("7.0.0", "8.0.0")])
def test_version_rejection(client, server):
    pair = ConnectionPair(client, server, hello=False)
    with pytest.raises(VersionRejected) as exc:
        pair.client.hello()
    pair.close()
    assert exc.value.server_version == get_dialect(server).version
    rec = pair.record
    assert rec.commands == 1 and rec.hello_only and rec.close_reason is None
    assert "rejected by its version rule" in rec.note
    assert len(pair.transport.c2s) == 1 + 8 + 24  # HELLO and nothing after it


def test_version_rejection_during_construction_still_ends_the_connection():
    srv = ReferenceServer(ServerConfig(dialect=get_dialect("9.0.0")), out=io.StringIO(),
                          err=io.StringIO())
    with pytest.raises(VersionRejected):
        ConnectionPair("7.0.0", server=srv)
    assert srv.connections[-1].ended is not None and srv.connections[-1].hello_only


BIG = HASH_THRESHOLD + 4096


def upload(pair: ConnectionPair, data) -> str:
    c = pair.client
    ptr, _ = c.alloc_buffer(len(data))
    t = RpcTensor.make(id=1, type=ggml.TYPE_I8, ne=(len(data),), buffer=ptr,
                       data=c.buffer_get_base(ptr), name="w")
    how = c.set_tensor(t, data, weights=True)
    assert fnv1a64(c.get_tensor(t, 0, len(data))) == fnv1a64(data)
    return how


@pytest.mark.parametrize("dialect", PRIMARY)
def test_hash_path_miss_save_hit(dialect, tmp_path):
    data = make_fill({"pattern": "random", "seed": 9, "dtype": "u8"}, BIG)
    srv = ReferenceServer(ServerConfig(dialect=get_dialect(dialect), cache_dir=tmp_path),
                          out=io.StringIO(), err=io.StringIO())
    with ConnectionPair(dialect, server=srv) as first:
        assert upload(first, data) == "sent"
        assert (first.client.stats.hash_requests, first.client.stats.hash_hits) == (1, 0)
    assert first.record.cache_saves == [cache_file_name(fnv1a64(data))]
    assert (tmp_path / first.record.cache_saves[0]).read_bytes() == data.tobytes()
    with ConnectionPair(dialect, server=srv) as second:
        assert upload(second, data) == "cached"
        assert second.client.stats.commands.get("SET_TENSOR") is None
    assert second.record.cache_hits == 1


@pytest.mark.parametrize("dialect, hashes", [("7.0.0", 1), ("8.0.0", 1), ("7.0.0+flags", 0),
                                             ("9.0.0", 0)])
def test_hashing_policy_without_a_server_cache(dialect, hashes):
    with ConnectionPair(dialect) as pair:
        assert upload(pair, np.zeros(BIG, np.uint8)) == "sent"
        assert pair.client.stats.hash_requests == hashes


@pytest.mark.parametrize("dialect, reads_payload", [("7.0.0", True), ("9.0.0", False)])
def test_receive_policy_on_a_bad_set_tensor_header(dialect, reads_payload):
    with ConnectionPair(dialect) as pair:
        c = pair.client
        ptr, _ = c.alloc_buffer(64)
        bad = RpcTensor.make(id=1, type=ggml.TYPE_I8, ne=(64,), buffer=ptr,
                             data=c.buffer_get_base(ptr))
        with pytest.raises(ServerClosed):
            c.set_tensor(bad, bytes(4 * MiB))
            c.device_count()
    rec = pair.record
    assert "out of buffer bounds" in rec.close_reason
    head = len(pair.transport.c2s) - 4 * MiB  # everything but the payload
    assert (rec.bytes_in > head) is reads_payload


def test_a_stalled_server_fails_the_read_at_once():
    with ConnectionPair("7.0.0", server_knobs=Misbehaviour(stall_on="DEVICE_COUNT")) as pair:
        with pytest.raises(TimeoutError, match="never return"):
            pair.client.device_count()
    assert pair.record.close_reason == "misbehaviour: stalled until the client closed"


def test_a_server_close_is_seen_by_the_client():
    with ConnectionPair("9.0.0", server_knobs=Misbehaviour(close_on="GET_ALIGNMENT")) as pair:
        assert pair.client.device_count() == 1
        with pytest.raises(ServerClosed):
            pair.client.get_alignment()
    assert pair.record.close_reason == "misbehaviour: close on GET_ALIGNMENT"
