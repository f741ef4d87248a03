from harness.impls.driver import digest, make_fill
from harness.matrix.scenario import WORKS, Check, Observation, Scenario

from ._session import Ended, run_steps

SIZES = (1, 4099, 1 << 20, 64 << 20)


class Roundtrip(Scenario):
    id = "roundtrip"
    title = "SET_TENSOR / GET_TENSOR round trips"
    description = ("Upload and read back 1 B to 64 MiB, at offsets and through a view; every byte "
                   "must come back.")
    checks = tuple(f"{n} bytes come back" for n in SIZES) + ("offset window", "view")

    def run(self, ctx):
        steps, expect = [], []
        for i, n in enumerate(SIZES):
            fill = {"pattern": "random", "seed": 100 + i, "dtype": "u8"}
            steps += [{"op": "alloc_buffer", "name": f"b{i}", "size": max(n, 64)},
                      {"op": "tensor", "name": f"t{i}", "buffer": f"b{i}", "type": "i8", "ne": [n]},
                      {"op": "set", "tensor": f"t{i}", "fill": fill},
                      {"op": "get", "tensor": f"t{i}"}]
            expect.append((f"{n} bytes come back", digest(make_fill(fill, n))))
        win = {"pattern": "arange", "dtype": "u8"}
        steps += [{"op": "set", "tensor": "t1", "offset": 1000, "size": 64, "fill": win},
                  {"op": "get", "tensor": "t1", "offset": 1000, "size": 64},
                  {"op": "view", "name": "v", "src": "t2", "ne": [256], "offset": 4096},
                  {"op": "set", "tensor": "v", "fill": {"pattern": "const", "value": 7, "dtype": "u8"}},
                  {"op": "get", "tensor": "t2", "offset": 4096, "size": 256}]
        try:
            res = run_steps(ctx, steps)
        except Ended as e:
            return e.observation
        got = [res[4 * i + 3] for i in range(len(SIZES))]
        checks = [Check(name, g["fnv"] == want["fnv"], f"got {g['fnv']} want {want['fnv']}")
                  for (name, want), g in zip(expect, got)]
        checks.append(Check("offset window", res[-4]["fnv"] == digest(make_fill(win, 64))["fnv"],
                            res[-4]["head"][:32]))
        checks.append(Check("view", res[-1]["fnv"] == digest(bytes([7]) * 256)["fnv"],
                            res[-1]["head"][:32]))
        return Observation(WORKS, checks=checks)
