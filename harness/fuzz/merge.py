"""``harness fuzz-merge``: the folders of several campaigns (the shards of a CI matrix, or
campaigns of different days) as one campaign.

* **corpus** -- every entry of every ``corpus/``, duplicates (same steps) dropped, then the
  smallest set that keeps every recorded behaviour feature (greedy, smallest cases first, as
  afl-cmin does with edges): the seed corpus of the next campaign (``--corpus``);
* **findings** -- one reproducer folder per signature (the one with the fewest steps);
* **report** -- counts summed, coverage recomputed from the shards' raw counts, elapsed time
  the longest shard's (shards run side by side), and the shards that are missing from
  ``1..N`` named.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections import Counter
from pathlib import Path

from .errors import FuzzError
from ..capture.transcript import Transcript
from .report import build_report_from_parts, write_report

_SUMMED = ("messages_sent", "bytes_sent", "cases", "generated_cases", "evolved_cases",
           "restarts", "shrink_attempts", "verdicts", "duplicates", "unconfirmed", "workers")


class MergeError(FuzzError, ValueError):
    """The folders cannot be merged (no report, different targets)."""


def merge_campaigns(out: Path, folders: list[Path]) -> dict:
    """Merge campaign ``folders`` into ``out``; returns the merged report."""
    reports = []
    for f in folders:
        try:
            reports.append(json.loads((Path(f) / "report.json").read_text()))
        except (OSError, ValueError) as e:
            raise MergeError(f"{f}: no campaign report ({e})") from None
    targets = {r["target"] for r in reports}
    if len(targets) != 1:
        raise MergeError(f"campaigns of different targets: {', '.join(sorted(targets))}")
    out = Path(out)
    for sub in ("corpus", "crashes"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    kept = _merge_corpus(out / "corpus", [Path(f) / "corpus" for f in folders])
    findings = _merge_findings(out, [Path(f) for f in folders], reports)
    report = _merge_reports(reports, findings, [str(f) for f in folders])
    report["corpus_merged"] = kept
    write_report(out, report)
    return report


def _case_key(meta: dict) -> str:
    steps = meta.get("case", {}).get("steps", [])
    return hashlib.sha1(json.dumps(steps, sort_keys=True).encode()).hexdigest()


def _merge_corpus(dest: Path, sources: list[Path]) -> dict:
    entries = {}
    for src in sources:
        for path in sorted(src.glob("*.rpct")):
            try:
                meta = Transcript.load(path).meta.get("fuzz", {})
            except (OSError, ValueError, KeyError):
                continue
            key = _case_key(meta)
            if key not in entries:
                entries[key] = (path, meta)
    # Smallest first; an entry stays if it has a feature none of the kept ones has.
    ordered = sorted(entries.values(),
                     key=lambda pm: len(pm[1].get("case", {}).get("steps", [])))
    seen: set = set()
    kept = 0
    for path, meta in ordered:
        feats = {json.dumps(f) for f in meta.get("features", [])} or {path.name}
        if feats <= seen:
            continue
        seen |= feats
        kept += 1
        shutil.copyfile(path, dest / f"m-{kept:05d}.rpct")
    return {"entries_read": len(entries), "entries_kept": kept, "features": len(seen)}


def _merge_findings(out: Path, folders: list[Path], reports: list[dict]) -> list[dict]:
    best: dict[str, tuple[dict, Path]] = {}
    for folder, r in zip(folders, reports):
        for f in r.get("findings", []):
            prev = best.get(f["id"])
            if prev is None or f.get("steps", 1 << 30) < prev[0].get("steps", 1 << 30):
                best[f["id"]] = (f, folder / "crashes" / f["id"])
    merged = []
    for fid, (f, src) in sorted(best.items()):
        dest = out / "crashes" / fid
        if src.is_dir() and src.resolve() != dest.resolve():
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(src, dest)
        target = f["replay"].split("--target", 1)[-1].strip()
        merged.append({**f, "replay": f"harness replay {dest}/repro.rpct --target {target}"})
    return merged


def _merge_reports(reports: list[dict], findings: list[dict], folders: list[str]) -> dict:
    first = reports[0]
    totals = {k: sum(r.get(k) or 0 for r in reports) for k in _SUMMED}
    coverage = Counter()
    statuses, timing = Counter(), Counter()
    for r in reports:
        coverage.update(r.get("coverage_counts", {}))
        statuses.update(r.get("statuses", {}))
        timing.update(r.get("timing_s", {}))
    shards = sorted({tuple(r.get("shard", [1, 1])) for r in reports})
    n = max(s[1] for s in shards)
    missing = sorted(set(range(1, n + 1)) - {s[0] for s in shards if s[1] == n})
    elapsed = max(r.get("elapsed_s", 0) for r in reports)
    errors = [{**e, "campaign": folder} for r, folder in zip(reports, folders)
              for e in r.get("errors", [])]
    return build_report_from_parts(
        first, totals=totals, elapsed=elapsed, coverage=coverage, statuses=dict(statuses),
        timing=dict(timing), findings=findings, errors=errors,
        rss_peak=max(r.get("rss_peak_bytes") or 0 for r in reports),
        extra={"merged_from": folders, "shard": None, "shards": [list(s) for s in shards],
               "shards_missing": missing,
               "duration_s": max(r.get("duration_s", 0) for r in reports),
               "seed": sorted({r.get("seed") for r in reports}, key=str),
               "behaviours": sum(r.get("behaviours", 0) for r in reports),
               "corpus_entries": sum(r.get("corpus_entries", 0) for r in reports),
               "workers_never_listened": [], "problems": [
                   p for r in reports for p in r.get("problems", [])]})
