"""The strictness switch: under CI a skip fails unless its code is on the reviewed list."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness import strictness
from needs import module

TESTS = Path(__file__).resolve().parent


@pytest.mark.parametrize("env, on", [({}, False), ({"CI": "true"}, True), ({"CI": "1"}, True),
                                     ({"CI": "false"}, False), ({strictness.STRICT_ENV: "1"}, True),
                                     ({strictness.STRICT_ENV: "0"}, False)])
def test_the_switch(env, on):
    assert strictness.strict(env) is on


def test_codes_round_trip_and_uncoded_reasons_are_named():
    assert strictness.parse(strictness.coded("tool-missing", "no tshark")) == ("tool-missing",
                                                                              "no tshark")
    assert strictness.parse("plain words") == (strictness.UNCODED, "plain words")


def test_only_what_cannot_exist_here_is_allowed():
    # the reviewed list: hardware, and cells that by design do not apply
    assert set(strictness.ALLOWED) == {"rdma-hca", "rdma-hca-present", "gpu", "not-applicable"}
    for code in (strictness.PEER_MISSING, strictness.TOOL_MISSING, strictness.NOT_ROOT,
                 strictness.PROGRAM_MISSING, strictness.UNCODED, strictness.BUILD_ERROR,
                 strictness.PYVERBS_MISSING):
        assert not strictness.allowed(code)


def test_refusal_names_the_code_and_the_list(monkeypatch):
    monkeypatch.setenv("CI", "true")
    text = strictness.refusal(strictness.coded("peer-missing", "p7 is not built"))
    assert "[peer-missing] p7 is not built" in text and "rdma-hca" in text
    assert strictness.refusal(strictness.coded("rdma-hca", "no HCA")) is None
    monkeypatch.setenv("CI", "false")
    monkeypatch.delenv("GGML_RPC_HARNESS_STRICT", raising=False)  # .ci/run sets it too
    assert strictness.refusal("anything") is None


SAMPLE = '''
import pytest
from harness.strictness import coded

def test_allowed():
    pytest.skip(coded("rdma-hca", "no HCA in this machine"))

def test_missing_peer():
    pytest.skip(coded("peer-missing", "p7 is not built"))

@pytest.mark.skipif(True, reason="no code at all")
def test_uncoded():
    pass

def test_passes():
    pass
'''


def _inner(tmp_path: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    """A pytest session with this suite's conftest (its hook) over SAMPLE."""
    shutil.copyfile(TESTS / "conftest.py", tmp_path / "conftest.py")
    shutil.copyfile(TESTS / "needs.py", tmp_path / "needs.py")
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    clean = {k: v for k, v in os.environ.items()
             if k not in ("CI", strictness.STRICT_ENV) and not k.startswith("PYTEST_")}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-rA", *args, str(tmp_path)], cwd=tmp_path, capture_output=True,
                          text=True, env={**clean, **env}, timeout=120)


def test_under_ci_a_skip_fails_unless_allowed_and_the_allowed_are_listed(tmp_path):
    done = _inner(tmp_path, {"CI": "true"})
    out = done.stdout
    assert done.returncode == 1, out
    assert "1 failed, 1 passed, 1 skipped, 1 error" in out
    assert "FAILED test_sample.py::test_missing_peer" in out
    assert "ERROR test_sample.py::test_uncoded" in out and "[uncoded] no code at all" in out
    assert "skips allowed in strict mode" in out and "[rdma-hca] 1 test(s)" in out


def test_under_xdist_the_workers_enforce_and_the_controller_lists_the_allowed(tmp_path):
    """`make test` runs the suite on xdist workers: they make the reports (and fail the
    refused skips), the controller prints the summary from the reports it receives. Planted:
    a hook that notes the allowed skips where reports are made (in the workers) leaves the
    controller's list empty, and the first assertion below fails with "none"."""
    module("xdist", "pip install -e '.[test]' (pytest-xdist)")
    done = _inner(tmp_path, {"CI": "true"}, "-n", "2")
    out = done.stdout
    assert "skips allowed in strict mode" in out and "[rdma-hca] 1 test(s)" in out, out
    assert done.returncode == 1 and "1 failed, 1 passed, 1 skipped, 1 error" in out, out
    assert "FAILED test_sample.py::test_missing_peer" in out


def test_outside_ci_skips_stay_skips(tmp_path):
    done = _inner(tmp_path, {})
    assert done.returncode == 0 and "1 passed, 3 skipped" in done.stdout, done.stdout
    assert "skips allowed in strict mode" not in done.stdout


