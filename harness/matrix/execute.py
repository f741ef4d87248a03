"""Executing cells: servers under supervision, a recording proxy in front, the scenario in a
thread with a deadline and an idle watchdog, then a verdict from the wire."""

from __future__ import annotations

import json
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from dataclasses import replace as dc_replace
from pathlib import Path
from typing import Callable

import scenarios  # noqa: F401 - importing the package registers every scenario

from ..capture.decode import iter_lines
from ..capture.upload_timing import UploadTiming, plot, time_uploads
from ..capture.pcap import write_pcap
from ..capture.proxy import RecordingProxy, compact
from ..capture.transcript import Transcript
from ..impls.adapters import Adapter, adapter_for, adapter_for_peer
from ..impls.driver import ExitInfo
from ..impls.model_client import LOADPROF_ENV
from ..impls.supervisor import ServerProcess, ServerStartError
from ..reference.knobs import Misbehaviour, parse_knobs
from ..scenario import (BUILD_ERROR, DEVICE_MISSING, NOT_APPLICABLE, PEER_MISSING, REJECTED,
                        SCENARIOS, Observation, Scenario, Skip)
from ..transport.chop import Delivery, FaultProxy
from .cells import RELEASES, Cell, expectation_for
from .labels import client_label_mismatch, server_label_mismatch
from .model import Expectation, Matrix
from .rdma import RDMA_FACTS, InProcessRdmaServer, connection_checks, connection_facts
from .rdma import unavailable as rdma_unavailable
from .rdma_soft import TRANSPORT as RDMA_SOFT
from .rdma_soft import SoftRdmaCell, rdma_pin
from .rdma_soft import unavailable as soft_unavailable
from .evidence import wire_evidence
from .verdict import ERROR, HANG, PASS, Verdict, describe, judge


from .context import CELL_KEEP, CellContext, FleetServer


@dataclass
class Timeouts:
    """How a cell runs: its deadlines, a delivery plan, what it keeps of the wire."""

    deadline: float
    idle: float
    deliver: str | None = None  # fault-injecting delivery plan (harness.transport.chop)
    keep_payloads: bool = False  # a passing cell keeps its payload bytes too (--keep-payloads)


@dataclass(frozen=True)
class PlannedCell:
    """A cell with everything needed to run it: its expectation and both implementations."""

    cell: Cell
    expect: Expectation
    client: Adapter
    server: Adapter
    client_knobs: Misbehaviour | None = None
    other_server: Adapter | None = None  # the design's other server role (mixed fleets)
    # rdma-soft cells: variables for the real client's / server's process (planted knobs such
    # as GGML_RPC_NO_RDMA=1, which the tests use to show the RDMA checks failing)
    client_env: dict = field(default_factory=dict)
    server_env: dict = field(default_factory=dict)


def _row(job: PlannedCell, verdict: Verdict, obs: Observation | None, duration: float,
         run_id: str) -> dict:
    cell, expect, client, server = job.cell, job.expect, job.client, job.server
    label = {"old-client": "old", "new-client": "new", "old-server": "old", "new-server": "new"}
    return {
        "run_id": run_id, "cell_id": cell.id, "design": cell.design, "pair": cell.pair,
        "client_role": cell.client_role, "server_role": cell.server_role,
        "client": cell.client, "server": cell.server,
        "client_label": f"{label.get(cell.client_role, cell.client_role)} client: {cell.client}",
        "server_label": f"{label.get(cell.server_role, cell.server_role)} server: {cell.server}",
        "client_dialect": client.dialect, "server_dialect": server.dialect,
        "client_kind": client.kind, "server_kind": server.kind,
        "cache": cell.cache, "scenario": cell.scenario, "transport": cell.transport,
        "expected": describe(expect), "expected_outcome": expect.outcome, "because": expect.because,
        "observed": obs.outcome if obs else None, "verdict": verdict.verdict,
        "reason": verdict.reason, "skip_code": verdict.skip.code if verdict.skip else None,
        "skip_missing": verdict.skip.missing if verdict.skip else None,
        "duration": round(duration, 3), "folder": cell.folder,
        "degraded": obs.degraded if obs else [], "rejected_by": obs.rejected_by if obs else None,
        "message": obs.message if obs else "",
        "checks": [c.__dict__ for c in obs.checks] if obs else [],
        "facts": obs.facts if obs else {},
    }


