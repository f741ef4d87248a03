from harness.scenario import WORKS, Check, Ended, Observation, Scenario, run_steps, scenario


@scenario
class DeviceInfo(Scenario):
    id = "device-info"
    title = "Device count and memory"
    description = "DEVICE_COUNT, GET_ALIGNMENT, GET_MAX_SIZE and GET_DEVICE_MEMORY answer sanely."
    evidence = ("GET_ALIGNMENT", "GET_DEVICE_MEMORY")
    checks = ("alignment is a power of two", "0 < free <= total")

    def run(self, ctx):
        try:
            n, bt, mem = run_steps(ctx, [{"op": "device_count"}, {"op": "buffer_type"},
                                         {"op": "device_memory"}])
        except Ended as e:
            return e.observation
        a = bt["alignment"]
        return Observation(WORKS, facts={**n, **bt, **mem}, checks=[
            Check("alignment is a power of two", a > 0 and a & (a - 1) == 0, f"alignment={a}"),
            Check("0 < free <= total", 0 < mem["free"] <= mem["total"],
                  f"free={mem['free']} total={mem['total']}"),
        ])
