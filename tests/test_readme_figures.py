"""Figures in README.md that a command can produce are produced by it: the cell counts from
`harness list --json --releases`, the designs and the releases pins from matrix.yaml."""

from __future__ import annotations

import collections
import json
import re
import subprocess
import sys
from pathlib import Path

import yaml
from harness.data import default_matrix, shipped

ROOT = Path(__file__).resolve().parents[1]
# the figures live in the docs pages that explain them (README.md is the short front door)
README = "\n".join((ROOT / "docs" / page).read_text()
                   for page in ("matrix.md", "releases.md", "fuzzing.md", "results.md"))
WORDS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
         "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14,
         "fifteen": 15, "sixteen": 16}


def _cells() -> list[dict]:
    out = subprocess.run([sys.executable, "-m", "harness", "list", "--json", "--releases"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300, check=True)
    return json.loads(out.stdout)


def _section(title: str) -> str:
    start = README.index(f"## {title}")
    end = README.find("\n## ", start + 1)
    return README[start:end if end > 0 else None]


def test_the_matrix_size_in_the_readme_is_what_harness_list_says():
    cells = _cells()
    by_transport = collections.Counter(c["transport"] for c in cells)
    releases = sum(c["design"] == "releases" for c in cells)
    m = re.search(r"The full matrix \(([\d,]+) cells: ([\d,]+) over TCP \(([\d,]+) of them the "
                  r"releases design\), ([\d,]+) over emulated RDMA, ([\d,]+) over rdma-soft\)",
                  " ".join(README.split()))
    assert m, "README: the sentence 'The full matrix (N cells: ...)' is missing"
    said = [int(x.replace(",", "")) for x in m.groups()]
    assert said == [len(cells), by_transport["tcp"], releases, by_transport["rdma-emu"],
                    by_transport["rdma-soft"]], said


def test_every_design_is_described_and_no_other():
    m = yaml.safe_load(default_matrix().read_text())
    text = _section("What the matrix says")
    named = set()
    for bold in re.findall(r"\*\*([a-z0-9/ -]+)\*\*", text):
        named |= {n.strip() for n in bold.split("/")}
    designs = set(m["designs"]) | {"releases"}
    scenarios = set(m["scenarios"])
    assert designs <= named, f"designs without a README entry: {designs - named}"
    assert named - designs <= scenarios | {"real c code in all four"}, \
        f"README names designs matrix.yaml does not have: {named - designs - scenarios}"


def test_the_releases_pins_in_the_readme_are_matrix_yamls():
    m = yaml.safe_load(default_matrix().read_text())
    peers = m["releases"]["peers"]
    count = re.search(r"The (\w+) pins are the matrix's fixed points", README)
    assert count and WORDS[count.group(1)] == len(peers)
    from harness.impls.pins import get_pin
    protos = ", ".join(get_pin(p).proto for p in peers)
    assert f"**releases**: every real build ({protos}) against every" in README


def test_the_sweep_sizes_in_the_readme_are_the_sweeps():
    from harness.fuzz.sweep import size
    m = re.search(r"is sent once: ([\d,]+) cases for 7\.0\.0, ([\d,]+) for 8\.0\.0",
                  " ".join(README.split()))
    assert m, "README: the sweep's size sentence is missing"
    assert [int(x.replace(",", "")) for x in m.groups()] == [size("7.0.0"), size("8.0.0")]


def test_the_saved_reproducers_are_counted_right():
    from harness.releases.watch import reproducer_dirs
    m = re.search(r"`harness/data/reproducers`: (\w+) of the project's own", " ".join(README.split()))
    assert m and WORDS.get(m.group(1)) == len(reproducer_dirs(shipped("reproducers")))


# ------------------------------------------------------------------ measured figures
# A figure a run measured (cells by verdict, size on disk, a campaign's messages) is marked in
# the docs with the history record it comes from, and the record is committed beside it
# (fixtures/figures/history.jsonl, filed by `harness history figures --add FOLDER`).
from harness.history import figures as fig, store  # noqa: E402
from harness.history.store import RunRecord  # noqa: E402

FIGURES_STORE = ROOT / "fixtures" / "figures" / "history.jsonl"


FRONT_DOOR = (ROOT / "README.md").read_text()


def test_every_marked_figure_is_what_its_record_says():
    found = fig.figures(README + FRONT_DOOR, store.read(FIGURES_STORE))
    assert any(f.kind == "campaign" for f in found)  # README's rates are marked
    stale = [f for f in found if f.stale]
    assert not stale, "figures that are not their records' (`harness history figures " \
        "docs/results.md --write` rewrites them):\n" + "\n".join(
            f"{f.kind}:{f.record_id}: README {f.said!r}, record {f.measured!r}" for f in stale)


def test_the_measured_run_figures_in_the_readme_are_marked():
    said = " ".join(README.split())
    for quoted in re.findall(r"[\d,]+ cells: [\d,]+ pass, [\d,]+ skip", said):
        assert re.search(r"<!-- figure run:\S+ -->" + re.escape(quoted), said), \
            f"README quotes {quoted!r} without the run record it was measured in"


# A campaign's rate as the README states it: bold, messages or executions per second.
_RATE = re.compile(r"\*\*([^*]*?[\d,]+ (?:messages|executions)/s[^*]*)\*\*")


def _unmarked_rates(text: str) -> list[str]:
    return [m for m in _RATE.findall(" ".join(text.split()))
            if not re.match(r"<!-- figure campaign:\S+ -->", m)]


def test_the_campaign_rates_in_the_readme_are_marked():
    assert _RATE.findall(" ".join(FRONT_DOOR.split())), "README states no campaign rate"
    assert not _unmarked_rates(FRONT_DOOR), "README quotes a rate without its campaign record"
    # planted: a rate typed into the prose
    assert _unmarked_rates("sent **6,510 messages/s** in ten minutes") == ["6,510 messages/s"]


def test_a_campaign_figure_reads_its_record_and_goes_stale_when_it_changes(tmp_path):
    """A real (reference) campaign filed as a record: the figure is its rate and counts."""
    from harness.fuzz.campaign import CampaignConfig, run_campaign
    from harness.history.ingest import campaign_record
    out, _ = run_campaign(CampaignConfig(target="ref", duration=3, seed=3, out=tmp_path / "c",
                                         sweep_share=0))
    rec = campaign_record(out, run_id="c-1")
    assert rec.rate and rec.messages and rec.cases and rec.replayed == 0
    text = fig.RENDERERS["campaign"](rec)
    assert text.startswith(f"{rec.rate:,.0f} messages/s ({rec.messages:,} messages, "
                           f"{rec.cases:,} connections") and text.endswith("0 findings")
    doc = f"ran <!-- figure campaign:c-1 -->{text}<!-- /figure -->."
    assert not fig.figures(doc, [rec])[0].stale
    # planted: the campaign run again, faster, with one finding that replays
    again = rec.model_copy(update={"rate": rec.rate * 2, "findings": {"crash": 1},
                                   "replayed": 1})
    [f] = fig.figures(doc, [again])
    assert f.stale and f.measured.endswith("1 finding (1 replay)")
    lf = again.model_copy(update={"engine": "libfuzzer", "restarts": None})
    assert "executions/s" in fig.RENDERERS["campaign"](lf)


def _record(**kw) -> RunRecord:
    return RunRecord(run_id="run-x", time=0.0, **{"cells": 628, "counts": {"pass": 544,
                     "skip": 84}, "size_bytes": int(36.8 * (1 << 20)), "files": 5991, **kw})


DOC = "A full run (<!-- figure run:run-x -->628 cells: 544 pass, 84\n skip; 36.8 MiB in " \
      "5,991 files<!-- /figure -->) on this machine."


def test_a_stale_figure_is_named_and_rewritten():
    assert [f.stale for f in fig.figures(DOC, [_record()])] == [False]
    # planted: the run measured again, with a failing cell; the prose kept the old figure
    again = _record(counts={"pass": 543, "skip": 84, "fail": 1})
    [f] = fig.figures(DOC, [again])
    assert f.stale and f.measured == "628 cells: 543 pass, 84 skip, 1 fail; 36.8 MiB in " \
        "5,991 files"
    assert fig.figures(fig.rewrite(DOC, [again]), [again])[0].stale is False
    # and a figure whose record is not in the store
    assert fig.figures(DOC, [])[0].stale


def test_the_command_files_a_run_without_its_path_and_checks(tmp_path):
    """`harness history figures --add FOLDER` on a real (reference-only) matrix run."""
    from harness.matrix.cells import expand
    from harness.matrix.execute import run_cells
    from harness.matrix.model import load_matrix
    from harness.report.writers import write_all
    from test_matrix import REF_MATRIX, write_matrix
    data = {**json.loads(json.dumps(REF_MATRIX)), "scenarios": ["handshake"],
            "cache_options": {"handshake": [False]}}
    m = load_matrix(write_matrix(tmp_path, data))
    run = tmp_path / "run-1"
    rows = run_cells(m, expand(m), run, run_id="run-1", workers=2)
    write_all(rows, run, "t")
    doc = tmp_path / "doc.md"
    doc.write_text("Measured: <!-- figure run:run-1 -->?<!-- /figure -->.\n")
    figures_store = tmp_path / "figures.jsonl"

    def harness(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "harness", "history", "figures", str(doc),
                               "--store", str(figures_store), *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
    # the record as the run filed it when it ended (what came into the folder later, a
    # screenshot, is no part of its size)
    from harness.history.ingest import records_from
    filed = records_from(run)[0].model_copy(update={"size_bytes": 3 << 20, "files": 7})
    store.append(tmp_path / store.HISTORY_NAME, [filed])
    stale = harness("--add", str(run))
    assert stale.returncode == 1 and "says '?'" in stale.stdout, stale.stdout + stale.stderr
    assert str(tmp_path) not in figures_store.read_text()  # no machine path is committed
    assert harness("--write").returncode == 0
    assert f"{len(rows)} cells: {len(rows)} pass, 0 skip; 3.0 MiB in 7 files" in doc.read_text()
    assert harness().returncode == 0
