"""``harness fuzz --transport rdma-soft``: bounded campaigns against the real RDMA builds.

The same short campaign against p7+rdma (7.0.0's whole-completion receive) must find the
SIGSEGV, minimised, with a reproducer that ``harness replay --transport rdma-soft`` replays
(exit 1); against p7f+rdma (seed 000's partial receive) it must find nothing. Planted faults:
the reproducer replayed against p7f, and the reproducer with its SEND plan put on 7.0.0's
read boundaries, must not reproduce (exit 0).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from harness.fuzz.rdma.campaign import RdmaCampaignConfig, run_rdma_campaign
from harness.fuzz.rdma.plans import RdmaCase, aligned

from softverbs_support import builds  # noqa: F401 (fixture: both RDMA builds exist)
from test_realclient_support import realpeer

pytestmark = [realpeer, pytest.mark.slow]


def campaign(target: str, out):
    # 40 s: on a quiet machine this seed finds a hang at 3 s (minimised in 7) and the SIGSEGV
    # at 11 s; on a loaded one (CI run 19) the hang came at 10 s and 20 s ended before the
    # SIGSEGV was reached
    cfg = RdmaCampaignConfig(target=target, duration=40, seed=16, out=out, deadline=2.0,
                             shrink_seconds=8, min_messages=20)
    return run_rdma_campaign(cfg)


def replay(path, target: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "replay", str(path), "--target",
                           target, "--transport", "rdma-soft"], capture_output=True, text=True,
                          timeout=180)


@pytest.fixture(scope="module")
def p7(builds, tmp_path_factory):
    return campaign("p7", tmp_path_factory.mktemp("rdma-campaign") / "p7")


@pytest.fixture(scope="module")
def sigsegv(p7):
    folder, report = p7
    deaths = [f for f in report["findings"]
              if f["class"] == "death" and f["signature"]["signal"] == "SIGSEGV"]
    assert deaths, json.dumps(report["findings"], indent=1)[:3000]
    return deaths[0]


def test_a_short_campaign_against_p7_finds_the_sigsegv_minimised(p7, sigsegv):
    folder, report = p7
    f = sigsegv
    assert f["replays"] and f["confirmed"], f
    assert f["steps"] <= f["original_steps"] and f["writes"] <= f["original_writes"], f
    # the emulation saw the overrun the real 7.0.0 server died of
    assert f["predicted"]["7.0.0 (whole-completion receive)"] != "intact", f
    assert report["rdma"]["findings_by_class"]["death"] >= 1
    assert report["cases"] > 0 and report["messages_per_s"] > 0 and not report["problems"]
    md = (folder / "report.md").read_text()
    assert "Findings by class: death" in md and f["id"] in md and "messages/s" in md
    assert (folder / "crashes" / f["id"] / "repro.json").is_file()


def test_the_reproducer_replays_from_the_cli(sigsegv):
    r = replay(sigsegv["replay"].split()[2], "p7")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "REPRODUCED" in r.stdout and "SIGSEGV" in r.stdout


def test_planted_the_patched_build_does_not_reproduce_it(sigsegv):
    r = replay(sigsegv["replay"].split()[2], "p7f")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "not reproduced" in r.stdout


def test_planted_the_sends_on_7_0_0_read_boundaries_do_not_reproduce_it(sigsegv, tmp_path):
    data = json.loads(open(sigsegv["replay"].split()[2]).read())
    data["case"] = aligned(RdmaCase.from_json(data["case"])).to_json()
    path = tmp_path / "repro.json"
    path.write_text(json.dumps(data))
    r = replay(path, "p7")
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_same_campaign_against_the_patched_build_finds_nothing(builds, tmp_path):
    folder, report = campaign("p7f", tmp_path / "p7f")
    # the errors too: a worker that stopped answering leaves only them (the CI of stop 27)
    assert report["findings"] == [] and report["nothing_found"], \
        json.dumps({"findings": report["findings"], "errors": report["errors"]}, indent=1)
    assert report["cases"] > 0 and not report["problems"] and report["restarts"] == 0
    assert report["coverage"]["mutations_exercised"] > 1
