"""``harness replay FILE --target PEER``: run a saved finding against a fresh target.

FILE is a reproducer folder, its ``repro.rpct`` or ``finding.json``, a corpus entry, or any
``.rpct`` transcript (without fuzz metadata its client bytes are replayed verbatim, one step
per recorded chunk, without relocation). The target is started fresh in a temporary work
dir, the steps run in lockstep (so the step that breaks it is known exactly), and the outcome
is compared with the signature the file was saved with.

Exit status of the command: 1 when the finding reproduces (like a failing test), 0 when it
does not, 2 when the replay could not run. The observed signature is printed either way.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..capture.transcript import C2S, Transcript
from ..proto import DEFAULT
from .case import Case, annotate, step
from .oracles import OracleLimits, Oracles
from .case_runner import CaseRunner
from .target import DEFAULT_AS_LIMIT, DEFAULT_RSS_LIMIT, Target
from .signature import Signature, reproduces
from .target_spec import TargetSpec


@dataclass
class ReplayResult:
    expected: Signature | None
    observed: Signature | None
    detail: str
    target: str
    steps: int

    @property
    def reproduced(self) -> bool:
        return self.matches(across_builds=False)

    @property
    def reproduced_elsewhere(self) -> bool:
        """Reproduced, judged as for another build than the finding's: an abort that moved to
        another line of the same file, with the same message, is the same bug."""
        return self.matches(across_builds=True)

    def matches(self, *, across_builds: bool) -> bool:
        """The same bug, by the one replay rule (:func:`.signature.reproduces`)."""
        return reproduces(self.expected, self.observed, across_builds=across_builds)

    def summary(self) -> str:
        lines = [f"target   : {self.target} ({self.steps} steps)",
                 f"expected : {self.expected.title() if self.expected else '(no signature saved: nothing to match)'}",
                 f"observed : {self.observed.title() if self.observed else 'nothing: the target survived'}"]
        if self.detail:
            lines.append(f"detail   : {self.detail}")
        lines.append("REPRODUCED" if self.reproduced else "not reproduced")
        return "\n".join(lines)


def load(path: str | Path) -> tuple[Case, Signature | None, dict]:
    """The case, its saved signature (if any) and the saved metadata of a reproducer file."""
    path = Path(path)
    if path.is_dir():
        path = path / "repro.rpct"
    if path.suffix == ".json":
        data = json.loads(path.read_text())
        if "case" in data:
            meta = data
        else:  # finding.json points at its transcript
            return load(path.with_name(data.get("reproducer", "repro.rpct")))
    else:
        tr = Transcript.load(path)
        meta = tr.meta.get("fuzz") if isinstance(tr.meta, dict) else None
        if not meta:
            dialect = tr.meta.get("dialect", DEFAULT.name) if isinstance(tr.meta, dict) \
                else DEFAULT.name
            steps = tuple(step(c.data or bytes(c.length), "RAW") for c in tr.stream(C2S))
            return annotate(dialect, steps), None, {}
    case = Case.from_json(meta["case"])
    sig = Signature.from_json(meta["signature"]) if meta.get("signature") else None
    return case, sig, meta


def replay(path: str | Path, target: str, *, dialect: str | None = None, deadline: float = 5.0,
           workdir: str | Path | None = None, as_limit: int = DEFAULT_AS_LIMIT,
           rss_limit: int = DEFAULT_RSS_LIMIT, oracles: dict | None = None) -> ReplayResult:
    """Start ``target`` fresh, run the reproducer once, stop the target; say what happened.
    ``oracles``: thresholds (OracleLimits JSON), default those the finding was saved with."""
    case, expected, meta = load(path)
    limits = OracleLimits.from_json(oracles if oracles is not None else saved_limits(path))
    spec = TargetSpec.parse(target, dialect or case.dialect)
    with tempfile.TemporaryDirectory(prefix="harness-replay-") as tmp:
        t = Target(spec, Path(workdir or tmp) / "target", as_limit=as_limit, rss_limit=rss_limit,
                   cache=limits.cache)
        t.start()
        try:
            runner = CaseRunner(t, deadline=deadline, oracles=Oracles(t, limits))
            verdict, _ = runner.check(case, lockstep=True, restart=False)
        finally:
            t.stop()
    return ReplayResult(expected, verdict.signature if verdict else None,
                        verdict.detail if verdict else "", spec.name, len(case.steps))


REPRODUCED, NO_FAILURE, OTHER_FAILURE = "reproduced", "no failure", "another failure"


def is_other_build(path: str | Path, target: str) -> bool:
    """True when ``target`` is another build than the one the finding was saved from (or the
    finding does not say): its aborts may sit on other lines."""
    from ..impls.errors import ImplError
    from ..impls.registry import resolve_pin
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    try:
        saved = json.loads((folder / "finding.json").read_text()).get("target")
        return not saved or resolve_pin(saved).key != resolve_pin(target).key
    except (OSError, ValueError, ImplError):
        return True


def replay_outcome(path: str | Path, target: str, **kw) -> tuple[str, ReplayResult]:
    """Replay against ``target`` (any build) and say ``reproduced``, ``no failure`` or
    ``another failure``, judging aborts as moved lines when ``target`` is another build."""
    result = replay(path, target, **kw)
    if result.matches(across_builds=is_other_build(path, target)):
        return REPRODUCED, result
    return (NO_FAILURE if result.observed is None else OTHER_FAILURE), result


def saved_limits(path: str | Path) -> dict:
    """The oracle thresholds a reproducer folder's finding.json was found with ({}: none)."""
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    try:
        return json.loads((folder / "finding.json").read_text()).get("oracles") or {}
    except (OSError, ValueError):
        return {}
