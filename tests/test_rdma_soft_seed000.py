"""Seed 000's RDMA changes as real C code in every role, over the soft verbs device.

old = the 7.0.0 RDMA build (p7-rdma), new = the same tree with harness/data/patches/seed000-server-flags.patch
(p7f-rdma: 8-slot pipelined send drained at flush, partial receive of a completion). Each of
the four client/server cells, server cache off and on, uploads tensors larger than one
256 KiB chunk and than the 6 MiB receive ring, reads them back bit-exact and computes a small
graph. The device's per-QP counters and both sides' own log lines say what went over the
queue pairs. Then the emulation (harness.transport.rdma_core and rdma_endpoint, the matrix's
rdma-emu cells of no-bump-ref) is asked the same question for the same dialect pair and must
agree, fact by fact.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from harness.impls.driver import fingerprint, make_fill
from harness.impls.ctypes_driver import CtypesClientDriver
from harness.impls.ref_driver import RefClientDriver
from harness.matrix.rdma import InProcessRdmaServer, connection_checks
from harness.proto.constants import RDMA_CHUNK, RDMA_RX_RING
from harness.transport.caps import ADVERTISE, WITHHOLD
from harness.proto.behaviour import WHOLE_COMPLETION
from harness.transport.rdma_core import SEED000, RdmaConfig, config_for_dialect
from harness.transport.rdma_endpoint import connect_emu
from harness.transport.softverbs import ACTIVATED_RE, QpStats, read_qp_stats, softverbs_env

from softverbs_support import builds, lib_dir  # noqa: F401 (fixtures)
from test_realclient_support import RealServer, realpeer

pytestmark = [realpeer, pytest.mark.slow]

MiB = 1 << 20
SMALL, LARGE = 3 * MiB + 7, 20 * MiB  # > one chunk, ragged tail; > the 6 MiB receive ring
DIALECT = {"old": "7.0.0", "new": "7.0.0+flags"}
LOAD_OPT_OFF = {"GGML_RPC_LOAD_OPT": "0"}
SLOTS_RE = re.compile(r"RDMA probed: .* send slots=(\d+)")  # the patched build's probe line
PROBED_RE = re.compile(r"RDMA probed: dev=(\S+)")
SV_VARS = ("LD_LIBRARY_PATH", "SOFTVERBS_STATS_DIR", "SOFTVERBS_LOG", "SOFTVERBS_MEMLOCK")


def _fill(seed: int) -> dict:
    return {"pattern": "random", "seed": seed}


OFFSET_LARGE = (SMALL + 255) // 256 * 256
STEPS = [
    {"op": "buffer_type"},
    {"op": "alloc_buffer", "name": "w", "size": OFFSET_LARGE + LARGE, "usage": "weights"},
    {"op": "tensor", "name": "S", "buffer": "w", "offset": 0, "type": "i8", "ne": [SMALL]},
    {"op": "tensor", "name": "L", "buffer": "w", "offset": OFFSET_LARGE, "type": "i8",
     "ne": [LARGE]},
    {"op": "set", "tensor": "S", "fill": _fill(1)},
    {"op": "set", "tensor": "L", "fill": _fill(2)},
    {"op": "get", "tensor": "S"},
    {"op": "get", "tensor": "L"},
    {"op": "alloc_buffer", "name": "act", "size": 65536, "usage": "compute"},
    {"op": "tensor", "name": "x", "buffer": "act", "offset": 0, "ne": [256]},
    {"op": "tensor", "name": "y", "buffer": "act", "offset": 1024, "ne": [256]},
    {"op": "set", "tensor": "x", "fill": {"pattern": "arange"}},
    {"op": "set", "tensor": "y", "fill": _fill(3)},
    {"op": "node", "name": "s", "kind": "add", "inputs": ["x", "y"], "buffer": "act",
     "offset": 2048},
    {"op": "node", "name": "p", "kind": "mul", "inputs": ["s", "y"], "buffer": "act",
     "offset": 4096},
    {"op": "compute", "outputs": ["p"]},
    {"op": "get", "tensor": "p"},
]
EXPECTED = {"S": fingerprint(make_fill(_fill(1), SMALL).view(np.uint8)),
            "L": fingerprint(make_fill(_fill(2), LARGE).view(np.uint8))}


# ------------------------------------------------------------------------------ one session
@dataclass
class Session:
    """What one client session did, judged the same way for real code and the emulation."""
    error: str | None = None
    gets: dict[str, dict] = field(default_factory=dict)  # tensor -> get result

    @property
    def verdict(self) -> str:
        if self.error:
            return "fails"
        bad = [t for t, want in EXPECTED.items() if self.gets.get(t) != want]
        return f"wrong data in {bad}" if bad else "works"


def run_steps(driver, endpoint: str) -> Session:
    out = Session()
    try:
        driver.do("connect", endpoint=endpoint)
        for step in STEPS:
            res = driver.do(**step)
            if step["op"] == "get":
                out.gets[step["tensor"]] = res
    except Exception as e:  # a failed step or a dead client: the cell's verdict
        out.error = f"{type(e).__name__}: {e}"
    finally:
        driver.close()
    return out


@dataclass
class Facts:
    """Per-connection RDMA facts, the terms the emulation's checks speak in."""
    switched: bool  # both sides switched to RDMA after HELLO
    no_overrun: bool  # no length error, no lost byte
    client_slots: int  # SENDs the client may keep in flight
    server_slots: int
    ring_kept: bool  # receive ring never beyond its depth, SENDs <= chunk, in flight <= slots
    client_sends: int  # SEND work requests each side posted over the QP
    server_sends: int
    client_send_bytes: int
    server_send_bytes: int

    def problems_against(self, other: "Facts") -> list[str]:
        return [f"{k}: {getattr(self, k)!r} here, {getattr(other, k)!r} there"
                for k in self.__dataclass_fields__ if getattr(self, k) != getattr(other, k)]


