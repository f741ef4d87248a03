"""Shared test configuration.

Hypothesis profiles: ``ci`` (the default) keeps the whole suite fast; ``thorough`` is for
nightly or pre-release runs. Pick one with ``HYPOTHESIS_PROFILE=thorough pytest ...``.
"""

from __future__ import annotations

import gc
import os

from hypothesis import HealthCheck, settings

from harness.impls.supervisor import exit_on_sigterm

# Deadlines are off in both profiles: example timing on shared CI machines is too noisy, and
# the framing properties deliberately feed inputs one byte at a time.
settings.register_profile("ci", max_examples=100, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", max_examples=2000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# A cancelled run (SIGTERM) unwinds the tests' finally blocks, which stop the real servers.
exit_on_sigterm()

# A worker's heap holds every dialect's prepared sweep, and each full collection walked it:
# the reference held to the oracle over a dialect's sweep spent 18 % of its CPU there. Only
# the test processes: a server under test keeps the default, whose RSS the oracles judge.
gc.set_threshold(20_000, 50, 100)


# ------------------------------------------------------------------ strictness
# Under CI (or GGML_RPC_HARNESS_STRICT=1) every outcome that is not a pass -- a skip, an xfail,
# an xpass -- is a failure unless its code is allowed in harness/strictness.py; the run ends
# by listing the ones it allowed and why.
import pytest  # noqa: E402

from harness import strictness  # noqa: E402

_ALLOWED_SKIPS: list[tuple[str, str]] = []
_XFAIL_PREFIXES = ("reason: ", "[NOTRUN] ")  # what pytest puts before an xfail's reason


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr or "")


def _xfail_reason(report) -> str:
    reason = str(report.wasxfail or "")
    for prefix in _XFAIL_PREFIXES:
        reason = reason.removeprefix(prefix)
    return reason


def _non_pass(report) -> tuple[str, str] | None:
    """(what, reason) of a report that is neither a pass nor a failure: a skip, an xfail (a
    test expected to fail, run or not) or an xpass (one that passed against that mark)."""
    if hasattr(report, "wasxfail"):
        return ("an xpass" if report.passed else "an xfail"), _xfail_reason(report)
    if report.skipped:
        return "a skip", _skip_reason(report)
    return None


def _enforce(report) -> None:
    found = _non_pass(report)
    if found is None:
        return
    what, reason = found
    refusal = strictness.refusal(reason, what=what)
    if refusal is not None:
        report.outcome = "failed"
        report.longrepr = refusal
        if hasattr(report, "wasxfail"):
            # pytest counts and shows a report that keeps this as xfailed / xpassed
            del report.wasxfail


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _enforce(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _enforce(outcome.get_result())


# The allowed skips are noted where reports are logged, not where they are made: under
# pytest-xdist the workers make them and only the controller, which prints the summary,
# logs them all.
def _note_allowed(report) -> None:
    found = _non_pass(report)
    if found is not None and not report.failed and strictness.strict():
        _ALLOWED_SKIPS.append((report.nodeid, found[1]))


# What a test measured and says of itself (the allow-list mutation count): recorded with
# ``record_property("summary", ...)``, which travels with the report from an xdist worker,
# where a print is lost, and printed at the end of the run.
_SUMMARIES: list[tuple[str, str]] = []


def pytest_runtest_logreport(report):
    _note_allowed(report)
    if report.when == "call":
        _SUMMARIES.extend((report.nodeid, str(v)) for k, v in report.user_properties
                          if k == "summary")


def pytest_collectreport(report):
    _note_allowed(report)


def pytest_terminal_summary(terminalreporter):
    if _SUMMARIES:
        terminalreporter.section("what tests measured")
        for nodeid, line in _SUMMARIES:
            terminalreporter.write_line(f"{line}  [{nodeid}]")
    if not strictness.strict():
        return
    terminalreporter.section("skips allowed in strict mode")
    if not _ALLOWED_SKIPS:
        terminalreporter.write_line("none")
        return
    by_code: dict[str, list[str]] = {}
    for nodeid, reason in _ALLOWED_SKIPS:
        by_code.setdefault(strictness.parse(reason)[0], []).append(nodeid)
    for code, nodeids in by_code.items():
        terminalreporter.write_line(f"[{code}] {len(nodeids)} test(s): {strictness.ALLOWED[code]}")
        for nodeid in nodeids:
            terminalreporter.write_line(f"    {nodeid}")


# ------------------------------------------------------------------ runs several modules read
# One run, many tests, each asserting its own facts (and one xdist worker for all of them: the
# suite's schedule keeps the users of a session fixture together).
@pytest.fixture(scope="session")
def reference_matrix_run(tmp_path_factory):
    """test_matrix.py's REF_MATRIX, every cell once: test_matrix reports it, test_chop holds
    chopped delivery to its verdicts. (run folder, rows)"""
    from harness.matrix.cells import expand
    from harness.matrix.execute import run_cells
    from harness.matrix.model import load_matrix
    from test_matrix import REF_MATRIX, write_matrix
    tmp = tmp_path_factory.mktemp("ref-matrix")
    m = load_matrix(write_matrix(tmp, REF_MATRIX))
    return tmp / "out", run_cells(m, expand(m), tmp / "out", run_id="t", workers=2)


@pytest.fixture(scope="session")
def emulated_reference_cells(tmp_path_factory):
    """matrix.yaml's reference designs over emulated RDMA (bump-ref, no-bump-ref), every
    cell once: test_rdma_soft_matrix holds the real transport's cells to them,
    test_rdma_matrix holds them to TCP's verdicts. (run folder, rows)"""
    from harness.data import default_matrix
    from harness.matrix.cells import expand
    from harness.matrix.execute import run_cells
    from harness.matrix.model import load_matrix
    m = load_matrix(default_matrix())
    out = tmp_path_factory.mktemp("emu-reference")
    cells = expand(m, designs=["bump-ref", "no-bump-ref"], transports=["rdma-emu"])
    return out, run_cells(m, cells, out, run_id="emu", workers=3)


# Campaigns several tests examine run once; each test asserts its own facts about it.
@pytest.fixture(scope="session")
def honest_reference_campaign(tmp_path_factory):
    from shared_campaigns import honest_reference
    return honest_reference(tmp_path_factory.mktemp("honest-ref"))


@pytest.fixture(scope="session")
def real_7_campaign(tmp_path_factory):
    from shared_campaigns import real_7
    return real_7(tmp_path_factory.mktemp("real-7"))
