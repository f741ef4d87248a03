"""glibc's fatal messages name a death: a heap the allocator finds corrupted, a smashed stack
canary (harness.fuzz.signature.GLIBC_FATAL); every real process gets LIBC_FATAL_STDERR_=1
(harness.impls.supervisor.REAL_PROCESS_ENV) so the message is on stderr even where the process
has a terminal."""

from __future__ import annotations

import pytest

from harness.fuzz.signature import death_line
from harness.fuzz.triage import SEVERITIES, severity
from harness.impls import supervisor

LINES = ["double free or corruption (!prev)", "malloc(): corrupted top size",
         "free(): invalid pointer", "corrupted size vs. prev_size",
         "free(): double free detected in tcache 2", "munmap_chunk(): invalid pointer",
         "*** stack smashing detected ***: terminated"]


@pytest.mark.parametrize("line", LINES)
def test_a_glibc_fatal_message_is_the_death_line(line):
    assert death_line(["Accepted client connection", line]) == line


def test_heap_corruption_ranks_as_a_write_out_of_bounds_a_double_free_as_use_after_free():
    assert SEVERITIES[severity("crash", "SIGABRT", "malloc(): corrupted top size")] == \
        "write out of bounds"
    assert SEVERITIES[severity("crash", "SIGABRT", "double free or corruption (!prev)")] == \
        "use after free / null dereference"
    assert SEVERITIES[severity("crash", "SIGABRT", "")] == "reachable assert"  # as before


def test_ordinary_lines_are_not_fatal_messages():
    assert death_line(["Accepted client connection", "recv returned 0 (peer closed?)"]) == ""


def test_every_real_process_writes_glibc_fatal_messages_to_stderr():
    assert supervisor.REAL_PROCESS_ENV["LIBC_FATAL_STDERR_"] == "1"


@pytest.mark.realpeer
@pytest.mark.parametrize("planted", [False, True])
def test_p8s_heap_corruption_is_named(planted, monkeypatch, tmp_path):
    """The shipped p8 COPY_TENSOR reproducer corrupts malloc's metadata: the death is named
    by glibc's message; a parser without glibc's messages (planted) left it anonymous."""
    from harness.data import shipped
    from harness.fuzz import signature
    from harness.fuzz.case_runner import CaseRunner
    from harness.fuzz.replay import load
    from harness.fuzz.target import Target
    from harness.fuzz.target_spec import TargetSpec
    from harness.impls.registry import get_peer
    if not get_peer("p8").available:
        from needs import skip
        skip("peer-missing", "p8 is not built (make peers)")
    if planted:
        monkeypatch.setattr(signature, "_DEATH_PATTERNS", [
            p for p in signature._DEATH_PATTERNS if p.pattern != signature.GLIBC_FATAL.pattern])
    case, _, _ = load(shipped("reproducers") / "p8-crash-copy_tensor-c0e20d76" / "repro.rpct")
    target = Target(TargetSpec.parse("p8", "8.0.0"), tmp_path / "t")
    target.start()
    try:
        verdict, _ = CaseRunner(target).check(case, lockstep=True)
    finally:
        target.stop()
    assert verdict is not None and verdict.signature.signal == "SIGABRT", verdict
    assert verdict.signature.line == ("" if planted else "double free or corruption (!prev)")
