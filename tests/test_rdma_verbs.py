"""The pyverbs transport: reported unavailable with the real reason where there is no device,
a fallback to TCP when asked, a real session over real pyverbs QPs on the soft verbs device
(harness/native/softverbs), and where a hardware device exists, over it.

On a machine with a device (soft-RoCE included) set ``RDMA_TEST_ADDR`` to an address the
device carries (e.g. the rxe interface's IPv4) to run the session over a real queue pair.
"""

from __future__ import annotations

import io
import os
import sys
import threading
import types

import pytest

from harness.reference.client import RefClient
from harness.reference.server import ReferenceServer
from harness.reference.server_core import ServerConfig
from harness.proto import get_dialect
from harness.transport import rdma_core, verbs
from harness.transport.softverbs import read_qp_stats
from harness.transport.rdma_core import OLD, SEED000
from harness.transport.rdma_endpoint import tcp_socket_pair
from harness.transport.tcp import TcpTransport
from harness.transport.verbs import (
    RdmaUnavailable,
    connect_verbs,
    unavailable_code,
    verbs_available,
    verbs_endpoint,
    verbs_listener,
)
from harness import strictness
from harness.strictness import (PYVERBS_MISSING, RDMA_HCA, RDMA_HCA_PRESENT, TOOL_MISSING,
                                 coded)
from needs import skip

from softverbs_support import pyverbs_session, softverbs_lib_dir

OK, REASON = verbs_available()
REASON_PREFIXES = ("pyverbs not importable: ", "no RDMA devices: ", "RDMA devices: ")


def test_availability_is_reported_with_a_reason():
    assert REASON.startswith(REASON_PREFIXES), REASON
    assert OK == REASON.startswith("RDMA devices: ")
    print(f"\nverbs_available() -> {OK}, {REASON!r}")


def _without_pyverbs(monkeypatch, tmp_path):
    for name in [m for m in sys.modules if m == "pyverbs" or m.startswith("pyverbs.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(verbs, "SYSTEM_DIST_PACKAGES", str(tmp_path / "none"))
    monkeypatch.setenv(verbs.PYVERBS_PATH_ENV, "")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if "dist-packages" not in p])


def test_reason_when_pyverbs_is_missing(monkeypatch, tmp_path):
    _without_pyverbs(monkeypatch, tmp_path)
    ok, reason = verbs_available()
    assert not ok and reason.startswith("pyverbs not importable: ")
    assert "pyverbs" in reason and verbs.PYVERBS_PATH_ENV in reason


def test_a_missing_pyverbs_is_its_own_code_and_fails_strict_mode(monkeypatch, tmp_path):
    _without_pyverbs(monkeypatch, tmp_path)
    _, reason = verbs_available()
    monkeypatch.setenv("CI", "true")
    assert unavailable_code(reason) == PYVERBS_MISSING
    assert strictness.refusal(coded(unavailable_code(reason), reason)) is not None
    # planted: filed under the allowed rdma-hca code, as the session test did, it passed
    assert strictness.refusal(coded(RDMA_HCA, f"no RDMA here: {reason}")) is None


def _fake_pyverbs(monkeypatch, get_device_list):
    pkg = types.ModuleType("pyverbs")
    pkg.__path__ = []
    dev = types.ModuleType("pyverbs.device")
    dev.get_device_list = get_device_list
    monkeypatch.setitem(sys.modules, "pyverbs", pkg)
    monkeypatch.setitem(sys.modules, "pyverbs.device", dev)


def test_reason_when_the_device_list_fails(monkeypatch, tmp_path):
    def fails():
        raise RuntimeError("Failed to get devices list")
    _fake_pyverbs(monkeypatch, fails)
    monkeypatch.setattr(verbs, "SYSFS", tmp_path / "infiniband")
    ok, reason = verbs_available()
    assert not ok
    assert reason.startswith("no RDMA devices: ibv_get_device_list failed (Failed to get devices")
    assert "does not exist" in reason and "rxe" in reason


def test_reason_when_there_are_no_devices(monkeypatch, tmp_path):
    _fake_pyverbs(monkeypatch, list)
    (tmp_path / "infiniband").mkdir()
    monkeypatch.setattr(verbs, "SYSFS", tmp_path / "infiniband")
    ok, reason = verbs_available()
    assert not ok and reason.startswith("no RDMA devices: ibv_get_device_list returned none")
    assert "lists nothing" in reason
    assert unavailable_code(reason) == RDMA_HCA  # the hardware CI machines lack: allowed


