import threading

from harness.impls.driver import ClientAborted
from harness.matrix.scenario import FAILED, WORKS, Check, Observation, Scenario, judge_abort

STEPS = [{"op": "alloc_buffer", "name": "b", "size": 1 << 20},
         {"op": "tensor", "name": "t", "buffer": "b", "type": "i8", "ne": [1 << 20]},
         {"op": "set", "tensor": "t", "fill": {"pattern": "random", "seed": 5, "dtype": "u8"}},
         {"op": "get", "tensor": "t"}]


class TwoClients(Scenario):
    id = "two-clients"
    title = "Two clients at once"
    description = ("Client A connects and allocates; client B connects meanwhile. A real server "
                   "serves one client at a time (B waits until A leaves); either way both sessions "
                   "must complete with correct data.")
    checks = ("A completed", "B completed", "both read back what they wrote")

    def run(self, ctx):
        a, b = ctx.new_client(), ctx.new_client()
        results, errors = {}, {}

        def second():
            try:
                b.do("connect", endpoint=ctx.endpoint)
                results["b"] = [b.run(s).result for s in STEPS]
                b.do("close")
            except ClientAborted as e:
                errors["b"] = e
            except Exception as e:  # noqa: BLE001 - reported as the failure
                errors["b"] = e

        try:
            a.do("connect", endpoint=ctx.endpoint)
            a.run(STEPS[0])
            t = threading.Thread(target=second, daemon=True)
            t.start()
            t.join(0.5)  # give B time to connect while A is active
            results["a"] = [a.run(s).result for s in STEPS[1:]]
            a.do("close")
            a.close()
            t.join(60)
        except ClientAborted as e:
            return judge_abort(ctx, e, ctx.sessions())
        finally:
            a.close()
            b.close()
        if "b" in errors:
            e = errors["b"]
            if isinstance(e, ClientAborted):
                return judge_abort(ctx, e, ctx.sessions())
            return Observation(FAILED, message=str(e), signature=f"second client: {type(e).__name__}")
        ok = "a" in results and "b" in results
        same = ok and results["a"][-1]["fnv"] == results["b"][-1]["fnv"]
        return Observation(WORKS if ok else FAILED, checks=[
            Check("A completed", "a" in results, ""),
            Check("B completed", "b" in results, "" if "b" in results else "B never finished"),
            Check("both read back what they wrote", same, ""),
        ], signature=None if ok else "second client never completed")
