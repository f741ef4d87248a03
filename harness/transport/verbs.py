"""A real RDMA transport over pyverbs (rdma-core): one RC queue pair per connection.

Used when the machine has an RDMA device (a RoCE/InfiniBand NIC, or soft-RoCE: ``rdma link
add rxe0 type rxe netdev eth0``). It is the emulator's endpoint with a real queue pair behind
it, so the data path is the same code: ``send_data`` calls cut into 256 KiB SENDs from a ring
of registered send buffers (1 slot = proto 7, 8 = seed 000, halved while registration fails
under a tight memlock limit), a ring of ``recv_depth`` registered receive buffers, the
whole-completion or partial receive policy, completions polled with a deadline, and the
caps exchanged in HELLO over the TCP socket exactly as ggml-rpc does (spec 10.1):

* probe: the device, port and GID index whose GID equals the TCP socket's local address as
  ``::ffff:a.b.c.d``, RoCE v2 preferred; ``GGML_RDMA_DEV`` / ``GGML_RDMA_GID`` override,
  ``GGML_RPC_NO_RDMA`` disables it (zero caps);
* activation: QP RESET -> INIT, receives posted, -> RTR (peer qpn/psn/gid from its caps,
  path MTU = the port's active MTU) -> RTS (timeout 14, retry 7, rnr_retry 7 = infinite).

Without hardware or a soft-RoCE kernel, the project's own software device does: run the
process with :func:`harness.transport.softverbs.softverbs_env` (its ``libibverbs.so.1`` first
in ``LD_LIBRARY_PATH``) and pyverbs sees ``softverbs0`` with ``::ffff:127.0.0.1`` as a RoCE v2
GID, so everything here runs unchanged on real queue pairs (docs/RDMA.md, section 5).

Where no device exists, :func:`verbs_available` says why (pyverbs import error, or "no RDMA
devices: ..."), and nothing is skipped silently: :func:`verbs_endpoint` raises
:class:`RdmaUnavailable` with that reason unless asked to fall back to TCP.

pyverbs is not on PyPI; Debian ships it as ``python3-pyverbs`` in the system
``dist-packages``. From a virtualenv the import also looks there (and in the directories of
``GGML_HARNESS_PYVERBS_PATH``), without leaving them on ``sys.path``.
"""

from __future__ import annotations

import importlib
import os
import socket
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from ..proto.dialects import DEFAULT, Dialect
from ..transport.tcp import TcpTransport
from .caps import ADVERTISE, WITHHOLD, LinuxCaps, MacCaps, gid_for_ipv4
from .rdma_core import OLD, RdmaConfig, RdmaError
from .rdma_endpoint import CLIENT, RdmaEmuListener, RdmaEndpoint
from .rdma_wires import NullWire, Wire, WireStats, next_qpn

PYVERBS_PATH_ENV = "GGML_HARNESS_PYVERBS_PATH"
SYSTEM_DIST_PACKAGES = "/usr/lib/python3/dist-packages"
SYSFS = Path("/sys/class/infiniband")
POLL_BATCH = 16


