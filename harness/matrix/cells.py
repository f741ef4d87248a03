"""Expanding matrix.yaml into cells, and finding the expectation of each."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterable

from ..scenario import SCENARIOS
from .model import CELLS, Expectation, Matrix
from .releases import predict

RELEASES = "releases"


@dataclass(frozen=True)
class Cell:
    design: str
    client_role: str
    server_role: str
    client: str  # implementation names
    server: str
    cache: bool
    scenario: str
    transport: str = "tcp"

    @property
    def pair(self) -> str:
        return f"{self.client_role}/{self.server_role}"

    @property
    def id(self) -> str:
        base = (f"{self.design}:{self.client}_{self.server}"
                f"{'+cache' if self.cache else ''}:{self.scenario}")
        return base if self.transport == "tcp" else f"{base}@{self.transport}"

    @property
    def folder(self) -> str:
        base = f"{self.design}/{self.client}_{self.server}{'_cache' if self.cache else ''}/{self.scenario}"
        return base if self.transport == "tcp" else f"{base}/{self.transport}"

    @property
    def slug(self) -> str:
        """The id with only characters every CI system accepts in artifact and job names."""
        return self.id.replace(":", "__").replace("+", "_").replace("/", "_").replace("@", "__")

    def to_dict(self) -> dict:
        return {**asdict(self), "id": self.id, "slug": self.slug, "pair": self.pair}


def scenario_cache_options(matrix: Matrix, scenario: str) -> list[bool]:
    if scenario in matrix.cache_options:
        return list(matrix.cache_options[scenario])
    return list(SCENARIOS[scenario].cache_options[:1])


def expand(matrix: Matrix, *, designs: Iterable[str] | None = None,
           client_role: str | None = None, server_role: str | None = None,
           scenarios: Iterable[str] | None = None,
           transports: Iterable[str] | None = None) -> list[Cell]:
    """All cells of the four-way designs, optionally narrowed by design, roles, scenarios and
    transports."""
    wanted = list(scenarios) if scenarios else matrix.scenarios
    cells = []
    for dname, design in matrix.designs.items():
        if designs and dname not in designs:
            continue
        for crole, srole in CELLS:
            if client_role and crole != client_role or server_role and srole != server_role:
                continue
            for transport in design.transports or matrix.transports:
                if transports and transport not in transports:
                    continue
                for scen in wanted:
                    if design.scenarios is not None and scen not in design.scenarios:
                        continue
                    for cache in scenario_cache_options(matrix, scen):
                        cells.append(Cell(dname, crole, srole, design.roles[crole],
                                          design.roles[srole], cache, scen, transport))
    return cells


def release_cells(matrix: Matrix, peers: Iterable[str] | None = None) -> list[Cell]:
    if matrix.releases is None:
        return []
    names = list(peers) if peers else matrix.releases.peers
    return [Cell(RELEASES, f"client {c}", f"server {s}", c, s, False, matrix.releases.scenario)
            for c in names for s in names]


def expectation_for(matrix: Matrix, cell: Cell) -> Expectation:
    """The version rule for a releases cell (its builds' dialects); else the first of
    matrix.yaml's ``expectations`` that matches the cell, and where none does, the version rule
    on the two implementations' dialects (``releases.predict``: the HELLO layout, then
    ``client_accepts``)."""
    if cell.design == RELEASES:  # registry builds, not matrix.yaml's implementations
        from ..impls.adapters import adapter_for_peer
        return predict(adapter_for_peer(cell.client).dialect,
                       adapter_for_peer(cell.server).dialect)
    for e in matrix.expectations:
        designs = [e.design] if isinstance(e.design, str) else e.design
        if designs is not None and cell.design not in designs:
            continue
        if e.transport is not None and e.transport != cell.transport:
            continue
        if e.cell is not None and e.cell != cell.pair:
            continue
        if e.cache is not None and e.cache != cell.cache:
            continue
        if e.scenario is not None and e.scenario != cell.scenario:
            continue
        return e
    return predict(matrix.implementations[cell.client].proto,
                   matrix.implementations[cell.server].proto)


def find_cell(cells: list[Cell], key: str) -> Cell:
    for c in cells:
        if key in (c.id, c.slug):
            return c
    raise KeyError(key)
