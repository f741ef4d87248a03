"""Differential transcripts: the same scenario in two cells, compared after canonicalising."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .canonical import (WireDivergence, canonical, command_differences, first_divergence,
                        unified_diff)
from .transcript import Transcript


def load_cell_sessions(path: str | Path) -> list[list[dict]]:
    """Canonical sessions of a cell folder (its conn*.rpct), a .rpct file or a pcap."""
    p = Path(path)
    if p.is_dir():
        files = sorted(p.glob("conn*.rpct"), key=lambda f: int(f.stem[4:] or 0))
        transcripts = [Transcript.load(f) for f in files]
    elif p.suffix == ".rpct":
        transcripts = [Transcript.load(p)]
    else:
        from .pcap import read_pcap
        transcripts = read_pcap(p)
    return [canonical(t.decode()) for t in transcripts]


@dataclass
class CellDiff:
    connection: int
    divergence: WireDivergence | None
    diff: list[str]
    a_connections: int
    b_connections: int
    commands: list[str]  # per connection: commands only one side sent


    @property
    def same(self) -> bool:
        return self.divergence is None and self.a_connections == self.b_connections

    def summary(self) -> str:
        if self.same:
            return f"identical ({self.a_connections} connection(s))"
        lines = []
        if self.divergence is None:
            lines.append(f"first {min(self.a_connections, self.b_connections)} connection(s) "
                         f"identical; connection counts differ: {self.a_connections} vs "
                         f"{self.b_connections}")
        else:
            lines.append(f"first divergence: connection {self.connection}: {self.divergence}")
        lines += self.commands
        return "\n".join(lines)


def diff_cells(a: str | Path, b: str | Path, *, context: int = 40) -> CellDiff:
    """First diverging message and field between two cells (connection by connection)."""
    sa, sb = load_cell_sessions(a), load_cell_sessions(b)
    commands = []
    for i in range(max(len(sa), len(sb))):
        x = sa[i] if i < len(sa) else []
        y = sb[i] if i < len(sb) else []
        commands += [f"connection {i}: {d}" for d in command_differences(x, y)]
    for i in range(min(len(sa), len(sb))):
        div = first_divergence(sa[i], sb[i])
        if div:
            return CellDiff(i, div, unified_diff(sa[i], sb[i], str(a), str(b))[:context],
                            len(sa), len(sb), commands)
    return CellDiff(min(len(sa), len(sb)), None, [], len(sa), len(sb), commands)
