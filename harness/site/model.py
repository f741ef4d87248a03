"""What the site shows, computed from history records: no HTML here.

Runs are ordered by the time they ended. For each design the newest run that has it is the
index's grid; a cell's verdict in that run is compared with its verdict in the newest earlier
run that had the same cell (a change is dated by both runs). Builds are every client and
server named by a cell, with what the run records said about them.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from ..history.store import (BenchRecord, BisectRecord, BuildFacts, CampaignRecord, CellRecord,
                             RunRecord, SuiteRecord)


@dataclass
class Change:
    cell: CellRecord  # the newest
    before: CellRecord  # the same cell in the newest earlier run that had it


@dataclass
class Site:
    runs: list[RunRecord]  # oldest first
    cells: list[CellRecord]
    campaigns: list[CampaignRecord]
    bench: list[BenchRecord]
    bisects: list[BisectRecord]
    suites: list[SuiteRecord] = field(default_factory=list)  # test suite runs, oldest first
    run_folders: dict[str, str] = field(default_factory=dict)  # run id -> folder in the site
    by_cell: dict[str, list[CellRecord]] = field(default_factory=dict)  # oldest first
    builds: dict[str, BuildFacts] = field(default_factory=dict)

    @classmethod
    def from_records(cls, records) -> "Site":
        kinds = defaultdict(list)
        for r in records:
            kinds[type(r)].append(r)
        cells = sorted(kinds[CellRecord], key=lambda c: (c.time, c.run_id))
        runs = {r.run_id: r for r in kinds[RunRecord]}
        for c in cells:  # a run filed with cells but no run line (none today) still shows
            runs.setdefault(c.run_id, RunRecord(run_id=c.run_id, time=c.time))
        site = cls(runs=sorted(runs.values(), key=lambda r: (r.time, r.run_id)), cells=cells,
                   campaigns=sorted(kinds[CampaignRecord], key=lambda c: c.time),
                   bench=sorted(kinds[BenchRecord], key=lambda b: b.time),
                   bisects=sorted(kinds[BisectRecord], key=lambda b: b.time),
                   suites=sorted(kinds[SuiteRecord], key=lambda s: s.time))
        for c in cells:
            site.by_cell.setdefault(c.cell_id, []).append(c)
        for run in site.runs:  # newest facts win
            for b in run.builds:
                site.builds[b.name] = b
        for c in cells:
            for name, dialect in ((c.client, c.client_dialect), (c.server, c.server_dialect)):
                site.builds.setdefault(name, BuildFacts(name=name, dialect=dialect))
        return site

    def designs(self) -> list[str]:
        seen: dict[str, None] = {}
        for c in self.cells:
            seen.setdefault(c.design)
        return list(seen)

    def newest(self, design: str) -> tuple[RunRecord | None, list[CellRecord]]:
        """The newest run that has ``design``, and its cells of that design."""
        runs = {c.run_id for c in self.cells if c.design == design}
        latest = next((r for r in reversed(self.runs) if r.run_id in runs), None)
        if latest is None:
            return None, []
        return latest, [c for c in self.cells if c.run_id == latest.run_id and c.design == design]

    def previous(self, cell: CellRecord) -> CellRecord | None:
        history = self.by_cell.get(cell.cell_id, [])
        earlier = [c for c in history if (c.time, c.run_id) < (cell.time, cell.run_id)]
        return earlier[-1] if earlier else None

    def changes(self, design: str) -> list[Change]:
        _, cells = self.newest(design)
        out = []
        for c in cells:
            before = self.previous(c)
            if before is not None and before.verdict != c.verdict:
                out.append(Change(c, before))
        return out

    def design_counts(self, design: str) -> list[tuple[RunRecord, dict[str, int]]]:
        """(run, verdict -> cells) of ``design`` in every run that has it, oldest first."""
        counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for c in self.cells:
            if c.design == design:
                counts[c.run_id][c.verdict] += 1
        return [(r, dict(counts[r.run_id])) for r in self.runs if r.run_id in counts]

    def cells_of_build(self, name: str) -> list[tuple[str, CellRecord]]:
        """(role, cell) of every cell ``name`` took part in, newest run first."""
        out = [("client" if c.client == name else "server", c) for c in self.cells
               if name in (c.client, c.server)]
        return sorted(out, key=lambda rc: (-rc[1].time, rc[1].design, rc[1].cell_id))
