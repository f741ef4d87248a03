from harness.reference.client import ServerClosed, VersionRejected
from harness.reference.knobs import Misbehaviour
from harness.proto import RpcTensor, ggml
from harness.scenario import WORKS, Check, Ended, Observation, Scenario, run_steps, scenario

SIZE = 4 << 20
CUT = 1 << 20


@scenario
class Disconnect(Scenario):
    id = "disconnect"
    title = "Client disconnect in the middle of a SET_TENSOR"
    description = ("A client (the reference client, in the cell's client dialect) sends 1 MiB of a "
                   "4 MiB SET_TENSOR and closes. The server must survive and serve the next client.")
    evidence = ("HELLO",)
    evidence_connections = 2
    checks = ("server process alive", "next client served")

    def run(self, ctx):
        try:
            c = ctx.ref_client(knobs=Misbehaviour(truncate_set_tensor_at=CUT))
            ptr, _ = c.alloc_buffer(SIZE)
            base = c.buffer_get_base(ptr)
            t = RpcTensor.make(id=0x1000, type=ggml.TYPE_I8, ne=(SIZE,), buffer=ptr, data=base)
            c.set_tensor(t, bytes(SIZE))
            c.close()
        except (VersionRejected, ServerClosed) as e:
            # the truncating client is not the subject here; a rejection is judged below
            ctx.log(f"truncating client: {e}")
        try:
            (count,) = run_steps(ctx, [{"op": "device_count"}])
        except Ended as e:
            return e.observation
        exit_info = ctx.server.poll()
        return Observation(WORKS, checks=[
            Check("server process alive", exit_info is None, "" if exit_info is None else str(exit_info)),
            Check("next client served", count["count"] >= 1, f"count={count['count']}"),
        ])
