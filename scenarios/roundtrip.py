from harness.scenario import (WORKS, Ended, Observation, Scenario, data_check, run_steps,
                              scenario)

SIZES = (1, 4099, 1 << 20, 64 << 20)


@scenario
class Roundtrip(Scenario):
    id = "roundtrip"
    title = "SET_TENSOR / GET_TENSOR round trips"
    description = ("Upload and read back 1 B to 64 MiB, at offsets and through a view; every byte "
                   "must come back.")
    evidence = ("SET_TENSOR", "GET_TENSOR")
    checks = tuple(f"{n} bytes come back" for n in SIZES) + ("offset window", "view")

    def run(self, ctx):
        steps, fills = [], []
        for i, n in enumerate(SIZES):
            fill = {"pattern": "random", "seed": 100 + i, "dtype": "u8"}
            steps += [{"op": "alloc_buffer", "name": f"b{i}", "size": max(n, 64)},
                      {"op": "tensor", "name": f"t{i}", "buffer": f"b{i}", "type": "i8", "ne": [n]},
                      {"op": "set", "tensor": f"t{i}", "fill": fill},
                      {"op": "get", "tensor": f"t{i}"}]
            fills.append(fill)
        win = {"pattern": "arange", "dtype": "u8"}
        view = {"pattern": "const", "value": 7, "dtype": "u8"}
        steps += [{"op": "set", "tensor": "t1", "offset": 1000, "size": 64, "fill": win},
                  {"op": "get", "tensor": "t1", "offset": 1000, "size": 64},
                  {"op": "view", "name": "v", "src": "t2", "ne": [256], "offset": 4096},
                  {"op": "set", "tensor": "v", "fill": view},
                  {"op": "get", "tensor": "t2", "offset": 4096, "size": 256}]
        try:
            res = run_steps(ctx, steps)
        except Ended as e:
            return e.observation
        checks = [data_check(f"{n} bytes come back", res[4 * i + 3], fill, n)
                  for i, (n, fill) in enumerate(zip(SIZES, fills))]
        checks.append(data_check("offset window", res[-4], win, 64))
        checks.append(data_check("view", res[-1], view, 256))
        return Observation(WORKS, checks=checks)