# ------------------------------------------------------------------------------ real code
NO_QP = QpStats(pid=0, qpn=0, dest_qpn=0, state="none", sends=0, send_bytes=0, inline_sends=0,
                max_send=0, recvs=0, recv_bytes=0, rnr_naks_sent=0, rnr_naks_received=0,
                retries=0, errors=0)
SLOTS = {"old": 1, "new": 8}  # the send ring of each generation (7.0.0: stop-and-wait)


@dataclass
class RealCell:
    session: Session
    server_log: str
    client_log: list[str]
    client_qps: list[QpStats]
    server_qps: list[QpStats]

    def qp(self, side: str) -> QpStats:
        """The side's one queue pair; none when it never probed (GGML_RPC_NO_RDMA)."""
        qps = self.client_qps if side == "client" else self.server_qps
        assert len(qps) <= 1, f"expected one {side} queue pair, found {qps}"
        return qps[0] if qps else NO_QP

    def log(self, side: str) -> str:
        return self.server_log if side == "server" else "\n".join(self.client_log)

    def slots(self, side: str) -> int:
        """The send ring the build reports; 7.0.0 prints none and polls every SEND (one)."""
        m = SLOTS_RE.search(self.log(side))
        return int(m.group(1)) if m else 1

    def facts(self) -> Facts:
        c, s = self.qp("client"), self.qp("server")
        activated = ACTIVATED_RE.search(self.server_log)
        cs, ss = self.slots("client"), self.slots("server")
        return Facts(
            switched=bool(activated) and bool(ACTIVATED_RE.search(self.log("client")))
            and (int(activated.group(1)), int(activated.group(2))) == (s.qpn, c.qpn)
            and (c.dest_qpn, s.dest_qpn) == (s.qpn, c.qpn),
            no_overrun=not c.errors and not s.errors and c.send_bytes == s.recv_bytes
            and s.send_bytes == c.recv_bytes,
            client_slots=cs, server_slots=ss,
            ring_kept=all(q.max_recv_queue <= RDMA_RX_RING and q.max_send <= RDMA_CHUNK
                          for q in (c, s))
            and c.max_send_queue <= cs and s.max_send_queue <= ss,
            client_sends=c.sends, server_sends=s.sends,
            client_send_bytes=c.send_bytes, server_send_bytes=s.send_bytes)

    def problems(self, client_slots: int, server_slots: int) -> list[str]:
        """Why this cell was not the seed's RDMA session (empty: it was): RDMA switched on
        both sides on the soft device and carried both tensors each way, without an error
        completion, in rings of the given sizes; a sender with more than one slot really
        kept several SENDs in flight, one with one slot never did."""
        f, out = self.facts(), []
        c, s = self.qp("client"), self.qp("server")
        if not (PROBED_RE.search(self.server_log) or [None, ""])[1] == "softverbs0":
            out.append("the server did not probe the soft device")
        if not f.switched:
            out.append("RDMA was not activated on both sides on these QPs")
        if min(c.send_bytes, s.send_bytes) < SMALL + LARGE:
            out.append(f"the payload did not go over RDMA: client sent {c.send_bytes}, "
                       f"server {s.send_bytes}")
        if not f.no_overrun:
            out.append(f"error completions or lost bytes: client {c}, server {s}")
        if not f.ring_kept or c.max_recv_queue != RDMA_RX_RING or s.max_recv_queue != RDMA_RX_RING:
            out.append(f"ring bounds: client {c}, server {s}")
        for side, q, want in (("client", c, client_slots), ("server", s, server_slots)):
            if self.slots(side) != want:
                out.append(f"{side} send ring {self.slots(side)}, expected {want}")
            elif (q.max_send_queue > 1) != (want > 1):
                out.append(f"{side} with {want} send slots kept {q.max_send_queue} in flight")
        return out




