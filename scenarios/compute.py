import numpy as np

from harness.impls.driver import digest, make_fill
from harness.matrix.scenario import WORKS, Check, Observation, Scenario

from ._session import Ended, run_steps

N, K, M = 64, 32, 16


class Compute(Scenario):
    id = "compute"
    title = "Graph compute against numpy"
    description = ("One graph with ADD, MUL, SCALE, CPY (f32->f16), MUL_MAT (f16 weights) and "
                   "GET_ROWS; every output equals numpy's.")
    checks = ("add/mul/scale", "cpy to f16", "mul_mat", "get_rows")

    def run(self, ctx):
        fa, fb = {"pattern": "random", "seed": 1}, {"pattern": "random", "seed": 2}
        fw, fx = {"pattern": "random", "seed": 3, "dtype": "f16"}, {"pattern": "random", "seed": 4}
        steps = [
            {"op": "alloc_buffer", "name": "w", "size": 1 << 16, "usage": "weights"},
            {"op": "alloc_buffer", "name": "act", "size": 1 << 16, "usage": "compute"},
            {"op": "tensor", "name": "a", "buffer": "w", "offset": 0, "ne": [N]},
            {"op": "tensor", "name": "b", "buffer": "w", "offset": 1024, "ne": [N]},
            {"op": "tensor", "name": "W", "buffer": "w", "offset": 2048, "type": "f16", "ne": [K, M]},
            {"op": "tensor", "name": "X", "buffer": "w", "offset": 4096, "ne": [K, 4]},
            {"op": "tensor", "name": "I", "buffer": "w", "offset": 8192, "type": "i32", "ne": [4]},
            {"op": "set", "tensor": "a", "fill": fa}, {"op": "set", "tensor": "b", "fill": fb},
            {"op": "set", "tensor": "W", "fill": fw}, {"op": "set", "tensor": "X", "fill": fx},
            {"op": "set", "tensor": "I", "fill": {"pattern": "arange", "dtype": "i32"}},
            {"op": "node", "name": "s", "kind": "add", "inputs": ["a", "b"], "buffer": "act", "offset": 0},
            {"op": "node", "name": "p", "kind": "mul", "inputs": ["s", "b"], "buffer": "act", "offset": 1024},
            {"op": "node", "name": "q", "kind": "scale", "inputs": ["p"], "buffer": "act",
             "offset": 2048, "params": {"s": 0.25}},
            {"op": "tensor", "name": "h", "buffer": "act", "offset": 3072, "type": "f16", "ne": [N]},
            {"op": "node", "name": "c", "kind": "cpy", "inputs": ["q", "h"]},
            {"op": "node", "name": "Y", "kind": "mul_mat", "inputs": ["W", "X"], "buffer": "act", "offset": 4096},
            {"op": "node", "name": "R", "kind": "get_rows", "inputs": ["W", "I"], "buffer": "act", "offset": 8192},
            {"op": "compute", "outputs": ["c", "Y", "R"]},
            {"op": "get", "tensor": "q"}, {"op": "get", "tensor": "h"},
            {"op": "get", "tensor": "Y"}, {"op": "get", "tensor": "R"},
        ]
        try:
            res = run_steps(ctx, steps)
        except Ended as e:
            return e.observation
        a = make_fill(fa, 4 * N).view(np.float32)
        b = make_fill(fb, 4 * N).view(np.float32)
        w = make_fill(fw, 2 * K * M).view(np.float16).reshape(M, K).astype(np.float32)
        x = make_fill(fx, 4 * K * 4).view(np.float32).reshape(4, K)
        q = ((a + b) * b * np.float32(0.25)).astype(np.float32)
        y = x @ w.T
        got_q, got_h, got_y, got_r = res[-4:]
        close_y = got_y["fnv"] == digest(y.astype(np.float32))["fnv"]
        return Observation(WORKS, checks=[
            Check("add/mul/scale", got_q["fnv"] == digest(q)["fnv"], got_q["head"][:32]),
            Check("cpy to f16", got_h["fnv"] == digest(q.astype(np.float16))["fnv"], got_h["head"][:32]),
            Check("mul_mat", close_y or _close(got_y, y), got_y["head"][:32]),
            Check("get_rows", got_r["fnv"] == digest(w[[0, 1, 2, 3]])["fnv"], got_r["head"][:32]),
        ])


def _close(got: dict, want: np.ndarray) -> bool:
    """Backends may sum in another order: compare the first 16 values with a tolerance."""
    head = np.frombuffer(bytes.fromhex(got["head"]), np.float32)
    return bool(np.allclose(head, want.reshape(-1)[:len(head)], rtol=1e-3, atol=1e-3))