class RdmaUnavailable(RdmaError):
    """No usable RDMA device here; ``reason`` says why."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(reason)


def _pyverbs_paths() -> list[str]:
    extra = [p for p in os.environ.get(PYVERBS_PATH_ENV, "").split(os.pathsep) if p]
    return extra + [SYSTEM_DIST_PACKAGES]


def import_pyverbs():
    """Import pyverbs (from sys.path, else from the system or configured dist-packages)."""
    try:
        return importlib.import_module("pyverbs.device")
    except ImportError as e:
        first = e
    tried = []
    for path in _pyverbs_paths():
        if not (Path(path) / "pyverbs").is_dir():
            continue
        tried.append(path)
        sys.path.insert(0, path)
        try:
            # once the package is imported its submodules resolve through pyverbs.__path__,
            # so the directory need not stay on sys.path
            return importlib.import_module("pyverbs.device")
        except ImportError as e:
            first = e
            for name in [m for m in sys.modules if m == "pyverbs" or m.startswith("pyverbs.")]:
                del sys.modules[name]
        finally:
            sys.path.remove(path)
    where = f" (also tried {', '.join(tried)})" if tried else \
        f" (not in {', '.join(_pyverbs_paths())} either)"
    raise ImportError(f"{first}{where}") from None


def _sysfs_note() -> str:
    if not SYSFS.is_dir():
        return (f"{SYSFS} does not exist: the kernel has no RDMA core (CONFIG_INFINIBAND) or no "
                "RDMA link (soft-RoCE: `rdma link add rxe0 type rxe netdev <iface>`; or run "
                "under the project's soft device, harness.transport.softverbs)")
    names = sorted(p.name for p in SYSFS.iterdir())
    return f"{SYSFS} lists {', '.join(names) or 'nothing'}"


PYVERBS_NOT_IMPORTABLE = "pyverbs not importable: "  # how verbs_available() says so


def verbs_available() -> tuple[bool, str]:
    """(True, the devices) when pyverbs works and sees a device, else (False, why not)."""
    try:
        device = import_pyverbs()
    except ImportError as e:
        return False, (f"{PYVERBS_NOT_IMPORTABLE}{e}; install rdma-core's python3-pyverbs "
                       f"(Debian) or point {PYVERBS_PATH_ENV} at its dist-packages")
    try:
        devs = device.get_device_list()
    except Exception as e:
        return False, f"no RDMA devices: ibv_get_device_list failed ({e}); {_sysfs_note()}"
    if not devs:
        return False, f"no RDMA devices: ibv_get_device_list returned none; {_sysfs_note()}"
    return True, "RDMA devices: " + ", ".join(_name(d) for d in devs)


def unavailable_code(reason: str) -> str:
    """The skip code for :func:`verbs_available`'s reason: a missing pyverbs is a Debian
    package away (``pyverbs-missing``, a failure under CI); no device is the hardware CI
    machines lack (``rdma-hca``, on the reviewed list)."""
    from ..strictness import PYVERBS_MISSING, RDMA_HCA
    return PYVERBS_MISSING if reason.startswith(PYVERBS_NOT_IMPORTABLE) else RDMA_HCA


def _name(dev) -> str:
    n = dev.name
    return n.decode() if isinstance(n, bytes) else str(n)


def _gid_bytes(gid) -> bytes:
    return bytes.fromhex(str(gid.gid).replace(":", ""))


def _gid_str(raw: bytes) -> str:
    h = raw.hex()
    return ":".join(h[i:i + 4] for i in range(0, 32, 4))


@dataclass(frozen=True)
class VerbsDevice:
    name: str
    port: int
    gid_index: int
    gid: bytes
    roce_v2: bool


def find_device(local_ip: str) -> VerbsDevice:
    """The device/port/GID that carries ``local_ip``, as ggml-rpc's probe picks it."""
    ok, reason = verbs_available()
    if not ok:
        raise RdmaUnavailable(reason)
    import pyverbs.device as d
    import pyverbs.enums as e
    want = gid_for_ipv4(local_ip)
    only_dev = os.environ.get("GGML_RDMA_DEV")
    only_gid = os.environ.get("GGML_RDMA_GID")
    found: list[VerbsDevice] = []
    for dev in d.get_device_list():
        name = _name(dev)
        if only_dev and name != only_dev:
            continue
        with d.Context(name=name) as ctx:
            for port in range(1, ctx.query_device().phys_port_cnt + 1):
                for idx in range(ctx.query_port(port).gid_tbl_len):
                    if only_gid is not None and idx != int(only_gid):
                        continue
                    try:
                        gid = _gid_bytes(ctx.query_gid(port, idx))
                        v2 = ctx.query_gid_type(port, idx) == e.IBV_GID_TYPE_SYSFS_ROCE_V2
                    except Exception:
                        continue
                    if gid == want or (only_gid is not None and any(gid)):
                        found.append(VerbsDevice(name, port, idx, gid, v2))
    if not found:
        raise RdmaUnavailable(f"no RDMA device has a GID equal to ::ffff:{local_ip} "
                              f"(GGML_RDMA_DEV={only_dev}, GGML_RDMA_GID={only_gid})")
    return sorted(found, key=lambda v: not v.roce_v2)[0]


