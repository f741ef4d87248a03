import numpy as np

from harness.impls.driver import make_fill
from harness.scenario import (WORKS, Check, Ended, Observation, Scenario, expect_bytes, run_steps,
                              scenario)

N, K, M = 64, 32, 16
WINDOW = 64  # bytes a get step reports in full: MUL_MAT's output is read window by window


@scenario
class Compute(Scenario):
    id = "compute"
    title = "Graph compute against numpy"
    description = ("One graph with ADD, MUL, SCALE, CPY (f32->f16), MUL_MAT (f16 weights) and "
                   "GET_ROWS; every output equals numpy's.")
    evidence = ("GRAPH_COMPUTE", "GET_TENSOR")
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
            {"op": "get", "tensor": "R"},
        ] + [{"op": "get", "tensor": "Y", "offset": o, "size": WINDOW}
             for o in range(0, 4 * M * 4, WINDOW)]
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
        n_y = 4 * M * 4 // WINDOW
        got_q, got_h, got_r = res[-3 - n_y:-n_y]
        got_y = res[-n_y:]
        return Observation(WORKS, checks=[
            expect_bytes("add/mul/scale", got_q, q),
            expect_bytes("cpy to f16", got_h, q.astype(np.float16)),
            _close("mul_mat", got_y, y.astype(np.float32)),
            expect_bytes("get_rows", got_r, w[[0, 1, 2, 3]]),
        ])


def _close(name: str, windows: list[dict], want: np.ndarray) -> Check:
    """Backends may sum in another order: every value of the output within a tolerance."""
    got = np.frombuffer(b"".join(bytes.fromhex(w["head"]) for w in windows), np.float32)
    flat = want.reshape(-1)
    ok = got.shape == flat.shape and bool(np.allclose(got, flat, rtol=1e-3, atol=1e-3))
    return Check(name, ok, "" if ok else f"got {got[:4]} ... want {flat[:4]} ...")
