"""Run conformance cases against a live server and report outcome versus expectation."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from . import feature_cases  # noqa: F401  (registers the cases of features beyond 7.0.0)
from .cases import CASES, CaseError, ConformanceCase
from ..proto import DEFAULT
from .raw import ANSWERED, CLOSED, OPEN, RawSession


@dataclass
class CaseResult:
    case: ConformanceCase
    outcome: str  # CLOSED | OPEN | ANSWERED | "error"
    detail: str
    expected: str = ""  # what the real server of the session's dialect does

    @property
    def ok(self) -> bool:
        return self.outcome == self.expected


def run_case(case: ConformanceCase, host: str, port: int, *, dialect: str = DEFAULT.name,
             timeout: float = 5.0, observe_wait: float = 0.5,
             close_wait: float = 5.0) -> CaseResult:
    """Run one case and observe what the server does next: within ``observe_wait`` for a case
    that expects the connection to stay open (the whole wait is paid), within ``close_wait``
    for one that expects a close or an answer (the wait ends when it comes: a loaded machine
    must not turn a late close into 'open')."""
    opened: list[RawSession] = []

    def new() -> RawSession:
        s = RawSession(host, port, dialect=dialect, timeout=timeout)
        opened.append(s)
        return s

    expected = case.expect_for(dialect)
    s = None
    try:
        try:
            s = case.run(new)
        except CaseError as e:
            return CaseResult(case, "error", f"intermediate answer differed: {e}", expected)
        except (ConnectionError, OSError) as e:
            # A close while the case was still talking is itself an outcome.
            return CaseResult(case, CLOSED, f"closed during the case: {type(e).__name__}: {e}",
                              expected)
        except Exception as e:  # a decoding error: the server answered something odd
            return CaseResult(case, "error", f"{type(e).__name__}: {e}", expected)
        outcome, detail = s.observe(observe_wait if expected == OPEN
                                    else max(observe_wait, close_wait))
        return CaseResult(case, outcome, detail, expected)
    finally:
        for x in opened:
            x.close()


def cases_for(dialect: str) -> list[ConformanceCase]:
    return [c for c in CASES if c.applies_to(dialect)]


def run_all(host: str, port: int, cases=None, *, dialect: str = DEFAULT.name, workers: int = 1,
            **kw) -> list[CaseResult]:
    """Every case, in order; ``workers`` > 1 runs that many at once (each case opens its own
    connections, so a server that serves connections concurrently takes them in parallel)."""
    todo = list(cases or cases_for(dialect))
    if workers <= 1:
        return [run_case(c, host, port, dialect=dialect, **kw) for c in todo]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda c: run_case(c, host, port, dialect=dialect, **kw), todo))


VECTOR_OUTCOMES = {"reset": CLOSED, "eof": CLOSED, "timeout": OPEN, "ok": ANSWERED}
