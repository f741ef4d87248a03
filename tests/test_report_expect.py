"""`harness report FOLDER --expect LIST`: a merge of shard folders is held to the cell list of
the same matrix and shards (`harness list --json --shards N`): every missing cell or shard,
and every cell not expected, fails it by name; a complete merge passes."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.matrix.cells import expand
from harness.matrix.execute import run_cells
from harness.matrix.model import load_matrix
from harness.shards import expected_cells, gaps

from test_matrix import REF_MATRIX, write_matrix

SHARDS = 2


def test_gaps_name_empty_shards_missing_cells_and_strangers():
    listing = [{"shard": "1/2", "cells": 2, "ids": ["a", "c"]},
               {"shard": "2/2", "cells": 2, "ids": ["b", "d"]}]
    expected = expected_cells(listing)
    assert not gaps(expected, "abcd")
    g = gaps(expected, ["a", "x"])
    assert g.shards == ["2/2"] and g.cells == ["c"] and g.unexpected == ["x"]
    assert g.lines() == ["shard 2/2: none of its cells arrived", "cell c: missing",
                         "cell x: not in the expected list"]
    # a plain cell list (no shards): each missing cell by name
    assert gaps(expected_cells([{"id": "a"}, {"id": "b"}]), ["a"]).cells == ["b"]
    with pytest.raises(ValueError):
        expected_cells({"id": "a"})


@pytest.fixture(scope="module")
def merged(tmp_path_factory):
    """A reference-only matrix run (handshake cells) and its expected list in two shards."""
    tmp = tmp_path_factory.mktemp("expect")
    data = {**json.loads(json.dumps(REF_MATRIX)), "scenarios": ["handshake"],
            "cache_options": {"handshake": [False]}}
    spec = write_matrix(tmp, data)
    m = load_matrix(spec)
    rows = run_cells(m, expand(m), tmp / "run", run_id="t", workers=2)
    assert rows and all(r["verdict"] == "pass" for r in rows), rows
    listed = CliRunner().invoke(app, ["list", "--matrix", str(spec), "--json", "--shards",
                                      str(SHARDS)])
    assert listed.exit_code == 0, listed.output
    (tmp / "expected.json").write_text(listed.output)
    return tmp, spec, {r["cell_id"]: r["folder"] for r in rows}


def _report(tmp, spec, folder, *extra):
    return CliRunner().invoke(app, ["report", str(folder), "--matrix", str(spec), "--expect",
                                    str(tmp / "expected.json"), *extra])


def _copy(tmp, name):
    dest = tmp / name
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(tmp / "run", dest)
    return dest


def test_a_complete_merge_passes(merged):
    tmp, spec, _ = merged
    done = _report(tmp, spec, _copy(tmp, "complete"))
    assert done.exit_code == 0, done.output


def test_a_shard_that_never_arrived_fails_the_report_by_name(merged):
    tmp, spec, folders = merged
    shard = json.loads((tmp / "expected.json").read_text())[1]
    partial = _copy(tmp, "no-shard-2")
    for cell in shard["ids"]:
        shutil.rmtree(partial / folders[cell])
    done = _report(tmp, spec, partial)
    assert done.exit_code == 3, done.output  # incomplete: distinct from a failed cell's 1
    assert f"shard {shard['shard']}: none of its cells arrived" in done.output
    # planted: without --expect the same folder is a smaller, passing report
    alone = CliRunner().invoke(app, ["report", str(partial), "--matrix", str(spec)])
    assert alone.exit_code == 0, alone.output


def test_a_missing_cell_and_a_stranger_fail_it_by_name(merged):
    tmp, spec, folders = merged
    first = json.loads((tmp / "expected.json").read_text())[0]
    partial = _copy(tmp, "one-missing")
    lost = first["ids"][0]
    shutil.rmtree(partial / folders[lost])
    done = _report(tmp, spec, partial)
    assert done.exit_code == 3 and f"cell {lost}: missing" in " ".join(done.output.split())
    # a cell of another matrix among the downloads
    stranger = partial / "extra" / "verdict.json"
    stranger.parent.mkdir()
    row = json.loads((partial / folders[first["ids"][1]] / "verdict.json").read_text())
    stranger.write_text(json.dumps({**row, "cell_id": "other:ref-7_ref-7:handshake"}))
    done = _report(tmp, spec, partial)
    assert "cell other:ref-7_ref-7:handshake: not in the expected list" in \
        " ".join(done.output.split())


def test_an_unreadable_expected_list_is_an_error(merged, tmp_path):
    tmp, spec, _ = merged
    bad = tmp_path / "bad.json"
    bad.write_text('{"not": "a list"}')
    done = CliRunner().invoke(app, ["report", str(tmp / "run"), "--expect", str(bad)])
    assert done.exit_code == 2 and "--expect" in done.output