def _device_env(lib_dir, stats_dir: Path, extra: dict | None = None) -> dict[str, str]:
    stats_dir.mkdir(parents=True, exist_ok=True)
    env = softverbs_env(lib_dir, stats_dir=stats_dir, log=True)
    return {k: env[k] for k in SV_VARS if k in env} | dict(extra or {})


def real_cell(builds, lib_dir, tmp: Path, client: str, server: str, *, cache: bool,
              client_env: dict | None = None, server_env: dict | None = None) -> RealCell:
    tmp.mkdir(parents=True, exist_ok=True)
    senv = _device_env(lib_dir, tmp / "server-qps", server_env)
    args = ()
    if cache:
        senv["LLAMA_CACHE"] = str(tmp / "cache")
        args = ("-c",)
    with RealServer(builds[server], tmp / "server.log", env=senv, args=args) as srv:
        drv = CtypesClientDriver(builds[client], proto="7.0.0", step_timeout=120,
                                 session_timeout=300,
                                 env=_device_env(lib_dir, tmp / "client-qps", client_env))
        session = run_steps(drv, srv.endpoint)
        log = srv.log()
    return RealCell(session, log, drv.log_tail(400), read_qp_stats(tmp / "client-qps"),
                    read_qp_stats(tmp / "server-qps"))


# ------------------------------------------------------------------------------ the emulation
@dataclass
class EmulatedCell:
    session: Session
    checks: list  # harness.matrix Check: the rdma-emu cell's per-connection checks
    client: object  # RdmaEmuEndpoint
    server: object

    def facts(self) -> Facts:
        def ok(prefix: str) -> bool:
            return all(c.ok for c in self.checks if prefix in c.name)
        c, s = self.client, self.server
        return Facts(
            switched=ok("both sides switched"), no_overrun=ok("no receive overrun"),
            client_slots=c.config.send_slots, server_slots=s.config.send_slots,
            ring_kept=ok("in flight <= slots") and ok("ring never over-filled")
            and c.config.recv_depth == s.config.recv_depth == RDMA_RX_RING,
            client_sends=c.stats.sends, server_sends=s.stats.sends,
            client_send_bytes=c.stats.send_bytes, server_send_bytes=s.stats.send_bytes)


