"""From an observation and an expectation to a verdict, with the first differing fact."""

from __future__ import annotations

from dataclasses import dataclass

from ..impls.driver import ExitInfo
from ..report.glyphs import VERDICTS
from ..scenario import DEGRADED, FAILED, REJECTED, Observation, Skip
from .model import Expectation

PASS, FAIL, CRASH, HANG, ERROR, SKIP = VERDICTS


@dataclass
class Verdict:
    verdict: str
    reason: str
    skip: Skip | None = None  # SKIP: why, and whether something is missing


def describe(expect: Expectation) -> str:
    text = expect.outcome
    if expect.outcome == DEGRADED and expect.degraded:
        text += f" ({', '.join(expect.degraded)})"
    if expect.outcome == REJECTED:
        text += f" by the {expect.side or 'either'} side"
        if expect.message:
            text += f" with '{expect.message}'"
    if expect.outcome == FAILED and expect.signature:
        text += f" with signature '{expect.signature}'"
    return text


def judge(expect: Expectation, obs: Observation | None, *, skip: Skip | None = None,
          error: str | None = None, hang: str | None = None,
          server_exit: ExitInfo | None = None) -> Verdict:
    if skip:
        return Verdict(SKIP, skip.reason, skip)
    if error:
        return Verdict(ERROR, error)
    if server_exit is not None and (server_exit.signal or server_exit.aborted):
        tail = " | ".join(server_exit.log_tail[-3:])
        return Verdict(CRASH, f"server died: rc={server_exit.returncode} "
                              f"signal={server_exit.signal} {server_exit.message} :: {tail}")
    if hang:
        return Verdict(HANG, hang)
    if obs is None:
        return Verdict(ERROR, "the scenario produced no observation")
    if obs.misconfigured:
        return Verdict(ERROR, f"misconfigured: {obs.misconfigured}")
    if obs.signature and obs.signature.startswith("client-crash"):
        return Verdict(CRASH, obs.signature)
    if obs.outcome != expect.outcome:
        detail = obs.message or obs.signature or ", ".join(c.name for c in obs.failed_checks)
        return Verdict(FAIL, f"expected {describe(expect)}, observed {obs.outcome}"
                             + (f": {detail}" if detail else ""))
    if expect.outcome == DEGRADED:
        missing = [d for d in expect.degraded if d not in obs.degraded]
        if missing:
            return Verdict(FAIL, f"expected degradation '{missing[0]}', observed {obs.degraded}")
    if expect.outcome == REJECTED:
        if expect.side and obs.rejected_by != expect.side:
            return Verdict(FAIL, f"expected rejection by the {expect.side}, observed by the "
                                 f"{obs.rejected_by}: {obs.message}")
        if expect.message and expect.message not in obs.message:
            return Verdict(FAIL, f"expected rejection message containing '{expect.message}', "
                                 f"observed '{obs.message}'")
    if expect.outcome == FAILED and expect.signature and expect.signature not in (obs.signature or ""):
        return Verdict(FAIL, f"expected failure signature '{expect.signature}', observed "
                             f"'{obs.signature}'")
    bad = obs.failed_checks
    if bad:
        return Verdict(FAIL, f"check failed: {bad[0].name} ({bad[0].evidence})")
    return Verdict(PASS, describe(expect))
