"""Seed 000's experiment: a real llama.cpp program loads a model over RPC, cold and warm.

llama-simple loads a generated GGUF (harness.impls.tiny_gguf.LOAD_MODEL_SPEC: feed-forward
weights above the 10 MiB hash threshold) with every layer on the RPC device(s), generates 24
tokens greedily, and must print what a local run prints. With a server cache the load runs
twice against the same server and cache dir (cold, then warm). Every run's row carries seed
000's columns from the wire and, for builds with the profiler (p7f), from both sides' own
GGML_RPC_LOADPROF=1 records. ``judge_model_runs`` is shared with the mixed-fleet scenario.
"""

from harness.proto import client_accepts, get_dialect
from harness.reference.compute import NO_OPS, SUPPORTED_OPS
from harness.scenario import (DEGRADED, FAILED, WORKS, Check, Observation, Scenario, Skip,
                              scenario)

CACHE_NEVER_USED = "server cache never used"
# profile field -> the wire column it must equal
_PROFILE_VS_WIRE = {"set_tensor": "set_tensor", "bytes": "set_tensor_bytes",
                    "hash_calls": "set_tensor_hash", "hash_hits": "cache_hits"}


def model_client_skip(ctx) -> Skip | None:
    """Why llama-simple cannot run in this cell against its server, or None."""
    if ctx.client_kind == "ref":
        return Skip("needs a real llama.cpp program as the client")
    if ctx.server_kind == "ref" and client_accepts(get_dialect(ctx.client_dialect).version,
                                                   get_dialect(ctx.server_dialect).version):
        # (across majors the HELLO rejection comes first, so the cell still runs)
        ops = ", ".join(sorted(op for op in SUPPORTED_OPS if op not in NO_OPS))
        return Skip(f"the reference server computes {ops} only; a llama graph also needs "
                    "RMS_NORM, ROPE, SOFT_MAX and GLU")
    return ctx.model_client_unavailable()


def _loadprof_checks(rows: list[dict]) -> list[Check]:
    """Each side's profiler, where the build has one, counts what the wire carried."""
    checks = []
    for side in ("client", "server"):
        with_loadprof = [r for r in rows if r[f"{side}_loadprof"]]
        if not with_loadprof:
            continue
        bad = [f"{r['run']} {r['server']}: {k}={r[side + '_loadprof'][k]} wire {w}={r[w]}"
               for r in with_loadprof for k, w in _PROFILE_VS_WIRE.items()
               if r[f"{side}_loadprof"][k] != r[w]]
        checks.append(Check(f"the {side}'s load profiler counts what the wire carried", not bad,
                            "; ".join(bad) or f"{len(with_loadprof)} run(s) agree"))
    return checks


def _cache_checks(rows: list[dict], cache: bool) -> tuple[list[Check], bool]:
    """One server's runs: (checks, whether its cache went unused although it has one)."""
    name = rows[0]["server"]
    hits = sum(r["cache_hits"] for r in rows)
    if not cache:
        return [Check(f"{name}: no cache hit without a cache", hits == 0, f"{hits} hits")], False
    asked = sum(r["set_tensor_hash"] for r in rows)
    if asked == 0:
        return [], True
    cold, warm = rows[0], rows[-1]
    return [
        Check(f"{name}: cold load misses (the cache starts empty)",
              cold["set_tensor_hash"] > 0 and cold["cache_hits"] == 0,
              f"{cold['set_tensor_hash']} SET_TENSOR_HASH, {cold['cache_hits']} hits"),
        Check(f"{name}: warm load hits for every hashed tensor",
              len(rows) > 1 and warm["set_tensor_hash"] > 0
              and warm["cache_hits"] == warm["set_tensor_hash"],
              f"{warm['set_tensor_hash']} SET_TENSOR_HASH, {warm['cache_hits']} hits"),
    ], False


def evidence_checks(rows: list[dict], layer_bytes: int) -> list[Check]:
    """What the wire must show of every run before its text may count: the client connected
    to every server of the run, opened each connection with HELLO, and the SET_TENSOR and
    SET_TENSOR_HASH calls of the run offered at least the model's layer weights (a model run
    locally, with the RPC device silently unused, shows none of it)."""
    checks = []
    for run in dict.fromkeys(r["run"] for r in rows):
        mine = [r for r in rows if r["run"] == run]
        for r in mine:
            checks.append(Check(f"run {run}: {r['server']} got connections, each opened with "
                                "the client's HELLO",
                                r["connections"] > 0 and r["client_hellos"] == r["connections"],
                                f"{r['connections']} connection(s), {r['client_hellos']} "
                                "opened with HELLO"))
        offered = sum(r["set_tensor_bytes"] + r["bytes_hashed"] for r in mine)
        checks.append(Check(f"run {run}: uploads carried the model's layer weights",
                            layer_bytes > 0 and offered >= layer_bytes,
                            f"SET_TENSOR + SET_TENSOR_HASH offered {offered:,} bytes of the "
                            f"{layer_bytes:,} bytes of blk.* weights"))
    return checks


def judge_model_runs(ctx, result: dict) -> Observation:
    """Evidence from the wire first (every run connected, said HELLO and uploaded the model's
    layers); then text identical to the local run in every run; profilers agree with the wire;
    each server's cache missed cold and hit warm, or went unused (degraded) when never asked."""
    if result.get("rejected"):
        return result["observation"]
    rows = result["load_runs"]
    texts = result["rpc_texts"]
    checks = evidence_checks(rows, result["layer_bytes"])
    checks += [Check(f"run {i + 1}: RPC text identical to the local run",
                     t == result["local_text"],
                     f"local={result['local_text']!r} rpc={t!r}")
               for i, t in enumerate(texts)]
    checks += _loadprof_checks(rows)
    unused = []
    for server in dict.fromkeys(r["server"] for r in rows):
        server_checks, never_used = _cache_checks([r for r in rows if r["server"] == server],
                                                  ctx.cache)
        checks += server_checks
        if never_used:
            unused.append(server)
    facts = {"text": texts[0] if texts else "", "load_runs": rows}
    if not result["equal"]:
        return Observation(FAILED, checks=checks, facts=facts,
                           signature="model output differs over RPC")
    if not all(c.ok for c in checks):
        return Observation(FAILED, checks=checks, facts=facts, signature="model load: " + "; ".join(
            c.name for c in checks if not c.ok))
    if unused:
        return Observation(DEGRADED, degraded=[CACHE_NEVER_USED], checks=checks, facts=facts,
                           message=f"the client never asked the cache of {', '.join(unused)} "
                                   "although it runs with one")
    return Observation(WORKS, checks=checks, facts=facts)


@scenario
class ModelLoad(Scenario):
    id = "model-load"
    title = "Model load over RPC (end to end, seed 000's experiment)"
    description = ("A real llama.cpp program (llama-simple) loads a generated GGUF whose "
                   "feed-forward weights are above the hash threshold, with every layer on the "
                   "RPC device, and generates 24 tokens; the text must equal a local run. With a "
                   "server cache it loads twice (cold, warm) against the same cache.")
    evidence = ("SET_TENSOR|SET_TENSOR_HASH", "GRAPH_COMPUTE")
    checks = ("every run connected and said HELLO", "uploads carried the model's layer weights",
              "RPC text identical to the local run", "load profilers count what the wire carried",
              "cold load misses, warm load hits", "no cache hit without a cache")
    cache_options = (False, True)
    uploads_big_weights = True

    def applicable(self, ctx):
        return model_client_skip(ctx)

    def run(self, ctx):
        return judge_model_runs(ctx, ctx.run_model_client(runs=2 if ctx.cache else 1))