def cell_skip(job: PlannedCell) -> Skip | None:
    """Why the cell cannot run here before anything starts, or None."""
    for adapter in (job.client, job.server):
        reason = adapter.unavailable()
        if reason:
            # a peer whose build failed is a failure no --allow-skip accepts, not a missing one
            return Skip(reason, BUILD_ERROR if adapter.build_failed() else PEER_MISSING,
                        adapter.pin or adapter.image or adapter.name)
    if job.cell.transport == RDMA_SOFT:
        return _soft_skip(job)
    if job.cell.transport != "tcp":
        reason = rdma_unavailable(job.cell.transport, job.client.kind, job.server.kind)
        if reason:
            # with reference peers in both roles only the device can be missing
            both_ref = job.client.kind == job.server.kind == "ref"
            return Skip(reason, DEVICE_MISSING if both_ref else NOT_APPLICABLE,
                        job.cell.transport if both_ref else None)
    return None


def _soft_skip(job: PlannedCell) -> Skip | None:
    # not applicable to the kinds, the device missing, or its build failed (a build error)
    skip = soft_unavailable(job.client.kind, job.server.kind)
    if skip:
        return skip
    for adapter in (job.client, job.server):
        if adapter.kind == "ref":
            continue
        pin = rdma_pin(adapter.pin)
        rdma = dc_replace(adapter, pin=pin)
        reason = rdma.unavailable()
        if reason:
            return Skip(f"{reason} (the RDMA build: `harness peers build {adapter.pin} --rdma`)",
                        BUILD_ERROR if rdma.build_failed() else PEER_MISSING, pin)
    return None


def wire_label_mismatch(ctx: CellContext, scenario: Scenario) -> str | None:
    """The cell's labels against what both sides put on the wire."""
    sessions = ctx.sessions()
    return (server_label_mismatch(ctx.server_dialect, sessions) or
            client_label_mismatch(ctx.client_dialect, ctx.transcripts(), sessions,
                                  uploads_big_weights=scenario.uploads_big_weights))


