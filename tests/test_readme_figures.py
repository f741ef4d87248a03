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
                   for page in ("matrix.md", "releases.md", "fuzzing.md"))
WORDS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
         "nine": 9, "ten": 10}


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
