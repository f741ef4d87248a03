"""The new deterministic phases against a real server find what the single-field sweep cannot.

p8 copies nbytes(src) into a COPY_TENSOR destination with no elements wherever that
destination's data points, and answers success: two fields of one tensor at their edges
together (its shape and its data). The combinatorial phase's COPY_TENSOR cases find it through
the accepted-out-of-bounds oracle, with nothing but the live server to compare with; the
catalogue walk and the boundary sweep of the same command, one field at a time, do not.
"""

from __future__ import annotations

import pytest

from harness.fuzz import sweep as sw
from harness.fuzz.bounds import ACCEPTED_OOB
from harness.fuzz.case_runner import CaseRunner
from harness.fuzz.target import Target
from harness.fuzz.target_spec import TargetSpec
from harness.impls.registry import get_peer
from needs import skip


def _copy_cases(parts):
    for item in sw.sweep("8.0.0", only=parts):
        mutated = [s for s in item.case.steps if s.desc]
        if mutated and mutated[-1].desc["cmd"] == "COPY_TENSOR":
            yield item


def _accepted(tmp_path, parts) -> tuple[set[str], int]:
    """The accepted-out-of-bounds lines p8 gave to ``parts``' COPY_TENSOR cases, and how many
    cases ran."""
    target = Target(TargetSpec.parse("p8", "8.0.0"), tmp_path / "t", standby=True)
    target.start()
    lines, n = set(), 0
    try:
        runner = CaseRunner(target)
        for item in _copy_cases(parts):
            verdicts, _ = runner.run_fast(item.case)
            n += 1
            lines |= {v.signature.line for v in verdicts if v.signature.kind == ACCEPTED_OOB}
        lines |= {v.signature.line for v in runner.finish() if v.signature.kind == ACCEPTED_OOB}
    finally:
        target.stop()
    return lines, n


@pytest.mark.realpeer
@pytest.mark.slow
def test_the_combinatorial_phase_finds_p8s_copy_into_an_empty_destination(tmp_path):
    if not get_peer("p8").available:
        skip("peer-missing", "p8 is not built (make peers)")
    found, n = _accepted(tmp_path / "combo", {"combinatorial"})
    assert n > 5000, n  # every COPY_TENSOR row of its covering arrays
    assert "write out of bounds accepted: COPY_TENSOR dst room for src before its buffer's " \
           "base" in found, found
    single, m = _accepted(tmp_path / "single", {"catalogue", "boundary"})
    assert m > 100, m
    assert not any("COPY_TENSOR dst room" in line for line in single), single
