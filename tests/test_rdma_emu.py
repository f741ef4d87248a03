"""The emulated RDMA transport: conn_caps, the sans-IO core and the endpoint mechanics."""

from __future__ import annotations

import threading
import time

import pytest

from harness.proto.constants import CONN_CAPS_SIZE, RDMA_CHUNK, SET_TENSOR_HEADER_SIZE
from harness.transport import caps
from harness.proto.behaviour import APP, C_NEW, C_OLD, PARTIAL, WHOLE_COMPLETION, WRITES
from harness.transport.rdma_core import (OLD, REQUEST, RESPONSE, SEED000, V9, CallCutter,
                                         RdmaConfig, RdmaHang, RdmaOverrun, SendFramer,
                                         config_for_dialect)
from harness.transport.rdma_endpoint import emu_pair
from harness.transport.rdma_wires import MEMORY, SOCKET

FABRICS = (MEMORY, SOCKET)
KiB = 1 << 10


# ---------------------------------------------------------------- conn_caps (spec 10.1)

def test_linux_and_macos_layouts_round_trip():
    gid = caps.gid_for_ipv4("192.168.7.9")
    assert gid.hex() == "00000000000000000000ffffc0a80709"
    lin = caps.pack_linux(0x1234567, gid)
    assert len(lin) == CONN_CAPS_SIZE
    c = caps.unpack_linux(lin)
    assert (c.qpn, c.psn, c.gid) == (0x1234567, 0x234567, gid)  # psn = qpn & 0xFFFFFF
    assert lin[:8] == bytes.fromhex("67452301" "67452300")
    mac = caps.pack_macos(0x42, 7, gid)
    m = caps.unpack_macos(mac)
    assert (m.qpn, m.lid, m.reserved, m.gid) == (0x42, 7, 0, gid)
    assert mac[4:8] == bytes.fromhex("07000000")
    assert caps.ipv4_of_gid(gid) == "192.168.7.9"
    with pytest.raises(ValueError):
        caps.unpack_linux(bytes(23))


@pytest.mark.parametrize("pos", range(CONN_CAPS_SIZE))
def test_any_single_nonzero_byte_means_rdma(pos):
    b = bytearray(CONN_CAPS_SIZE)
    b[pos] = 0x80
    assert caps.supports_rdma(bytes(b))
    assert caps.activates(caps.ADVERTISE, bytes(b))
    assert not caps.activates(caps.WITHHOLD, bytes(b))
    assert not caps.supports_rdma(caps.ZERO_CAPS)


def test_lie_caps_are_flagged_as_odd_but_count_as_rdma():
    assert caps.supports_rdma(caps.LIE_CAPS)
    assert caps.oddities(caps.LIE_CAPS) == []  # well-formed: only the qpn names nothing
    odd = bytes([1]) + bytes(23)
    assert any("psn" in o for o in caps.oddities(odd))
    assert any("IPv4-mapped" in o for o in caps.oddities(odd))


P = caps
NEGOTIATIONS = [
    # client policy, server policy, outcome, client on, server on
    (P.ADVERTISE, P.ADVERTISE, P.RDMA, True, True),
    (P.ADVERTISE, P.WITHHOLD, P.TCP, False, False),  # a peer without RDMA answers zero caps
    (P.WITHHOLD, P.ADVERTISE, P.TCP, False, False),
    (P.WITHHOLD, P.WITHHOLD, P.TCP, False, False),
    (P.LIE_CAPABLE, P.ADVERTISE, P.ASYMMETRIC, False, True),  # server switches alone
    (P.ADVERTISE, P.LIE_CAPABLE, P.ASYMMETRIC, True, False),  # client switches alone
    (P.HIDE_AND_ACTIVATE, P.ADVERTISE, P.ASYMMETRIC, True, False),
    (P.ADVERTISE, P.HIDE_AND_ACTIVATE, P.ASYMMETRIC, False, True),
    (P.LIE_CAPABLE, P.LIE_CAPABLE, P.TCP, False, False),  # lies, but nobody can switch
    (P.HIDE_AND_ACTIVATE, P.HIDE_AND_ACTIVATE, P.TCP, False, False),
]


@pytest.mark.parametrize("cp, sp, outcome, client_on, server_on", NEGOTIATIONS)
def test_negotiation_predictions(cp, sp, outcome, client_on, server_on):
    n = caps.negotiate(cp, sp)
    assert (n.outcome, n.client_activates, n.server_activates) == (outcome, client_on, server_on)
    assert ("asymmetric" in n.describe()) == (outcome == P.ASYMMETRIC)


def test_version_rejection_after_server_activation_is_asymmetric():
    n = caps.negotiate(P.ADVERTISE, P.ADVERTISE, client_accepts_version=False)
    assert n.server_activates and not n.client_activates and n.asymmetric


