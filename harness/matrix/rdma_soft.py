"""Matrix cells on ``rdma-soft``: the real llama.cpp RDMA builds over softverbs.

Each real peer of the cell runs its pin's RDMA build (``<pin>+rdma``, `harness peers build PIN
--rdma`) with the soft device in its environment: the server process and every ctypes client
agent get ``softverbs_env(..., stats_dir=<cell>/qps-server|qps-client)``, which also makes the
device capture what each queue pair received. HELLO still crosses the cell's TCP recording
proxy; after it the RPC bytes go over the queue pairs, so the cell's transcripts are the
proxy's HELLO plus the device capture of the two QPs that HELLO's ``conn_caps`` name, and
every scenario judges them as it judges a TCP wire. The RDMA checks per connection: both
sides switched on those QPs (the server's own ``RDMA activated`` line, the QPs connected to
each other), no RPC byte after HELLO on TCP, every byte one QP sent received by the other and
in the transcript, no error completion, the generation's ring bounds.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..capture.transcript import C2S, S2C, Transcript
from ..impls.adapters import Adapter
from ..impls.driver import ClientDriver
from ..proto.constants import RDMA_CHUNK, RDMA_RX_RING
from ..reference.knobs import Misbehaviour
from ..scenario import BUILD_ERROR, DEVICE_MISSING, Check, Skip
from ..transport.caps import ZERO_CAPS, unpack_linux
from ..transport.rdma_core import config_for_dialect
from ..transport.softverbs import (ACTIVATED_RE, QpCapture, SoftverbsBuildError,
                                   SoftverbsUnavailable, build_softverbs, rdma_carried_problems,
                                   read_capture, read_qp_stats, softverbs_env)

TRANSPORT = "rdma-soft"
RDMA_SUFFIX = "+rdma"  # the cache entry of `harness peers build PIN --rdma`
SOFTVERBS_VARS = ("LD_LIBRARY_PATH", "SOFTVERBS_STATS_DIR", "SOFTVERBS_CAPTURE_DIR",
                  "SOFTVERBS_LOG")
SLOTS_RE = re.compile(r"RDMA probed: .* send slots=(\d+)")  # the seed-000 build's probe line


REAL_KINDS = ("pin", "user")  # their RDMA builds; kind ref: pyverbs (harness.matrix.soft_ref)


def unavailable(client_kind: str, server_kind: str) -> Skip | None:
    """Why a cell of these kinds has no rdma-soft form here (None: it has): not applicable to
    its kinds, the device missing (no compiler or verbs headers), or a build error (the
    device's compile failed: never a skip any run accepts)."""
    for kind in (client_kind, server_kind):
        if kind not in (*REAL_KINDS, "ref"):
            return Skip(f"rdma-soft cells run RDMA builds or the reference peer on pyverbs; a "
                        f"{kind} peer has neither here")
    try:
        build_softverbs()
    except SoftverbsBuildError as e:
        return Skip(str(e), BUILD_ERROR, "softverbs")
    except SoftverbsUnavailable as e:
        return Skip(str(e), DEVICE_MISSING, TRANSPORT)
    return None


def rdma_pin(pin: str) -> str:
    return pin if pin.endswith(RDMA_SUFFIX) else pin + RDMA_SUFFIX


@dataclass
class SoftRdmaAdapter(Adapter):
    """A real peer's RDMA build with the soft device in its server's and clients' environment."""

    env: dict[str, str] = field(default_factory=dict)  # softverbs + the cell's planted knobs
    client_env: dict[str, str] = field(default_factory=dict)

    idle: float = 60.0  # a reference server's every wait

    def start_server(self, workdir: Path, cache_dir: Path | None,
                     env: dict[str, str] | None = None):
        if self.kind != "ref":
            return super().start_server(workdir, cache_dir, env={**(env or {}), **self.env})
        from ..impls.supervisor import ServerProcess
        from .soft_ref import server_argv
        workdir.mkdir(parents=True, exist_ok=True)
        # the real servers keep entries in <LLAMA_CACHE>/rpc; mirror that layout
        return ServerProcess.start(
            server_argv(self.dialect, cache_dir / "rpc" if cache_dir else None, self.idle),
            {**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
            name=f"reference-{self.dialect}-pyverbs".replace("+", "_"), workdir=workdir)

    def new_client(self, *, step_timeout: float = 60.0, knobs: Misbehaviour | None = None,
                   transport_factory=None) -> ClientDriver:
        if self.kind == "ref":
            from .soft_ref import SoftRefClientDriver
            return SoftRefClientDriver(self.dialect, env=self.client_env,
                                       step_timeout=step_timeout, name=self.name)
        from ..impls.ctypes_driver import CtypesClientDriver
        peer = self.peer()
        return CtypesClientDriver(peer.lib_dir, proto=peer.proto, step_timeout=step_timeout,
                                  name=self.name, env=self.client_env)


def _side_env(lib_dir: Path, qps: Path, extra: dict[str, str]) -> dict[str, str]:
    env = softverbs_env(lib_dir, stats_dir=qps, capture_dir=qps, log=True)
    return {k: env[k] for k in SOFTVERBS_VARS if k in env} | dict(extra)


def _hello_qpns(tr: Transcript) -> tuple[int, int]:
    """(client QPN, server QPN) from the HELLO ``conn_caps`` on the TCP wire; 0 = no caps."""
    s = tr.decode()
    if not s.exchanges or s.server_hello is None:
        return 0, 0
    req = s.exchanges[0].request
    caps = (getattr(req, "conn_caps", ZERO_CAPS), s.server_hello.conn_caps)
    return tuple(unpack_linux(c).qpn if c != ZERO_CAPS else 0 for c in caps)  # type: ignore


@dataclass
class SoftRdmaCell:
    """The soft device's side of one rdma-soft cell: environments, transcripts, checks."""

    folder: Path
    client_env: dict[str, str] = field(default_factory=dict)  # planted knobs (tests)
    server_env: dict[str, str] = field(default_factory=dict)
    # local ports of the harness's own TCP clients (a scenario's misbehaving reference client):
    # their connections have no RDMA side; every other client of the cell must switch
    tcp_clients: set[int] = field(default_factory=set)

    def __post_init__(self):
        self.lib_dir = build_softverbs()
        self.server_qps = self.folder / "qps-server"
        self.client_qps = self.folder / "qps-client"
        for d in (self.server_qps, self.client_qps):  # a re-run of the cell starts afresh
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)

    def adapter(self, base: Adapter) -> SoftRdmaAdapter:
        """``base``'s RDMA build, the soft device in its server's and clients' environment."""
        server = _side_env(self.lib_dir, self.server_qps, self.server_env)
        client = _side_env(self.lib_dir, self.client_qps, self.client_env)
        return SoftRdmaAdapter(name=base.name, kind=base.kind, dialect=base.dialect,
                               pin=rdma_pin(base.pin) if base.pin else None,
                               server_args=base.server_args, env=server, client_env=client)

    # ------------------------------------------------------------ transcripts
    def _captures(self) -> tuple[dict[int, QpCapture], dict[int, QpCapture]]:
        return read_capture(self.client_qps), read_capture(self.server_qps)

    def merge(self, transcripts: list[Transcript]) -> list[Transcript]:
        """Each TCP transcript with what its two QPs carried, in time order: the client's
        SENDs (captured at the server's QP) as c2s, the server's as s2c."""
        client_rx, server_rx = self._captures()
        out = []
        for tr in transcripts:
            cq, sq = _hello_qpns(tr)
            pieces = [(t, S2C, d) for t, d in (client_rx[cq].sends if cq in client_rx else [])]
            pieces += [(t, C2S, d) for t, d in (server_rx[sq].sends if sq in server_rx else [])]
            if not pieces:
                out.append(tr)
                continue
            # everything: compact() applies the frame-aware budget afterwards (Transcript's
            # own keep elides whole chunks past it, frame headers included, and a decode then
            # saw nothing after the first MiB)
            merged = Transcript(meta={**tr.meta, "rdma": {"client_qpn": cq, "server_qpn": sq}},
                                keep=1 << 62)
            for t, direction, data in sorted(
                    [(c.t, c.direction, c.data if c.data is not None else c.length)
                     for c in tr.chunks] + pieces, key=lambda p: p[0]):
                if isinstance(data, int):
                    merged.add_elided(t, direction, data)
                else:
                    merged.add(t, direction, data)
            merged.closed = dict(tr.closed)
            out.append(merged)
        return out

    # ------------------------------------------------------------ checks
    def connection_facts(self, tcp: list[Transcript], server_log: str,
                         client_dialect: str, server_dialect: str) -> list[dict]:
        """Per connection, the RDMA facts the emulation's cells state too (same keys as
        :func:`harness.matrix.rdma.connection_facts`), plus what only a device shows."""
        stats = {q.qpn: q for q in read_qp_stats(self.client_qps) + read_qp_stats(self.server_qps)}
        client_rx, server_rx = self._captures()
        activated = {(int(a), int(b)) for a, b in ACTIVATED_RE.findall(server_log)}
        slots = (config_for_dialect(client_dialect).send_slots,
                 config_for_dialect(server_dialect).send_slots)
        out = []
        for tr in tcp:
            cq, sq = _hello_qpns(tr)
            c, s = stats.get(cq), stats.get(sq)
            hello = tr.decode().exchanges[:1]
            after_hello = sum(ch.length for ch in tr.chunks) - sum(
                e.req_size + e.rsp_size for e in hello)
            switched = bool(c and s and (sq, cq) in activated and c.dest_qpn == sq and
                            s.dest_qpn == cq)
            captured = (sum(len(d) for _, d in server_rx[sq].sends) if sq in server_rx else 0,
                        sum(len(d) for _, d in client_rx[cq].sends) if cq in client_rx else 0)
            out.append({
                "switched": switched,
                "no_overrun": bool(c and s and not c.errors and not s.errors and
                                   c.send_bytes == s.recv_bytes and s.send_bytes == c.recv_bytes),
                "ring_kept": bool(c and s and all(
                    q.max_send <= RDMA_CHUNK and q.max_recv_queue <= RDMA_RX_RING
                    for q in (c, s)) and c.max_send_queue <= slots[0]
                    and s.max_send_queue <= slots[1]),
                "client_sends": c.sends if c else 0, "server_sends": s.sends if s else 0,
                "client_send_bytes": c.send_bytes if c else 0,
                "server_send_bytes": s.send_bytes if s else 0,
                # device only
                "tcp_client": tr.meta.get("client", [None, None])[1] in self.tcp_clients,
                "server_activated": any(a == sq for a, _ in activated) if sq else False,
                "client_qpn": cq, "server_qpn": sq, "tcp_bytes_after_hello": after_hello,
                "captured": list(captured),
                "problems": rdma_carried_problems(c, s, 0) if c and s else
                ["no queue pair of this connection on the device"],
            })
        return out

    def checks(self, facts: list[dict], rejected: bool) -> list[Check]:
        out = []
        for i, f in enumerate(facts):
            if f["tcp_client"]:  # the harness's own TCP client: RDMA must stay off
                out.append(Check(f"conn {i}: the harness's TCP client stays on TCP",
                                 not f["server_activated"] and not f["server_sends"],
                                 f"server QP {f['server_qpn']}: activated "
                                 f"{f['server_activated']}, {f['server_sends']} SENDs"))
                continue
            if rejected:  # the client refused the version after the server switched (10.4)
                out += [Check(f"conn {i}: only the server switched",
                              f["server_activated"] and not f["switched"],
                              f"server activated {f['server_activated']}, both "
                              f"{f['switched']}"),
                        Check(f"conn {i}: nothing after the rejected HELLO",
                              f["tcp_bytes_after_hello"] == 0 and not f["client_sends"]
                              and not f["server_sends"],
                              f"{f['tcp_bytes_after_hello']} TCP bytes, SENDs "
                              f"{f['client_sends']} / {f['server_sends']}")]
                continue
            out += [
                Check(f"conn {i}: both sides switched to RDMA after HELLO", f["switched"],
                      f"client QP {f['client_qpn']}, server QP {f['server_qpn']}: "
                      f"{'; '.join(f['problems']) or 'activated, connected'}"),
                Check(f"conn {i}: no RPC byte on TCP after HELLO",
                      f["tcp_bytes_after_hello"] == 0, f"{f['tcp_bytes_after_hello']} bytes"),
                Check(f"conn {i}: every byte sent over a QP received, none lost, no error "
                      "completion, all in the transcript",
                      f["no_overrun"] and not f["problems"] and f["captured"] ==
                      [f["client_send_bytes"], f["server_send_bytes"]],
                      f"client sent {f['client_send_bytes']} in {f['client_sends']} SENDs, "
                      f"server {f['server_send_bytes']} in {f['server_sends']}, captured "
                      f"{f['captured']}"),
                Check(f"conn {i}: every SEND <= chunk, in flight <= slots, receive ring kept",
                      f["ring_kept"], ""),
            ]
        return out

    def cleanup(self) -> None:
        """Keep the counters (small, the evidence); the captures are in conn*.rpct now."""
        for d in (self.server_qps, self.client_qps):
            for p in d.glob("rx-*.bin"):
                p.unlink()

    def idle_seconds(self) -> float:
        """Seconds since a queue pair of the cell last changed its counters (rewritten on
        every completion): the watchdog must not call a busy RDMA connection idle because
        its TCP socket is quiet."""
        newest = 0.0
        for d in (self.server_qps, self.client_qps):
            for p in d.glob("qp-*.json"):
                try:
                    newest = max(newest, p.stat().st_mtime)
                except FileNotFoundError:
                    continue
        return time.time() - newest if newest else float("inf")
