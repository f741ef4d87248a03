import threading

from harness.impls.driver import ClientAborted
from harness.scenario import (FAILED, WORKS, Check, Observation, Scenario, data_check, judge_abort,
                              scenario)

SIZE = 1 << 20
# Each client writes its own pattern into its own buffer: a server that mixed the two
# sessions' buffers up, or returned nothing written, reads back the wrong bytes.
FILLS = {"A": {"pattern": "random", "seed": 5, "dtype": "u8"},
         "B": {"pattern": "random", "seed": 6, "dtype": "u8"}}


def steps(fill: dict) -> list[dict]:
    return [{"op": "alloc_buffer", "name": "b", "size": SIZE},
            {"op": "tensor", "name": "t", "buffer": "b", "type": "i8", "ne": [SIZE]},
            {"op": "set", "tensor": "t", "fill": fill},
            {"op": "get", "tensor": "t"}]


@scenario
class TwoClients(Scenario):
    id = "two-clients"
    title = "Two clients at once"
    description = ("Client A connects and allocates; client B connects meanwhile. A real server "
                   "serves one client at a time (B waits until A leaves); either way both sessions "
                   "must complete, each reading back exactly the pattern it wrote.")
    evidence = ("SET_TENSOR", "GET_TENSOR")
    evidence_connections = 2
    checks = ("A completed", "B completed", "A reads back its pattern", "B reads back its pattern")

    def run(self, ctx):
        a, b = ctx.new_client(), ctx.new_client()
        steps_a, steps_b = steps(FILLS["A"]), steps(FILLS["B"])
        results, errors = {}, {}

        def second():
            try:
                b.do("connect", endpoint=ctx.endpoint)
                results["B"] = [b.run(s).result for s in steps_b]
                b.do("close")
            except Exception as e:  # noqa: BLE001 - reported as the failure (ClientAborted too)
                errors["B"] = e

        try:
            a.do("connect", endpoint=ctx.endpoint)
            a.run(steps_a[0])
            t = threading.Thread(target=second, daemon=True)
            t.start()
            t.join(0.5)  # give B time to connect while A is active
            results["A"] = [a.run(s).result for s in steps_a[1:]]
            a.do("close")
            a.close()
            t.join(60)
        except ClientAborted as e:
            return judge_abort(ctx, e, ctx.sessions())
        finally:
            a.close()
            b.close()
        if "B" in errors:
            e = errors["B"]
            if isinstance(e, ClientAborted):
                return judge_abort(ctx, e, ctx.sessions())
            return Observation(FAILED, message=str(e), signature=f"second client: {type(e).__name__}")
        checks = []
        for who in ("A", "B"):
            done = who in results
            checks.append(Check(f"{who} completed", done, "" if done else f"{who} never finished"))
            checks.append(data_check(f"{who} reads back its pattern", results[who][-1],
                                     FILLS[who], SIZE) if done else
                          Check(f"{who} reads back its pattern", False, "no read-back"))
        ok = all(who in results for who in ("A", "B"))
        return Observation(WORKS if ok else FAILED, checks=checks,
                           signature=None if ok else "second client never completed")