@pytest.mark.parametrize("fabric", FABRICS)
@pytest.mark.parametrize("cp, sp, outcome, client_on, server_on", NEGOTIATIONS)
def test_endpoints_follow_the_prediction(fabric, cp, sp, outcome, client_on, server_on):
    raw = OLD.with_(send_framing=WRITES, read_calls=APP)  # bytes, not frames
    with emu_pair(raw, raw, fabric=fabric, client_policy=cp, server_policy=sp,
                  timeout=2) as p:
        c_caps, s_caps = p.client.local_conn_caps(), p.server.local_conn_caps()
        assert caps.supports_rdma(c_caps) == (cp in (P.ADVERTISE, P.LIE_CAPABLE))
        if cp == P.ADVERTISE:
            assert caps.unpack_linux(c_caps).qpn == p.client.qpn
            assert caps.ipv4_of_gid(caps.unpack_linux(c_caps).gid) == "127.0.0.1"
        # spec 10.1 order: server answers, then switches; the client checks, then switches
        assert p.server.upgrade(c_caps) == server_on
        assert p.client.upgrade(s_caps) == client_on
        if outcome == P.RDMA:
            p.client.sendall(b"ping")
            p.client.flush()
            buf = bytearray(16)
            assert p.server.recv_into(memoryview(buf)) == 4 and buf[:4] == b"ping"


# ---------------------------------------------------------------- sans-IO core

def _calls(cutter: CallCutter, stream: bytes) -> list[tuple[str, int]]:
    out = []
    pos = 0
    while pos < len(stream):
        kind, size = cutter.kind, cutter.remaining
        cutter.advance(stream[pos:pos + size])
        out.append((kind, size))
        pos += size
    return out


def _set_tensor(size: int) -> bytes:
    from harness.proto import get_dialect
    from harness.proto.codec import pack_request
    from harness.proto.messages import SetTensorRequest
    from harness.proto.tensor import RpcTensor
    t = RpcTensor.make(id=1, type=24, ne=(max(size, 1),), buffer=0x10, data=0x20)
    return pack_request(get_dialect("7.0.0"), SetTensorRequest(t, 0, 0, bytes(size)))


def test_call_plans_of_both_generations():
    frame = _set_tensor(1000) + bytes([15]) + bytes(8)  # SET_TENSOR then DEVICE_COUNT
    old = _calls(CallCutter(REQUEST), frame)
    assert old == [("cmd", 1), ("len", 8), ("payload", SET_TENSOR_HEADER_SIZE + 1000),
                   ("cmd", 1), ("len", 8)]  # no payload call for len 0
    new = _calls(CallCutter(REQUEST, split_set_tensor=True, data_piece=300), frame)
    assert new == [("cmd", 1), ("len", 8), ("set_tensor header", SET_TENSOR_HEADER_SIZE),
                   ("set_tensor data", 300), ("set_tensor data", 300), ("set_tensor data", 300),
                   ("set_tensor data", 100), ("cmd", 1), ("len", 8)]
    rsp = (4).to_bytes(8, "little") + b"abcd"
    assert _calls(CallCutter(RESPONSE), rsp) == [("len", 8), ("payload", 4)]


def test_send_framer_cuts_each_call_from_its_start():
    f = SendFramer(100)
    assert [len(p) for p in f.write(bytes(250))] == [100, 100, 50]
    assert list(f.write(b"")) == []  # zero-length calls send nothing
    c = SendFramer(100, CallCutter(REQUEST, split_set_tensor=True))
    frame = _set_tensor(150)
    # [1] [8] [305 -> 100,100,100,5] [150 -> 100,50]
    assert [len(p) for p in c.write(frame)] == [1, 8, 100, 100, 100, 5, 100, 50]
    # an unfinished call waits until flush (a truncating sender)
    c2 = SendFramer(100, CallCutter(REQUEST))
    assert [len(p) for p in c2.write(frame[:50])] == [1, 8]
    assert [len(p) for p in c2.flush()] == [41]


def test_presets_follow_the_generations():
    assert (OLD.send_slots, OLD.recv_policy, OLD.send_framing) == (1, WHOLE_COMPLETION, C_OLD)
    assert (SEED000.send_slots, SEED000.recv_policy, SEED000.send_framing) == (8, PARTIAL, C_NEW)
    assert (V9.send_slots, V9.recv_policy, V9.data_read_piece) == (1, PARTIAL, 16 << 20)
    assert OLD.chunk == RDMA_CHUNK == 256 * KiB and OLD.recv_depth == 24
    assert config_for_dialect("7.0.0") is OLD and config_for_dialect("8.0.0") is OLD
    assert config_for_dialect("7.0.0+flags") is SEED000 and config_for_dialect("9.0.0") is V9
    with pytest.raises(ValueError):
        RdmaConfig().with_(recv_policy="eager")


