"""The one replay rule (harness.fuzz.signature.reproduces) on every path that decides whether a
finding came back: a reproducer with no saved signature reproduces nothing, and a death with
no log line is not the saved one that has a line (nor the other way round). TCP replay, RDMA
replay, client replay and the in-process engine's minimiser each say so."""

from __future__ import annotations

import inspect
import os
from pathlib import Path

import pytest

from harness.fuzz import campaign as tcp_campaign, client_targets, replay as tcp_replay, \
    signature as sig_mod
from harness.fuzz.client_targets import ClientOutcome, ClientReplayResult
from harness.fuzz.libfuzzer import running, triage as lf_triage
from harness.fuzz.rdma import campaign as rdma_campaign, replay as rdma_replay
from harness.fuzz.rdma.campaign import RdmaOutcome
from harness.fuzz.rdma.plans import RdmaCase
from harness.fuzz.rdma.replay import RdmaReplayResult
from harness.fuzz.replay import ReplayResult
from harness.fuzz.signature import Signature, reproduces

ASSERT = "ggml.c:1644: GGML_ASSERT(ctx->mem_buffer != NULL) failed"
LINED = Signature("crash", "SIGABRT", ASSERT, "GRAPH_COMPUTE")
UNLINED = Signature("crash", "SIGABRT", "", "GRAPH_COMPUTE")  # a death that printed nothing
SEGV = Signature("crash", "SIGSEGV", "", "GRAPH_COMPUTE")


def test_the_rule():
    assert reproduces(LINED, LINED) and reproduces(UNLINED, UNLINED)
    assert not reproduces(None, LINED) and not reproduces(None, UNLINED)  # nothing saved
    assert not reproduces(LINED, None)  # the target survived
    assert not reproduces(LINED, UNLINED) and not reproduces(UNLINED, LINED)
    assert not reproduces(UNLINED, SEGV)  # without lines the signal is all there is
    assert not reproduces(None, LINED, across_builds=True, command=False)


# ------------------------------------------------------------------ one result per path
def _tcp(expected, observed) -> bool:
    r = ReplayResult(expected, observed, "", "p7", 3)
    assert r.reproduced == r.reproduced_elsewhere or expected is not None
    return r.reproduced or r.reproduced_elsewhere


def _rdma(expected, observed) -> bool:
    case = RdmaCase(requests=(), writes=(), plan={"what": "planted"})
    return RdmaReplayResult(expected, RdmaOutcome({"verdict": "crash"}, signature=observed),
                            "p7+rdma", case).reproduced


def _client(expected, observed) -> bool:
    return ClientReplayResult(expected, ClientOutcome("finding", "graph_compute",
                                                      signature=observed)).reproduced


PATHS = {"tcp": _tcp, "rdma": _rdma, "client": _client}


@pytest.mark.parametrize("path", PATHS)
def test_no_saved_signature_reproduces_nothing(path):
    # (the RDMA and client replays counted any failure as reproduced)
    judge = PATHS[path]
    assert not judge(None, LINED) and not judge(None, UNLINED) and not judge(None, None)
    assert judge(LINED, LINED)  # and the rule can say yes


@pytest.mark.parametrize("path", PATHS)
def test_a_death_without_its_log_line_is_not_the_finding(path):
    judge = PATHS[path]
    assert not judge(LINED, UNLINED) and not judge(UNLINED, LINED)
    assert judge(UNLINED, UNLINED) and not judge(UNLINED, SEGV)


def test_every_path_uses_the_one_rule():
    # the live TCP campaign confirms, hunts and minimises a finding by the rule as well
    for module in (tcp_replay, tcp_campaign, rdma_replay, rdma_campaign, client_targets,
                   lf_triage):
        assert module.reproduces is sig_mod.reproduces, module.__name__
        assert ".same_bug(" not in inspect.getsource(module), module.__name__


# ------------------------------------------------------------------ the in-process minimiser
def _fake_minimiser(tmp_path: Path) -> Path:
    """A stand-in for the libFuzzer binary's -minimize_crash: writes the input less its last
    byte to -exact_artifact_path (the rerun of that input is given per test)."""
    script = tmp_path / "fake-fuzzer"
    script.write_text("#!/bin/sh\nfor a in \"$@\"; do case $a in -exact_artifact_path=*) "
                      "out=${a#-exact_artifact_path=};; -*) ;; *) src=$a;; esac; done\n"
                      "head -c $(($(wc -c < \"$src\") - 1)) \"$src\" > \"$out\"\n")
    script.chmod(0o755)
    return script


def _minimised(tmp_path, monkeypatch, saved: Signature, rerun_log: str | None) -> bool:
    monkeypatch.setattr(running, "rerun", lambda *a, **k: rerun_log)
    failure = lf_triage.Failure(saved, bytes(100), "", "planted")
    data, kept = lf_triage.minimise(_fake_minimiser(tmp_path), failure, "7.0.0", dict(os.environ),
                                 tmp_path / "work", seconds=30, deadline=1)
    assert kept == (len(data) == 99)
    return kept


def test_the_minimiser_keeps_a_smaller_input_only_with_the_same_line(tmp_path, monkeypatch):
    assert _minimised(tmp_path, monkeypatch, LINED, f"{ASSERT}\n")
    # the smaller input dies without a telling line: not the saved finding
    assert not _minimised(tmp_path, monkeypatch, LINED, "something went wrong\n")
    assert not _minimised(tmp_path, monkeypatch, LINED, None)  # ran to the end
    # the saved one had no line, the smaller one has one
    assert not _minimised(tmp_path, monkeypatch, UNLINED, f"{ASSERT}\n")
