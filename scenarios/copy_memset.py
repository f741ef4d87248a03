from harness.impls.driver import make_fill
from harness.proto import Cmd
from harness.scenario import (WORKS, Check, Ended, Observation, Scenario, count, expect_bytes,
                              run_steps, scenario)


@scenario
class CopyMemset(Scenario):
    id = "copy-memset"
    title = "COPY_TENSOR and MEMSET_TENSOR"
    description = "Copy a tensor to another in the same buffer, memset part of it, read both back."
    evidence = ("COPY_TENSOR", "MEMSET_TENSOR", "GET_TENSOR")
    checks = ("copy result", "memset result", "COPY_TENSOR on the wire")

    def run(self, ctx):
        fill = {"pattern": "random", "seed": 11}
        steps = [{"op": "alloc_buffer", "name": "b", "size": 4096},
                 {"op": "tensor", "name": "src", "buffer": "b", "offset": 0, "ne": [64]},
                 {"op": "tensor", "name": "dst", "buffer": "b", "offset": 1024, "ne": [64]},
                 {"op": "set", "tensor": "src", "fill": fill},
                 {"op": "copy", "src": "src", "dst": "dst"},
                 {"op": "get", "tensor": "dst"},
                 {"op": "memset", "tensor": "dst", "offset": 16, "size": 32, "value": 0},
                 {"op": "get", "tensor": "dst"}]
        try:
            res = run_steps(ctx, steps)
        except Ended as e:
            return e.observation
        src = make_fill(fill, 256)
        after = src.copy()
        after[16:48] = 0
        return Observation(WORKS, checks=[
            expect_bytes("copy result", res[5], src),
            expect_bytes("memset result", res[7], after),
            Check("COPY_TENSOR on the wire", count(ctx.sessions(), Cmd.COPY_TENSOR) >= 1, ""),
        ])
