from harness.impls.driver import make_fill
from harness.proto import (HASH_THRESHOLD, SERVER_FLAG_CACHE, Cmd, cache_file_name, fnv1a64,
                           get_dialect)
from harness.scenario import (DEGRADED, FAILED, WORKS, Check, Ended, Observation, Scenario,
                              data_check, handshake_facts, run_steps, scenario)

SIZE = HASH_THRESHOLD + (2 << 20)  # above the 10 MiB threshold: the hash path applies


@scenario
class WeightsCache(Scenario):
    id = "weights-cache"
    title = "Weight upload above the hash threshold, with and without a server cache"
    description = ("Upload a 12 MiB weight twice, on two connections. Count SET_TENSOR_HASH on the "
                   "wire: with a cache the first upload misses and saves, the second hits; a client "
                   "told (HELLO byte 3) that the server has no cache must not hash at all.")
    evidence = ("SET_TENSOR|SET_TENSOR_HASH", "GET_TENSOR")
    evidence_connections = 2
    checks = ("data reads back", "a flags-aware client facing no cache flag sends no SET_TENSOR_HASH",
              "miss then save then hit after reconnect (cache on)", "cache file named by FNV-1a")
    cache_options = (False, True)
    uploads_big_weights = True

    def run(self, ctx):
        fill = {"pattern": "random", "seed": 0xC0FFEE, "dtype": "u8"}
        data = make_fill(fill, SIZE)
        steps = [{"op": "alloc_buffer", "name": "w", "size": SIZE, "usage": "weights"},
                 {"op": "tensor", "name": "W", "buffer": "w", "type": "i8", "ne": [SIZE]},
                 {"op": "set", "tensor": "W", "fill": fill},
                 {"op": "get", "tensor": "W"}]
        try:
            first = run_steps(ctx, steps)
            second = run_steps(ctx, steps)
        except Ended as e:
            return e.observation
        sessions = ctx.sessions()
        per_conn = []
        for s in sessions:
            hashes = [e for e in s.exchanges if e.cmd is Cmd.SET_TENSOR_HASH]
            big_sets = [e for e in s.exchanges if e.cmd is Cmd.SET_TENSOR and e.data_length >= SIZE]
            per_conn.append({"hash_requests": len(hashes),
                             "hash_results": [e.response.result for e in hashes if e.response],
                             "uploads": len(big_sets),
                             "cache_flags": [e.request.cache_flag for e in big_sets]})
        facts = {"per_connection": per_conn, **handshake_facts(sessions[0]),
                 "cache_files": ctx.cache_files(), "bytes": SIZE}
        total_hashes = sum(p["hash_requests"] for p in per_conn)
        flags = facts["server_flags"] or 0
        checks = [data_check("data reads back (first connection)", first[-1], fill, SIZE),
                  data_check("data reads back (second connection)", second[-1], fill, SIZE)]
        if get_dialect(ctx.client_dialect).server_flags and not flags & SERVER_FLAG_CACHE:
            checks.append(Check("a flags-aware client facing no cache flag sends no SET_TENSOR_HASH",
                                total_hashes == 0, f"{total_hashes} SET_TENSOR_HASH sent"))
        if not ctx.cache:
            checks.append(Check("no cache files without a cache", not facts["cache_files"],
                                str(facts["cache_files"])))
            return Observation(WORKS, facts=facts, checks=checks)
        if total_hashes == 0:
            checks.append(Check("cache untouched", not facts["cache_files"], str(facts["cache_files"])))
            return Observation(DEGRADED, degraded=["server cache never used"], facts=facts,
                               checks=checks, message="the client never asked the server's cache "
                               f"(HELLO byte 3 = 0x{flags:02x}) although the server runs with one")
        name = cache_file_name(fnv1a64(data))
        r1, r2 = per_conn[0], per_conn[-1]
        checks += [
            Check("first upload: miss, then SET_TENSOR with cache_flag set",
                  r1["hash_results"] == [0] and r1["uploads"] == 1 and r1["cache_flags"][0] != 0,
                  str(r1)),
            Check("saved under its FNV-1a name", name in facts["cache_files"],
                  f"want {name}, have {facts['cache_files']}"),
            Check("after reconnect: hit and no upload", r2["hash_results"] == [1] and r2["uploads"] == 0,
                  str(r2)),
        ]
        if not all(c.ok for c in checks):
            return Observation(FAILED, facts=facts, checks=checks,
                               signature="cache protocol: " + "; ".join(c.name for c in checks if not c.ok))
        return Observation(WORKS, facts=facts, checks=checks)
