"""What a scenario receives: the cell's context (its implementations, servers, the recording
proxy in front, the client it may open) and the fleet of servers a cell runs."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..capture.loadprof_log import LoadprofRecord, of_side, parse_loadprof
from ..capture.proxy import RecordingProxy
from ..capture.transcript import Transcript
from ..impls.adapters import Adapter
from ..impls.driver import ClientAborted, ClientDriver, ExitInfo
from ..impls.model_client import LOADPROF_ENV, run_llama_simple
from ..impls.preload_shim import ensure_shim
from ..impls.tiny_gguf import LOAD_MODEL_SPEC, layer_weight_bytes, tiny_model
from ..impls.supervisor import ServerProcess
from ..reference.client import RefClient
from ..reference.knobs import Misbehaviour
from ..proto import Session
from ..scenario import PROGRAM_MISSING, Observation, Skip, judge_abort
from .cells import Cell
from .load_runs import load_run_row, run_summary
from .rdma_soft import SoftRdmaCell


# Bytes of each direction a cell's transcript keeps verbatim; beyond it frame headers are kept
# and bulk payload is recorded by length, so a run's folders stay small (a 64 MiB round trip
# would otherwise be kept twice over, as .rpct and as .pcap).
CELL_KEEP = 1 << 20


@dataclass
class FleetServer:
    """One server of a cell behind its recording proxy: the cell's own, or one more that a
    scenario started (a mixed fleet: the design's other server role)."""

    name: str  # the implementation
    server: ServerProcess
    proxy: RecordingProxy | None
    port: int  # where a client connects (the proxy's port)
    cache_dir: Path | None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def transcripts(self) -> list[Transcript]:
        if self.proxy is None:
            return []
        self.proxy.wait_quiet(timeout=10.0)
        return list(self.proxy.transcripts)

    def loadprof_records(self) -> list[LoadprofRecord]:
        """The server's own load profiler records (GGML_RPC_LOADPROF=1 builds print them)."""
        return of_side(parse_loadprof(self.server.log_text().splitlines()), "server")


def model_client_rejection(ctx, exit_info: ExitInfo, sessions: list[Session]) -> Observation:
    """The model client ended saying it refused the server's version: a rejection by the
    client only as far as this run's connections show it (judge_abort: the server's HELLO
    answer on the wire, nothing sent after it, the version named in the message); without
    that answer the server hung up at HELLO, or the run failed. The message alone is the
    client's word, not evidence."""
    return judge_abort(ctx, ClientAborted(exit_info), sessions)


@dataclass
class CellContext:
    """What a scenario sees of its cell (implements harness.scenario.Context)."""

    cell: Cell
    client_adapter: Adapter
    server_adapter: Adapter
    server: ServerProcess
    proxy: RecordingProxy | None  # None: RDMA cells, whose endpoints record what they carry
    workdir: Path
    cache_dir: Path | None
    step_timeout: float
    client_knobs: Misbehaviour | None = None  # what a reference client in the cell is told to do
    notes: list[str] = field(default_factory=list)
    clients: list[ClientDriver] = field(default_factory=list)
    _sessions: list[Session] | None = None

    front_port: int | None = None  # a fault-injecting proxy in front of the recorder
    connect: object = None  # RDMA cells: dialect -> (host, port) -> Transport
    endpoints: list = field(default_factory=list)  # RDMA cells: every client endpoint
    other_server: Adapter | None = None  # the design's other server role
    fleet: list[FleetServer] = field(default_factory=list)  # servers a scenario started
    proxy_timeout: float = 600.0
    extra_servers: list = field(default_factory=list)  # second_server(): stopped with the cell
    soft: SoftRdmaCell | None = None  # rdma-soft cells: what crossed the queue pairs
    # the labels scenarios read (harness.scenario.Context), from the two adapters
    client_dialect: str = field(init=False)
    server_dialect: str = field(init=False)
    client_kind: str = field(init=False)
    server_kind: str = field(init=False)

    def __post_init__(self):
        self.client_dialect = self.client_adapter.dialect
        self.client_kind = self.client_adapter.kind
        self.server_dialect = self.server_adapter.dialect
        self.server_kind = self.server_adapter.kind

    @property
    def port(self) -> int:
        if self.proxy is None:
            return self.server.port
        return self.front_port or self.proxy.port

    def _factory(self, dialect: str):
        if self.connect is None:
            return None
        make = self.connect(dialect)

        def factory(host: str, port: int):
            ep = make(host, port)
            self.endpoints.append(ep)
            return ep
        return factory

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def cache(self) -> bool:
        return self.cell.cache

    def new_client(self) -> ClientDriver:
        drv = self.client_adapter.new_client(step_timeout=self.step_timeout,
                                             knobs=self.client_knobs,
                                             transport_factory=self._factory(self.client_dialect))
        self.clients.append(drv)
        return drv

    def ref_client(self, *, knobs=None, dialect: str | None = None) -> RefClient:
        dialect = dialect or self.client_dialect
        factory = self._factory(dialect)
        if factory is None:
            client = RefClient.connect("127.0.0.1", self.port, dialect,
                                       timeout=self.step_timeout, knobs=knobs, hello=False)
            if self.soft is not None:  # the harness's own client: its connection stays TCP
                self.soft.tcp_clients.add(client.tr.sock.getsockname()[1])
        else:
            client = RefClient(factory("127.0.0.1", self.port), dialect, knobs=knobs)
        if not client.knobs.skip_hello:
            client.hello()
        return client

    def transcripts(self) -> list[Transcript]:
        if self.proxy is None:
            return [ep.transcript for ep in self.endpoints]
        self.proxy.wait_quiet(timeout=10.0)
        tcp = list(self.proxy.transcripts)
        return self.soft.merge(tcp) if self.soft is not None else tcp

    def sessions(self) -> list[Session]:
        return [t.decode() for t in self.transcripts()]

    def cache_files(self) -> list[str]:
        d = self.cache_dir / "rpc" if self.cache_dir else None
        if d is None or not d.is_dir():
            return []
        return sorted(p.name for p in d.iterdir() if len(p.name) == 16)

    def log(self, message: str) -> None:
        self.notes.append(message)

    # -- a second server of the cell's server implementation (two-server scenarios)
    def second_server_unavailable(self) -> Skip | None:
        if self.proxy is None:
            return Skip(f"the second server runs over TCP only, not {self.cell.transport}")
        if self.server_kind == "docker":
            return Skip("a second server needs loopback_bind preloaded, not possible in an image")
        return None

    def second_server(self) -> ServerProcess:
        """Another server of the cell's server implementation, on 127.0.0.1, stopped with the
        cell; a real one runs with loopback_bind and is checked to listen on loopback only."""
        from ..impls.loopback import require_loopback_only, start_loopback_peer_server
        workdir = self.workdir / f"server{len(self.extra_servers) + 2}"
        if self.server_kind == "ref":
            srv = self.server_adapter.start_server(workdir, None)
        else:
            workdir.mkdir(parents=True, exist_ok=True)
            srv = start_loopback_peer_server(self.server_adapter.peer(), workdir=workdir)
        self.extra_servers.append(srv)
        if self.server_kind != "ref":
            require_loopback_only(srv)
        return srv

    def stop_second_servers(self) -> None:
        for srv in self.extra_servers:
            (self.workdir / f"{srv.name}-{srv.port}.log").write_text(srv.log_text())
            srv.stop()

    def kill_clients(self) -> None:
        for c in self.clients:
            try:
                c.close()
            except Exception:  # noqa: BLE001 - best effort while tearing down a hung cell
                pass

    # -- the end-to-end model client (real llama.cpp programs only)
    def model_client_unavailable(self) -> Skip | None:
        if self.client_kind == "docker":
            return Skip("the model client (llama-simple) runs natively only, not from an image",
                        PROGRAM_MISSING, f"{self.client_adapter.pin}:llama-simple in an image")
        if self.client_kind == "pin" and self.client_adapter.peer().kind == "wheel":
            return Skip(f"{self.client_adapter.pin} is a prebuilt wheel: its libraries ship no "
                        "llama-simple to build (a property of the pin, not of this machine)")
        bin_dir = self.client_adapter.bin_dir
        if bin_dir is None or not (bin_dir / "llama-simple").exists():
            return Skip(f"{self.client_adapter.pin} has no llama-simple: run `harness peers build "
                        f"{self.client_adapter.pin} --extra-target llama-simple`",
                        PROGRAM_MISSING, f"{self.client_adapter.pin}:llama-simple")
        return None

    def own_server(self) -> FleetServer:
        return FleetServer(self.cell.server, self.server, self.proxy, self.port, self.cache_dir)

    def start_other_server(self) -> FleetServer:
        """Start the design's other server role beside the cell's own, recorded the same way."""
        if self.other_server is None:
            raise RuntimeError(f"{self.cell.id}: no other server role to start")
        n = len(self.fleet) + 2
        cache_dir = self.workdir / f"cache{n}" if self.cache else None
        srv = self.other_server.start_server(self.workdir / f"server{n}", cache_dir,
                                             env=LOADPROF_ENV)
        try:
            proxy = RecordingProxy(("127.0.0.1", srv.port), idle_timeout=self.proxy_timeout,
                                   deadline=self.proxy_timeout, keep=CELL_KEEP).start()
        except BaseException:
            srv.stop()
            raise
        member = FleetServer(self.other_server.name, srv, proxy, proxy.port, cache_dir)
        self.fleet.append(member)
        return member

    def run_model_client(self, *, runs: int = 1, servers: list[FleetServer] | None = None
                         ) -> dict:
        """llama-simple with the load model: once locally, then ``runs`` times over RPC to
        ``servers`` (default: the cell's own; the same servers and cache dirs every run, so
        the second run is a warm cache). Each run's row per server: what the wire showed
        (that run's connections only) and what both sides' profilers printed."""
        servers = servers or [self.own_server()]
        bin_dir = self.client_adapter.bin_dir
        model, shim = tiny_model(LOAD_MODEL_SPEC), ensure_shim(bin_dir)
        timeout = self.step_timeout * 5
        local = run_llama_simple(bin_dir, model, timeout=timeout)
        summary = {"model": model.name, "local": run_summary(local), "runs": []}
        rows = []
        for i in range(runs):
            marks = [(len(m.transcripts()), len(m.loadprof_records())) for m in servers]
            rpc = run_llama_simple(bin_dir, model, servers=[m.endpoint for m in servers],
                                   shim=shim, env=LOADPROF_ENV, timeout=timeout)
            if rpc.exit.aborted and "version mismatch" in (rpc.exit.message or ""):
                this_run = [t.decode() for m, (n_conns, _) in zip(servers, marks)
                            for t in m.transcripts()[n_conns:]]
                return {"rejected": True,
                        "observation": model_client_rejection(self, rpc.exit, this_run)}
            label = ("cold", "warm")[i] if runs == 2 and self.cache else str(i + 1)
            equal = local.ok and rpc.ok and local.stdout == rpc.stdout
            clients = of_side(parse_loadprof(rpc.log), "client")
            for m, (n_conns, n_records) in zip(servers, marks):
                rows.append(load_run_row(label, m, n_conns, n_records, rpc, equal,
                                          [p for p in clients if p.endpoint == m.endpoint]))
            summary["runs"].append({"run": label, "equal": equal, **run_summary(rpc)})
        (self.workdir / "model.json").write_text(json.dumps(summary, indent=2))
        return {"equal": all(r["equal"] for r in summary["runs"]), "local_text": local.text,
                "rpc_texts": [r["text"] for r in summary["runs"]], "load_runs": rows,
                "layer_bytes": layer_weight_bytes(model)}
