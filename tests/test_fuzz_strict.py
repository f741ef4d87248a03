"""A campaign that tested nothing is not a pass: ``harness fuzz`` exits non-zero when a
worker's target never listened or fewer than ``--min-messages`` messages were exchanged."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys


from harness.fuzz.report import campaign_problems
from harness.strictness import TOOL_MISSING
from needs import skip


def _fuzz(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "fuzz", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_a_target_that_never_listens_fails_the_campaign(tmp_path):
    true = shutil.which("true")
    if true is None:
        skip(TOOL_MISSING, "no `true` binary")
    proc = _fuzz("--target", true, "--duration", "3s", "--workers", "2",
                 "--out", str(tmp_path / "t"))
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "target never listened (worker 0, 1)" in proc.stdout
    report = json.loads((tmp_path / "t" / "report.json").read_text())
    assert report["workers_never_listened"] == [0, 1] and report["problems"]
    assert "did not test the target" in (tmp_path / "t" / "report.md").read_text()


def test_too_few_messages_fail_the_campaign(tmp_path):
    """The same short campaign against the reference server passes with the default minimum
    and fails when the minimum is more than it could send."""
    ok = _fuzz("--target", "ref", "--duration", "3s", "--seed", "5", "--out", str(tmp_path / "a"))
    assert ok.returncode == 0, ok.stdout[-2000:] + ok.stderr[-2000:]
    sent = json.loads((tmp_path / "a" / "report.json").read_text())["messages_sent"]
    assert sent >= 100
    short = _fuzz("--target", "ref", "--duration", "3s", "--seed", "5", "--out",
                  str(tmp_path / "b"), "--min-messages", str(10 ** 9))
    assert short.returncode == 2, short.stdout[-2000:] + short.stderr[-2000:]
    assert "fewer than the minimum 1,000,000,000" in short.stdout


def test_campaign_problems():
    ran = {"target_kind": "ref", "messages_sent": 500, "workers_never_listened": [],
           "errors": []}
    assert campaign_problems(ran, 100) == []
    assert campaign_problems({**ran, "messages_sent": 99}, 100)
    dead = {**ran, "workers_never_listened": [1], "errors": [{"worker": 1, "error": "boom"}]}
    assert campaign_problems(dead, 100) == ["target never listened (worker 1): boom"]
    assert campaign_problems({"target_kind": "client", "cases": 0}, 100) == \
        ["no client session ran"]
    assert campaign_problems({"target_kind": "client", "cases": 3}, 100) == []