@pytest.mark.skipif(OK, reason=coded(RDMA_HCA_PRESENT, "this machine has an RDMA device"))
def test_a_required_endpoint_refuses_with_the_same_reason():
    c, s = tcp_socket_pair()
    try:
        with pytest.raises(RdmaUnavailable) as e:
            verbs_endpoint(TcpTransport(c, 2), OLD)
        assert e.value.reason == REASON
    finally:
        c.close()
        s.close()


@pytest.mark.skipif(OK, reason=coded(RDMA_HCA_PRESENT, "this machine has an RDMA device"))
def test_without_a_device_both_sides_fall_back_to_tcp():
    srv = ReferenceServer(ServerConfig(dialect=get_dialect("7.0.0")), idle_timeout=5,
                          out=io.StringIO(), err=io.StringIO())
    with verbs_listener(srv.serve_transport, SEED000, timeout=5) as lst:
        ep = connect_verbs("127.0.0.1", lst.port, SEED000, require=False, timeout=5)
        assert ep.rdma_unavailable == REASON
        c = RefClient(ep, "7.0.0")
        c.hello()
        assert c.server_hello.conn_caps == bytes(24) and c.rdma_active is False
        assert c.device_count() == 1
        c.close()
    assert any(REASON in n for n in lst.notes)
    assert srv.connections[0].rdma_active is False


def test_pyverbs_objects_the_wire_uses():
    """Where pyverbs imports (with or without a device), the work requests, attributes and
    enums the queue-pair code relies on exist under these names."""
    try:
        verbs.import_pyverbs()
    except ImportError as e:
        skip(TOOL_MISSING, f"pyverbs not importable here: {e} (apt-get install python3-pyverbs)")
    import pyverbs.addr as a
    import pyverbs.enums as e
    import pyverbs.qp as qp
    import pyverbs.wr as wr
    sge = wr.SGE(0x1000, 64, 7)
    assert (sge.addr, sge.length, sge.lkey) == (0x1000, 64, 7)
    assert wr.RecvWR(wr_id=3, num_sge=1, sg=[sge]).wr_id == 3
    send = wr.SendWR(wr_id=4, opcode=e.IBV_WR_SEND, num_sge=1, sg=[sge],
                     send_flags=e.IBV_SEND_SIGNALED)
    assert send.opcode == e.IBV_WR_SEND
    cap = qp.QPCap(max_send_wr=12, max_recv_wr=24, max_send_sge=1, max_recv_sge=1,
                   max_inline_data=0)
    init = qp.QPInitAttr(qp_type=e.IBV_QPT_RC, cap=cap, sq_sig_all=1)
    assert init.max_recv_wr == 24
    attr = qp.QPAttr()
    for name in ("port_num", "pkey_index", "qp_access_flags", "path_mtu", "dest_qp_num",
                 "rq_psn", "max_dest_rd_atomic", "min_rnr_timer", "ah_attr", "timeout",
                 "retry_cnt", "rnr_retry", "sq_psn", "max_rd_atomic"):
        assert hasattr(attr, name), name
    gid = a.GID()
    gid.gid = verbs._gid_str(bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 1]))
    ah = a.AHAttr(port_num=1, is_global=1, gr=a.GlobalRoute(dgid=gid, sgid_index=1, hop_limit=1))
    assert str(ah.dgid).endswith("ffff:0a00:0001") and ah.is_global == 1
    assert verbs._gid_bytes(gid) == bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 1])
    for name in ("IBV_WC_SUCCESS", "IBV_WC_RECV", "IBV_ACCESS_LOCAL_WRITE",
                 "IBV_GID_TYPE_SYSFS_ROCE_V2"):
        assert hasattr(e, name), name


@pytest.mark.skipif(not (OK and os.environ.get("RDMA_TEST_ADDR")),
                    reason=coded(unavailable_code(REASON), f"no RDMA here: {REASON}")
                    if not OK else
                    coded(TOOL_MISSING, "set RDMA_TEST_ADDR to an IPv4 address an RDMA device "
                                        "carries"))
@pytest.mark.parametrize("client_cfg, server_cfg", [(OLD, OLD), (SEED000, OLD), (OLD, SEED000),
                                                    (SEED000, SEED000)])