class _VerbsWire(Wire):
    """One RC queue pair and its registered buffers behind an RdmaEndpoint."""

    def __init__(self, dev: VerbsDevice, config: RdmaConfig):
        import pyverbs.cq as cq
        import pyverbs.device as d
        import pyverbs.enums as e
        import pyverbs.mr as mr
        import pyverbs.pd as pd
        import pyverbs.qp as qp
        self.e = e
        self.dev = dev
        self.gid = dev.gid
        self.config = config
        self.chunk = config.chunk
        self._closed = False
        self.qp = self.cq = self.send_mr = self.recv_mr = self.pd = None
        self.ctx = d.Context(name=dev.name)
        try:
            self._setup(config, cq, e, mr, pd, qp)
        except BaseException:
            self.close()
            raise

    def _setup(self, config, cq, e, mr, pd, qp) -> None:
        self.pd = pd.PD(self.ctx)
        slots = config.send_slots
        self.send_mr = None
        while self.send_mr is None:  # seed 000: halve the ring while registration fails
            try:
                self.send_mr = mr.MR(self.pd, slots * self.chunk, e.IBV_ACCESS_LOCAL_WRITE)
            except Exception:
                if slots == 1:
                    raise
                slots //= 2
        self.slots = slots
        self.recv_mr = mr.MR(self.pd, config.recv_depth * self.chunk,
                             e.IBV_ACCESS_LOCAL_WRITE)
        self.cq = cq.CQ(self.ctx, config.recv_depth + slots + 8, None, None, 0)
        cap = qp.QPCap(max_send_wr=slots + 4, max_recv_wr=config.recv_depth, max_send_sge=1,
                       max_recv_sge=1, max_inline_data=0)
        self.qp = qp.QP(self.pd, qp.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq,
                                               cap=cap, sq_sig_all=1))
        self.local_qpn = self.qp.qp_num
        self.peer_qpn = 0
        self.port_attr = self.ctx.query_port(self.dev.port)
        self.stats = WireStats()
        self._seq = 0
        self._in_flight = 0
        self._received: deque[tuple[int, int]] = deque()  # (slot, byte_len) not yet taken
        self._handed: deque[int] = deque()  # slots given to the reader, in order
        self._fresh: deque[int] = deque(range(config.recv_depth))  # never posted yet

    # -- setup (spec 10.1: RESET -> INIT, receives posted, -> RTR -> RTS; no confirmation)
    def activate(self, peer: LinuxCaps | MacCaps, recv_depth: int) -> None:
        import pyverbs.addr as a
        import pyverbs.qp as qp
        e = self.e
        self.peer_qpn = peer.qpn
        init = qp.QPAttr()
        init.port_num = self.dev.port
        init.pkey_index = 0
        init.qp_access_flags = e.IBV_ACCESS_LOCAL_WRITE
        self.qp.to_init(init)
        self.post_receives(recv_depth)
        gid = a.GID()
        gid.gid = _gid_str(peer.gid)
        rtr = qp.QPAttr()
        rtr.path_mtu = self.port_attr.active_mtu
        rtr.dest_qp_num = peer.qpn
        rtr.rq_psn = getattr(peer, "psn", peer.qpn & 0xFFFFFF)
        rtr.max_dest_rd_atomic = 1
        rtr.min_rnr_timer = 12
        rtr.ah_attr = a.AHAttr(port_num=self.dev.port, is_global=1,
                               gr=a.GlobalRoute(dgid=gid, sgid_index=self.dev.gid_index,
                                                hop_limit=1))
        self.qp.to_rtr(rtr)
        rts = qp.QPAttr()
        rts.timeout = 14
        rts.retry_cnt = 7
        rts.rnr_retry = 7  # infinite: a full receive ring only delays the sender
        rts.sq_psn = self.local_qpn & 0xFFFFFF
        rts.max_rd_atomic = 1
        self.qp.to_rts(rts)

    def connect(self, remote_qpn: int) -> None:  # activate() does the real work
        self.peer_qpn = remote_qpn

    # -- completions
    def _reap(self) -> int:
        n, wcs = self.cq.poll(POLL_BATCH)
        e = self.e
        for wc in wcs[:n]:
            if wc.status != e.IBV_WC_SUCCESS:
                import pyverbs.cq as cq
                raise RdmaError(f"RDMA completion error: {cq.cqe_status_to_str(wc.status)} "
                                f"(wr_id {wc.wr_id}, opcode {wc.opcode})")
            if wc.opcode == e.IBV_WC_RECV:
                self._received.append((wc.wr_id, wc.byte_len))
                self.stats.max_landed = max(self.stats.max_landed, len(self._received))
            else:
                self._in_flight -= 1
        return n

    def _poll_until(self, done, deadline: float) -> bool:
        """Busy-poll the CQ (yielding the CPU) until ``done()`` or the deadline."""
        spins = 0
        while not done():
            if self._reap():
                continue
            if time.monotonic() >= deadline:
                return False
            spins += 1
            time.sleep(0 if spins < 100 else 0.0005)
        return True

    # -- sending
    def send(self, piece, slots, deadline, hang) -> None:
        import pyverbs.wr as wr
        limit = min(slots, self.slots)
        if not self._poll_until(lambda: self._in_flight < limit, deadline):
            raise hang(f"send ring full ({self._in_flight} of {limit} SENDs in flight)")
        slot = self._seq % self.slots
        self.send_mr.write(piece, len(piece), slot * self.chunk)
        sge = wr.SGE(self.send_mr.buf + slot * self.chunk, len(piece), self.send_mr.lkey)
        self.qp.post_send(wr.SendWR(wr_id=self._seq, opcode=self.e.IBV_WR_SEND, num_sge=1,
                                    sg=[sge], send_flags=self.e.IBV_SEND_SIGNALED))
        self._seq += 1
        self._in_flight += 1
        self.stats.sends += 1
        self.stats.max_in_flight = max(self.stats.max_in_flight, self._in_flight)

    def wait_sends(self, deadline, hang) -> None:
        if not self._poll_until(lambda: self._in_flight == 0, deadline):
            raise hang(f"{self._in_flight} SENDs never completed")

    def finish_sending(self) -> None:
        pass  # RDMA has no FIN: the peer learns from TCP after the last completion

    # -- receiving
    def post_receives(self, n: int) -> None:
        import pyverbs.wr as wr
        for _ in range(n):
            slot = self._fresh.popleft() if self._fresh else self._handed.popleft()
            sge = wr.SGE(self.recv_mr.buf + slot * self.chunk, self.chunk, self.recv_mr.lkey)
            self.qp.post_recv(wr.RecvWR(wr_id=slot, num_sge=1, sg=[sge]))

    def poll(self, timeout: float):
        if not self._received and not self._poll_until(lambda: bool(self._received),
                                                       time.monotonic() + timeout):
            return None
        slot, n = self._received.popleft()
        self._handed.append(slot)  # reposted by post_receives once the reader is done
        return self.recv_mr.read(n, slot * self.chunk)

    # -- teardown and diagnosis
    def close(self, fin: bool = True) -> None:
        if self._closed:
            return
        self._closed = True
        for obj in (self.qp, self.cq, self.send_mr, self.recv_mr, self.pd, self.ctx):
            if obj is None:
                continue
            try:
                obj.close()
            except Exception:
                pass

    def peer_active(self) -> bool:
        return True  # unknowable on hardware; diagnosis falls back to the TCP evidence

    def reachable(self) -> bool:
        return True

    def in_flight(self) -> int:
        return self._in_flight


