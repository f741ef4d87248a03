"""The pull-request check: build, run, judge by the version rule (``harness pr``)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..data import default_matrix
from ..errors import HarnessError

COMPATIBLE, BREAKS, UNTESTED = 0, 1, 2
PR_DESIGN = "pr"
HEADER = "ggml/include/ggml-rpc.h"
GIT_TIMEOUT = 30.0
SHRINK_SECONDS = 30.0  # a divergence's minimisation, within the differential's own budget


@dataclass
class PrConfig:
    out: Path
    source_dir: Path | None = None  # the PR's llama.cpp tree: built here, unless ...
    peer: str | None = None  # ... its build is a peer already (`harness peers list`)
    name: str = "pr"  # the peer name of a --source-dir build
    extra_targets: tuple[str, ...] = ()
    jobs: int | None = None
    against: tuple[str, ...] = ()  # released builds (default: the matrix's releases peers)
    scenarios: tuple[str, ...] = ()  # default: the matrix's scenarios
    base_proto: str | None = None  # the version the PR's base announces ...
    base_ref: str | None = None  # ... or a git ref of the tree whose ggml-rpc.h tells it
    duration: float = 60.0  # differential seconds (0: none)
    seed: int = 0
    matrix_file: Path = field(default_factory=default_matrix)
    workers: int | None = None
    site: bool = True


@dataclass
class PrBuild:
    name: str
    version: str  # what its banner and HELLO announce
    dialect: str | None  # the reference it is held to: the dialect of that version
    known: bool  # the dialect table has a row for the version (not derived from its major)
    how: str  # "built already", "cached", "built in 95 s"
    source_dir: str | None = None
    commit: str | None = None


@dataclass
class PrResult:
    build: PrBuild | None
    base_version: str | None = None
    base_from: str = ""
    bumped: bool = False
    against: list[str] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)
    run_dir: str | None = None
    differential: dict | None = None  # cases, seconds, allow-list, divergences
    diff_dir: str | None = None
    site_dir: str | None = None
    problems: list[str] = field(default_factory=list)  # why something could not be tested
    notes: list[str] = field(default_factory=list)
    exit_code: int = UNTESTED
    headline: str = ""

    @property
    def unexpected(self) -> list[dict]:
        return [r for r in self.rows if r["verdict"] not in ("pass", "skip")]

    @property
    def divergences(self) -> list[dict]:
        return (self.differential or {}).get("divergences", [])

    def to_json(self) -> dict:
        out = asdict(self)
        out["rows"] = [{k: r.get(k) for k in ("cell_id", "design", "pair", "client", "server",
                                              "scenario", "cache", "expected", "observed",
                                              "verdict", "reason", "folder")}
                       for r in self.rows]
        return {"format": "ggml-rpc-pr/1", **out}


class PrError(HarnessError):
    """The root of harness.pr's errors: the check cannot start (no such peer, a tree that does
    not build)."""


def judge(result: PrResult) -> tuple[int, str]:
    """The version rule over what was observed: (exit status, one-line headline).

    A releases cell that does not do what the version rule predicts breaks it, bump or not.
    Without a bump the build must also behave as the reference of the version it announces
    (every cell works, the differential finds nothing outside the allow-list); after a bump
    those differences are what the bump announces, reported but not failed.
    """
    b = result.build
    release_bad = [r for r in result.unexpected if r["design"] != PR_DESIGN]
    design_bad = [r for r in result.unexpected if r["design"] == PR_DESIGN]
    wire = f"{len(design_bad)} cell(s) against ref-{b.dialect} not as expected" if design_bad \
        else ""
    diverged = f"{len(result.divergences)} divergence(s) from ref-{b.dialect}" \
        if result.divergences else ""
    evidence = "; ".join(filter(None, (wire, diverged)))
    if release_bad:
        return BREAKS, (f"breaks the version rule: {len(release_bad)} releases cell(s) are not "
                        f"what the version rule predicts for {b.version}")
    if evidence and not result.bumped:
        return BREAKS, (f"breaks compatibility without a version bump: it announces "
                        f"{b.version}{_base(result)}, but {evidence}")
    if result.problems:
        return UNTESTED, f"could not be tested: {result.problems[0]}"
    if result.bumped:
        return COMPATIBLE, (f"version bump to {b.version}{_base(result)}: the released builds "
                            "accept or refuse it as the version rule predicts"
                            + (f" ({evidence}: what the bump announces)" if evidence else ""))
    return COMPATIBLE, (f"compatible: it announces {b.version}{_base(result)} and behaves as "
                        f"ref-{b.dialect} and the released builds expect")


def _base(result: PrResult) -> str:
    if result.base_version is None:
        return ""
    return f" (its base {result.base_version}: {'a bump' if result.bumped else 'no bump'})"


def base_version(cfg: PrConfig) -> tuple[str | None, str, list[str]]:
    """(the base's version or None, where it came from, notes)."""
    from ..impls.source import proto_from_header
    from ..impls.tools import find_tool
    if cfg.base_proto:
        return cfg.base_proto, "--base-proto", []
    if cfg.base_ref and cfg.source_dir is not None:
        try:
            done = subprocess.run([find_tool("git") or "git", "-C", str(cfg.source_dir), "show",
                                   f"{cfg.base_ref}:{HEADER}"], capture_output=True, text=True,
                                  timeout=GIT_TIMEOUT, stdin=subprocess.DEVNULL)
        except (subprocess.SubprocessError, OSError) as e:
            done, why = None, str(e)
        else:
            why = (done.stderr.strip().splitlines() or ["no output"])[-1]
        found = proto_from_header(done.stdout) if done is not None and done.returncode == 0 \
            else None
        if found:
            return found, f"{HEADER} at {cfg.base_ref}", []
        return None, "", [f"the base's version could not be read at {cfg.base_ref} ({why}); "
                          "judged by the dialect table instead"]
    return None, "", []


def run_pr(cfg: PrConfig, *, console=None, progress=None,
           say: Callable[[str], None] = print) -> PrResult:
    """The whole check. It raises for nothing it finds, nor when it cannot start (a tree that
    does not build, a peer that is missing): the result says which, with its exit status."""
    result = PrResult(build=None)
    cfg.out.mkdir(parents=True, exist_ok=True)
    try:
        result.build = _the_build(cfg, progress)
    except PrError as e:
        result.problems.append(str(e))
        result.exit_code, result.headline = UNTESTED, f"could not be tested: {e}"
        _write(cfg.out, result)
        return result
    build = result.build
    result.base_version, result.base_from, notes = base_version(cfg)
    result.notes += notes
    result.bumped = (build.version != result.base_version) if result.base_version \
        else not build.known
    if result.base_version is None:
        result.base_from = "the dialect table"
    say(f"{build.name}: announces {build.version}, held to ref-{build.dialect} "
        f"({'a bump' if result.bumped else 'no bump'}, from {result.base_from})")
    _run_cells(cfg, result, console, progress, say)
    if cfg.duration > 0:
        _run_differential(cfg, result, say)
    if cfg.site and result.run_dir:
        _build_site(cfg, result)
    result.exit_code, result.headline = judge(result)
    _write(cfg.out, result)
    return result


def _the_build(cfg: PrConfig, progress) -> PrBuild:
    from ..impls.build import build_source
    from ..impls.errors import ImplError
    from ..impls.registry import get_peer
    from ..proto.dialects import DIALECTS, dialect_for_version

    if cfg.peer is None and cfg.source_dir is None:
        raise PrError("give the PR's tree (--source-dir), its build (--peer), or both")
    source = str(cfg.source_dir) if cfg.source_dir is not None else None
    commit = None
    if cfg.peer is None:
        try:
            out = build_source(cfg.source_dir, name=cfg.name, extra_targets=cfg.extra_targets,
                               progress=progress, jobs=cfg.jobs)
        except ImplError as e:
            raise PrError(f"{cfg.source_dir} does not build as a peer: {e}") from None
        name, commit = out.pin.name, out.manifest.get("commit")
        how = "cached" if out.cached else f"built in {out.seconds:.0f} s"
    else:
        name, how = cfg.peer, "built already"
    try:
        peer = get_peer(name)
    except ImplError as e:
        raise PrError(str(e)) from None
    if not peer.available:
        raise PrError(f"{name} is not built: {peer.reason}")
    version = peer.verified_proto or peer.proto
    triple = tuple(int(x) for x in version.split("."))
    # the dialect of the version it announces, never a pin's own label (p7f says 7.0.0+flags:
    # a pull request's build is held to what it announces)
    dialect = dialect_for_version(triple, server_flags_seen=False)
    if dialect is None:
        raise PrError(f"{name} announces {version}: the harness has no dialect of major "
                      f"{triple[0]} to hold it to (a row in harness/proto/dialects.py)")
    return PrBuild(name=name, version=version, dialect=dialect.name,
                   known=DIALECTS.get(dialect.name) is dialect, how=how, source_dir=source,
                   commit=commit or peer.manifest.get("commit"))


def pr_matrix(m, build: PrBuild, kind: str, against: list[str], scenarios: list[str]):
    """The check's own matrix: one design with the reference of the build's dialect as old
    and the build as new (TCP, every scenario, everything expected to work), and the
    releases design with ``against``."""
    from ..matrix.model import Design, Expectation, Implementation, Matrix, Releases
    ref = f"ref-{build.dialect}"
    return Matrix(
        defaults=m.defaults, scenarios=scenarios, transports=["tcp"],
        cache_options={k: v for k, v in m.cache_options.items() if k in scenarios},
        implementations={
            build.name: Implementation(kind=kind, pin=build.name, proto=build.dialect,
                                       description="the pull request's build"),
            ref: Implementation(kind="ref", proto=build.dialect,
                                description=f"the reference peer of {build.dialect}")},
        designs={PR_DESIGN: Design(
            description=f"{build.name} as new against the reference {build.dialect} as old",
            roles={"old-client": ref, "old-server": ref, "new-client": build.name,
                   "new-server": build.name})},
        expectations=[Expectation(outcome="works", because=(
            f"same version: a build announcing {build.version} interoperates with the "
            f"reference of {build.dialect} in every role"))],
        releases=Releases(peers=against, scenario=m.releases.scenario if m.releases
                          else "handshake"),
        allowed_skips=m.allowed_skips)


def pr_cells(pm, build: str, against: list[str]) -> list:
    """The cells that involve the build: three pairs of the four against the reference (ref
    against ref says nothing of it), and each released build against it both ways."""
    from ..matrix.cells import expand, release_cells
    cells = [c for c in expand(pm) if build in (c.client, c.server)]
    return cells + [c for c in release_cells(pm, list(dict.fromkeys([*against, build])))
                    if build in (c.client, c.server)]


def _run_cells(cfg: PrConfig, result: PrResult, console, progress, say) -> None:
    from ..impls.build import build_pin
    from ..impls.errors import ImplError
    from ..impls.registry import get_peer
    from ..matrix.job import new_run_id, run_job
    from ..matrix.model import MatrixError, load_matrix
    from ..matrix.skips import AllowSkip, describe_refused, refused_skips

    build = result.build
    try:
        m = load_matrix(cfg.matrix_file)
    except (MatrixError, OSError) as e:
        result.problems.append(f"matrix: {e}")
        return
    against = list(cfg.against or (m.releases.peers if m.releases else []))
    for name in against:  # the released builds: cached after the first run
        try:
            build_pin(name, progress=progress)
        except ImplError as e:
            result.problems.append(f"released build {name} does not build here: {e}")
    result.against = against
    kind = "user" if get_peer(build.name).kind == "user" else "pin"
    try:
        pm = pr_matrix(m, build, kind, against, list(cfg.scenarios or m.scenarios))
    except ValueError as e:  # pydantic: an unknown scenario or build name
        result.problems.append(f"matrix: {e}")
        return
    cells = pr_cells(pm, build.name, against)
    allow = AllowSkip.parse([a.match for a in pm.allowed_skips])
    rows, run_dir, _ = run_job(pm, cells, cfg.out, title=f"pull request build {build.name} "
                               f"({build.version})", run_id=new_run_id("pr"), workers=cfg.workers,
                               console=console, allow_skip=allow)
    result.rows, result.run_dir = rows, str(run_dir)
    refused = refused_skips(rows, allow)
    if refused:
        result.problems += [f"cells skipped because something is missing: {line}"
                            for line in describe_refused(refused)]
    say(f"{len(rows)} cells, {len(result.unexpected)} not as expected ({run_dir})")


def _run_differential(cfg: PrConfig, result: PrResult, say) -> None:
    from ..fuzz.allow_list import shipped_allow_list
    from ..fuzz.differential import DifferentialConfig, run_differential

    build = result.build
    allow = shipped_allow_list(build.dialect)
    # beside the run folder it belongs to, named after it
    out = cfg.out / (f"{Path(result.run_dir).name}-differential" if result.run_dir
                     else "differential")
    dcfg = DifferentialConfig(a=build.name, b=f"ref-{build.dialect}", dialect=build.dialect,
                              duration=cfg.duration, seed=cfg.seed, out=out, allow=allow,
                              shrink_seconds=min(SHRINK_SECONDS, cfg.duration))
    try:
        folder, report = run_differential(dcfg)
    except (ValueError, OSError) as e:  # a target that cannot start, a bad allow-list
        result.problems.append(f"differential: {e}")
        return
    result.diff_dir = str(folder)
    # the replay command as run from the report folder (what the artifact unpacks to)
    here = f"{cfg.out}/"
    result.differential = {
        "a": build.name, "b": f"ref-{build.dialect}", "cases": report["cases"],
        "seconds": report["elapsed_s"], "allow_list": allow.name if allow else None,
        "divergences": [{"id": f.get("id"), "title": f.get("title"), "detail": f.get("detail"),
                         "replay": str(f.get("replay", "")).replace(here, "")}
                        for f in report["findings"]]}
    for problem in [*(e.get("error", str(e)) for e in report["errors"]), *report["problems"]]:
        result.problems.append(f"differential: {problem}")
    say(f"differential against ref-{build.dialect}: {report['cases']} sessions, "
        f"{len(report['findings'])} divergence(s) outside the allow-list ({folder})")


def _build_site(cfg: PrConfig, result: PrResult) -> None:
    from ..site.build import build_site

    folders = [Path(p) for p in (result.run_dir, result.diff_dir) if p]
    try:
        _, broken = build_site(folders, cfg.out / "site")
    except Exception as e:  # noqa: BLE001 - the site is an artifact; its failure is reported
        result.problems.append(f"results site: {e}")
        return
    result.site_dir = str(cfg.out / "site")
    if broken:
        result.notes.append(f"results site: {len(broken)} broken internal link(s), e.g. "
                            f"{broken[0]}")


def _write(out: Path, result: PrResult) -> None:
    from .summary import render
    (out / "pr.json").write_text(json.dumps(result.to_json(), indent=1, default=str) + "\n")
    (out / "pr.md").write_text(render(result))
