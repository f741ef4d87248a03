"""Matrix cells over an RDMA transport: the emulated one here, pyverbs where a device exists.

A real llama.cpp binary cannot speak the emulated fabric, so these cells put reference peers
in both roles, each with the RDMA generation of its dialect (old: whole-completion receive
and stop-and-wait send; seed 000 / 9.0.0: partial receive, pipelined send). The server runs
in-process behind an RDMA listener; every endpoint records what it carried, which is the
cell's transcript, and the RDMA-specific checks run on every connection.
"""

from __future__ import annotations

import io
from pathlib import Path

from ..impls.driver import ExitInfo
from ..reference.client import RefClient
from ..reference.server import ReferenceServer
from ..reference.server_core import ServerConfig
from ..proto import get_dialect
from ..transport.rdma_core import RdmaOverrun, config_for_dialect
from ..transport.rdma_endpoint import RdmaEmuEndpoint, RdmaEmuListener, connect_emu
from ..scenario import Check

PROBE_TIMEOUT = 5.0  # every wait of a liveness probe


def unavailable(transport: str, client_kind: str, server_kind: str) -> str | None:
    if client_kind != "ref" or server_kind != "ref":
        return (f"{transport} cells need reference peers in both roles (a real binary speaks "
                "RDMA only over a device: see docs/RDMA.md)")
    if transport == "rdma-verbs":
        from ..transport.verbs import verbs_available
        ok, reason = verbs_available()
        return None if ok else reason
    return None


class InProcessRdmaServer:
    """A ServerProcess stand-in: the reference server behind an RDMA listener."""

    def __init__(self, transport: str, dialect: str, cache_dir: Path | None, idle: float):
        self.transport = transport
        self.dialect = dialect
        self.name = f"reference-{dialect}@{transport}"
        self.err = io.StringIO()
        self.server = ReferenceServer(
            ServerConfig(dialect=get_dialect(dialect),
                         cache_dir=cache_dir / "rpc" if cache_dir else None),
            idle_timeout=idle, out=io.StringIO(), err=self.err)
        if transport == "rdma-verbs":
            from ..transport.verbs import verbs_listener
            self.listener = verbs_listener(self.server.serve_transport, config_for_dialect(dialect),
                                           timeout=idle, record=True, dialect=dialect)
        else:
            self.listener = RdmaEmuListener(self.server.serve_transport,
                                            config_for_dialect(dialect), timeout=idle,
                                            record=True, dialect=dialect)
        self.probe_timeout = PROBE_TIMEOUT
        self._exit: ExitInfo | None = None
        self.port = self.listener.start()
        self.endpoint = f"127.0.0.1:{self.port}"

    def connect(self, client_dialect: str, idle: float):
        """A transport factory for the cell's clients: (host, port) -> endpoint."""
        if self.transport == "rdma-verbs":
            from ..transport.verbs import connect_verbs
            return lambda h, p: connect_verbs(h, p, config_for_dialect(client_dialect),
                                              timeout=idle, record=True)
        return lambda h, p: connect_emu(h, p, config_for_dialect(client_dialect), timeout=idle,
                                        record=True, dialect=client_dialect)

    def poll(self) -> ExitInfo | None:
        """None while the server serves: a fresh connection gets HELLO and DEVICE_COUNT
        answered (a TCP connect alone would succeed on a listening socket nobody accepts
        from). How it ended otherwise."""
        if self._exit is not None:
            return self._exit
        client = None
        try:
            client = RefClient(self.connect(self.dialect, self.probe_timeout)(
                "127.0.0.1", self.port), self.dialect)
            client.hello()
            client.device_count()
        except Exception as e:  # noqa: BLE001 - any failure of the probe is the answer
            return ExitInfo(returncode=None, message=f"the in-process {self.name} did not "
                            f"serve a fresh connection: {type(e).__name__}: {e}",
                            log_tail=self.log_tail())
        finally:
            if client is not None:
                client.close()
        return None

    def log_tail(self, n: int = 20) -> list[str]:
        return self.err.getvalue().splitlines()[-n:]

    def log_text(self) -> str:
        return self.err.getvalue()

    def stop(self, timeout: float = 5.0) -> ExitInfo:
        self.listener.stop(timeout)
        self._exit = ExitInfo(returncode=0)
        return self._exit