def emulated_cell(tmp: Path, client: str, server: str, *, cache: bool,
                  client_config: RdmaConfig | None = None, server_config: RdmaConfig | None = None,
                  client_policy: str = ADVERTISE, server_policy: str = ADVERTISE) -> EmulatedCell:
    """The matrix's rdma-emu cell for this dialect pair: reference peers, each with the RDMA
    generation :func:`config_for_dialect` gives its dialect, unless a config or caps policy
    stands for a knob of the real build (GGML_RPC_LOAD_OPT=0, a memlock limit,
    GGML_RPC_NO_RDMA)."""
    cd, sd = DIALECT[client], DIALECT[server]
    srv = InProcessRdmaServer("rdma-emu", sd, tmp / "emu-cache" if cache else None, idle=120)
    srv.listener.config = server_config or srv.listener.config
    srv.listener.caps_policy = server_policy
    endpoints = []
    ccfg = client_config or config_for_dialect(cd)

    def factory(host, port):
        endpoints.append(connect_emu(host, port, ccfg, caps_policy=client_policy, timeout=120,
                                     record=True, dialect=cd))
        return endpoints[-1]
    try:
        session = run_steps(RefClientDriver(cd, timeout=120, transport_factory=factory),
                            srv.endpoint)
    finally:
        srv.stop()
    assert len(endpoints) == 1, endpoints
    checks = connection_checks(endpoints, srv, rejected=False)
    peer = {ep.qpn: ep for ep in srv.listener.endpoints}[endpoints[0].wire.peer_qpn]
    return EmulatedCell(session, checks, endpoints[0], peer)


def assert_same_as_emulated(real: RealCell, emu: EmulatedCell, fields=None) -> None:
    assert emu.session.verdict == real.session.verdict, (emu.session.error, real.session.error)
    assert emu.session.gets == real.session.gets  # same tensors back, same graph result
    mismatch = [m for m in real.facts().problems_against(emu.facts())
                if fields is None or m.split(":")[0] in fields]
    assert not mismatch, f"real code vs emulation: {mismatch}"


# ------------------------------------------------------------------------------ the four cells
CELLS = [(c, s, cache) for c in ("old", "new") for s in ("old", "new") for cache in (False, True)]


@pytest.mark.parametrize("client,server,cache", CELLS,
                         ids=[f"{c}-client-{s}-server-{'cache' if k else 'nocache'}"
                              for c, s, k in CELLS])
def test_real_rdma_cell_agrees_with_the_emulation(builds, lib_dir, tmp_path, client, server,
                                                  cache):
    real = real_cell(builds, lib_dir, tmp_path / "real", client, server, cache=cache)
    assert real.session.verdict == "works", (real.session.error, real.server_log[-3000:],
                                             real.client_log[-40:])
    assert real.problems(SLOTS[client], SLOTS[server]) == []
    assert "RDMA auto-negotiate enabled" in real.server_log
    emu = emulated_cell(tmp_path, client, server, cache=cache)
    assert [ch for ch in emu.checks if not ch.ok] == []
    assert_same_as_emulated(real, emu)


# ------------------------------------------------------------------------------ knobs and faults
@pytest.mark.parametrize("side", ["client", "server"])
def test_load_opt_0_is_stop_and_wait(builds, lib_dir, tmp_path, side):
    """GGML_RPC_LOAD_OPT=0 on one side of new/new: that side's sender waits for every SEND,
    which the pipelining check then reports, and the emulation predicts the session from
    the old generation on that side (what docs/RDMA.md maps LOAD_OPT=0 to)."""
    envs = {f"{side}_env": LOAD_OPT_OFF}
    real = real_cell(builds, lib_dir, tmp_path / "real", "new", "new", cache=False, **envs)
    assert real.session.verdict == "works", real.session.error
    slots = {"client": 8, "server": 8} | {side: 1}
    assert real.problems(slots["client"], slots["server"]) == []
    assert real.qp(side).max_send_queue == 1
    assert real.problems(8, 8) == [f"{side} send ring 1, expected 8"]  # the planted fault
    # LOAD_OPT=0 is 7.0.0 on that side, on the wire too (the client hashes for any server)
    emu = emulated_cell(tmp_path, *("old" if s == side else "new" for s in ("client", "server")),
                        cache=False)
    assert_same_as_emulated(real, emu)