# ---------------------------------------------------------------- endpoint mechanics

def _activate(p):
    assert p.server.upgrade(p.client.local_conn_caps())
    assert p.client.upgrade(p.server.local_conn_caps())


def _drain(ep, n: int, step: int = 1 << 20) -> bytes:
    out = bytearray()
    buf = memoryview(bytearray(step))
    while len(out) < n:
        k = ep.recv_into(buf)
        if k == 0:
            break
        out += buf[:k]
    return bytes(out)


@pytest.mark.parametrize("fabric", FABRICS)
@pytest.mark.parametrize("gen", [OLD, SEED000])
def test_stop_and_wait_versus_ring(fabric, gen):
    cfg = gen.with_(send_framing=WRITES, read_calls=APP)  # raw bytes, reads >= chunk
    with emu_pair(cfg, cfg, fabric=fabric, timeout=5) as p:
        _activate(p)
        data = bytes(range(256)) * (40 * RDMA_CHUNK // 256 + 3)  # 40 chunks and a bit
        got = {}
        reader = threading.Thread(target=lambda: got.setdefault("d", _drain(p.server, len(data))))
        reader.start()
        p.client.sendall(data)
        p.client.flush()
        assert p.client.wire.in_flight() == 0  # flush drained the ring
        reader.join(10)
        assert got["d"] == data
        ws, st = p.client.wire_stats, p.client.stats
        assert st.sends == 41 and st.largest_send == RDMA_CHUNK
        assert ws.max_in_flight <= gen.send_slots
        if gen.send_slots == 1:
            assert ws.max_in_flight == 1
        assert p.server.wire_stats.max_landed <= gen.recv_depth


@pytest.mark.parametrize("fabric", FABRICS)
@pytest.mark.parametrize("gen", [OLD, SEED000])
def test_receive_ring_bounds_the_sender_rnr(fabric, gen):
    cfg = gen.with_(send_framing=WRITES, chunk=1 * KiB)
    with emu_pair(cfg, cfg, fabric=fabric, timeout=0.6) as p:
        _activate(p)
        data = bytes(50 * KiB)  # 50 SENDs against a 24-deep ring nobody reads
        with pytest.raises(RdmaHang) as e:
            p.client.sendall(data)
            p.client.flush()
        assert "SENDs" in str(e.value)
        assert p.client.wire_stats.rnr_waits > 0
        assert p.server.wire_stats.max_landed == cfg.recv_depth  # never more than the posted buffers


@pytest.mark.parametrize("fabric", FABRICS)
def test_slow_reader_gets_everything_despite_rnr(fabric):
    cfg = SEED000.with_(chunk=4 * KiB)
    with emu_pair(cfg, cfg, fabric=fabric, timeout=5) as p:
        _activate(p)
        data = bytes(range(251)) * 1000
        sender = threading.Thread(target=lambda: (p.client.sendall(data), p.client.flush()))
        sender.start()
        time.sleep(0.2)  # let the ring fill up before anyone reads
        out = _drain(p.server, len(data), step=777)
        sender.join(10)
        assert out == data and p.client.wire_stats.rnr_waits > 0


@pytest.mark.parametrize("fabric", FABRICS)
def test_overrun_is_raised_with_details_and_sticks(fabric):
    with emu_pair(OLD.with_(send_framing=WRITES), OLD, fabric=fabric, timeout=2) as p:
        _activate(p)
        p.client.sendall(bytes([15]) + bytes(8))  # DEVICE_COUNT as one SEND of 9 bytes
        p.client.flush()
        buf = memoryview(bytearray(64))
        with pytest.raises(RdmaOverrun) as e:
            p.server.recv_into(buf)
        assert e.value.to_dict() == {"completion_index": 0, "byte_len": 9, "call_kind": "cmd",
                                     "call_size": 1, "call_remaining": 1, "stream_offset": 0,
                                     "excess": 8}
        with pytest.raises(RdmaOverrun):
            p.server.recv_into(buf)  # the endpoint stays failed
        assert p.server.summary()["failure"]["excess"] == 8


@pytest.mark.parametrize("fabric", FABRICS)
def test_every_wait_has_a_deadline(fabric):
    with emu_pair(OLD, OLD, fabric=fabric, timeout=0.3) as p:
        buf = memoryview(bytearray(8))
        t0 = time.monotonic()
        with pytest.raises(RdmaHang, match="no TCP data.*TCP on both sides"):
            p.server.recv_into(buf)
        _activate(p)
        with pytest.raises(RdmaHang, match="no RDMA completion.*sent nothing"):
            p.server.recv_into(buf)
        assert time.monotonic() - t0 < 3
        assert p.server.diagnosis is not None


@pytest.mark.parametrize("fabric", FABRICS)
def test_peer_close_is_eof_both_through_rdma_and_tcp_liveness(fabric):
    with emu_pair(SEED000, SEED000, fabric=fabric, timeout=2) as p:
        _activate(p)
        p.client.sendall(b"last words")
        p.client.flush()
        p.client.close()
        assert _drain(p.server, 100) == b"last words"
        assert p.server.recv_into(memoryview(bytearray(8))) == 0


def test_tcp_hangup_ends_a_receiver_whose_peer_never_switched():
    # version rejection after server activation: the client closes TCP without switching
    with emu_pair(OLD, OLD, timeout=2) as p:
        assert p.server.upgrade(p.client.local_conn_caps())
        p.client.close()
        t0 = time.monotonic()
        assert p.server.recv_into(memoryview(bytearray(8))) == 0
        assert p.server.stats.tcp_hangup_seen and time.monotonic() - t0 < 1


@pytest.mark.parametrize("fabric", FABRICS)
def test_asymmetric_activation_is_a_hang_with_the_reason(fabric):
    with emu_pair(OLD, OLD, fabric=fabric, timeout=0.4, client_policy=caps.LIE_CAPABLE) as p:
        assert p.server.upgrade(p.client.local_conn_caps())
        assert not p.client.upgrade(p.server.local_conn_caps())
        p.client.sendall(bytes([15]) + bytes(8))  # over TCP: the client never switched
        with pytest.raises(RdmaHang, match="asymmetric activation: the server switched to RDMA"
                                           ".*client still talks TCP"):
            p.server.recv_into(memoryview(bytearray(8)))
        with pytest.raises(RdmaHang, match="asymmetric activation: the client stayed on TCP"):
            p.client.recv_into(memoryview(bytearray(8)))
        # the server's QP targets the qpn of the lie, which names no queue pair
        with pytest.raises(RdmaHang):
            p.server.sendall(b"x" * 8)
            p.server.flush()
        assert not p.server.wire.reachable()


@pytest.mark.parametrize("fabric", FABRICS)
def test_shutdown_write_delivers_then_eof(fabric):
    with emu_pair(SEED000, SEED000, fabric=fabric, timeout=2) as p:
        _activate(p)
        p.client.sendall(b"abc")
        p.client.shutdown_write()
        assert _drain(p.server, 10) == b"abc"


def test_socket_fabric_threads_are_joined_on_close():
    p = emu_pair(SEED000, SEED000, fabric=SOCKET, timeout=1)
    threads = [p.client.wire._writer, p.client.wire._reader, p.server.wire._writer,
               p.server.wire._reader]
    assert all(t.is_alive() for t in threads)
    p.close()
    assert not any(t.is_alive() for t in threads)


@pytest.mark.parametrize("fabric", FABRICS)
def test_completions_are_the_senders_sends(fabric):
    cfg = OLD.with_(send_framing=WRITES, recv_policy=PARTIAL, chunk=100)
    with emu_pair(cfg, cfg, fabric=fabric, timeout=2) as p:
        _activate(p)
        for n in (1, 99, 100, 101, 250):
            p.client.sendall(bytes(n))
        p.client.flush()
        assert _drain(p.server, 551) == bytes(551)
        assert p.client.stats.sends == p.server.stats.completions == 1 + 1 + 1 + 2 + 3


@pytest.mark.parametrize("gen", [OLD, SEED000])
def test_send_window_does_not_bound_the_receive_ring(gen):
    """Seed 000: "the receive ring is 24 deep, so the sender cannot outrun it". Within one
    message the window of in-flight SENDs retires as soon as each lands, so one message of 25
    chunks to a receiver that is busy already meets a full ring on the 25th SEND, with 1 slot
    or 8. Only the infinite RNR retry (rnr_retry = 7) makes that safe, not 8 < 24."""
    cfg = gen.with_(send_framing=WRITES, read_calls=APP, chunk=1 * KiB)
    with emu_pair(cfg, cfg, timeout=3) as p:
        _activate(p)
        done = threading.Event()
        sender = threading.Thread(target=lambda: (p.client.sendall(bytes(25 * KiB)),
                                                  p.client.flush(), done.set()))
        sender.start()
        deadline = time.monotonic() + 2
        while p.client.wire_stats.rnr_waits < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert p.server.wire_stats.max_landed == 24 and p.client.wire_stats.rnr_waits == 1
        assert not done.is_set()  # the 25th SEND waits for a posted receive
        assert _drain(p.server, 25 * KiB, step=KiB) == bytes(25 * KiB)
        sender.join(5)
        assert done.is_set()
