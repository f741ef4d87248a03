"""`harness pr` without real peers: the version rule's judgement over observed rows, the job
summary and the annotations it writes, the check's own matrix, the base version from git."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from harness.data import default_matrix
from harness.matrix.cells import RELEASES
from harness.matrix.model import load_matrix
from harness.pr.check import (BREAKS, COMPATIBLE, PR_DESIGN, UNTESTED, PrBuild, PrConfig,
                              PrResult, base_version, judge, pr_cells, pr_matrix)
from harness.pr.cli import _words
from harness.pr.summary import annotations, render
from needs import tool

HEADER = """#pragma once
#define RPC_PROTO_MAJOR_VERSION    {0}
#define RPC_PROTO_MINOR_VERSION    {1}
#define RPC_PROTO_PATCH_VERSION    {2}
"""


def _build(version="7.0.0", known=True, **kw) -> PrBuild:
    return PrBuild(name="pr", version=version, dialect=version, known=known, how="built in 9 s",
                   **kw)


def _row(design=PR_DESIGN, pair="old-client/new-server", verdict="pass", cache=False,
         observed="works", client="ref-7.0.0", server="pr", reason="works") -> dict:
    return {"cell_id": f"{design}:{client}_{server}{'+cache' if cache else ''}:handshake",
            "design": design, "pair": pair, "client": client, "server": server,
            "scenario": "handshake", "cache": cache, "verdict": verdict, "observed": observed,
            "expected_outcome": "works", "reason": reason, "client_dialect": "7.0.0",
            "server_dialect": "7.0.0"}


WIRE_CHANGE = _row(verdict="error", cache=True,
                   reason="misconfigured: server labelled 7.0.0 sent flags 0x01 in HELLO byte 3")
RELEASE_BREAK = _row(design=RELEASES, pair="client pr/server p7", verdict="fail", client="pr",
                     server="p7", observed="rejected-at-hello",
                     reason="expected works, observed rejected-at-hello")
DIVERGENCE = {"id": "d1", "title": "Crash vs close at SET_TENSOR", "detail": "a | b",
              "replay": "harness replay x --differential pr ref-7.0.0"}


def _result(rows=(), *, bumped=False, known=True, divergences=(), problems=(), base=None):
    return PrResult(build=_build(known=known), rows=list(rows), bumped=bumped,
                    base_version=base, base_from="--base-proto" if base else "the dialect table",
                    against=["p7"],
                    differential={"b": "ref-7.0.0", "cases": 10, "seconds": 5.0,
                                  "allow_list": "allow-7.0.0.yaml",
                                  "divergences": list(divergences)},
                    problems=list(problems))


# ------------------------------------------------------------------ the version rule

def test_everything_as_expected_is_compatible():
    code, headline = judge(_result([_row(), _row(cache=True)]))
    assert code == COMPATIBLE and headline.startswith("compatible")


def test_a_wire_change_without_a_bump_breaks_compatibility():
    code, headline = judge(_result([_row(), WIRE_CHANGE]))
    assert code == BREAKS and "without a version bump" in headline and "1 cell(s)" in headline


def test_a_divergence_without_a_bump_breaks_compatibility():
    code, headline = judge(_result([_row()], divergences=[DIVERGENCE]))
    assert code == BREAKS and "1 divergence(s) from ref-7.0.0" in headline


def test_after_a_bump_the_same_differences_are_reported_not_failed():
    code, headline = judge(_result([_row(), WIRE_CHANGE], bumped=True, known=False,
                                   divergences=[DIVERGENCE]))
    assert code == COMPATIBLE and headline.startswith("version bump to 7.0.0")
    assert "what the bump announces" in headline


def test_a_releases_cell_against_the_version_rule_fails_bump_or_not():
    for bumped in (False, True):
        code, headline = judge(_result([_row(), RELEASE_BREAK], bumped=bumped))
        assert code == BREAKS and headline.startswith("breaks the version rule")


def test_what_could_not_be_tested_is_neither_a_pass_nor_a_break():
    code, headline = judge(_result([_row()], problems=["differential: target never listened"]))
    assert code == UNTESTED and "target never listened" in headline
    # evidence of a break outranks what could not be tested
    assert judge(_result([WIRE_CHANGE], problems=["x"]))[0] == BREAKS


def test_planted_a_skip_is_no_evidence_of_compatibility():
    """A check whose cells were all skipped must not read as compatible."""
    skipped = _row(verdict="skip", observed=None, reason="[peer-missing] pr is not built")
    result = _result([skipped], problems=["cells skipped because something is missing: pr"])
    assert judge(result)[0] == UNTESTED


# ------------------------------------------------------------------ summary and annotations

def test_the_summary_has_the_headline_the_facts_the_unexpected_and_the_grids():
    result = _result([_row(), WIRE_CHANGE, _row(design=RELEASES, pair="client pr/server p7",
                                                client="pr", server="p7")],
                     divergences=[DIVERGENCE], base="7.0.0")
    result.exit_code, result.headline = judge(result)
    text = render(result)
    assert text.startswith("## ✘ ggml-rpc harness: pr\n")
    assert "**breaks compatibility without a version bump" in text
    assert "| announces | 7.0.0 |" in text and "| base | 7.0.0 (--base-proto) |" in text
    assert "### Unexpected verdicts" in text and "sent flags 0x01 in HELLO byte 3" in text
    assert "(reference client → pr's server, handshake, server cache on)" in text
    assert "### Differential divergences from ref-7.0.0" in text
    assert "a \\| b" in text  # a table separator in a message is escaped
    assert "| handshake | off | ✔ works |" in text and "| handshake | on | ⚠ error |" in text
    assert "| p7 (7.0.0) | ✔ works (works) |" in text


def test_a_compatible_summary_lists_no_unexpected_section():
    result = _result([_row()])
    result.exit_code, result.headline = judge(result)
    text = render(result)
    assert text.startswith("## ✔ ") and "Unexpected" not in text and "divergences" not in text


def test_annotations_point_at_the_version_line_and_escape_messages(tmp_path):
    tree = tmp_path / "work" / "llama.cpp"
    (tree / "ggml" / "include").mkdir(parents=True)
    (tree / "ggml" / "include" / "ggml-rpc.h").write_text(HEADER.format(7, 0, 0))
    result = _result([WIRE_CHANGE], divergences=[{**DIVERGENCE, "detail": "50%\nthen"}])
    result.build.source_dir = str(tree)
    result.exit_code, result.headline = judge(result)
    lines = annotations(result, tmp_path / "work")
    assert lines[0].startswith("::error file=llama.cpp/ggml/include/ggml-rpc.h,line=2,"
                               "title=ggml-rpc pr%3Aref-7.0.0_pr+cache%3Ahandshake::error: ")
    assert "50%25%0Athen" in lines[1]
    assert lines[-1].startswith("::error file=llama.cpp/ggml/include/ggml-rpc.h,line=2,"
                                "title=ggml-rpc harness::breaks compatibility")
    # outside the workspace there is no file to point at
    assert "file=" not in annotations(result, tmp_path / "elsewhere")[0]


def test_after_a_bump_the_differences_are_warnings_and_the_headline_a_notice():
    result = _result([WIRE_CHANGE], bumped=True, known=False)
    result.exit_code, result.headline = judge(result)
    lines = annotations(result)
    assert lines[0].startswith("::warning ") and lines[-1].startswith("::notice ")


# ------------------------------------------------------------------ the check's matrix

def test_the_check_runs_the_build_against_its_reference_and_the_released_builds():
    m = load_matrix(default_matrix())
    pm = pr_matrix(m, _build(), "pin", ["p6", "p7"], ["handshake", "compute"])
    cells = pr_cells(pm, "pr", ["p6", "p7"])
    design = [c for c in cells if c.design == PR_DESIGN]
    assert {c.pair for c in design} == {"old-client/new-server", "new-client/old-server",
                                        "new-client/new-server"}
    assert {c.transport for c in design} == {"tcp"}
    # handshake with the cache off and on (the matrix's cache options), compute once
    assert len(design) == 3 * 3
    releases = {(c.client, c.server) for c in cells if c.design == RELEASES}
    assert releases == {("pr", "p6"), ("p6", "pr"), ("pr", "p7"), ("p7", "pr"), ("pr", "pr")}
    assert pm.implementations["ref-7.0.0"].kind == "ref"


def test_list_inputs_arrive_as_one_string_or_repeated():
    assert _words(["p6 p7", "p8", ""]) == ("p6", "p7", "p8")
    assert _words(["handshake,compute"]) == ("handshake", "compute")
    assert _words([""]) == ()


# ------------------------------------------------------------------ the base's version

@pytest.fixture
def repo(tmp_path):
    git = tool(shutil.which("git"), "git (apt-get install git)")
    tree = tmp_path / "llama.cpp"
    (tree / "ggml" / "include").mkdir(parents=True)

    def commit(version, message):
        (tree / "ggml" / "include" / "ggml-rpc.h").write_text(HEADER.format(*version))
        for cmd in (["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm",
                                    message]):
            subprocess.run([git, "-C", str(tree), *cmd], check=True, capture_output=True,
                           timeout=30)
    subprocess.run([git, "init", "-q", str(tree)], check=True, capture_output=True, timeout=30)
    commit((7, 0, 0), "base")
    commit((7, 1, 0), "the pull request")
    return tree


def test_the_base_version_is_read_from_the_base_ref(repo, tmp_path):
    cfg = PrConfig(out=tmp_path / "out", source_dir=repo, base_ref="HEAD^1")
    assert base_version(cfg)[:2] == ("7.0.0", "ggml/include/ggml-rpc.h at HEAD^1")
    cfg.base_proto = "7.1.0"  # given outright, it wins
    assert base_version(cfg)[0] == "7.1.0"


def test_an_unreadable_base_ref_falls_back_to_the_table_with_a_note(repo, tmp_path):
    cfg = PrConfig(out=tmp_path / "out", source_dir=repo, base_ref="HEAD~5")
    version, source, notes = base_version(cfg)
    assert version is None and source == "" and "could not be read at HEAD~5" in notes[0]


# ------------------------------------------------------------------ a check that cannot start

def test_a_tree_that_cannot_be_built_is_reported_not_raised(tmp_path):
    """The action's summary and annotations still say why (exit 2), from the command line."""
    from typer.testing import CliRunner

    from harness.cli import app
    summary = tmp_path / "step-summary.md"
    done = CliRunner().invoke(app, ["pr", "--source-dir", str(tmp_path / "nothing"), "--out",
                                    str(tmp_path / "out"), "--summary", str(summary),
                                    "--annotations"])
    assert done.exit_code == UNTESTED
    text = summary.read_text()
    assert text.startswith("## ⚠ ggml-rpc harness: the pull request's build\n")
    assert "could not be tested" in text and "not a directory" in text
    assert "::error title=ggml-rpc%3A could not test::" in done.output
    assert (tmp_path / "out" / "pr.md").read_text() == text
    assert json.loads((tmp_path / "out" / "pr.json").read_text())["exit_code"] == UNTESTED
