"""What a report folder files into the history: a matrix run (results.jsonl), a fuzz campaign
or differential (report.json), a bench run (bench.json), a bisect (bisect.json) or a test
suite's profile (suite-profile.json).

The same functions serve the commands that append as they finish and ``harness history add``
for folders written before (or elsewhere: a CI artifact), so a record says the same whoever
filed it. A folder that is none of these is an error, not an empty result.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

from .errors import HistoryError
from .store import (BenchRecord, BisectRecord, BuildFacts, CampaignRecord, CellRecord,
                    RunRecord, SuiteRecord, append, store_for)

FUZZ_FORMATS = ("ggml-rpc-fuzz-report/", "ggml-rpc-fuzz-differential/")
MAX_REPORT = 256 << 20  # a summary file larger than this is not one this harness wrote
SUITE_PROFILE = "suite-profile.json"  # harness.suite.profile.PROFILE_NAME (it files, we read)
SUITE_FORMAT = "ggml-rpc-suite-profile/"
SUITE_SLOWEST = 20  # the slowest tests a suite record keeps


def folder_size(folder: Path) -> tuple[int, int]:
    """(bytes on disk, files) under ``folder``; links are not followed."""
    total = files = 0
    for root, _, names in os.walk(folder):
        for n in names:
            try:
                st = os.lstat(os.path.join(root, n))
            except OSError:
                continue
            total += st.st_blocks * 512 if hasattr(st, "st_blocks") else st.st_size
            files += 1
    return total, files


def _load_json(path: Path):
    if path.stat().st_size > MAX_REPORT:
        raise HistoryError(f"{path}: {path.stat().st_size:,} bytes: not a report summary")
    try:
        return json.loads(path.read_text())
    except ValueError as e:
        raise HistoryError(f"{path}: not JSON: {e}") from None


def _rows(path: Path) -> list[dict]:
    if path.stat().st_size > MAX_REPORT:
        raise HistoryError(f"{path}: {path.stat().st_size:,} bytes: not a results table")
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except ValueError as e:
                raise HistoryError(f"{path}:{n}: not JSON: {e}") from None
    return rows


def kind_of(folder: Path) -> str:
    folder = Path(folder)
    if (folder / "results.jsonl").is_file():
        return "matrix"
    if (folder / "bench.json").is_file():
        return "bench"
    if (folder / "bisect.json").is_file():
        return "bisect"
    if (folder / "report.json").is_file():
        return "fuzz"
    if (folder / SUITE_PROFILE).is_file():
        return "suite"
    raise HistoryError(f"{folder}: not a report folder (no results.jsonl, report.json, "
                       f"bench.json, bisect.json or {SUITE_PROFILE})")


def records_from(folder: Path, *, run_id: str | None = None, builds=None) -> list:
    """The records of one report folder. ``builds``: a callable name -> BuildFacts extras
    (digest), used for matrix runs; by default what this machine knows (no download)."""
    folder = Path(folder)
    kind = kind_of(folder)
    if kind == "matrix":
        return matrix_records(folder, run_id=run_id, builds=builds)
    if kind == "bench":
        return bench_records(folder, run_id=run_id)
    if kind == "bisect":
        return [bisect_record(folder, run_id=run_id)]
    if kind == "suite":
        return [suite_record(folder, run_id=run_id)]
    return [campaign_record(folder, run_id=run_id)]


def file_report(folder: Path) -> tuple[Path | None, list]:
    """File a folder a command just wrote into the store beside it (``store_for`` its parent):
    (the store or None when filing is off, the records)."""
    folder = Path(folder)
    path = store_for(folder.parent)
    records = records_from(folder)
    if path is not None:
        append(path, records)
    return path, records


def _local_digest(name: str) -> str | None:
    try:
        from ..impls.catalogue import local_class
        return local_class(name)
    except Exception:  # noqa: BLE001 - an unknown build (a user binary, an image) has none
        return None


def matrix_records(folder: Path, *, run_id: str | None = None, builds=None) -> list:
    rows = _rows(folder / "results.jsonl")
    if not rows:
        raise HistoryError(f"{folder}/results.jsonl: no cells")
    ended = (folder / "results.jsonl").stat().st_mtime
    rid = run_id or Counter(str(r.get("run_id") or folder.name) for r in rows).most_common(1)[0][0]
    cells = [CellRecord(run_id=rid, time=ended, **{k: v for k, v in r.items()
                                                   if k not in ("run_id", "time")})
             for r in rows]
    digest = builds or _local_digest
    facts: dict[str, BuildFacts] = {}
    for r in rows:
        for role in ("client", "server"):
            name = r.get(role)
            if name and name not in facts:
                facts[name] = BuildFacts(name=name, kind=r.get(f"{role}_kind"),
                                         dialect=r.get(f"{role}_dialect"), digest=digest(name))
    size, files = folder_size(folder)
    title = ""
    md = folder / "matrix.md"
    if md.is_file():
        title = md.read_text().split("\n", 1)[0].lstrip("# ").strip()
    run = RunRecord(run_id=rid, time=ended, title=title, cells=len(rows),
                    counts=dict(Counter(r["verdict"] for r in rows)), size_bytes=size,
                    files=files, builds=sorted(facts.values(), key=lambda b: b.name),
                    folder=str(folder))
    return [run, *cells]


def campaign_record(folder: Path, *, run_id: str | None = None) -> CampaignRecord:
    path = folder / "report.json"
    r = _load_json(path)
    if not str(r.get("format", "")).startswith(FUZZ_FORMATS):
        raise HistoryError(f"{path}: format {r.get('format')!r} is not a fuzz report")
    ended = path.stat().st_mtime
    findings = Counter()
    for f in r.get("findings") or []:
        sig = f.get("signature") or {}
        findings[str(sig.get("kind") or f.get("kind") or "finding")] += 1
    engine = r.get("engine") or ("differential" if r.get("target_kind") == "differential"
                                 else "rdma-soft" if r.get("transport") == "rdma-soft"
                                 else "live")
    cov = r.get("coverage") or {}
    coverage: dict = {}
    for k in ("mutations_exercised", "mutations_catalogue", "fields_exercised",
              "fields_catalogue"):
        if isinstance(cov.get(k), (int, float)):
            coverage[k] = cov[k]
    for k in ("edges", "features"):
        if isinstance(r.get(k), (int, float)):
            coverage[k] = r[k]
    server = r.get("server_coverage") or {}
    if isinstance(server, dict) and isinstance(server.get("line_percent"), (int, float)):
        coverage["line_percent"] = server["line_percent"]
    in_process = engine == "libfuzzer"
    messages = r.get("executions") if in_process else r.get("messages_sent")
    listed = r.get("findings") or []
    return CampaignRecord(run_id=run_id or f"fuzz:{folder.name}:{int(ended)}", time=ended,
                          target=str(r.get("target", "?")), engine=engine,
                          dialect=r.get("dialect"), seconds=r.get("elapsed_s"),
                          messages=messages, findings=dict(findings), coverage=coverage,
                          replayed=sum(bool(f.get("replays")) for f in listed),
                          rate=r.get("executions_per_s" if in_process else "messages_per_s"),
                          cases=r.get("cases"), restarts=None if in_process else
                          r.get("restarts"), workers=r.get("workers"), seed=r.get("seed"),
                          problems=[str(p) for p in r.get("problems") or []],
                          folder=str(folder))


def bench_records(folder: Path, *, run_id: str | None = None) -> list[BenchRecord]:
    doc = _load_json(folder / "bench.json")
    ended = float(doc.get("started") or 0) + float(doc.get("seconds") or 0) or \
        (folder / "bench.json").stat().st_mtime
    rid = run_id or f"bench:{doc.get('id', folder.name)}"
    return [BenchRecord(run_id=rid, time=ended, figure=f["id"], title=f.get("title", ""),
                        unit=f.get("unit", ""), value=f.get("value"), ratio=f.get("ratio"),
                        met=f.get("met"), failed=f.get("failed"), folder=str(folder))
            for f in doc.get("figures") or []]


def bisect_record(folder: Path, *, run_id: str | None = None) -> BisectRecord:
    path = folder / "bisect.json"
    d = _load_json(path)
    ended = path.stat().st_mtime
    try:
        return BisectRecord(run_id=run_id or f"bisect:{folder.name}:{int(ended)}", time=ended,
                            package=d["package"], good=d["good"], bad=d["bad"],
                            question=d.get("question", ""),
                            first_different=d.get("first_different"),
                            last_same=d.get("last_same"), measured=d.get("measured"),
                            folder=str(folder))
    except KeyError as e:
        raise HistoryError(f"{path}: no {e.args[0]!r}: not a bisect result") from None


def suite_record(folder: Path, *, run_id: str | None = None) -> SuiteRecord:
    path = folder / SUITE_PROFILE
    p = _load_json(path)
    if not str(p.get("format", "")).startswith(SUITE_FORMAT):
        raise HistoryError(f"{path}: format {p.get('format')!r} is not a suite profile")
    try:
        tests = sorted(((str(t["id"]), float(t.get("setup", 0)) + float(t.get("call", 0)) +
                         float(t.get("teardown", 0))) for t in p.get("tests") or []),
                       key=lambda t: -t[1])
        return SuiteRecord(run_id=run_id or p["run_id"], time=float(p["started"]) +
                           float(p["wall"]), wall=p["wall"], workers=p.get("workers") or 0,
                           tests=len(tests), outcomes=p.get("outcomes") or {},
                           test_seconds=round(sum(s for _, s in tests), 1),
                           areas=p.get("areas") or {},
                           slowest=[(i, round(s, 1)) for i, s in tests[:SUITE_SLOWEST]],
                           host=p.get("host") or {}, folder=str(folder))
    except (KeyError, TypeError, ValueError) as e:
        raise HistoryError(f"{path}: not a suite profile: {e}") from None
