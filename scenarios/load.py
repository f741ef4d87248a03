"""A model-sized weight upload, for load profiles (``harness profile``); not in the default matrix."""

import os

from harness.capture.upload_timing import time_transcripts
from harness.impls.driver import fingerprint, make_fill
from harness.scenario import (WORKS, Check, Ended, Observation, Scenario, expect_fingerprint, run_steps,
                              scenario)

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


@scenario
class Load(Scenario):
    id = "load"
    title = "Model-sized weight upload"
    description = ("Upload about 1 GiB of weights in a few hundred tensors of realistic sizes into "
                   "a WEIGHTS buffer, twice on two connections (the second can hit a server "
                   "cache), and profile it from the wire.")
    evidence = ("SET_TENSOR|SET_TENSOR_HASH", "GET_TENSOR")
    evidence_connections = 2
    checks = ("every tensor reads back in full on both connections",
              "the first connection uploads every byte (the cache starts empty)")
    cache_options = (False, True)
    uploads_big_weights = True

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
        fills = [{"pattern": "const", "value": 1 + i % 251, "dtype": "u8"} for i in range(len(sizes))]
        sets = [{"op": "set", "tensor": name, "fill": fill}
                for (name, _), fill in zip(sizes, fills)]
        # read back after the whole upload, so the upload's profile stays the upload's
        gets = [{"op": "get", "tensor": name} for name, _ in sizes]
        try:
            first = run_steps(ctx, steps + sets + gets)
            second = run_steps(ctx, steps + sets + gets)
        except Ended as e:
            return e.observation
        per_conn = [time_transcripts([t]) for t in ctx.transcripts()]
        facts = {"tensors": len(sizes), "bytes": nbytes,
                 "load": [p.to_dict() for p in per_conn]}
        want = [fingerprint(make_fill(fill, n)) for (_, n), fill in zip(sizes, fills)]
        checks = []
        for which, res in (("first", first), ("second", second)):
            got = res[-len(sizes):]
            bad = [c for c in (expect_fingerprint(name, g, w)
                               for (name, _), w, g in zip(sizes, want, got)) if not c.ok]
            checks.append(Check(f"every tensor reads back in full ({which} connection)", not bad,
                                f"{len(bad)} of {len(sizes)} differ; first: {bad[0].name}: "
                                f"{bad[0].evidence}" if bad else f"{len(sizes)} tensors"))
        checks.append(Check("the first connection uploads every byte (the cache starts empty)",
                            bool(per_conn) and per_conn[0].set_tensor_bytes == nbytes,
                            f"{per_conn[0].set_tensor_bytes if per_conn else 0} of {nbytes} bytes"))
        return Observation(WORKS, facts=facts, checks=checks)
