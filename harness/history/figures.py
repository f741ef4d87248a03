"""Measured figures in prose, written from the history records they were measured in.

A document marks a figure it quotes with the record it comes from::

    <!-- figure run:run-20261204-190000-1234 -->628 cells: 544 pass, 84 skip; 36.8 MiB in
    5,991 files<!-- /figure -->

``harness history figures DOC --store STORE`` renders every marked figure from the store's
record (:data:`RENDERERS`, one entry per record kind) and says which ones the text no longer
matches; ``--write`` puts the rendered text in; ``--add FOLDER`` files a report folder's
summary record into the store first (its machine path left out: such a store is committed).
So a figure in a document is what a command printed from a measurement, and a test can hold
the document to it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from .errors import HistoryError
from .store import CampaignRecord, RunRecord, _Record

BLOCK = re.compile(r"<!-- figure (?P<kind>[a-z]+):(?P<id>[^ ]+) -->(?P<text>.*?)<!-- /figure -->",
                   re.S)


def _run(r: RunRecord) -> str:
    counts = dict(r.counts)
    parts = [f"{counts.pop(v, 0):,} {v}" for v in ("pass", "skip")]
    parts += [f"{n:,} {v}" for v, n in sorted(counts.items())]
    size = f"; {r.size_bytes / (1 << 20):.1f} MiB in {r.files:,} files" \
        if r.size_bytes is not None and r.files is not None else ""
    return f"{r.cells:,} cells: {', '.join(parts)}{size}"


def _campaign(r: CampaignRecord) -> str:
    found = sum(r.findings.values())
    findings = f"{found:,} finding{'s' * (found != 1)}" + \
        (f" ({r.replayed:,} replay)" if r.replayed is not None and found else "")
    if r.rate is not None and r.messages is not None:
        # a rate with what it counted: messages on connections, or in-process executions
        if r.engine == "libfuzzer":
            return f"{r.rate:,.0f} executions/s ({r.messages:,} executions), {findings}"
        counts = [f"{r.messages:,} messages"]
        counts += [f"{n:,} {what}" for n, what in ((r.cases, "connections"),
                                                   (r.restarts, "restarts")) if n is not None]
        return f"{r.rate:,.0f} messages/s ({', '.join(counts)}), {findings}"
    seconds = f" in {r.seconds:,.0f} s" if r.seconds is not None else ""
    messages = f"{r.messages:,} messages{seconds}" if r.messages is not None else "?"
    return f"{messages}, {findings}"


# record kind -> how a figure of that record reads (a new kind of figure: one entry here)
RENDERERS: dict[str, Callable] = {"run": _run, "campaign": _campaign}


@dataclass(frozen=True)
class QuotedFigure:
    kind: str
    record_id: str
    said: str  # the document's text, whitespace folded
    measured: str | None  # rendered from the record (None: no such record)

    @property
    def stale(self) -> bool:
        return self.measured is None or self.said != self.measured


def _fold(text: str) -> str:
    return " ".join(text.split())


def _records(store: Iterable[_Record]) -> dict[tuple[str, str], _Record]:
    return {(r.kind, r.run_id): r for r in store if r.kind in RENDERERS}


def figures(text: str, store: Iterable[_Record]) -> list[QuotedFigure]:
    """Every marked figure of ``text``, with what its record says."""
    held = _records(store)
    out = []
    for m in BLOCK.finditer(text):
        record = held.get((m["kind"], m["id"]))
        out.append(QuotedFigure(m["kind"], m["id"], _fold(m["text"]),
                                RENDERERS[m["kind"]](record) if record is not None else None))
    return out


def rewrite(text: str, store: Iterable[_Record]) -> str:
    """``text`` with every marked figure rendered from its record (one it lacks: an error)."""
    held = _records(store)

    def one(m: re.Match) -> str:
        record = held.get((m["kind"], m["id"]))
        if record is None:
            raise HistoryError(f"no {m['kind']} record {m['id']} in the store")
        said, measured = m["text"], RENDERERS[m["kind"]](record)
        if _fold(said) == measured:
            return m.group(0)  # as wrapped in the document
        return f"<!-- figure {m['kind']}:{m['id']} -->{measured}<!-- /figure -->"
    return BLOCK.sub(one, text)


def summary_records(folder: Path) -> list[_Record]:
    """The records of a report folder that figures are made of (a run's totals, a campaign),
    as the run filed them when it ended (the history store beside the folder: what came into
    the folder later, a screenshot, is no part of the run's size), else as read from the
    folder now; without the folder's path on this machine."""
    from .ingest import records_from
    from .store import HISTORY_NAME, read
    found = [r for r in records_from(folder) if r.kind in RENDERERS]
    if not found:
        raise HistoryError(f"{folder}: no run or campaign record to quote")
    filed = {(r.kind, r.run_id): r for r in read(Path(folder).parent / HISTORY_NAME)}
    out = []
    for r in found:
        kept = filed.get((r.kind, r.run_id), r)
        # a field the record filed then did not have yet is read from the folder
        later = {k: v for k, v in r if getattr(kept, k, None) is None and v is not None}
        out.append(kept.model_copy(update={**later, "folder": None}))
    return out
