"""``harness suite``: read a test run's profile (``pytest --suite-profile DIR``)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Column, Table

from .profile import SLOW_SECONDS, ProfileError, listed_but_quick, read_profile, \
    read_slow_list, unlisted_slow

console = Console()
suite_app = typer.Typer(no_args_is_help=True, add_completion=False,
                        help="The test suite's profile: where its time goes.")
DEFAULT_SLOW_LIST = Path("tests") / "slow-tests.toml"


def _fail(e: Exception) -> None:
    console.print(str(e), style="red", highlight=False, markup=False, soft_wrap=True)
    raise typer.Exit(2)


@suite_app.command("show")
def suite_show(profile: Path = typer.Argument(..., help="A profile file or its folder."),
               slowest: int = typer.Option(20, "--slowest", help="How many tests to list."),
               as_json: bool = typer.Option(False, "--json", help="The same as JSON.")):
    """Wall time, seconds by area and the slowest tests of one run."""
    try:
        p = read_profile(profile)
    except ProfileError as e:
        _fail(e)
    tests = p.test_seconds()
    if as_json:
        import json
        print(json.dumps({"run_id": p.run_id, "wall": p.wall, "tests": len(p.tests),
                          "test_seconds": tests, "workers": p.workers or 1, "host": p.host,
                          "areas": p.by_area(),
                          "slowest": [{"id": t.id, "seconds": t.total, "setup": t.setup,
                                       "call": t.call, "area": t.area}
                                      for t in p.slowest(slowest)]}, indent=1))
        return
    console.print(f"{p.run_id}: wall {p.wall:.0f} s, {len(p.tests)} tests, {tests:.0f} s of "
                  f"test time, {p.workers or 1} process(es), {p.host.get('cpu', '?')}, load "
                  f"{p.host.get('load_start')} -> {p.host.get('load_end')}", highlight=False,
                  soft_wrap=True)
    areas = Table("area", "seconds", "share")
    for area, seconds in sorted(p.by_area().items(), key=lambda kv: -kv[1]):
        areas.add_row(area, f"{seconds:.0f}", f"{100 * seconds / (tests or 1):.1f} %")
    console.print(areas)
    slow = Table("seconds", "setup", "call", Column("test", overflow="fold"), "area")
    for t in p.slowest(slowest):
        slow.add_row(f"{t.total:.1f}", f"{t.setup:.1f}", f"{t.call:.1f}", t.id, t.area)
    console.print(slow)
    fixtures = sorted(p.fixtures, key=lambda f: -f.seconds)[:10]
    if fixtures:
        table = Table("seconds", Column("fixture", overflow="fold"), "scope",
                      Column("set up for", overflow="fold"))
        for f in fixtures:
            table.add_row(f"{f.seconds:.1f}", f.id, f.scope, f.test)
        console.print(table)


@suite_app.command("check")
def suite_check(profile: Path = typer.Argument(..., help="A profile file or its folder."),
                slow_list: Path = typer.Option(DEFAULT_SLOW_LIST, "--slow-list",
                                               help="The reviewed list of slow tests."),
                threshold: float = typer.Option(SLOW_SECONDS, "--threshold",
                                                help="Seconds a test may take unlisted.")):
    """Exit 1 when a test of the run took more than the threshold and the reviewed list does
    not name it (with its reason); a listed test that was quick is a note, not a failure."""
    try:
        p = read_profile(profile)
        listed = read_slow_list(slow_list)
    except ProfileError as e:
        _fail(e)
    unlisted = unlisted_slow(p, listed, threshold)
    for i, seconds in listed_but_quick(p, listed, threshold):
        console.print(f"note: {i} is listed in {slow_list} but took {seconds} s this run",
                      highlight=False, soft_wrap=True)
    if not unlisted:
        console.print(f"{len(p.tests)} tests: none over {threshold:.0f} s outside {slow_list} "
                      f"({len(listed)} listed)", highlight=False, soft_wrap=True)
        return
    for s in unlisted:
        console.print(f"{s.seconds:8.1f} s  {s.id}", style="red", highlight=False,
                      markup=False, soft_wrap=True)
    console.print(f"{len(unlisted)} test(s) took more than {threshold:.0f} s of their own and "
                  f"are not in {slow_list}: make them faster, or list each with the reason it "
                  "needs the time", style="red", highlight=False, soft_wrap=True)
    raise typer.Exit(1)
