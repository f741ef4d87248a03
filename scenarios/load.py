"""A model-sized weight upload, for load profiles (``harness profile``); not in the default matrix."""

import os

from harness.capture.loadprof import profile_transcripts
from harness.matrix.scenario import WORKS, Check, Observation, Scenario

from ._session import Ended, run_steps

MiB = 1 << 20


def weight_sizes(total: int) -> list[tuple[str, int]]:
    """A transformer-like mix: two 64 MiB embedding matrices, then per layer four 2.5 MiB
    attention weights, three 11 MiB feed-forward weights (above the 10 MiB hash threshold)
    and four 8 KiB norms, as many layers as fit in ``total`` bytes."""
    emb = min(64 * MiB, total // 8)
    out = [("token_embd", emb), ("output", emb)]
    layer = [("attn_q", 5 * MiB // 2), ("attn_k", 5 * MiB // 2), ("attn_v", 5 * MiB // 2),
             ("attn_o", 5 * MiB // 2), ("ffn_gate", 11 * MiB), ("ffn_up", 11 * MiB),
             ("ffn_down", 11 * MiB), ("attn_norm", 8192), ("ffn_norm", 8192),
             ("q_norm", 8192), ("k_norm", 8192)]
    per_layer = sum(n for _, n in layer)
    for i in range(max(1, (total - 2 * emb) // per_layer)):
        out += [(f"blk.{i}.{name}", n) for name, n in layer]
    return out


class Load(Scenario):
    id = "load"
    title = "Model-sized weight upload"
    description = ("Upload about 1 GiB of weights in a few hundred tensors of realistic sizes into "
                   "a WEIGHTS buffer, twice on two connections (the second can hit a server "
                   "cache), and profile it from the wire.")
    checks = ("every tensor reads back",)
    cache_options = (False, True)

    def run(self, ctx):
        total = int(os.environ.get("GGML_RPC_HARNESS_LOAD_BYTES", 1 << 30))
        sizes = weight_sizes(total)
        nbytes = sum(n for _, n in sizes)
        steps = [{"op": "alloc_buffer", "name": "w", "size": nbytes, "usage": "weights"}]
        off = 0
        for i, (name, n) in enumerate(sizes):
            steps.append({"op": "tensor", "name": name, "buffer": "w", "offset": off,
                          "type": "i8", "ne": [n]})
            off += n
        # cheap, distinct contents: generating data must not look like hashing time
        sets = [{"op": "set", "tensor": name, "fill": {"pattern": "const", "value": 1 + i % 251,
                                                        "dtype": "u8"}}
                for i, (name, _) in enumerate(sizes)]
        last = {"op": "get", "tensor": sizes[-1][0], "size": 64}
        try:
            first = run_steps(ctx, steps + sets + [last])
            second = run_steps(ctx, steps + sets + [last])
        except Ended as e:
            return e.observation
        per_conn = [profile_transcripts([t]) for t in ctx.transcripts()]
        facts = {"tensors": len(sizes), "bytes": nbytes,
                 "load": [p.to_dict() for p in per_conn]}
        want = bytes([1 + (len(sizes) - 1) % 251]) * 64
        return Observation(WORKS, facts=facts, checks=[
            Check("the last tensor reads back on both connections",
                  first[-1]["head"] == second[-1]["head"] == want.hex(), first[-1]["head"][:16]),
            Check("the first connection uploads every byte (the cache starts empty)",
                  bool(per_conn) and per_conn[0].set_tensor_bytes == nbytes,
                  f"{per_conn[0].set_tensor_bytes if per_conn else 0} of {nbytes} bytes"),
        ])
