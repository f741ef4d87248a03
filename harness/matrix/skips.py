"""Which skips a run accepts, and the exit code that follows.

A cell skipped because it does not apply (a reference client cannot run llama-simple) is a
property of the matrix and never fails a run. A cell skipped because something is missing
here (a real peer is not built, llama-simple is absent, no RDMA device) would turn evidence
into silence, so it fails the run unless the run names it: ``--allow-skip REASON`` accepts a
skip whose code equals REASON (``peer-missing``, ``program-missing``, ``device-missing``) or
whose reason or missing thing contains REASON (``p8``, ``llama-simple``). A cell skipped on a
build error (``build-error``: the soft verbs device did not compile) is never accepted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from ..scenario import BUILD_ERROR, NOT_APPLICABLE, SKIP_CODES

NOT_FAILURES = ("pass", "skip")  # verdicts that fail nothing by themselves


@dataclass(frozen=True)
class AllowSkip:
    reasons: tuple[str, ...] = ()

    @classmethod
    def parse(cls, items: Iterable[str] | None) -> "AllowSkip":
        """Repeated options and comma-separated lists alike: ``-a p8 -a peer-missing,p3``."""
        out = []
        for item in items or ():
            out += [r.strip() for r in item.split(",") if r.strip()]
        return cls(tuple(out))

    def allows(self, row: dict) -> bool:
        code = row.get("skip_code")
        if code == NOT_APPLICABLE:
            return True
        if code == BUILD_ERROR:
            return False  # a build error is a failure, whatever --allow-skip names
        text = " ".join(str(row.get(k) or "") for k in ("reason", "skip_missing")).lower()
        return any(r == code or (r not in SKIP_CODES and r.lower() in text)
                   for r in self.reasons)


def refused_skips(rows: Iterable[dict], allow: AllowSkip) -> list[dict]:
    """The skipped cells this run does not accept."""
    return [r for r in rows if r["verdict"] == "skip" and not allow.allows(r)]


def exit_code(rows: list[dict], allow: AllowSkip) -> int:
    bad = [r for r in rows if r["verdict"] not in NOT_FAILURES]
    return 1 if bad or refused_skips(rows, allow) else 0


def describe_refused(rows: Iterable[dict]) -> list[str]:
    """One line per missing thing, with how many cells it cost and the first reason."""
    by_missing: dict[str, list[dict]] = {}
    for r in rows:
        key = r.get("skip_missing") or r.get("reason") or "?"
        by_missing.setdefault(key, []).append(r)
    lines = []
    for missing, group in sorted(by_missing.items()):
        code = group[0].get("skip_code") or "unknown"
        lines.append(f"{missing} ({code}, {len(group)} cell{'s' * (len(group) != 1)}): "
                     f"{group[0]['reason']}")
    return lines
