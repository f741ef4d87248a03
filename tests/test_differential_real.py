"""Each real server against the reference server of its dialect: a bounded differential
campaign (fixed seed, fixed number of sessions) finds no divergence outside the shipped
allow-list of that pair.

The campaigns CI runs for 90 s and the README's 10-minute runs are the same command with a
duration; this is the deterministic slice of them that the test suite can afford. A finding
fails the test with its reproducer listed (replay it with the command in the message).
"""

from __future__ import annotations

import pytest

from harness.data import shipped
from harness.fuzz.differential import DifferentialConfig, run_differential
from harness.fuzz.sweep import size as sweep_size

PAIRS = {"p7": ("ref-7.0.0", "allow-7.0.0.yaml"),
         "p8": ("ref-8.0.0", "allow-8.0.0.yaml"),
         "p7f": ("ref-7.0.0+flags", "allow-7.0.0+flags.yaml")}
# sessions per pair: the single-field parts of the deterministic sweep of the dialect
# (harness/fuzz/sweep.py: the catalogue walk and the boundary classes, 2,957 for 7.0.0, 3,732
# for 8.0.0) and this many of the random search after it; about a minute per pair on 2 idle
# cores. The covering arrays and stateful pairs against real servers: tests/test_phases_real.py
RANDOM_CASES = 1000
SEED = 12
PHASES = ("catalogue", "boundary")


def _findings_text(report: dict) -> str:
    return "\n\n".join(f"{f['title']}\n{f['detail']}\n{f['replay']}\n" + "\n".join(f["listing"])
                       for f in report["findings"])


@pytest.mark.realpeer
@pytest.mark.slow
@pytest.mark.parametrize("real", sorted(PAIRS))
def test_real_server_and_reference_show_no_unlisted_divergence(real, tmp_path):
    ref, allow = PAIRS[real]
    cases = sweep_size(ref.removeprefix("ref-"), only=PHASES) + RANDOM_CASES
    cfg = DifferentialConfig(a=real, b=ref, seed=SEED, max_cases=cases, duration=900,
                             shrink_seconds=10, allow=shipped("differential", allow),
                             out=tmp_path / "diff", phases=PHASES)
    _, report = run_differential(cfg)
    assert not report["errors"] and not report["problems"], report["errors"] or \
        report["problems"]
    assert report["sweep"]["complete"], report["sweep"]
    assert report["cases"] == cases, report["stats"]
    assert report["nothing_found"], _findings_text(report)