def rdma_checks(client: RdmaEmuEndpoint, server: RdmaEmuEndpoint, *,
                expect_rdma: bool = True) -> list[Check]:
    """What must hold on an emulated-RDMA connection besides the scenario's own checks."""
    out = []
    if expect_rdma:
        out.append(Check("both sides switched to RDMA after HELLO",
                         client.active and server.active,
                         f"client {'on' if client.active else 'off'}, "
                         f"server {'on' if server.active else 'off'}"))
    for ep in (client, server):
        cfg, st, ws = ep.config, ep.stats, ep.wire.stats
        out.append(Check(f"{ep.role}: no receive overrun or lost bytes",
                         not st.overruns and not st.dropped and
                         not isinstance(ep.failure, RdmaOverrun),
                         str(ep.failure) if ep.failure else f"{st.completions} completions"))
        out.append(Check(f"{ep.role}: no wait ran out", ep.diagnosis is None,
                         ep.diagnosis or ""))
        out.append(Check(f"{ep.role}: every SEND <= chunk, in flight <= slots",
                         st.largest_send <= cfg.chunk and ws.max_in_flight <= cfg.send_slots,
                         f"largest {st.largest_send}, max in flight {ws.max_in_flight}"))
        out.append(Check(f"{ep.role}: receive ring never over-filled",
                         ws.max_landed <= cfg.recv_depth,
                         f"most waiting {ws.max_landed}, depth {cfg.recv_depth}"))
    return out


# Per-connection RDMA facts both RDMA runners state (rdma-emu here, rdma-soft from the soft
# device's counters in harness.matrix.rdma_soft), kept in a cell's facts as "rdma"
RDMA_FACTS = ("switched", "no_overrun", "ring_kept", "client_sends", "server_sends",
              "client_send_bytes", "server_send_bytes")


def connection_facts(client_endpoints: list, server: InProcessRdmaServer) -> list[dict]:
    servers = {ep.qpn: ep for ep in server.listener.endpoints}
    out = []
    for client in client_endpoints:
        srv = servers.get(client.wire.peer_qpn)
        if srv is None:
            out.append({k: None for k in RDMA_FACTS})
            continue
        checks = rdma_checks(client, srv, expect_rdma=False)

        def ok(part: str) -> bool:
            return all(c.ok for c in checks if part in c.name)
        out.append({"switched": client.active and srv.active,
                    "no_overrun": ok("no receive overrun"),
                    "ring_kept": ok("in flight <= slots") and ok("ring never over-filled"),
                    "client_sends": client.stats.sends, "server_sends": srv.stats.sends,
                    "client_send_bytes": client.stats.send_bytes,
                    "server_send_bytes": srv.stats.send_bytes})
    return out


def connection_checks(client_endpoints: list, server: InProcessRdmaServer,
                      rejected: bool) -> list[Check]:
    """RDMA-specific checks on every connection: both sides switched after HELLO (after a
    HELLO rejection only the server did, spec 10.4), no overrun, no wait ran out, ring
    bounds kept."""
    servers = {ep.qpn: ep for ep in server.listener.endpoints}
    out = []
    for i, client in enumerate(client_endpoints):
        srv = servers.get(client.wire.peer_qpn)
        if srv is None:
            out.append(Check(f"conn {i}: server side found", False, "no accepted endpoint"))
            continue
        if rejected:
            out.append(Check(f"conn {i}: only the server switched", srv.active and not client.active,
                             f"server {srv.active}, client {client.active}"))
            out += [Check(f"conn {i}: {c.name}", c.ok, c.evidence)
                    for c in rdma_checks(client, srv, expect_rdma=False)]
        else:
            out += [Check(f"conn {i}: {c.name}", c.ok, c.evidence) for c in rdma_checks(client, srv)]
    return out
