"""Seed 000's four-way load table, from the model-load (and mixed-fleet) cells of a design.

One row per cell, server and run (cold / warm with a server cache): client, server, upload
span, wall, hashing, wire time, gaps, SET_TENSOR / SET_TENSOR_HASH counts and cache hits, all
measured on that server's wire for that run, then what the seed-000 builds' own profilers
(GGML_RPC_LOADPROF=1) printed: the client's hashing, staging and wire time and the server's
direct / staged receives. Hashing is the client profiler's when it has one, else the gaps
before SET_TENSOR_HASH on the wire (marked "w").
"""

from __future__ import annotations

import pandas as pd

LOAD_SCENARIOS = ("model-load", "mixed-fleet")
HEADERS = ["client", "server", "cache", "run", "upload span", "wall", "hashing", "wire", "gaps",
           "SET_TENSOR", "MiB", "SET_TENSOR_HASH", "hits", "client profiler",
           "server profiler", "text"]
MIB = 1 << 20


def _s(value) -> str:
    return f"{value:.3f} s" if isinstance(value, (int, float)) else "-"


def _client_loadprof(p: dict | None) -> str:
    if not p:
        return "-"
    return (f"span {p['span_s']:.3f} s, hash {p['hash_s']:.3f} s, staging {p['staging_s']:.3f} s,"
            f" wire {p['wire_s']:.3f} s, gaps {p['gap_s']:.3f} s")


def _server_loadprof(p: dict | None) -> str:
    if not p:
        return "-"
    return (f"flags 0x{p['flags']:02x}, {p['direct']} direct / {p['staged']} staged, "
            f"hash {p['hash_s']:.3f} s, wire {p['wire_s']:.3f} s")


def load_rows(d: pd.DataFrame) -> list[list[str]]:
    """The table's rows (text) for one design's rows of results."""
    out = []
    if "facts" not in d:
        return out
    cells = d[d["scenario"].isin(LOAD_SCENARIOS)]
    order = cells["scenario"].map(LOAD_SCENARIOS.index)  # single-server runs first, then fleets
    for _, r in cells.iloc[order.argsort(kind="stable")].iterrows():
        facts = r["facts"] if isinstance(r["facts"], dict) else {}
        runs = facts.get("load_runs") or []
        fleet = sorted({run["endpoint"] for run in runs}) if r["scenario"] == "mixed-fleet" \
            else []
        order = list(dict.fromkeys(run["endpoint"] for run in runs))  # the client's --rpc order
        for run in runs:
            profile = run.get("client_loadprof")
            hashing = _s(profile["hash_s"]) if profile else f"{_s(run['hashing_s'])} w"
            server = (f"fleet {order.index(run['endpoint']) + 1}/{len(order)}: {run['server']}"
                      if fleet else f"{r['server_role']}: {run['server']}")
            out.append([f"{r['client_role']}: {r['client']}", server,
                        "on" if r["cache"] else "off", run["run"], _s(run["upload_span_s"]),
                        _s(run["wall_s"]), hashing, _s(run["wire_s"]), _s(run["gaps_s"]),
                        str(run["set_tensor"]), f"{run['set_tensor_bytes'] / MIB:.1f}",
                        str(run["set_tensor_hash"]), str(run["cache_hits"]),
                        _client_loadprof(profile), _server_loadprof(run.get("server_loadprof")),
                        "= local" if run["equal"] else "DIFFERS"])
    return out


def markdown_table(d: pd.DataFrame) -> list[str]:
    rows = load_rows(d)
    if not rows:
        return []
    return (["**model load (seed 000's table, from the wire and the load profilers)**", "",
             "| " + " | ".join(HEADERS) + " |", "|---" * len(HEADERS) + "|"]
            + ["| " + " | ".join(row) + " |" for row in rows] + [""])
