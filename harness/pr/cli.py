"""``harness pr``: the typer layer (options, the job summary, annotations, the exit status)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from ..data import default_matrix

console = Console()
SUMMARY_ENV = "GITHUB_STEP_SUMMARY"


def pr_command(
    source_dir: Optional[Path] = typer.Option(None, "--source-dir", help="The pull request's "
                                              "llama.cpp tree: its RPC targets are built as a "
                                              "peer (`harness peers add --source-dir`); the "
                                              "annotations point into it."),
    peer: Optional[str] = typer.Option(None, "--peer", help="The tree's build, when it is a "
                                       "peer already (`harness peers list`): nothing is built."),
    name: str = typer.Option("pr", "--name", help="The peer name of the --source-dir build."),
    extra_target: list[str] = typer.Option([], "--extra-target", help="Also build this target "
                                           "(llama-simple: the model-load client)."),
    jobs: int = typer.Option(0, "--jobs", "-j", help="Build jobs (0: all cores)."),
    base_ref: Optional[str] = typer.Option(None, "--base-ref", help="A git ref of the tree whose "
                                           "ggml-rpc.h holds the base's version (HEAD^1 in a "
                                           "pull request's merge commit)."),
    base_proto: Optional[str] = typer.Option(None, "--base-proto", help="The base's version, "
                                             "X.Y.Z. Without either, a version the dialect "
                                             "table has a row for counts as not bumped."),
    against: list[str] = typer.Option([], "--against", help="A released build to run against "
                                      "(repeatable; default: the matrix's releases peers)."),
    scenario: list[str] = typer.Option([], "--scenario", help="Only these scenarios against "
                                       "the reference (default: the matrix's)."),
    duration: str = typer.Option("60s", "--duration", help="The differential against the "
                                 "reference (0: none)."),
    seed: int = typer.Option(0, "--seed", help="The differential's seed."),
    out: Path = typer.Option(Path("reports") / "pr", "--out", help="Report folder: the matrix "
                             "run, the differential, site/, pr.json and pr.md."),
    summary: Optional[Path] = typer.Option(None, "--summary", help="Append the Markdown summary "
                                           f"here (default: ${SUMMARY_ENV} when set)."),
    annotate: Optional[bool] = typer.Option(None, "--annotations/--no-annotations",
                                            help="Print GitHub workflow annotations (default: "
                                            "when GITHUB_ACTIONS is true)."),
    site: bool = typer.Option(True, "--site/--no-site", help="Build the results site in "
                              "OUT/site."),
    workers: Optional[int] = typer.Option(None, "--workers", help="Cells in parallel."),
    matrix_file: Path = typer.Option(default_matrix(), "--matrix", help="Scenarios, defaults "
                                     "and released builds from this matrix.",
                                     show_default="shipped with the harness"),
):
    """Hold a llama.cpp pull request's build to the version rule: it runs as "new" against the
    released builds and the reference of the version it announces, and in a short differential
    against that reference. Exit 0: compatible (or a bump the released builds handle as the
    version rule predicts); 1: it breaks compatibility without a version bump, or breaks the
    version rule; 2: it could not be tested."""
    from ..fuzz.display import parse_duration
    from ..impls.progress import RichBuildProgress
    from .check import PrConfig, run_pr
    from .summary import annotations, render

    try:
        seconds = parse_duration(duration)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--duration") from None
    # an action passes every input, empty ones as "": empty is unset, lists split on spaces
    cfg = PrConfig(out=out, peer=peer or None, source_dir=source_dir, name=name,
                   extra_targets=_words(extra_target), jobs=jobs or None,
                   against=_words(against), scenarios=_words(scenario),
                   base_proto=base_proto or None, base_ref=base_ref or None,
                   duration=seconds, seed=seed, matrix_file=matrix_file, workers=workers,
                   site=site)
    result = run_pr(cfg, console=console, progress=RichBuildProgress(console),
                    say=lambda line: console.print(line, highlight=False, soft_wrap=True))
    text = render(result)
    summary = summary or (Path(os.environ[SUMMARY_ENV]) if os.environ.get(SUMMARY_ENV) else None)
    if summary is not None:
        with summary.open("a") as f:
            f.write(text)
    if annotate if annotate is not None else os.environ.get("GITHUB_ACTIONS") == "true":
        workspace = os.environ.get("GITHUB_WORKSPACE")
        for line in annotations(result, Path(workspace) if workspace else None):
            print(line, flush=True)
    console.print(f"{result.headline}\nsummary: {out / 'pr.md'}", highlight=False,
                  soft_wrap=True, markup=False)
    raise typer.Exit(result.exit_code)


def _words(items: list[str]) -> tuple[str, ...]:
    """Repeated options and space- or comma-separated lists alike."""
    return tuple(w for item in items for w in item.replace(",", " ").split())
