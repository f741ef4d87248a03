"""Campaigns several tests examine, run once per session (conftest's fixtures of the same
names); each test asserts its own facts about the one run (a module of helpers, not of
tests)."""

from __future__ import annotations

from pathlib import Path

# every oracle on, the cache too, the amplification floor as low as the planted-bug tests use
HONEST_REF_ORACLES = {"cache": True, "amplification_floor": 16 << 20}


def honest_reference(tmp: Path):
    """25 s against the honest reference server: test_fuzz_campaign holds it to surviving,
    test_fuzz_oracles to no oracle finding. (out, report)"""
    from harness.fuzz.campaign import CampaignConfig, run_campaign
    return run_campaign(CampaignConfig(target="ref", duration=25, seed=11, out=tmp / "ref",
                                       shrink_seconds=20, oracles=HONEST_REF_ORACLES))


def real_7(tmp: Path):
    """45 s against the real 7.0.0 server with every oracle on, the cache too:
    test_fuzz_campaign holds its crash findings to minimal reproducers that replay,
    test_fuzz_oracles its oracle findings to p7's one true positive. (out, report)"""
    from harness.fuzz.campaign import CampaignConfig, run_campaign
    from test_realclient_support import require_peer_dir
    require_peer_dir()
    return run_campaign(CampaignConfig(target="p7", duration=45, seed=3, out=tmp / "p7",
                                       shrink_seconds=15, oracles={"cache": True}))
