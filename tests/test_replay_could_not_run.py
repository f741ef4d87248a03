"""A finding whose replay could not run is an error of the campaign, not a "no": the in-process
engine's replay against a live server that is missing or does not start, and the live
campaign's acceptance replay on a target that cannot start, both record why, the report names
it, and ``harness fuzz`` exits non-zero on it (campaign_problems)."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pytest

from harness.fuzz.campaign import CampaignConfig, Progress, _Worker
from harness.fuzz.case import annotate, step
from harness.fuzz.case_runner import Finding
from harness.fuzz.libfuzzer import findings, report as lf_report
from harness.fuzz.libfuzzer.config import ENGINE, LibFuzzerConfig
from harness.fuzz.libfuzzer.triage import Failure
from harness.fuzz.report import (build_report, campaign_problems, render_markdown,
                                 replay_problems)
from harness.fuzz.signature import Signature
from harness.strategies import hello_request_frame
from harness.fuzz.target_spec import TargetSpec
from harness.proto import get_dialect
from harness.strictness import TOOL_MISSING
from needs import skip

ROOT = Path(__file__).resolve().parents[1]
D7 = get_dialect("7.0.0")
OVERLAP = ("AddressSanitizer: memcpy-param-overlap in ggml_backend_cpu_buffer_cpy_tensor "
           "(ggml-backend.cpp) < rpc_server::copy_tensor (ggml-rpc.cpp) < rpc_serve_client "
           "(ggml-rpc.cpp)")


def _never_listens() -> str:
    """A live 'server' that exits at once: its replay cannot run."""
    true = shutil.which("true")
    if true is None:
        skip(TOOL_MISSING, "no `true` binary")
    return true


# ------------------------------------------------------------------ in process
def _lf_report(cfg: LibFuzzerConfig, findings: list[dict]) -> dict:
    progress = Progress()
    progress.workers[0] = {"stats": {"cases": 5000, "frames": 0}, "dialect": "7.0.0",
                           "statuses": {}, "coverage": {}}
    progress.findings = findings
    report = build_report(cfg, TargetSpec.parse(cfg.target), progress)
    report.update({"engine": ENGINE, "executions": 5000, "executions_per_s": 500.0,
                   "fuzz_seconds": 10.0, "edges": 100, "features": 200, "corpus_size": 30,
                   "edges_over_time": [], "seeds": 10, "imported": 0, "exported_cases": 30,
                   "artifacts_not_rerun": 0, "findings_by_class": {}, "rss_baseline_mb": 40,
                   "binary": "rpc_server_fuzzer", "server_coverage": None,
                   "execution_profile": None})
    report["problems"] = campaign_problems(report)
    return report


def test_an_in_process_finding_whose_live_server_will_not_start(tmp_path):
    cfg = LibFuzzerConfig(target="p7", sanitizer_target=_never_listens(), out=tmp_path)
    data = (ROOT / "fixtures" / "libfuzzer" / "copy-tensor-overlap.bin").read_bytes()
    failure = Failure(Signature("crash", "exit 1", OVERLAP, "COPY_TENSOR"), data,
                             "planted", "planted")
    finding = findings.save_finding(cfg, failure, tmp_path, "7.0.0", Counter({failure.signature: 1}))
    assert finding["replays"] is None and "exited before listening" in finding["replay_error"]
    report = _lf_report(cfg, [finding])
    assert report["problems"] == replay_problems(report) and len(report["problems"]) == 1
    assert finding["id"] in report["problems"][0]
    md = lf_report.render_libfuzzer_markdown(report, tmp_path)
    assert "**could not run**" in md and "Findings whose replay could not run" in md
    assert "did not test the target" not in md


def test_an_in_process_finding_whose_sanitizer_build_is_missing(tmp_path):
    cfg = LibFuzzerConfig(target="p7", out=tmp_path)
    folder = tmp_path / "f"
    folder.mkdir()
    got = findings.replayed(cfg, folder, "7.0.0", "p9+asan+ubsan", "p9+asan+ubsan is not built")
    assert got["replays"] is None and got["replay_error"] == "p9+asan+ubsan is not built"
    # planted: the record as it was (replays None, no error named) fails nothing
    old = {k: v for k, v in got.items() if k != "replay_error"}
    ran = {"engine": ENGINE, "executions": 5000}
    assert campaign_problems({**ran, "findings": [{"id": "x", **old}]}) == []
    assert campaign_problems({**ran, "findings": [{"id": "x", **got}]}) != []


# ------------------------------------------------------------------ the live campaign
def test_a_live_finding_whose_replay_cannot_start_fails_the_campaign(tmp_path):
    events: list[dict] = []
    worker = _Worker(CampaignConfig(target=_never_listens(), dialect="7.0.0", duration=5), 0, 1,
                     tmp_path, events.append)
    case = annotate(D7, (step(hello_request_frame(D7), "HELLO"),))
    sig = Signature("crash", "SIGABRT", "ggml-rpc.cpp:1: GGML_ASSERT(x) failed", "HELLO")
    worker._save(Finding(sig, case), case, None, minimised=True, confirmed=True)
    finding = next(e["finding"] for e in events if e["type"] == "finding")
    assert finding["replays"] is None and "exited before listening" in finding["replay_error"]
    problems = replay_problems({"findings": [finding]})
    assert len(problems) == 1 and finding["id"] in problems[0]
    progress = Progress()
    progress.workers[0] = {"stats": {"cases": 500, "frames": 5000}, "dialect": "7.0.0",
                           "statuses": {}, "coverage": {}, "target_starts": 1}
    progress.findings = [finding]
    report = build_report(worker.cfg, worker.spec, progress)
    assert problems[0] in report["problems"]
    md = render_markdown(report, tmp_path)
    assert "| **could not run** |" in md and "Findings whose replay could not run" in md


@pytest.mark.parametrize("replays, cell", [(True, "yes"), (False, "**no**"), (None, "?")])
def test_the_replay_column_still_says_yes_and_no(replays, cell):
    from harness.fuzz.report import replay_cell
    assert replay_cell({"replays": replays}) == cell
    assert not replay_problems({"findings": [{"id": "x", "replays": replays}]})
