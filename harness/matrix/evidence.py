"""Every verdict rests on wire evidence: what must have crossed the cell's wire for its outcome.

A scenario names the commands its verdict rests on (``Scenario.evidence``: each entry a
command, or alternatives ``"SET_TENSOR|SET_TENSOR_HASH"``) and how many connections it opens
(``Scenario.evidence_connections``). After the scenario ran, the cell's own transcripts must
show that many connections, each opened with the client's HELLO, and, for a working outcome,
every evidence command sent by the client at least once. A rejection rests on the HELLO alone.
The checks join the observation's, so a missing one fails the cell like any failed check: a
scenario (or a client) that reports success without the traffic cannot pass.
"""

from __future__ import annotations

from ..proto import Cmd, get_dialect
from ..scenario import DEGRADED, WORKS, Check, Observation, Scenario


def wire_evidence(scenario: Scenario, obs: Observation, sessions: list, client_dialect: str
                  ) -> list[Check]:
    opened = [s for s in sessions if s.commands]
    working = obs.outcome in (WORKS, DEGRADED)
    want = scenario.evidence_connections if working else 1
    checks = [Check("wire evidence: the client's connections reached the server",
                    len(opened) >= want, f"{len(opened)} connection(s) carried a command, "
                                          f"{want} needed"),
              Check("wire evidence: every connection opened with HELLO",
                    all(s.commands[0] == Cmd.HELLO for s in opened),
                    ", ".join(s.commands[0].name for s in opened) or "no connection")]
    if not working:
        return checks
    dialect = get_dialect(client_dialect)
    sent = {c for s in sessions for c in s.commands}
    for entry in scenario.evidence:
        options = [Cmd[name] for name in entry.split("|")]
        if not any(dialect.has(c) for c in options):
            continue  # a command this dialect does not have is no evidence it can give
        checks.append(Check(f"wire evidence: {entry} crossed the wire", bool(sent & set(options)),
                            f"the client sent {', '.join(sorted(c.name for c in sent)) or 'nothing'}"))
    return checks
