"""``harness bisect GOOD BAD``: parse the question, run the search, print and write the table."""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console
from rich.table import Column, Table

from ..impls.catalogue import builds_between, release_pin
from ..impls.errors import ImplError
from ..impls.packages import version_key
from ..impls.progress import RichBuildProgress
from . import report
from .predicates import CellPredicate, DifferentialPredicate, Predicate, ReproPredicate, \
    RunPredicate, build_class
from .search import INFERRED, MEASURED, BisectError, Probe, bisect

FOUND, RANGE, CANNOT = 0, 1, 2  # exit codes: an exact answer, a range or oddity, no answer


def make_predicate(console: Console, *, cell: str | None, role: str, repro: Path | None,
                   differential: bool, sessions: int, seed: int, run: str | None,
                   run_classes: bool, matrix_file: Path, out: Path,
                   timeout: float) -> Predicate:
    asked = [x for x in (cell, repro, run) if x] + ([True] if differential else [])
    if len(asked) != 1:
        raise ValueError("ask one question: --cell SLUG, --repro FILE, --differential or "
                         "--run CMD")
    progress = RichBuildProgress(console)
    if cell:
        from ..matrix.cells import expand, find_cell, release_cells
        from ..matrix.model import load_matrix
        m = load_matrix(matrix_file)
        try:
            c = find_cell(expand(m) + release_cells(m), cell)
        except KeyError:
            raise ValueError(f"no cell {cell!r} in {matrix_file} (see `harness list "
                             "--releases`)") from None
        if role not in ("client", "server"):
            raise ValueError(f"--role {role!r}: client or server")
        return CellPredicate(progress=progress, matrix=m, cell=c, role=role, out=out)
    if repro:
        if not repro.exists():
            raise ValueError(f"{repro}: no such reproducer")
        return ReproPredicate(progress=progress, path=repro)
    if differential:
        return DifferentialPredicate(progress=progress, sessions=sessions, seed=seed, out=out,
                                     max_seconds=timeout)
    return RunPredicate(progress=progress, command=run, timeout=timeout, classes=run_classes)


def _print_probe(console: Console, p: Probe) -> None:
    result = p.result if p.result is not None else f"[yellow]{p.status}[/yellow]"
    extra = f"inferred from {p.inferred_from}" if p.status == INFERRED else \
        (f"{p.seconds:.1f} s" + (f", built in {p.build_seconds:.0f} s" if p.build_seconds else ""))
    console.print(f"  {p.build:<28} class {p.klass or '?':<10} {p.proto or '?':<6} "
                  f"{result}  ({extra})", highlight=False)
    if p.status not in (MEASURED, INFERRED) and p.detail:
        console.print(f"      {p.detail}", highlight=False, markup=False)


def bisect_command(console: Console, good: str, bad: str, *, predicate: Predicate,
                   recheck: bool, classes: bool, out: Path) -> int:
    t0 = time.monotonic()
    try:
        builds = builds_between(good, bad)
    except ImplError as e:
        console.print(f"[red]{e}", highlight=False)
        return CANNOT
    if version_key(release_pin(good).version) > version_key(release_pin(bad).version):
        builds.reverse()  # GOOD newer than BAD (when did it get fixed?): search from GOOD
    use_classes = classes and predicate.classes_apply
    console.print(f"bisect {len(builds)} builds of {builds[0].package}, {builds[0].version} .. "
                  f"{builds[-1].version}: {predicate.describe()}"
                  f"{'' if use_classes else '; equivalence classes not used'}", highlight=False)
    try:
        result = bisect([b.spec for b in builds], predicate,
                        klass=build_class, infer=use_classes, recheck=recheck,
                        log=lambda p: _print_probe(console, p))
    except BisectError as e:
        console.print(f"[red]cannot bisect: {e}", highlight=False)
        return CANNOT
    data = report.to_json(result, package=builds[0].package, question=predicate.describe(),
                          kind=predicate.kind, elapsed=time.monotonic() - t0)
    _, md_path = report.write(out, data, result.probes)
    from ..history.cli import file_history
    if not file_history(console, out):
        return CANNOT
    _print_table(console, result)
    console.print(f"first build whose result differs: [bold]{result.first_different}[/bold] "
                  f"({_result_of(result)}), after {result.last_same} ({result.good_result})",
                  highlight=False)
    for note in result.notes:
        console.print(f"note: {note}", highlight=False)
    console.print(f"{result.measured} builds measured of {len(builds)} spanned; "
                  f"{data['elapsed_s']} s; {md_path}", highlight=False)
    odd = bool(result.untested_between) or any("more than once" in n for n in result.notes)
    return RANGE if odd else FOUND


def _result_of(result) -> str:
    return next(p.result for p in result.probes if p.build == result.first_different)


def _print_table(console: Console, result) -> None:
    # the build stays whole at 80 columns; the others fold rather than end in "…"
    t = Table(Column("build", no_wrap=True), Column("class", overflow="fold"),
              Column("proto", no_wrap=True), Column("probe", overflow="fold"),
              Column("result", overflow="fold"), Column("seconds", no_wrap=True))
    for p in sorted(result.probes, key=lambda p: p.index):
        t.add_row(p.build, p.klass or "?", p.proto or "?", p.status, p.result or "-",
                  f"{p.seconds:.1f}")
    console.print(t)
