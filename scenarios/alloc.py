from harness.proto import Cmd
from harness.scenario import WORKS, Check, Ended, Observation, Scenario, count, run_steps, scenario


@scenario
class Alloc(Scenario):
    id = "alloc"
    title = "Alloc, clear, free"
    description = "Allocate buffers of several sizes, clear them, free them, allocate again."
    evidence = ("ALLOC_BUFFER", "FREE_BUFFER")
    checks = ("every ALLOC_BUFFER got a live handle", "every free reached the server",
              "server still answers after the frees")

    def run(self, ctx):
        sizes = [32, 4096, 1 << 20, 16 << 20]
        steps = [{"op": "alloc_buffer", "name": f"b{i}", "size": n} for i, n in enumerate(sizes)]
        steps += [{"op": "clear", "buffer": f"b{i}", "value": 0x5A} for i in range(len(sizes))]
        steps += [{"op": "free_buffer", "buffer": f"b{i}"} for i in range(len(sizes))]
        steps += [{"op": "alloc_buffer", "name": "again", "size": 4096}, {"op": "device_count"}]
        try:
            res = run_steps(ctx, steps)
        except Ended as e:
            return e.observation
        sessions = ctx.sessions()
        allocs = [e for s in sessions for e in s.exchanges if e.cmd is Cmd.ALLOC_BUFFER]
        return Observation(WORKS, facts={"allocs": len(allocs)}, checks=[
            Check("every ALLOC_BUFFER got a live handle",
                  all(e.response is not None and e.response.remote_ptr for e in allocs),
                  f"{len(allocs)} allocations"),
            Check("every free reached the server", count(sessions, Cmd.FREE_BUFFER) >= len(sizes),
                  f"{count(sessions, Cmd.FREE_BUFFER)} FREE_BUFFER on the wire"),
            Check("server still answers after the frees", res[-1]["count"] >= 1, ""),
        ])