def test_a_memlock_limit_halves_the_send_ring(builds, lib_dir, tmp_path):
    """7 MiB of lockable memory: the 6 MiB receive ring fits, the 2 MiB send ring does not,
    its half does: the server sends with 4 slots, as SEED000.with_(send_slots=4) models."""
    limit = RDMA_RX_RING * RDMA_CHUNK + 4 * RDMA_CHUNK
    real = real_cell(builds, lib_dir, tmp_path / "real", "new", "new", cache=False,
                     server_env={"SOFTVERBS_MEMLOCK": str(limit)})
    assert real.session.verdict == "works", real.session.error
    assert real.problems(8, 4) == []
    assert real.qp("server").max_send_queue <= 4
    emu = emulated_cell(tmp_path, "new", "new", cache=False,
                        server_config=SEED000.with_(send_slots=4))
    assert_same_as_emulated(real, emu)


@pytest.mark.parametrize("side", ["client", "server"])
def test_no_rdma_on_one_side_fails_the_rdma_check(builds, lib_dir, tmp_path, side):
    """Planted fault: GGML_RPC_NO_RDMA on one side. The session still works (TCP on both
    sides), the RDMA check says it did not go over RDMA, and the emulation with that side
    withholding its caps predicts the same: nobody switched, nothing on the queue pairs."""
    real = real_cell(builds, lib_dir, tmp_path / "real", "new", "new", cache=False,
                     **{f"{side}_env": {"GGML_RPC_NO_RDMA": "1"}})
    assert real.session.verdict == "works", real.session.error
    found = real.problems(8, 8)
    assert "RDMA was not activated on both sides on these QPs" in found, found
    assert any(p.startswith("the payload did not go over RDMA") for p in found), found
    emu = emulated_cell(tmp_path, "new", "new", cache=False, **{f"{side}_policy": WITHHOLD})
    assert_same_as_emulated(real, emu, fields={"switched", "no_overrun", "client_sends",
                                               "server_sends", "client_send_bytes",
                                               "server_send_bytes"})
    assert not real.facts().switched and real.facts().client_sends == 0


def test_the_old_client_new_server_cell_needs_the_partial_receive(tmp_path):
    """Why old-client/new-server works: the old client's 256 KiB SEND carries the SET_TENSOR
    header and the start of its data, which the new server reads header first. With 7.0.0's
    whole-completion receive the same cell overruns (the emulation; tests/test_rdma_soft_fuzz.py
    shows the real 7.0.0 receiver dying on such completions)."""
    emu = emulated_cell(tmp_path, "old", "new", cache=False,
                        server_config=SEED000.with_(recv_policy=WHOLE_COMPLETION))
    assert emu.session.verdict == "fails"
    assert [c.name for c in emu.checks if not c.ok] == ["conn 0: server: no receive overrun or "
                                                         "lost bytes"]


def test_the_pipelining_check_catches_a_ring_that_never_fills():
    """Planted fault for the in-flight check on its own: a build that reports 8 send slots
    but whose device counters never saw a second SEND outstanding."""
    def qp(qpn, dest, **kw):
        return QpStats(**{**NO_QP.__dict__, "pid": 1, "qpn": qpn, "dest_qpn": dest,
                          "state": "RTS", "max_send": RDMA_CHUNK,
                          "max_recv_queue": RDMA_RX_RING, **kw})
    probed = "RDMA probed: dev=softverbs0 gid=3 RoCEv2 qpn={} inline=256 send slots=8"
    payload = 2 * (SMALL + LARGE)
    cell = RealCell(Session(), f"{probed.format(2)}\nRDMA activated: qpn=2->1 mtu=1024",
                    [probed.format(1), "RDMA activated: qpn=1->2 mtu=1024"],
                    [qp(1, 2, send_bytes=payload, recv_bytes=payload, max_send_queue=1)],
                    [qp(2, 1, send_bytes=payload, recv_bytes=payload, max_send_queue=8)])
    assert cell.problems(8, 8) == ["client with 8 send slots kept 1 in flight"]
    assert cell.problems(1, 8) == ["client send ring 8, expected 1"]