def run_cell(job: PlannedCell, run_dir: Path, timeouts: Timeouts, run_id: str) -> dict:
    cell, expect, server = job.cell, job.expect, job.server
    t0 = time.monotonic()
    folder = run_dir / cell.folder
    folder.mkdir(parents=True, exist_ok=True)
    scenario = SCENARIOS[cell.scenario]

    def finish(verdict: Verdict, obs: Observation | None = None, load: dict | None = None) -> dict:
        row = _row(job, verdict, obs, time.monotonic() - t0, run_id)
        row["load"] = load or {}
        (folder / "verdict.json").write_text(json.dumps(row, indent=2, default=str))
        return row

    skip = cell_skip(job)
    if skip:
        return finish(judge(expect, None, skip=skip))
    cache_dir = folder / "cache" if cell.cache else None
    proxy = soft = None
    if cell.transport == RDMA_SOFT:  # the pins' RDMA builds, the soft device in their env
        soft = SoftRdmaCell(folder, dict(job.client_env), dict(job.server_env))
        job = dc_replace(job, client=soft.adapter(job.client), server=soft.adapter(job.server))
        server = job.server
    try:
        if cell.transport in ("tcp", RDMA_SOFT):
            srv = server.start_server(folder / "server", cache_dir, env=LOADPROF_ENV)
        else:
            srv = InProcessRdmaServer(cell.transport, server.dialect, cache_dir, timeouts.idle)
    except (ServerStartError, OSError) as e:
        return finish(judge(expect, None, error=f"server did not start: {e}"))
    if cell.transport in ("tcp", RDMA_SOFT):
        # (on rdma-soft it sees HELLO; the queue pairs carry the rest)
        # the proxy never times a connection out itself: the watchdog below decides on hangs
        proxy = RecordingProxy(("127.0.0.1", srv.port), idle_timeout=timeouts.deadline + 60,
                               deadline=timeouts.deadline + 60, keep=CELL_KEEP).start()
    fault = None
    if timeouts.deliver and proxy is not None:
        plan = Delivery.parse(timeouts.deliver)
        fault = FaultProxy(("127.0.0.1", proxy.port), c2s=plan, s2c=plan,
                           idle=timeouts.deadline).start()
    ctx = CellContext(cell, job.client, server, srv, proxy, folder, cache_dir, timeouts.idle,
                      client_knobs=job.client_knobs,
                      front_port=fault.port if fault else None,
                      connect=None if proxy else (lambda d: srv.connect(d, timeouts.idle)),
                      other_server=job.other_server, proxy_timeout=timeouts.deadline + 60,
                      soft=soft)
    obs: Observation | None = None
    failure: list[str] = []
    hang: str | None = None
    server_exit: ExitInfo | None = None
    try:
        skip = scenario.applicable(ctx)
        if skip:
            return finish(judge(expect, None, skip=skip))
        result: dict = {}

        def body():
            try:
                result["obs"] = scenario.run(ctx)
            except BaseException:  # noqa: BLE001 - a harness bug is reported, not raised
                result["error"] = traceback.format_exc()

        th = threading.Thread(target=body, name=f"cell-{cell.id}", daemon=True)
        th.start()
        deadline = t0 + timeouts.deadline
        while th.is_alive():
            th.join(0.1)
            now = time.monotonic()
            if now > deadline:
                hang = f"no result within the cell deadline of {timeouts.deadline:.0f} s"
            elif proxy is not None and _idle(proxy, soft) > timeouts.idle and \
                    proxy.active_connections() > 0:
                hang = f"no byte on the wire for {timeouts.idle:.0f} s with a connection open"
            if hang:
                ctx.kill_clients()
                server_exit = srv.poll()
                srv.stop()
                th.join(10)
                break
        if server_exit is None:
            server_exit = srv.poll()
        if "error" in result:
            failure.append(result["error"])
        obs = result.get("obs")
        if obs is not None and obs.message.startswith("hang:"):
            hang = obs.message
        if obs is not None and not hang:
            obs.misconfigured = wire_label_mismatch(ctx, scenario)
    finally:
        ctx.kill_clients()
        ctx.stop_second_servers()
        if fault is not None:
            fault.stop()
            ctx.notes += [f"delivery {timeouts.deliver}: {line}" for line in fault.log[-50:]]
        final = srv.stop()  # RDMA cells: joins the connection threads, their state is final
        _stop_fleet(folder, ctx.fleet)
        if server_exit is None and final.returncode not in (None, 0, -15, 143):
            server_exit = final
        transcripts = proxy.stop() if proxy is not None else \
            [compact(t, CELL_KEEP) for t in ctx.transcripts()]
        if soft is not None:
            facts = soft.connection_facts(transcripts, srv.log_text(), job.client.dialect,
                                          job.server.dialect)
            transcripts = [compact(t, CELL_KEEP) for t in soft.merge(transcripts)]
            soft.cleanup()
            if obs is not None:
                obs.checks += soft.checks(facts, expect.outcome == REJECTED)
                obs.facts["rdma"] = [{k: f[k] for k in RDMA_FACTS} for f in facts]
            (folder / "rdma.json").write_text(json.dumps(facts, indent=1, default=str))
        _write_artefacts(folder, transcripts, ctx, srv)
        if obs is not None and not hang:
            obs.checks += wire_evidence(scenario, obs, [t.decode() for t in transcripts],
                                        job.client.dialect)
        if proxy is None and obs is not None:
            obs.checks += connection_checks(ctx.endpoints, srv, expect.outcome == REJECTED)
            obs.facts["rdma"] = connection_facts(ctx.endpoints, srv)
            (folder / "rdma.json").write_text(json.dumps(
                [ep.summary() for ep in ctx.endpoints + list(srv.listener.endpoints)],
                indent=1, default=str))
    verdict = judge(expect, obs, error=failure[0] if failure else None, hang=hang,
                    server_exit=server_exit)
    load = _upload_timing(folder, transcripts, cell)
    if verdict.verdict == PASS and not timeouts.keep_payloads:
        elide_payloads(folder, transcripts)
    return finish(verdict, obs, load)


