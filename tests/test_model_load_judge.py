"""The model-load and mixed-fleet verdicts from their run rows, each check made to fail once;
the load table the reports show; summing the profilers' per-connection records."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pandas as pd
import pytest

from harness.capture.loadprof_log import LoadprofRecord
from harness.matrix.load_runs import sum_loadprof_records
from harness.report.html_report import load_table
from harness.report.load_table import load_rows, markdown_table
from harness.scenario import DEGRADED, FAILED, WORKS
from scenarios.mixed_fleet import MixedFleet
from scenarios.model_load import judge_model_runs

TEXT = "<s> Hello world abc"
LAYER_BYTES = 1000  # the model's blk.* weights (what every run must offer the RPC device)


def _prof(**kw) -> dict:
    base = {"set_tensor": 10, "bytes": 1000, "hash_calls": 3, "hash_hits": 0, "span_s": 0.5,
            "hash_s": 0.1, "staging_s": 0.0, "wire_s": 0.2, "gap_s": 0.1, "flags": 1,
            "direct": 7, "staged": 3}
    return {**base, **kw}


def _row(run="cold", server="llama-7f", hashes=3, hits=0, profile=True, endpoint="h:1",
         nbytes=1000) -> dict:
    prof = _prof(hash_calls=hashes, hash_hits=hits, bytes=nbytes) if profile else None
    return {"run": run, "server": server, "endpoint": endpoint, "equal": True, "wall_s": 1.0,
            "connections": 8, "client_hellos": 8, "upload_span_s": 0.5, "hashing_s": 0.1, "wire_s": 0.2,
            "gaps_s": 0.1, "set_tensor": 10, "set_tensor_bytes": nbytes,
            "set_tensor_hash": hashes, "cache_hits": hits, "bytes_hashed": 33,
            "client_loadprof": prof, "server_loadprof": copy.deepcopy(prof)}


def _result(rows, texts=(TEXT, TEXT)) -> dict:
    return {"equal": all(t == TEXT for t in texts), "local_text": TEXT, "rpc_texts": list(texts),
            "load_runs": rows, "layer_bytes": LAYER_BYTES}


CTX_CACHE = SimpleNamespace(cache=True)
CTX_NO_CACHE = SimpleNamespace(cache=False)


def test_cold_miss_warm_hit_works():
    obs = judge_model_runs(CTX_CACHE, _result([_row(), _row("warm", hits=3)]))
    assert obs.outcome == WORKS, obs.failed_checks
    assert obs.facts["load_runs"][1]["cache_hits"] == 3


def test_a_cache_never_asked_is_degraded():
    rows = [_row(hashes=0), _row("warm", hashes=0)]
    obs = judge_model_runs(CTX_CACHE, _result(rows))
    assert obs.outcome == DEGRADED and obs.degraded == ["server cache never used"]
    assert "llama-7f" in obs.message


@pytest.mark.parametrize("rows,texts,failing", [
    ([_row(), _row("warm", hits=2)], (TEXT, TEXT), "warm load hits"),  # a warm miss
    ([_row(hits=1), _row("warm", hits=3)], (TEXT, TEXT), "cold load misses"),  # a cold hit
    ([_row(), _row("warm", hits=3)], (TEXT, TEXT + "x"), "run 2: RPC text"),
], ids=["warm-miss", "cold-hit", "text-differs"])
def test_planted_faults_fail(rows, texts, failing):
    obs = judge_model_runs(CTX_CACHE, _result(rows, texts))
    assert obs.outcome == FAILED
    assert any(failing in c.name for c in obs.failed_checks), obs.failed_checks


@pytest.mark.parametrize("side", ["client", "server"])
def test_a_profiler_that_disagrees_with_the_wire_fails(side):
    rows = [_row(), _row("warm", hits=3)]
    rows[1][f"{side}_loadprof"]["set_tensor"] = 11
    obs = judge_model_runs(CTX_CACHE, _result(rows))
    assert obs.outcome == FAILED
    assert [c.name for c in obs.failed_checks] == [
        f"the {side}'s load profiler counts what the wire carried"]


def test_no_profiler_no_profiler_check():
    obs = judge_model_runs(CTX_NO_CACHE, _result([_row("1", profile=False)], (TEXT,)))
    assert obs.outcome == WORKS
    assert not any("profiler" in c.name for c in obs.checks)


def test_a_hit_without_a_cache_fails():
    obs = judge_model_runs(CTX_NO_CACHE, _result([_row("1", hits=1)], (TEXT,)))
    assert obs.outcome == FAILED and "no cache hit without a cache" in obs.signature


def test_rejection_passes_through():
    marker = object()
    assert judge_model_runs(CTX_CACHE, {"rejected": True, "observation": marker}) is marker


# ------------------------------------------------------------------------------ mixed fleet
class _FleetCtx(SimpleNamespace):
    def own_server(self):
        return "own"

    def start_other_server(self):
        return "other"

    def run_model_client(self, *, runs, servers):
        assert runs == 2 and servers == ["own", "other"]
        return self.result


def _fleet_rows(second_bytes=500, second_hashes=2):
    return [_row(endpoint="h:1"), _row(server="llama-7", endpoint="h:2", nbytes=second_bytes,
                                       hashes=second_hashes),
            _row("warm", hits=3, endpoint="h:1"),
            _row("warm", server="llama-7", endpoint="h:2", nbytes=5, hashes=second_hashes,
                 hits=second_hashes)]


def test_mixed_fleet_reports_each_servers_share():
    ctx = _FleetCtx(cache=True, result=_result(_fleet_rows()))
    obs = MixedFleet().run(ctx)
    assert obs.outcome == WORKS, obs.failed_checks
    assert obs.facts["shares"] == {"llama-7f": {"bytes": 1000, "set_tensor": 10},
                                   "llama-7": {"bytes": 500, "set_tensor": 10}}


def test_mixed_fleet_server_without_weights_fails():
    rows = _fleet_rows(second_bytes=0)
    ctx = _FleetCtx(cache=True, result=_result(rows))
    obs = MixedFleet().run(ctx)
    assert obs.outcome == FAILED
    assert [c.name for c in obs.failed_checks] == ["llama-7 received part of the model"]


def test_mixed_fleet_one_cache_unused_is_degraded():
    ctx = _FleetCtx(cache=True, result=_result(_fleet_rows(second_hashes=0)))
    obs = MixedFleet().run(ctx)
    assert obs.outcome == DEGRADED and "llama-7" in obs.message and "llama-7f" not in obs.message


def test_mixed_fleet_needs_two_versions_of_real_servers():
    base = dict(server_kind="pin", server_dialect="7.0.0", client_kind="pin")
    same = SimpleNamespace(**base, other_server=SimpleNamespace(kind="pin", dialect="7.0.0"))
    ref = SimpleNamespace(**base, other_server=SimpleNamespace(kind="ref", dialect="7.0.0+flags"))
    assert "not a fleet of two versions" in MixedFleet().applicable(same).reason
    assert "two native real servers" in MixedFleet().applicable(ref).reason


# ------------------------------------------------------------------------------ report, profiles
def _results_frame() -> pd.DataFrame:
    return pd.DataFrame([{
        "scenario": "model-load", "client_role": "new-client", "client": "llama-7f",
        "server_role": "old-server", "server": "llama-7", "cache": True,
        "facts": {"load_runs": [_row(server="llama-7"),
                                _row("warm", server="llama-7", hits=3, profile=False)]}}])


def test_load_table_has_a_row_per_run_with_the_seeds_columns():
    rows = load_rows(_results_frame())
    assert [r[3] for r in rows] == ["cold", "warm"]
    assert rows[0][:7] == ["new-client: llama-7f", "old-server: llama-7", "on", "cold",
                           "0.500 s", "1.000 s", "0.100 s"]
    assert rows[1][6] == "0.100 s w"  # no client profiler: hashing as the wire shows it
    assert rows[1][12] == "3" and rows[1][13] == "-"
    md = markdown_table(_results_frame())
    assert md[2].startswith("| client | server | cache | run | upload span | wall | hashing")
    assert "<table class='load'>" in "".join(load_table(_results_frame()))


def test_load_table_empty_without_model_load_cells():
    d = _results_frame().assign(scenario="alloc")
    assert load_rows(d) == [] and markdown_table(d) == [] and load_table(d) == []


def test_profiles_of_several_connections_add_up():
    def rec(conn, **kw):
        fields = dict(side="client", conn=conn, endpoint="h:1", load_opt=True, flags=1,
                      set_tensor=2, bytes=10, hash_calls=1, hash_hits=0, hashed_bytes=5,
                      direct=0, staged=0, span_s=0.5, hash_s=0.1, staging_s=0.0, wire_s=0.2,
                      gap_s=0.1, gaps=1, max_gap_s=0.1)
        return LoadprofRecord(**{**fields, **kw})
    total = sum_loadprof_records([rec(1), rec(2, span_s=0.7, flags=0, load_opt=False, max_gap_s=0.3)])
    assert total["set_tensor"] == 4 and total["bytes"] == 20 and total["connections"] == 2
    assert total["span_s"] == 0.7 and total["max_gap_s"] == 0.3
    assert total["flags"] == 1 and total["load_opt"] is False
    assert sum_loadprof_records([]) is None



# ---------------------------------------------------------------- wire evidence (planted)
def _unused(row: dict) -> dict:
    """The RPC device silently unused: the model ran locally, nothing crossed the wire."""
    return {**row, "connections": 0, "client_hellos": 0, "set_tensor": 0, "set_tensor_bytes": 0,
            "set_tensor_hash": 0, "cache_hits": 0, "bytes_hashed": 0, "client_loadprof": None,
            "server_loadprof": None}


@pytest.mark.parametrize("ctx", [CTX_NO_CACHE, CTX_CACHE], ids=["no-cache", "cache"])
def test_a_model_run_locally_fails_the_cell_though_its_text_is_right(ctx):
    rows = [_unused(_row())] + ([_unused(_row("warm"))] if ctx.cache else [])
    obs = judge_model_runs(ctx, _result(rows, texts=(TEXT,) * len(rows)))
    assert obs.outcome == FAILED  # not works, and not works-degraded with a cache
    names = [c.name for c in obs.failed_checks]
    assert any("got connections" in n for n in names)
    assert any("layer weights" in n for n in names)


def test_a_connection_that_did_not_open_with_hello_fails():
    rows = [{**_row(), "client_hellos": 7}, _row("warm", hits=3)]
    obs = judge_model_runs(CTX_CACHE, _result(rows))
    assert obs.outcome == FAILED and "HELLO" in obs.failed_checks[0].name


def test_uploads_short_of_the_layers_fail():
    rows = [_row(nbytes=100), _row("warm", hits=3, nbytes=100)]
    obs = judge_model_runs(CTX_CACHE, {**_result(rows), "layer_bytes": 10_000})
    assert obs.outcome == FAILED
    assert all("layer weights" in c.name for c in obs.failed_checks)
