"""The load profiler records a seed-000 C build prints itself (GGML_RPC_LOADPROF=1), parsed.

``patches/seed000-server-flags.patch`` makes both the client library and ggml-rpc-server print
one record per connection to stderr when the connection ends (the client when its dispatcher
goes away, i.e. after the program freed the connection's buffers and backends; the server
when the client leaves). The format, one record per line, space-separated ``key=value``:

    ggml-rpc-loadprof side=client|server conn=N endpoint=HOST:PORT|- load_opt=0|1 flags=0xNN
        set_tensor=N bytes=N hash_calls=N hash_hits=N hashed_bytes=N direct=N staged=N
        span_s=F hash_s=F staging_s=F wire_s=F gap_s=F gaps=N max_gap_s=F
    ggml-rpc-loadprof side=client conn=N endpoint=HOST:PORT cmd=NAME count=N time_s=F

(the first record is a single line). The client follows its summary with one ``cmd=`` line
per command it sent. ``conn`` numbers connections within one process. Field meanings are in
the patch header; :class:`harness.capture.upload_timing.UploadTiming` is the same measured
from the wire by the recording proxy.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Iterable

from .errors import CaptureError

PREFIX = "ggml-rpc-loadprof"


class LoadProfError(CaptureError, ValueError):
    """A line carries the profiler's prefix but is not a well-formed record."""


@dataclass
class CommandTime:
    count: int
    time_s: float


@dataclass
class LoadprofRecord:
    side: str
    conn: int
    endpoint: str | None
    load_opt: bool
    flags: int
    set_tensor: int
    bytes: int
    hash_calls: int
    hash_hits: int
    hashed_bytes: int
    direct: int  # server: payloads received straight into the destination
    staged: int  # server: payloads received through a staging buffer
    span_s: float
    hash_s: float
    staging_s: float
    wire_s: float
    gap_s: float
    gaps: int
    max_gap_s: float
    commands: dict[str, CommandTime] = field(default_factory=dict)  # client only

    def to_dict(self) -> dict:
        return asdict(self)


_SUMMARY_FIELDS = [f for f in fields(LoadprofRecord) if f.name != "commands"]


def _convert(name: str, kind, raw: str):
    if name == "endpoint":
        return None if raw == "-" else raw
    if name == "load_opt":
        if raw not in ("0", "1"):
            raise ValueError(raw)
        return raw == "1"
    if name == "flags":
        return int(raw, 16)
    if kind in (int, "int"):
        return int(raw)
    if kind in (float, "float"):
        return float(raw)
    return raw


def _pairs(record: str, lineno: int) -> dict[str, str]:
    out: dict[str, str] = {}
    for token in record.split()[1:]:
        key, sep, value = token.partition("=")
        if not sep or not key or not value:
            raise LoadProfError(f"line {lineno}: {token!r} is not key=value")
        if key in out:
            raise LoadProfError(f"line {lineno}: {key} given twice")
        out[key] = value
    return out


def _parse_summary(kv: dict[str, str], lineno: int) -> LoadprofRecord:
    missing = [f.name for f in _SUMMARY_FIELDS if f.name not in kv]
    extra = sorted(set(kv) - {f.name for f in _SUMMARY_FIELDS})
    if missing or extra:
        raise LoadProfError(f"line {lineno}: missing {missing or 'nothing'}, "
                            f"unknown {extra or 'nothing'}")
    values = {}
    for f in _SUMMARY_FIELDS:
        try:
            values[f.name] = _convert(f.name, f.type, kv[f.name])
        except ValueError:
            raise LoadProfError(f"line {lineno}: bad value {f.name}={kv[f.name]!r}") from None
    if values["side"] not in ("client", "server"):
        raise LoadProfError(f"line {lineno}: side must be client or server, not {values['side']!r}")
    return LoadprofRecord(**values)


def parse_loadprof(lines: Iterable[str]) -> list[LoadprofRecord]:
    """Every record in ``lines`` (a log: other lines are skipped), in the order printed.

    A ``cmd=`` line belongs to the latest summary of the same side, conn and endpoint; one
    without such a summary, or any malformed record, raises LoadProfError naming the line.
    """
    records: list[LoadprofRecord] = []
    latest: dict[tuple, LoadprofRecord] = {}
    for lineno, line in enumerate(lines, 1):
        at = line.find(PREFIX + " ")
        if at < 0:
            continue
        kv = _pairs(line[at:].strip(), lineno)
        if "cmd" in kv:
            if set(kv) != {"side", "conn", "endpoint", "cmd", "count", "time_s"}:
                raise LoadProfError(f"line {lineno}: a cmd record has side, conn, endpoint, "
                                    f"cmd, count, time_s; got {sorted(kv)}")
            key = (kv["side"], kv["conn"], kv["endpoint"])
            owner = latest.get(key)
            if owner is None:
                raise LoadProfError(f"line {lineno}: cmd record before the summary of "
                                    f"{kv['side']} conn {kv['conn']}")
            try:
                owner.commands[kv["cmd"]] = CommandTime(int(kv["count"]), float(kv["time_s"]))
            except ValueError:
                raise LoadProfError(f"line {lineno}: bad count or time_s") from None
            continue
        prof = _parse_summary(kv, lineno)
        latest[(kv["side"], kv["conn"], kv["endpoint"])] = prof
        records.append(prof)
    return records


def of_side(records: Iterable[LoadprofRecord], side: str) -> list[LoadprofRecord]:
    return [p for p in records if p.side == side]