def _uncoded_skips(path: Path) -> list[str]:
    """Calls of pytest.skip / importorskip / skipif in a test file that give no coded reason."""
    tree = ast.parse(path.read_text())
    bad = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = ast.unparse(node.func)
        if name in ("pytest.skip", "pytest.importorskip"):
            bad.append(f"{path.name}:{node.lineno}: {name}")
        elif name == "pytest.mark.skipif":
            reason = next((k.value for k in node.keywords if k.arg == "reason"), None)
            text = ast.unparse(reason) if reason is not None else ""
            if "coded(" not in text:
                bad.append(f"{path.name}:{node.lineno}: skipif without coded(...)")
    return bad


def test_every_skip_in_the_suite_has_a_code():
    found = []
    for path in sorted(TESTS.glob("*.py")):
        if path.name in ("needs.py", "conftest.py", Path(__file__).name):
            continue
        found += _uncoded_skips(path)
    assert not found, "skip through tests/needs.py (a code per reason):\n" + "\n".join(found)


XFAILS = '''
import pytest
from harness.strictness import coded

@pytest.mark.xfail(run=False, reason="not written yet")
def test_not_run():
    pass

@pytest.mark.xfail(reason="known bug")
def test_fails_as_expected():
    assert False

@pytest.mark.xfail(reason="known bug")
def test_passes_against_its_mark():
    pass

@pytest.mark.xfail(run=False, reason=coded("gpu", "needs a GPU"))
def test_allowed():
    pass
'''

# Planted: the rule before, which let every report with ``wasxfail`` through untouched.
OLD_XFAIL_RULE = '''
_checked = _non_pass
_non_pass = lambda report: None if hasattr(report, "wasxfail") else _checked(report)
'''


def _inner_xfails(tmp_path: Path, env: dict, planted: str = "") -> subprocess.CompletedProcess:
    """A pytest session (its own basetemp) with this suite's conftest over XFAILS."""
    (tmp_path / "conftest.py").write_text((TESTS / "conftest.py").read_text() + planted)
    shutil.copyfile(TESTS / "needs.py", tmp_path / "needs.py")
    (tmp_path / "test_xfails.py").write_text(XFAILS)
    clean = {k: v for k, v in os.environ.items() if k not in ("CI", strictness.STRICT_ENV)}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA",
                           "--basetemp", str(tmp_path / "basetemp"), str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, env={**clean, **env},
                          timeout=120)


def test_under_ci_an_xfail_or_xpass_fails_unless_its_code_is_allowed(tmp_path):
    done = _inner_xfails(tmp_path, {"CI": "true"})
    out = done.stdout
    assert done.returncode == 1, out
    # (one not run fails at its setup: an error)
    assert "2 failed, 1 xfailed, 1 error" in out, out
    assert "ERROR test_xfails.py::test_not_run" in out
    for name in ("test_fails_as_expected", "test_passes_against_its_mark"):
        assert f"FAILED test_xfails.py::{name}" in out, out
    assert "an xfail is a failure here" in out and "an xpass is a failure here" in out
    assert "[uncoded] not written yet" in out
    assert "skips allowed in strict mode" in out and "[gpu] 1 test(s)" in out


def test_outside_ci_xfails_stay_xfails(tmp_path):
    done = _inner_xfails(tmp_path, {})
    assert done.returncode == 0 and "3 xfailed, 1 xpassed" in done.stdout, done.stdout


def test_the_old_rule_lets_an_xfail_pass_strict_mode(tmp_path):
    """Planted: with xfails returned early (the rule before), CI=true exits 0 on them."""
    done = _inner_xfails(tmp_path, {"CI": "true"}, planted=OLD_XFAIL_RULE)
    assert done.returncode == 0 and "3 xfailed, 1 xpassed" in done.stdout, done.stdout


MEASURES = '''
def test_records(record_property):
    record_property("summary", "widgets: 7 generated, 7 caught")

def test_prints(capsys):
    with capsys.disabled():
        print("printed: 7 generated, 7 caught")
'''


def test_what_a_test_measured_reaches_the_end_of_an_xdist_run(tmp_path):
    """The allow-list mutation test's count was printed from an xdist worker, where output is
    dropped, so CI never showed it. A recorded summary travels with the report and the
    controller prints it. Planted: the old print, which is lost."""
    module("xdist", "pip install -e '.[test]' (pytest-xdist)")
    (tmp_path / "test_sample.py").write_text(MEASURES)
    shutil.copyfile(TESTS / "conftest.py", tmp_path / "conftest.py")
    shutil.copyfile(TESTS / "needs.py", tmp_path / "needs.py")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-n", "2", str(tmp_path)], cwd=tmp_path, capture_output=True,
                          text=True, env=clean, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "what tests measured" in done.stdout, done.stdout
    assert "widgets: 7 generated, 7 caught  [test_sample.py::test_records]" in done.stdout
    assert "printed: 7 generated" not in done.stdout  # the planted way: lost
