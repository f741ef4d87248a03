"""Run conformance cases against a live server and report outcome versus expectation."""

from __future__ import annotations

from dataclasses import dataclass

from .cases import CASES, Case, CaseError
from .raw import ANSWERED, CLOSED, OPEN, RawSession


@dataclass
class CaseResult:
    case: Case
    outcome: str  # CLOSED | OPEN | ANSWERED | "error"
    detail: str

    @property
    def ok(self) -> bool:
        return self.outcome == self.case.expect


def run_case(case: Case, host: str, port: int, *, dialect: str = "7.0.0",
             timeout: float = 5.0, observe_wait: float = 0.5) -> CaseResult:
    opened: list[RawSession] = []

    def new() -> RawSession:
        s = RawSession(host, port, dialect=dialect, timeout=timeout)
        opened.append(s)
        return s

    s = None
    try:
        try:
            s = case.run(new)
        except CaseError as e:
            return CaseResult(case, "error", f"intermediate answer differed: {e}")
        except (ConnectionError, OSError) as e:
            # A close while the case was still talking is itself an outcome.
            return CaseResult(case, CLOSED, f"closed during the case: {type(e).__name__}: {e}")
        except Exception as e:  # a decoding error: the server answered something odd
            return CaseResult(case, "error", f"{type(e).__name__}: {e}")
        outcome, detail = s.observe(observe_wait)
        return CaseResult(case, outcome, detail)
    finally:
        for x in opened:
            x.close()


def run_all(host: str, port: int, cases=None, **kw) -> list[CaseResult]:
    return [run_case(c, host, port, **kw) for c in (cases or CASES)]


VECTOR_OUTCOMES = {"reset": CLOSED, "eof": CLOSED, "timeout": OPEN, "ok": ANSWERED}