def test_session_over_a_real_queue_pair(client_cfg, server_cfg):
    addr = os.environ["RDMA_TEST_ADDR"]
    srv = ReferenceServer(ServerConfig(dialect=get_dialect("7.0.0")), idle_timeout=10,
                          out=io.StringIO(), err=io.StringIO())
    with verbs_listener(srv.serve_transport, server_cfg, host=addr, timeout=10) as lst:
        ep = connect_verbs(addr, lst.port, client_cfg, timeout=10)
        c = RefClient(ep, "7.0.0")
        c.hello()
        assert c.rdma_active
        _round_trip_three_mib_and_change(c)
        c.close()
        threading.Event().wait(0.2)
    assert srv.connections[0].rdma_active and srv.connections[0].close_reason is None
    assert ep.stats.overruns == 0 and ep.stats.largest_send == client_cfg.chunk


def _round_trip_three_mib_and_change(c) -> None:
    """Upload and read back a tensor that spans several 1 MiB chunks plus a ragged tail."""
    from harness.proto import RpcTensor, ggml
    size = 3 * (1 << 20) + 7
    ptr, _ = c.alloc_buffer(size)
    t = RpcTensor.make(id=0x1000, type=ggml.TYPE_I8, ne=(size,), buffer=ptr,
                       data=c.buffer_get_base(ptr))
    data = os.urandom(size)
    c.set_tensor(t, data)
    assert bytes(c.get_tensor(t, 0, size)) == data


# ---------------------------------------------------------------- the QP code on a fake device

class _FakeRdma:
    """Just enough of pyverbs to run _VerbsWire: RC QPs in one process that move SEND data
    into the peer's posted receive buffers and report completions, with RNR queueing."""

    def __init__(self):
        self.lock = threading.RLock()
        self.qps = {}
        self.memory = {}  # MR base address -> bytearray
        self.next_qpn = 0x40
        self.next_addr = 1 << 32

    def modules(self) -> dict:
        fake = self
        e = types.ModuleType("pyverbs.enums")
        e.IBV_ACCESS_LOCAL_WRITE, e.IBV_QPT_RC = 1, 2
        e.IBV_WR_SEND, e.IBV_SEND_SIGNALED = 2, 2
        e.IBV_WC_SUCCESS, e.IBV_WC_SEND, e.IBV_WC_RECV = 0, 0, 128
        e.IBV_GID_TYPE_SYSFS_ROCE_V2 = 2

        ns = types.SimpleNamespace

        class GID:
            def __init__(self, gid="0000:0000:0000:0000:0000:0000:0000:0000"):
                self.gid = gid

        class Context:
            def __init__(self, name):
                self.name = name

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.close()

            def close(self):
                pass

            def query_device(self):
                return ns(phys_port_cnt=1)

            def query_port(self, port):
                return ns(gid_tbl_len=2, active_mtu=5)

            def query_gid(self, port, idx):
                raw = bytes.fromhex("fe80" + "00" * 14) if idx == 0 else \
                    bytes(10) + b"\xff\xff" + bytes([127, 0, 0, 1])
                return GID(verbs._gid_str(raw))

            def query_gid_type(self, port, idx):
                return 2

        class MR:
            def __init__(self, pd, length, access):
                with fake.lock:
                    self.buf = fake.next_addr
                    fake.next_addr += length + (1 << 20)
                    self.mem = fake.memory[self.buf] = bytearray(length)
                self.lkey = self.buf & 0xFFFF

            def write(self, data, length, offset=0):
                self.mem[offset:offset + length] = bytes(data)[:length]

            def read(self, length, offset=0):
                return bytes(self.mem[offset:offset + length])

            def close(self):
                pass

        class CQ:
            def __init__(self, ctx, cqe, a=None, b=None, c=0):
                self.wcs = []

            def poll(self, n):
                with fake.lock:
                    out, self.wcs = self.wcs[:n], self.wcs[n:]
                return len(out), out

            def close(self):
                pass

        def locate(addr):
            for base, mem in fake.memory.items():
                if base <= addr < base + len(mem):
                    return mem, addr - base
            raise AssertionError(f"address {addr:x} is not registered")

        class QP:
            def __init__(self, pd, init):
                with fake.lock:
                    self.qp_num = fake.next_qpn
                    fake.next_qpn += 1
                    fake.qps[self.qp_num] = self
                self.cq = init.send_cq
                self.recvs, self.pending, self.peer = [], [], None

            def to_init(self, attr):
                pass

            def to_rtr(self, attr):
                self.peer = attr.dest_qp_num

            def to_rts(self, attr):
                pass

            def post_recv(self, wr):
                with fake.lock:
                    self.recvs.append(wr)
                    for qp in list(fake.qps.values()):
                        qp._deliver()

            def post_send(self, wr):
                mem, off = locate(wr.sg[0].addr)
                with fake.lock:
                    self.pending.append((wr.wr_id, bytes(mem[off:off + wr.sg[0].length])))
                    self._deliver()

            def _deliver(self):  # under the lock: SENDs land into posted receives (RNR)
                peer = fake.qps.get(self.peer)
                while peer is not None and self.pending and peer.recvs:
                    wr_id, data = self.pending.pop(0)
                    rwr = peer.recvs.pop(0)
                    mem, off = locate(rwr.sg[0].addr)
                    mem[off:off + len(data)] = data
                    peer.cq.wcs.append(ns(status=0, opcode=128, wr_id=rwr.wr_id,
                                          byte_len=len(data)))
                    self.cq.wcs.append(ns(status=0, opcode=0, wr_id=wr_id, byte_len=0))

            def close(self):
                with fake.lock:
                    fake.qps.pop(self.qp_num, None)

        dev = types.ModuleType("pyverbs.device")
        dev.get_device_list = lambda: [ns(name=b"fake0")]
        dev.Context = Context
        mods = {"pyverbs.device": dev, "pyverbs.enums": e}
        for name, attrs in {
            "pyverbs.pd": {"PD": lambda ctx: ns(close=lambda: None)},
            "pyverbs.mr": {"MR": MR},
            "pyverbs.cq": {"CQ": CQ, "cqe_status_to_str": str},
            "pyverbs.qp": {"QP": QP, "QPCap": lambda **kw: ns(**kw),
                           "QPInitAttr": lambda **kw: ns(send_cq=kw["scq"], **kw),
                           "QPAttr": lambda: ns()},
            "pyverbs.wr": {"SGE": lambda addr, length, lkey: ns(addr=addr, length=length,
                                                                lkey=lkey),
                           "RecvWR": lambda wr_id, num_sge, sg: ns(wr_id=wr_id, sg=sg),
                           "SendWR": lambda **kw: ns(**kw)},
            "pyverbs.addr": {"GID": GID, "GlobalRoute": lambda **kw: ns(**kw),
                             "AHAttr": lambda **kw: ns(**kw)},
        }.items():
            m = types.ModuleType(name)
            m.__dict__.update(attrs)
            mods[name] = m
        pkg = types.ModuleType("pyverbs")
        pkg.__path__ = []
        mods["pyverbs"] = pkg
        for name, m in mods.items():
            if name != "pyverbs":
                setattr(pkg, name.split(".")[1], m)
        return mods


