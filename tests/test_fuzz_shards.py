"""A CI matrix of jobs is one campaign: ``--shard I/N`` gives each job its own seeds and corpus
share, and ``harness fuzz-merge`` makes one corpus, one reproducer per signature and one
report of their folders."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from harness.fuzz.campaign import CampaignConfig
from harness.shards import parse_shard, take_shard
from harness.fuzz.merge import MergeError, merge_campaigns


def test_parse_shard():
    assert parse_shard("2/5") == (2, 5)
    for bad in ("0/3", "4/3", "1", "a/b", "1/0"):
        with pytest.raises(ValueError):
            parse_shard(bad)


def test_shards_partition_the_workers():
    a = CampaignConfig(target="ref", workers=2, shard=(1, 3))
    b = CampaignConfig(target="ref", workers=2, shard=(3, 3))
    assert (a.first_worker, a.all_workers) == (0, 6)
    assert (b.first_worker, b.all_workers) == (4, 6)


def _harness(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True,
                          text=True, timeout=180)


def test_two_shards_merge_into_one_campaign(tmp_path):
    for i in (1, 2):
        proc = _harness("fuzz", "--target", "ref", "--duration", "4s", "--seed", "9",
                        "--shard", f"{i}/2", "--out", str(tmp_path / f"s{i}"))
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    reports = [json.loads((tmp_path / f"s{i}" / "report.json").read_text()) for i in (1, 2)]
    assert [r["shard"] for r in reports] == [[1, 2], [2, 2]]
    # Disjoint seeds: the shards' corpora are not copies of each other.
    names = [{p.name for p in (tmp_path / f"s{i}" / "corpus").glob("*.rpct")} for i in (1, 2)]
    assert names[0] and names[1] and not names[0] & names[1]
    merged = _harness("fuzz-merge", "--out", str(tmp_path / "m"), str(tmp_path / "s1"),
                      str(tmp_path / "s2"))
    assert merged.returncode == 0, merged.stdout + merged.stderr
    report = json.loads((tmp_path / "m" / "report.json").read_text())
    assert report["messages_sent"] == sum(r["messages_sent"] for r in reports)
    assert report["shards"] == [[1, 2], [2, 2]] and report["shards_missing"] == []
    kept = report["corpus_merged"]
    assert 0 < kept["entries_kept"] <= kept["entries_read"]
    assert len(list((tmp_path / "m" / "corpus").glob("*.rpct"))) == kept["entries_kept"]
    # A shard short: the merge says which one is missing and fails.
    short = _harness("fuzz-merge", "--out", str(tmp_path / "m1"), str(tmp_path / "s1"))
    assert short.returncode == 1 and "shards missing: [2]" in short.stdout


def _fake_campaign(folder, *, steps: int, shard, messages: int):
    (folder / "crashes" / "crash-x-1").mkdir(parents=True)
    (folder / "crashes" / "crash-x-1" / "repro.rpct").write_text(f"{steps} steps")
    (folder / "corpus").mkdir()
    finding = {"id": "crash-x-1", "steps": steps, "title": "crash", "listing": [],
               "signature": {"kind": "crash", "signal": "SIGABRT", "line": "x",
                             "command": "SET_TENSOR"},
               "replay": f"harness replay {folder}/crashes/crash-x-1/repro.rpct --target p7"}
    report = {"target": "p7", "target_kind": "peer", "dialect": "7.0.0", "messages_sent":
              messages, "cases": 10, "elapsed_s": 10.0, "findings": [finding], "shard": shard,
              "coverage_counts": {"valid|HELLO": 10}, "rss_limit_bytes": 1, "deadline_s": 5,
              "as_limit_bytes": 1}
    (folder / "report.json").write_text(json.dumps(report))


def test_merge_keeps_the_smallest_reproducer_of_each_signature(tmp_path):
    _fake_campaign(tmp_path / "a", steps=5, shard=[1, 2], messages=100)
    _fake_campaign(tmp_path / "b", steps=2, shard=[2, 2], messages=50)
    report = merge_campaigns(tmp_path / "m", [tmp_path / "a", tmp_path / "b"])
    (f,) = report["findings"]
    assert f["steps"] == 2 and str(tmp_path / "m" / "crashes") in f["replay"]
    assert (tmp_path / "m" / "crashes" / "crash-x-1" / "repro.rpct").read_text() == "2 steps"
    assert report["messages_sent"] == 150 and report["coverage"]["valid_commands"] == \
        {"HELLO": 20}


def test_merge_refuses_campaigns_of_different_targets(tmp_path):
    _fake_campaign(tmp_path / "a", steps=5, shard=[1, 1], messages=1)
    _fake_campaign(tmp_path / "b", steps=5, shard=[1, 1], messages=1)
    other = json.loads((tmp_path / "b" / "report.json").read_text())
    (tmp_path / "b" / "report.json").write_text(json.dumps({**other, "target": "p3"}))
    with pytest.raises(MergeError, match="different targets"):
        merge_campaigns(tmp_path / "m", [tmp_path / "a", tmp_path / "b"])


def test_shards_cover_every_item_once():
    items = list(range(23))
    parts = [take_shard(items, (i, 5)) for i in range(1, 6)]
    assert sorted(x for p in parts for x in p) == items
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
