"""Per-run summaries of model loads through a cell's fleet: the wire's upload timing of each
server's connections next to the peers' own load profiler records (the model-load and mixed-fleet
verdicts rest on the wire part)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..capture.upload_timing import UploadTiming, time_uploads
from ..capture.loadprof_log import LoadprofRecord
from ..impls.model_client import ModelRun
from ..proto import Cmd

if TYPE_CHECKING:
    from .context import FleetServer


def run_summary(run: ModelRun) -> dict:
    return {"rc": run.exit.returncode, "signal": run.exit.signal, "message": run.exit.message,
            "seconds": round(run.seconds, 3), "text": run.text, "tokens": run.decoded_tokens}


def sum_loadprof_records(records: list[LoadprofRecord]) -> dict | None:
    """One record for several connections: counts and times add up, the span is the longest."""
    if not records:
        return None
    out: dict = {}
    for rec in records:
        for k, v in rec.to_dict().items():
            if k in ("side", "conn", "endpoint", "commands"):
                continue
            if k in ("span_s", "max_gap_s"):
                out[k] = max(out.get(k, 0.0), v)
            elif k == "flags":
                out[k] = out.get(k, 0) | v
            elif k == "load_opt":
                out[k] = out.get(k, True) and v
            else:
                out[k] = out.get(k, 0) + v
    out["connections"] = len(records)
    return out


# A server prints its load profiler record when the client's connection ends, which may come a
# moment after the proxy saw the connection close.
_PROFILE_SETTLE_S = 5.0


def load_run_row(label: str, member: FleetServer, n_conns: int, n_records: int, rpc: ModelRun,
                  equal: bool, client_records: list[LoadprofRecord]) -> dict:
    transcripts = member.transcripts()[n_conns:]
    wire = UploadTiming()
    client_hellos = 0
    for t in transcripts:
        session = t.decode()
        wire.merge(time_uploads(t, session))
        client_hellos += session.commands[:1] == [Cmd.HELLO]
    records = member.loadprof_records()[n_records:]
    settle = time.monotonic() + _PROFILE_SETTLE_S
    while records and len(records) < len(transcripts) and time.monotonic() < settle:
        time.sleep(0.1)
        records = member.loadprof_records()[n_records:]
    return {"run": label, "server": member.name, "endpoint": member.endpoint, "equal": equal,
            "wall_s": round(rpc.seconds, 4), "connections": len(transcripts),
            "client_hellos": client_hellos,
            "upload_span_s": wire.upload_span, "hashing_s": wire.hashing_seconds,
            "wire_s": wire.wire_seconds, "gaps_s": wire.gap_seconds,
            "set_tensor": wire.set_tensor_calls, "set_tensor_bytes": wire.set_tensor_bytes,
            "set_tensor_hash": wire.hash_calls, "cache_hits": wire.hash_hits,
            "bytes_hashed": wire.bytes_hashed,
            "client_loadprof": sum_loadprof_records(client_records),
            "server_loadprof": sum_loadprof_records(records)}
