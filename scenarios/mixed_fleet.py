"""A mixed fleet: one client, two servers of different versions (the rolling-upgrade case).

llama-simple splits the load model across the cell's server and the design's other server
(``--rpc a,b``: the shim's GGML_RPC_SERVERS, cell's server first), both real programs behind
their own recording proxies. Reported per server and run (cold, warm): the bytes and
SET_TENSOR calls each one received (who serves which layers), what its cache did, and the
profilers' records; the text must equal a local run's in every run.
"""

from harness.scenario import FAILED, Check, Scenario, Skip, scenario

from .model_load import judge_model_runs, model_client_skip

REAL_SERVER_KINDS = ("pin", "user")


@scenario
class MixedFleet(Scenario):
    id = "mixed-fleet"
    title = "Mixed fleet: one client, an old and a new server"
    description = ("llama-simple loads the load model split across two real servers of different "
                   "versions (the cell's server first, then the design's other server) twice "
                   "against the same caches; the text must equal a local run, and each server's "
                   "share of the upload and its cache hits are measured from its own wire.")
    evidence = ("SET_TENSOR|SET_TENSOR_HASH", "GRAPH_COMPUTE")
    checks = ("every run connected and said HELLO", "uploads carried the model's layer weights",
              "RPC text identical to the local run", "load profilers count what the wire carried",
              "each server received part of the model",
              "cold load misses, warm load hits (per server)")
    cache_options = (True,)
    uploads_big_weights = True

    def applicable(self, ctx):
        other = ctx.other_server
        if ctx.server_kind not in REAL_SERVER_KINDS or other is None or \
                other.kind not in REAL_SERVER_KINDS:
            return Skip("needs two native real servers (the design's old and new server)")
        if other.dialect == ctx.server_dialect:
            return Skip(f"both servers speak {other.dialect}: not a fleet of two versions")
        return model_client_skip(ctx)

    def run(self, ctx):
        servers = [ctx.own_server(), ctx.start_other_server()]
        obs = judge_model_runs(ctx, ctx.run_model_client(runs=2, servers=servers))
        rows = obs.facts.get("load_runs", [])
        if not rows:  # rejected at HELLO: nothing was split
            return obs
        cold = [r for r in rows if r["run"] == rows[0]["run"]]  # the first run's row per server
        obs.facts["shares"] = {r["server"]: {"bytes": r["set_tensor_bytes"],
                                             "set_tensor": r["set_tensor"]} for r in cold}
        shares = [Check(f"{r['server']} received part of the model", r["set_tensor_bytes"] > 0,
                        f"{r['set_tensor_bytes']} bytes in {r['set_tensor']} SET_TENSOR")
                  for r in cold]
        obs.checks += shares
        if obs.outcome != FAILED and (len(shares) != 2 or not all(c.ok for c in shares)):
            obs.outcome, obs.signature = FAILED, "mixed fleet: a server received no weights"
        return obs
