"""The recording proxy: faithful relay and transcript, close kinds, timeouts, bounded memory."""

from __future__ import annotations

import socket
import struct
import threading
import time
import tracemalloc

import pytest

from harness.capture.proxy import LiveDecoder, RecordingProxy
from harness.capture.transcript import C2S, S2C
from harness.proto import (Cmd, RpcTensor, decode_session, get_dialect, pack_request)
from harness.proto.messages import (DeviceCountRequest, GetAlignmentRequest,
                                    GraphComputeRequest, SetTensorRequest)

D7 = get_dialect("7.0.0")
DEVICE_COUNT = pack_request(D7, DeviceCountRequest())  # 9 bytes
DEVICE_COUNT_RSP = struct.pack("<QI", 4, 1)
TIMEOUT = 10.0


class Upstream:
    """A one-connection server thread: ``handler(conn)`` talks to the proxied client."""

    def __init__(self, handler):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(TIMEOUT)
        self.address = self.listener.getsockname()
        self.handler = handler
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            conn, _ = self.listener.accept()
            conn.settimeout(TIMEOUT)
            with conn:
                self.handler(conn)
        except BaseException as e:  # noqa: BLE001 - re-raised in the test thread by join()
            self.error = e
        finally:
            self.listener.close()

    def join(self):
        self.thread.join(TIMEOUT)
        assert not self.thread.is_alive(), "upstream thread hung"
        if self.error is not None:
            raise self.error


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError(f"closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def answer_device_count(conn: socket.socket) -> None:
    """Answer every 9-byte request with the fixed DEVICE_COUNT response until EOF."""
    while True:
        try:
            req = recv_exactly(conn, 9)
        except EOFError:
            return
        assert req == DEVICE_COUNT
        conn.sendall(DEVICE_COUNT_RSP)


def turned_away(address) -> bool:
    """Connect and expect the proxy to close on us (the reset may even beat connect())."""
    try:
        with socket.create_connection(address, timeout=TIMEOUT) as c:
            return c.recv(1) == b""
    except ConnectionResetError:
        return True


def test_ping_pong_transcript_equals_the_traffic():
    up = Upstream(answer_device_count)
    seen = []
    with RecordingProxy(up.address, on_chunk=lambda i, d, data, t: seen.append((i, d, bytes(data)))) as px:
        with socket.create_connection(px.address, timeout=TIMEOUT) as c:
            for _ in range(50):
                c.sendall(DEVICE_COUNT)
                assert recv_exactly(c, 12) == DEVICE_COUNT_RSP
            c.shutdown(socket.SHUT_WR)
            assert c.recv(1) == b""  # the upstream's FIN came through
        up.join()
    [tr] = px.transcripts
    assert not px.running and not px.errors
    assert tr.bytes_of(C2S) == DEVICE_COUNT * 50 and tr.bytes_of(S2C) == DEVICE_COUNT_RSP * 50
    assert tr.complete
    # strictly alternating: every request is answered before the next one is sent
    dirs = [c.direction for c in tr.chunks]
    assert dirs == [C2S, S2C] * 50
    assert [c.t for c in tr.chunks] == sorted(c.t for c in tr.chunks)
    assert {d: how for d, (_, how) in tr.closed.items()} == {C2S: "fin", S2C: "fin"}
    assert tr.meta["server"] == list(up.address) and tr.meta["end"] == "closed"
    assert b"".join(d for _, direction, d in seen if direction == C2S) == DEVICE_COUNT * 50
    session = tr.decode()
    assert session.commands == [Cmd.DEVICE_COUNT] * 50
    assert all(e.response.device_count == 1 for e in session.exchanges)


def test_live_decoder_follows_the_session():
    up = Upstream(answer_device_count)
    live = LiveDecoder()
    with RecordingProxy(up.address, on_chunk=live) as px:
        with socket.create_connection(px.address, timeout=TIMEOUT) as c:
            for _ in range(3):
                c.sendall(DEVICE_COUNT)
                assert recv_exactly(c, 12) == DEVICE_COUNT_RSP
        up.join()
    session = live.session(0)
    assert session.commands == [Cmd.DEVICE_COUNT] * 3
    assert [e.response.device_count for e in session.exchanges] == [1, 1, 1]
    assert session.c2s_error is None and not px.errors


def test_reset_by_the_server_is_recorded_and_passed_on():
    def reset_after_one(conn):
        recv_exactly(conn, 9)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    up = Upstream(reset_after_one)
    with RecordingProxy(up.address) as px:
        with socket.create_connection(px.address, timeout=TIMEOUT) as c:
            c.sendall(DEVICE_COUNT)
            with pytest.raises(ConnectionResetError):
                c.recv(1)
        up.join()
    [tr] = px.transcripts
    assert tr.closed[S2C][1] == "rst" and C2S not in tr.closed
    assert tr.meta["end"] == "reset"


def test_idle_timeout_closes_the_connection():
    release = threading.Event()
    up = Upstream(lambda conn: release.wait(TIMEOUT))
    px = RecordingProxy(up.address, idle_timeout=0.3).start()
    try:
        with socket.create_connection(px.address, timeout=TIMEOUT) as c:
            t0 = time.monotonic()
            assert c.recv(1) == b""
            assert 0.25 < time.monotonic() - t0 < 5
    finally:
        release.set()
        px.stop()
        up.join()
    assert px.transcripts[0].meta["end"] == "idle_timeout"


def test_deadline_ends_everything():
    release = threading.Event()
    up = Upstream(lambda conn: release.wait(TIMEOUT))
    px = RecordingProxy(up.address, deadline=0.4).start()
    try:
        with socket.create_connection(px.address, timeout=TIMEOUT) as c:
            assert c.recv(1) == b""
        deadline = time.monotonic() + 5
        while px.running and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not px.running
    finally:
        release.set()
        px.stop()
        up.join()
    assert px.transcripts[0].meta["end"] == "deadline"


def test_unreachable_upstream():
    spare = socket.create_server(("127.0.0.1", 0))
    address = spare.getsockname()
    spare.close()  # nothing listens here now
    with RecordingProxy(address, connect_timeout=2.0) as px:
        assert turned_away(px.address)
    assert "upstream connect failed" in px.transcripts[0].meta["error"]


def test_several_clients_get_one_transcript_each():
    up = Upstream(answer_device_count)  # accepts a single connection
    with RecordingProxy(up.address) as px:
        with socket.create_connection(px.address, timeout=TIMEOUT) as c:
            c.sendall(DEVICE_COUNT)
            assert recv_exactly(c, 12) == DEVICE_COUNT_RSP
        up.join()
        assert turned_away(px.address)  # the upstream is gone now
    assert len(px.transcripts) == 2
    assert px.transcripts[0].bytes_of(C2S) == DEVICE_COUNT
    assert px.transcripts[1].total(C2S) == 0 and "error" in px.transcripts[1].meta


def test_reset_by_the_client_reaches_the_server():
    outcome = []

    def wait_for_reset(conn):
        try:
            outcome.append(conn.recv(1 << 16))
            outcome.append(conn.recv(1 << 16))
        except ConnectionResetError:
            outcome.append("reset")

    up = Upstream(wait_for_reset)
    with RecordingProxy(up.address) as px:
        c = socket.create_connection(px.address, timeout=TIMEOUT)
        c.sendall(DEVICE_COUNT)
        time.sleep(0.1)
        c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        c.close()
        up.join()
    assert outcome == [DEVICE_COUNT, "reset"]
    assert px.transcripts[0].closed[C2S][1] == "rst"


def _drain(conn: socket.socket) -> None:
    buf = bytearray(1 << 20)
    while conn.recv_into(buf):
        pass


def test_elision_keeps_frame_headers_beyond_keep():
    """Past ``keep``, payloads are elided but every frame header stays, so it still decodes."""
    up = Upstream(_drain)
    tensor = RpcTensor.make(id=0x10, ne=(25_000,), buffer=0xB0, data=0xD0, name="w")
    requests = [pack_request(D7, GetAlignmentRequest())]
    for i in range(20):
        requests.append(pack_request(D7, SetTensorRequest(tensor=tensor, offset=i,
                                                          data=bytes([i]) * 100_000)))
    graph = GraphComputeRequest(nodes=(0x10,), tensors=(tensor,) * 5)
    requests.append(pack_request(D7, graph))  # 1.5 KB of structure: kept whole
    requests.append(pack_request(D7, GetAlignmentRequest(device=3)))
    with RecordingProxy(up.address, keep=1000, head_bytes=512, heads_keep=64 << 10) as px:
        with socket.create_connection(px.address, timeout=TIMEOUT) as c:
            c.sendall(b"".join(requests))
            c.shutdown(socket.SHUT_WR)
            assert c.recv(1) == b""
        up.join()
    [tr] = px.transcripts
    kept = sum(c.length for c in tr.chunks if c.data is not None)
    assert tr.total(C2S) == sum(map(len, requests))
    assert kept < 1000 + 21 * 512 + len(requests[-2]) + 100
    session = decode_session(tr.bytes_of(C2S), b"", D7)
    assert session.c2s_error is None
    msgs = [e.request for e in session.exchanges]
    assert [m.cmd for m in msgs] == [Cmd.GET_ALIGNMENT] + [Cmd.SET_TENSOR] * 20 + \
        [Cmd.GRAPH_COMPUTE, Cmd.GET_ALIGNMENT]
    assert [m.offset for m in msgs[1:21]] == list(range(20))
    assert all(m.tensor == tensor for m in msgs[1:21])
    assert msgs[21] == graph and msgs[22].device == 3


def test_stop_joins_the_thread_and_closes_sockets():
    up = Upstream(answer_device_count)
    before = threading.active_count()
    px = RecordingProxy(up.address).start()
    c = socket.create_connection(px.address, timeout=TIMEOUT)
    c.sendall(DEVICE_COUNT)
    assert recv_exactly(c, 12) == DEVICE_COUNT_RSP
    px.stop()
    assert not px.running
    assert c.recv(1) == b""  # the proxy closed our connection on stop
    c.close()
    up.join()
    assert threading.active_count() <= before
    assert px.transcripts[0].meta["end"] == "stopped"


def test_heads_budget_and_plain_byte_budget():
    frame = pack_request(D7, SetTensorRequest(tensor=RpcTensor.make(id=1, ne=(10_000,)),
                                              data=bytes(40_000)))
    for head_bytes, heads_keep, expect_kept in ((512, 2 * 600, 100 + 2 * 512 + 2 * 9),
                                                (0, 1 << 20, 100)):
        up = Upstream(_drain)
        with RecordingProxy(up.address, keep=100, head_bytes=head_bytes,
                            heads_keep=heads_keep) as px:
            with socket.create_connection(px.address, timeout=TIMEOUT) as c:
                c.sendall(frame * 5)
                c.shutdown(socket.SHUT_WR)
                assert c.recv(1) == b""
            up.join()
        [tr] = px.transcripts
        kept = sum(c.length for c in tr.chunks if c.data is not None)
        assert tr.total(C2S) == 5 * len(frame)
        # heads kept until the budget ran out (the first frame's head is inside ``keep``)
        assert kept <= expect_kept + 9 + 512, (head_bytes, kept)
        assert tr.bytes_of(C2S)[:100] == frame[:100]


@pytest.mark.slow
def test_throughput_and_bounded_memory(record_property):
    """256 MiB of SET_TENSOR through the proxy with keep=1 MiB: fast, and memory stays flat."""
    total = 256 << 20
    received = []
    up = Upstream(lambda conn: received.append(_count(conn)))
    block = memoryview(bytes(16 << 20))  # allocated before tracing starts
    header = pack_request(D7, SetTensorRequest(tensor=RpcTensor.make(id=1, ne=(total // 4,))))
    header = header[:1] + struct.pack("<Q", total - 9) + header[9:]
    tracemalloc.start()
    try:
        with RecordingProxy(up.address, keep=1 << 20) as px:
            with socket.create_connection(px.address, timeout=TIMEOUT) as c:
                t0 = time.perf_counter()
                c.sendall(header)
                left = total - len(header)
                while left:
                    n = min(left, len(block))
                    c.sendall(block[:n])
                    left -= n
                c.shutdown(socket.SHUT_WR)
                assert c.recv(1) == b""
                seconds = time.perf_counter() - t0
            up.join()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    rate = total / seconds / (1 << 30)
    record_property("proxy_gib_per_s", round(rate, 2))
    print(f"\nproxy throughput: {rate:.2f} GiB/s ({total >> 20} MiB in {seconds:.2f} s), "
          f"traced peak {peak / (1 << 20):.1f} MiB")
    [tr] = px.transcripts
    assert received == [total] and tr.total(C2S) == total
    assert sum(c.length for c in tr.chunks if c.data is not None) <= (1 << 20) + (64 << 10)
    assert peak < 16 << 20  # relay buffers + the kept MiB; nothing proportional to the volume
    assert len(tr.chunks) < 2000
    assert rate > 0.1  # a floor against per-byte work; a quiet machine does > 1 GiB/s


def _count(conn: socket.socket) -> int:
    buf, n = bytearray(1 << 20), 0
    while True:
        k = conn.recv_into(buf)
        if not k:
            return n
        n += k


def test_compact_keeps_headers_and_elides_bulk():
    from harness.capture.proxy import compact
    from harness.capture.transcript import C2S, Transcript
    from harness.proto import RpcTensor, get_dialect, pack_request
    from harness.proto.messages import HelloRequest, SetTensorRequest

    d = get_dialect("7.0.0")
    frames = [pack_request(d, HelloRequest())] + [
        pack_request(d, SetTensorRequest(RpcTensor.make(id=i, ne=(1 << 18,)), 0, 0,
                                         bytes([i]) * (1 << 20))) for i in range(1, 6)]
    tr = Transcript()
    for i, f in enumerate(frames):
        tr.add(float(i), C2S, f)
    small = compact(tr, keep=1 << 20)
    assert small.total(C2S) == tr.total(C2S)
    kept = sum(c.length for c in small.chunks if c.data is not None)
    assert kept < 2 * (1 << 20)
    a, b = tr.decode(), small.decode()
    assert [e.cmd for e in a.exchanges] == [e.cmd for e in b.exchanges]
    assert [e.data_length for e in a.exchanges] == [e.data_length for e in b.exchanges]