@pytest.fixture
def fake_device(monkeypatch):
    for name, mod in _FakeRdma().modules().items():
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.delenv("GGML_RPC_NO_RDMA", raising=False)
    assert verbs_available() == (True, "RDMA devices: fake0")


@pytest.mark.parametrize("client_cfg, server_cfg", [("OLD", "OLD"), ("SEED000", "OLD"),
                                                    ("OLD", "SEED000"), ("SEED000", "SEED000")])
def test_queue_pair_code_runs_a_session_on_the_soft_device(client_cfg, server_cfg, tmp_path):
    """The reference client and server, each on its own real pyverbs QP of the soft verbs
    device (in a subprocess: the soft libibverbs is loaded there only)."""
    out = pyverbs_session(softverbs_lib_dir(), tmp_path, 3 * (1 << 20) + 7, "pair",
                          client_cfg, server_cfg)
    ccfg, scfg = getattr(rdma_core, client_cfg), getattr(rdma_core, server_cfg)
    assert out["rdma_active"] and out["device"] == "softverbs0" and out["round_trip_ok"], out
    assert out["server_rdma_active"] and out["server_close_reason"] is None, out
    assert not out["notes"], out
    assert out["overruns"] == 0 and out["largest_send"] == ccfg.chunk, out
    assert out["max_in_flight"] <= ccfg.send_slots, out
    assert out["server_max_landed"] <= scfg.recv_depth, out
    qps = {q.qpn: q for q in read_qp_stats(tmp_path)}
    client_qp, server_qp = qps[out["qpn"]], qps[out["peer_qpn"]]
    assert client_qp.dest_qpn == server_qp.qpn and client_qp.errors == server_qp.errors == 0
    assert client_qp.send_bytes == server_qp.recv_bytes >= 3 * (1 << 20) + 7


def test_no_rdma_env_withholds_even_with_a_device(fake_device, monkeypatch):
    monkeypatch.setenv("GGML_RPC_NO_RDMA", "1")
    c, s = tcp_socket_pair()
    try:
        ep = verbs_endpoint(TcpTransport(c, 2), OLD)
        assert ep.local_conn_caps() == bytes(24) and not ep.upgrade(b"\x01" * 24)
    finally:
        c.close()
        s.close()
