from harness.proto import HASH_THRESHOLD, Cmd
from harness.scenario import (WORKS, Check, Ended, Observation, Scenario, data_check, run_steps,
                              scenario)

SIZE = HASH_THRESHOLD + (2 << 20)


@scenario
class WeightsOnly(Scenario):
    id = "weights-only"
    title = "Only weights are hashed and cached"
    description = ("Upload 12 MiB into a compute buffer (activations) to a server with a cache: "
                   "no SET_TENSOR_HASH, cache_flag 0, and nothing written to the cache (proto 7).")
    evidence = ("SET_TENSOR", "GET_TENSOR")
    checks = ("data reads back", "no SET_TENSOR_HASH", "cache_flag 0 on every SET_TENSOR",
              "no cache file written")
    cache_options = (True,)

    def run(self, ctx):
        fill = {"pattern": "random", "seed": 77, "dtype": "u8"}
        steps = [{"op": "alloc_buffer", "name": "act", "size": SIZE, "usage": "compute"},
                 {"op": "tensor", "name": "A", "buffer": "act", "type": "i8", "ne": [SIZE]},
                 {"op": "set", "tensor": "A", "fill": fill},
                 {"op": "get", "tensor": "A"}]
        try:
            res = run_steps(ctx, steps)
        except Ended as e:
            return e.observation
        sets = [e for s in ctx.sessions() for e in s.exchanges if e.cmd is Cmd.SET_TENSOR]
        hashes = sum(s.count(Cmd.SET_TENSOR_HASH) for s in ctx.sessions())
        files = ctx.cache_files()
        return Observation(WORKS, facts={"set_tensor": len(sets), "hash_requests": hashes}, checks=[
            data_check("data reads back", res[-1], fill, SIZE),
            Check("no SET_TENSOR_HASH", hashes == 0, f"{hashes} sent"),
            Check("cache_flag 0 on every SET_TENSOR", all(e.request.cache_flag == 0 for e in sets),
                  str([e.request.cache_flag for e in sets])),
            Check("no cache file written", not files, str(files)),
        ])