def _policy(caps_policy: str) -> str:
    # GGML_RPC_NO_RDMA disables probing: zero caps, never activate
    return WITHHOLD if os.environ.get("GGML_RPC_NO_RDMA") else caps_policy


def verbs_endpoint(tcp: TcpTransport, config: RdmaConfig = OLD, *, role: str = CLIENT,
                   caps_policy: str = ADVERTISE, require: bool = True,
                   timeout: float | None = None, transcript=None,
                   dialect: Dialect | str = DEFAULT) -> RdmaEndpoint:
    """An endpoint over a real RC QP on the device that carries the TCP socket's address.

    ``require=False`` falls back like a C peer whose probe failed: zero caps, TCP only; the
    reason is kept in ``endpoint.rdma_unavailable``.
    """
    policy = _policy(caps_policy)
    reason = None
    wire = None
    if policy != WITHHOLD:
        try:
            wire = _VerbsWire(find_device(tcp.sock.getsockname()[0]), config)
        except RdmaUnavailable as e:
            if require:
                raise
            reason = e.reason
    if wire is None:
        wire, policy = NullWire(next_qpn()), WITHHOLD
    ep = RdmaEndpoint(tcp, wire, config, role=role, caps_policy=policy, timeout=timeout,
                      transcript=transcript, dialect=dialect)
    ep.rdma_unavailable = reason
    return ep


def connect_verbs(host: str, port: int, config: RdmaConfig = OLD, *, require: bool = True,
                  timeout: float | None = None, **kw) -> RdmaEndpoint:
    """Client side: TCP connect, then an endpoint whose QP is ready for the HELLO caps."""
    sock = socket.create_connection((host, port), timeout=10.0)
    try:
        return verbs_endpoint(TcpTransport(sock, timeout or config.timeout), config,
                              role=CLIENT, require=require, timeout=timeout, **kw)
    except BaseException:
        sock.close()
        raise


def verbs_listener(serve, config: RdmaConfig = OLD, *, host: str = "127.0.0.1", port: int = 0,
                   caps_policy: str = ADVERTISE, timeout: float | None = None,
                   record: bool = False, dialect: Dialect | str = DEFAULT) -> RdmaEmuListener:
    """Server side: every accepted connection gets its own QP (``serve`` as in the emulator's
    listener, e.g. ``ReferenceServer.serve_transport``). Without a device the connection is
    served on TCP with zero caps and the reason lands in ``listener.notes``."""

    def wire_for(sock: socket.socket) -> Wire:
        return _VerbsWire(find_device(sock.getsockname()[0]), config)

    return RdmaEmuListener(serve, config, caps_policy=_policy(caps_policy), host=host,
                           port=port, timeout=timeout, record=record, dialect=dialect,
                           wire_factory=wire_for)


__all__ = [
    "PYVERBS_PATH_ENV",
    "RdmaUnavailable",
    "VerbsDevice",
    "connect_verbs",
    "find_device",
    "import_pyverbs",
    "verbs_available",
    "verbs_endpoint",
    "verbs_listener",
]