# A passing cell's evidence after its verdict: frame headers and payloads up to this many bytes
# stay, longer payloads become their length and SHA-256 (a full run of the matrix went from
# 1.2 GB to well under 100 MB). Failing, crashing, hanging and erroring cells keep everything
# the recording kept.
PASSING_PAYLOAD_KEEP = 512
PASSING_HEADS_BUDGET = 16 << 20  # per direction: headers and short payloads, never bulk


def elide_payloads(folder: Path, transcripts: list[Transcript]) -> None:
    """Rewrite a passing cell's transcripts and pcap with long payloads elided (hashed),
    gzip-compressed under the same names (every reader of them takes either)."""
    def small(tr: Transcript) -> Transcript:
        return compact(tr, 0, head_bytes=PASSING_PAYLOAD_KEEP, heads_keep=PASSING_HEADS_BUDGET,
                       hash_elided=True)
    kept = [small(t) for t in transcripts]
    for i, tr in enumerate(kept):
        tr.save(folder / f"conn{i}.rpct", compress=True)
    if kept:
        write_pcap(kept, folder / "wire.pcap", compress=True)
    for conn in sorted(folder.glob("server*/conn*.rpct")):  # a fleet's other servers
        small(Transcript.load(conn)).save(conn, compress=True)


def _idle(proxy: RecordingProxy, soft: SoftRdmaCell | None) -> float:
    return proxy.idle_seconds() if soft is None else min(proxy.idle_seconds(), soft.idle_seconds())


def _write_artefacts(folder: Path, transcripts: list[Transcript], ctx: CellContext,
                     srv: ServerProcess) -> None:
    for i, tr in enumerate(transcripts):
        tr.save(folder / f"conn{i}.rpct")
    if transcripts:
        try:
            write_pcap(transcripts, folder / "wire.pcap")
            lines = list(iter_lines(folder / "wire.pcap", dialect=None))
            (folder / "transcript.txt").write_text("\n".join(lines) + "\n")
        except Exception as e:  # noqa: BLE001 - artefacts must not hide the verdict
            (folder / "transcript.txt").write_text(f"could not render: {e!r}\n")
    (folder / "server.log").write_text(srv.log_text())
    _compact_cache(ctx.cache_dir)
    logs = []
    for c in ctx.clients:
        logs.append(f"== {c.name}\n" + "\n".join(c.log_tail(200)))
    if ctx.notes:
        logs.append("== notes\n" + "\n".join(ctx.notes))
    (folder / "client.log").write_text("\n\n".join(logs) + "\n")


def _stop_fleet(folder: Path, fleet: list[FleetServer]) -> None:
    """Stop the servers a scenario started; keep their transcripts and logs beside the cell's."""
    for n, member in enumerate(fleet, start=2):
        transcripts = member.proxy.stop() if member.proxy is not None else []
        member.server.stop()
        out = folder / f"server{n}"
        out.mkdir(parents=True, exist_ok=True)
        for i, tr in enumerate(transcripts):
            tr.save(out / f"conn{i}.rpct")
        (out / "server.log").write_text(member.server.log_text())
        _compact_cache(member.cache_dir)


