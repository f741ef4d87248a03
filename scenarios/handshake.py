from harness.proto import SERVER_FLAG_CACHE, get_dialect
from harness.scenario import (WORKS, Check, Ended, Observation, Scenario, handshake_facts,
                              run_steps, scenario)


@scenario
class Handshake(Scenario):
    id = "handshake"
    title = "Handshake and version negotiation"
    description = ("Connect, HELLO, DEVICE_COUNT. Same-major pairs must proceed; other majors must "
                   "be turned away at HELLO with nothing sent after it.")
    evidence = ("HELLO", "DEVICE_COUNT")
    checks = ("server announces the version of its label", "HELLO byte 3 carries the cache bit "
              "exactly when the server has flags semantics and a cache", "device count >= 1")
    cache_options = (False, True)

    def run(self, ctx):
        try:
            (count,) = run_steps(ctx, [{"op": "device_count"}])
        except Ended as e:
            return e.observation
        s = ctx.sessions()[0]
        facts = handshake_facts(s)
        want_flag = get_dialect(ctx.server_dialect).server_flags and ctx.cache
        got_flag = bool((facts["server_flags"] or 0) & SERVER_FLAG_CACHE)
        return Observation(WORKS, facts=facts, checks=[
            Check("cache bit in HELLO byte 3 matches the server's cache", got_flag == want_flag,
                  f"flags=0x{facts['server_flags'] or 0:02x}, cache={'on' if ctx.cache else 'off'}"),
            Check("device count >= 1", count["count"] >= 1, f"count={count['count']}"),
        ])
