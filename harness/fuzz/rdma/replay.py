"""``harness replay FILE --transport rdma-soft --target PEER``: a saved RDMA finding, again.

FILE is a reproducer folder, its ``repro.json`` or ``finding.json``. The target's ``+rdma``
build is started fresh on the soft device, the case runs once (then the liveness client, as in
the campaign), everything is stopped, and the observation is compared with the signature the
reproducer was saved with, by the one replay rule (:func:`..signature.reproduces`).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..signature import Signature, reproduces
from .campaign import REPRO_FORMAT, RdmaOutcome, RdmaSession, resolve_target
from .plans import RdmaCase


def reproducer_path(path: str | Path) -> Path | None:
    """The ``repro.json`` that ``path`` names (folder, repro.json, finding.json), or None when
    it is not an RDMA reproducer."""
    path = Path(path)
    cand = path / "repro.json" if path.is_dir() else path
    if cand.name == "finding.json":
        cand = cand.with_name("repro.json")
    try:
        return cand if json.loads(cand.read_text()).get("format") == REPRO_FORMAT else None
    except (OSError, ValueError, AttributeError):
        return None


@dataclass
class RdmaReplayResult:
    expected: Signature | None
    observation: RdmaOutcome
    target: str
    case: RdmaCase

    @property
    def observed(self) -> Signature | None:
        return self.observation.signature

    @property
    def reproduced(self) -> bool:
        return reproduces(self.expected, self.observed)

    def summary(self) -> str:
        o = self.observation
        lines = [f"target   : {self.target} over the soft verbs device "
                 f"({len(self.case.requests)} requests, {len(self.case.writes)} writes, "
                 f"SEND plan {self.case.plan.get('what')})",
                 f"expected : {self.expected.title() if self.expected else '(none saved)'}",
                 "observed : " + (self.observed.title() if self.observed else
                                   f"nothing: {o.result.get('verdict')}, the target survived"
                                   + (f", liveness {o.result['liveness']}"
                                      if "liveness" in o.result else ""))]
        if o.detail:
            lines.append(f"detail   : {o.detail}")
        lines.append("REPRODUCED" if self.reproduced else "not reproduced")
        return "\n".join(lines)


def replay_rdma(path: str | Path, target: str, *, deadline: float | None = None,
                ) -> RdmaReplayResult:
    repro = reproducer_path(path)
    if repro is None:
        raise ValueError(f"{path} is not an RDMA reproducer ({REPRO_FORMAT} repro.json)")
    data = json.loads(repro.read_text())
    case = RdmaCase.from_json(data["case"])
    expected = Signature.from_json(data["signature"]) if data.get("signature") else None
    spec = resolve_target(target)
    work = Path(tempfile.mkdtemp(prefix="harness-rdma-replay-"))
    session = RdmaSession(spec, work, deadline=deadline or data.get("deadline_s", 2.0))
    try:
        session.start()
        obs = session.observe(case)
    finally:
        session.close()
        shutil.rmtree(work, ignore_errors=True)
    return RdmaReplayResult(expected, obs, spec.name, case)