def _compact_cache(cache_dir: Path | None) -> None:
    """Keep the cache's listing (name and size of every entry), not its multi-MiB contents."""
    entries = cache_dir / "rpc" if cache_dir else None
    if entries is None or not entries.is_dir():
        return
    files = sorted(p for p in entries.iterdir() if p.is_file())
    (cache_dir / "entries.txt").write_text(
        "".join(f"{p.name} {p.stat().st_size}\n" for p in files))
    for p in files:
        p.unlink()


def _upload_timing(folder: Path, transcripts: list[Transcript], cell: Cell) -> dict:
    """The cell's upload timing from the wire; a bytes-over-time plot when it uploaded much."""
    if not transcripts:
        return {}
    per_conn = [time_uploads(t, t.decode()) for t in transcripts]
    total = UploadTiming()
    for p in per_conn:
        total.merge(p)
    if total.set_tensor_bytes >= PLOT_BYTES:
        plot({f"connection {i}": p for i, p in enumerate(per_conn)}, folder / "load.png",
             title=f"{cell.id}: bytes sent by the client")
    return total.to_dict()


PLOT_BYTES = 1 << 20


def missing_builds(jobs: list[PlannedCell]) -> list[str]:
    """The pins the planned cells need that are not built here and that a build can give
    (a registry or patched pin, its RDMA variant for an rdma-soft cell; not a user build,
    and not one whose last build failed: that is the cells' build-error, not a retry)."""
    out: dict[str, None] = {}
    for job in jobs:
        for adapter in (job.client, job.server, job.other_server):
            if adapter is None or adapter.kind not in ("pin", "docker") or not adapter.pin:
                continue
            # a docker peer's image is made from its pin: the pin is what a build gives
            wanted = [Adapter(adapter.name, "pin", adapter.dialect, pin=adapter.pin)]
            if job.cell.transport == RDMA_SOFT:
                wanted.append(dc_replace(wanted[0], pin=rdma_pin(adapter.pin)))
            for a in wanted:
                if a.unavailable() and not a.build_failed() and a.buildable():
                    out[a.pin] = None
    return list(out)


def plan(matrix: Matrix, cells: list[Cell]) -> list[PlannedCell]:
    adapters = {name: adapter_for(name, impl) for name, impl in matrix.implementations.items()}
    knobs = {name: parse_knobs(impl.client_knobs) if impl.client_knobs else None
             for name, impl in matrix.implementations.items()}
    out = []
    for cell in cells:
        if cell.design == RELEASES:
            c, s = adapter_for_peer(cell.client), adapter_for_peer(cell.server)
            out.append(PlannedCell(cell, expectation_for(matrix, cell), c, s))
        else:
            roles = matrix.designs[cell.design].roles
            other = roles["new-server" if cell.server_role == "old-server" else "old-server"]
            out.append(PlannedCell(cell, expectation_for(matrix, cell), adapters[cell.client],
                                   adapters[cell.server], knobs[cell.client], adapters[other]))
    return out


def run_cells(matrix: Matrix, cells: list[Cell], run_dir: Path, *, run_id: str,
              workers: int | None = None, deliver: str | None = None,
              progress: Callable[[dict], None] | None = None,
              keep_payloads: bool = False) -> list[dict]:
    timeouts = Timeouts(matrix.defaults.deadline, matrix.defaults.idle_timeout, deliver,
                        keep_payloads)
    rows: list[dict] = []
    with ThreadPoolExecutor(max_workers=workers or matrix.defaults.workers) as pool:
        futs = {pool.submit(run_cell, job, run_dir, timeouts, run_id): job
                for job in plan(matrix, cells)}
        for fut in as_completed(futs):
            try:
                row = fut.result()
            except Exception:  # noqa: BLE001
                job = futs[fut]
                row = _row(job, Verdict(ERROR, traceback.format_exc()), None, 0.0, run_id)
            rows.append(row)
            if progress:
                progress(row)
    order = {c.id: i for i, c in enumerate(cells)}
    rows.sort(key=lambda r: order.get(r["cell_id"], 0))
    return rows


__all__ = ["run_cells", "run_cell", "plan", "PlannedCell", "CellContext", "Timeouts", "HANG"]
