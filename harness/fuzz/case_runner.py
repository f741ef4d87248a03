"""Cases against a live target, with the verdict: did this case break it, and how.

Two ways to run a case:

* :meth:`CaseRunner.check` -- in isolation, for confirmation, shrinking and replay: run it,
  then make sure the server is still serving (a throwaway HELLO on a new connection), and
  restart the target if it died, hung or grew too big. Reliable, a little slower.
* :meth:`CaseRunner.run_fast` -- for campaigns: no extra round trips. A connection the server
  closed is judged by the *next* case, whose HELLO answer proves the server survived (a real
  server serves one connection at a time, so the HELLO is only answered once the previous
  connection was fully processed). Only when the next case does not start with a valid
  HELLO is a throwaway HELLO spent.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field, replace

from . import bounds, sanitizer
from .case import Case
from .execute import CLOSED, HANG, OK, PROTOCOL, REFUSED, Executor, Outcome
from .oracles import AMPLIFICATION
from .target import Target
from .signature import Signature, normalise
from ..proto.codec import REQUEST_HEADER_SIZE
from ..proto.wire import announced_length

_NUMBER = re.compile(r"\b\d+\b")
LATE_SLACK = 0.5  # a first-probe answer a little past the deadline (connect time) is not late
HUGE_PREFIX = 1 << 30


@dataclass
class Finding:
    """A case broke the target: how (signature) and the details for the report."""

    signature: Signature
    case: Case
    detail: str = ""
    outcome: Outcome | None = None
    # when it was first seen (time.time): a report's "found after" is this, not the end of
    # the minimisation that follows
    seen_at: float = field(default_factory=time.time)


def culprit(case: Case, out: Outcome | None, *, lockstep: bool = False,
            hang: bool = False) -> str:
    """The command of the step that most likely caused what ``out`` observed.

    A death in a lockstep run shows right after its step. A hang does not: a server stuck in
    a step that has no answer (BUFFER_CLEAR, SET_TENSOR) is only seen when the next request
    goes unanswered, so for a hang every step since the last answer is a suspect and the
    first (or a mutated one) is named."""
    if not case.steps:
        return "NONE"
    if out is None:
        return case.steps[-1].cmd
    first, last = out.window(len(case.steps))
    window = case.steps[first:last + 1]
    if hang:
        lockstep = False
    if lockstep and case.steps[last].mutated:
        return case.steps[last].cmd  # seen right after it: every earlier step had its chance
    for s in window:
        if s.mutated:
            return s.cmd
    if lockstep:
        return case.steps[last].cmd
    return window[0].cmd if window else case.steps[-1].cmd


def starts_with_hello(case: Case) -> bool:
    return bool(case.steps) and case.steps[0].cmd == "HELLO" and not case.steps[0].mutated \
        and bool(case.steps[0].expect)


class CaseRunner:
    def __init__(self, target: Target, *, deadline: float = 5.0, rss_every: float = 0.25,
                 settle: float = 0.3, oracles=None, bounds_oracle: bool = True):
        self.target = target
        self.oracles = oracles  # harness.fuzz.oracles.Oracles: findings beyond death
        # harness.fuzz.bounds: a processed request naming memory outside its buffer, and a
        # plain in-bounds request refused
        self.bounds_oracle = bounds_oracle
        self.deadline = deadline
        self.rss_every = rss_every
        # Open-ended cases (a length prefix the payload never fills): the server may be
        # allocating what the prefix announced; watch its memory up to this long.
        self.settle = settle
        self.executor: Executor | None = None
        self.pending: tuple[Case, Outcome] | None = None  # closed by the server, not yet judged
        self.previous: tuple[Case, Outcome] | None = None  # the last case run_fast ran
        self.restarts = 0
        self._last_rss = 0.0
        self._memory: int | None = None
        self._refresh()

    def _refresh(self) -> None:
        self.executor = Executor(self.target.host, self.target.port, deadline=self.deadline,
                                 idle_probe=self.target.is_idle)

    def restart(self) -> None:
        self.target.restart()
        self.restarts += 1
        self.pending = self.previous = None
        self._refresh()

    def ensure_running(self) -> None:
        if self.target.server is None or self.target.exit_info() is not None:
            self.restart()

    # ---------------------------------------------------------------- memory
    def _sample(self, case: Case, always: bool = False):
        def before_close(out: Outcome) -> None:
            sample(out)
            if self.oracles is not None:
                self.oracles.during(case, out, isolated=always)

        def sample(out: Outcome) -> None:
            now = time.monotonic()
            if case.open_ended:
                self._memory = self._watch_growth(now + self.settle)
                self._last_rss = time.monotonic()
                return
            if not always and now - self._last_rss < self.rss_every:
                return
            self._last_rss = now
            self._memory = self.target.over_memory()
        self._memory = None
        return before_close

    def _watch_growth(self, until: float) -> int | None:
        """Sample RSS until it is over the bound, stops growing, or ``until`` passes."""
        last = self.target.rss() or 0
        while True:
            over = self.target.over_memory()
            if over is not None:
                return over
            if time.monotonic() >= until:
                return None
            time.sleep(0.01)
            now = self.target.rss() or 0
            if now - last < (1 << 20):  # settled: less than 1 MiB more in 10 ms
                return None
            last = now

    def _memory_verdict(self, case: Case, out: Outcome) -> Finding:
        rss = self._memory
        return Finding(Signature("memory", "", sanitizer.RSS_SAMPLED,
                                 culprit(case, out)), case,
                       f"RSS {rss >> 20} MiB > bound {self.target.rss_limit >> 20} MiB", out)

    # ---------------------------------------------------------------- isolated
    def check(self, case: Case, *, lockstep: bool = False, record: bool = False,
              restart: bool = True, pin_from: int = 0, pin_growth: bool = True
              ) -> tuple[Finding | None, Outcome]:
        """Run ``case`` on its own and judge it; the target is left running and healthy
        (restarted if the case broke it, unless ``restart`` is False). ``pin_from``: a lockstep
        run pins the steps from there on (a fast run showed the ones before it served).
        ``pin_growth``: an amplification is cut to the step that allocated it
        (:meth:`_pin_growth`; the finding's case and outcome are then that prefix's)."""
        self.ensure_running()
        before = self.oracles.before(case, isolated=True) if self.oracles is not None else None
        self.target.reset_peak_rss()
        out = self.executor.run(case, lockstep=lockstep, record=record,
                                before_close=self._sample(case, always=True),
                                pin_from=pin_from if lockstep else 0)
        if lockstep and pin_from and out.at is not None and out.at < pin_from:
            # it ended among the steps it did not pin (unlike the run before): pin them all
            # (check restarts the target first if the case killed it)
            return self.check(case, lockstep=True, record=record, restart=restart)
        verdict = self._judge_now(case, out, lockstep=lockstep)
        if verdict is None and out.status in (OK, CLOSED):
            # Still serving? (A crash after our last answer, or a server stuck in our case.)
            verdict = self._serving_verdict(case, out, lockstep=lockstep)
            if verdict is None:
                verdict = self._bounds_verdict(case, out, lockstep=lockstep)
            if verdict is None and not lockstep and self._may_refuse_in_bounds(case, out):
                return self.check(case, lockstep=True, record=record, restart=restart,
                                  pin_from=out.window(len(case.steps))[0])
            if verdict is None and self.oracles is not None:
                found = self.oracles.judge_isolated(case, out, before)
                if found is not None:
                    verdict = Finding(found[0], case, found[1], out)
        if verdict is not None and restart and _disabling(verdict):
            self.restart()
        self.pending = None
        if verdict is not None and pin_growth and verdict.signature.kind == AMPLIFICATION:
            verdict = self._pin_growth(verdict, lockstep=lockstep, record=record)
            return verdict, verdict.outcome or out
        return verdict, out

    def _pin_growth(self, found: Finding, *, lockstep: bool, record: bool) -> Finding:
        """An amplification is memory the connection keeps, so it is named after the step
        that allocated it: the last of the shortest prefix of the case that still grows the
        server past the bound, found by bisection. The window since the last answer, which
        names a death, names any answered step sent after the allocation instead (under load
        a minimisation cut short left a valid GET_TENSOR after the amplifying SET_TENSOR, and
        the bug was filed twice)."""
        case = found.case
        lo, hi, pinned = 0, len(case.steps), found  # steps[:lo] does not grow; steps[:hi] does
        while hi - lo > 1:
            mid = (lo + hi) // 2
            v, _ = self.check(case.with_steps(case.steps[:mid]), lockstep=lockstep,
                              record=record, pin_growth=False)
            if v is not None and v.signature.kind == AMPLIFICATION:
                hi, pinned = mid, v
            else:
                lo = mid
        sig = replace(found.signature, command=case.steps[hi - 1].cmd)
        return Finding(sig, pinned.case, pinned.detail, pinned.outcome, seen_at=found.seen_at)

    def _judge_now(self, case: Case, out: Outcome, *, lockstep: bool = False) -> Finding | None:
        """What can be said from this connection alone (no waiting unless it looks bad)."""
        if out.status == PROTOCOL:
            if self._memory is None:
                # a server still busy with what it allocated (zeroing a huge buffer) keeps the
                # connection open past the close deadline: its peak memory, not the open
                # connection, is the finding (on a loaded machine the growth samples during
                # the run may all fall in a pause; the peak the kernel kept says so)
                peak = self.target.peak_rss()
                if peak and self.target.rss_limit and peak > self.target.rss_limit:
                    self._memory = peak
            if self._memory is not None:
                return self._memory_verdict(case, out)
            return Finding(Signature("protocol", "", _generic(out.detail),
                                     culprit(case, out, lockstep=lockstep)), case, out.detail, out)
        if out.status in (HANG, REFUSED):
            info = self.target.wait_exit(0.5)
            if info is not None:
                sig, detail = self.target.death_verdict(info, culprit(case, out,
                                                                      lockstep=lockstep))
                return Finding(sig, case, detail, out)
            if out.status == HANG:
                return Finding(Signature("hang", "", "no answer within the deadline",
                                         culprit(case, out, hang=True)), case,
                               out.detail, out)
        if self._memory is not None:
            return self._memory_verdict(case, out)
        info = self.target.exit_info()
        if info is not None:
            sig, detail = self.target.death_verdict(info, culprit(case, out, lockstep=lockstep))
            return Finding(sig, case, detail, out)
        return None

    # ---------------------------------------------------------------- campaign
    def run_fast(self, case: Case, *, again: bool = True) -> tuple[list[Finding], Outcome]:
        """Run ``case`` as part of a stream of cases; returns the verdicts it settled (about
        this case, or about the previous one that this case proved guilty). A case that found
        the server still dying of the previous one runs again on the restarted server
        (``again``): it was not tried, and a sweep counts it as sent."""
        verdicts: list[Finding] = []
        if not starts_with_hello(case) or (self.target.server is not None
                                           and self.target.exit_info() is not None):
            # before ensure_running, which would restart a server that died after the
            # previous case without a word about that case
            verdicts += self._settle_before_unproven()
        self.ensure_running()
        before = self.oracles.before(case) if self.oracles is not None else None
        self.target.reset_peak_rss()
        out = self.executor.run(case, before_close=self._sample(case))
        if out.proven > 0:
            self.pending = None  # our HELLO was answered: the previous connection did no harm
        elif starts_with_hello(case) and out.status in (CLOSED, REFUSED, HANG):
            # Not even a valid HELLO was answered: the server was already dead or stuck, so
            # the previous connection is the suspect (even one that ended normally: a crash
            # may come after its last answer).
            suspect = self.pending or self.previous
            if suspect is not None:
                self.pending = suspect
                verdicts += self._settle_pending()
                if verdicts:
                    self.previous = None
                    if again:
                        more, out = self.run_fast(case, again=False)
                        return verdicts + more, out
                    return verdicts, out
        verdict = self._judge_now(case, out)
        if verdict is not None:
            if _disabling(verdict):
                self.restart()
            self.previous = None
            return verdicts + [verdict], out
        previous = self.previous
        if out.status == CLOSED:
            self.pending = (case, out)
        self.previous = (case, out)
        if out.status in (OK, CLOSED):
            verdict = self._bounds_verdict(case, out)
            if verdict is not None:
                verdicts.append(verdict)
            elif self._may_refuse_in_bounds(case, out):
                again, _ = self.check(case)  # pinned to its step in lockstep, there
                if again is not None and again.signature.kind == bounds.REFUSED_IN_BOUNDS:
                    verdicts.append(again)
        if self.oracles is not None and out.status in (OK, CLOSED):
            kind = self.oracles.judge_stream(case, out, before)
            if kind is not None:
                verdicts += self._confirm_oracle(kind, [case] + ([previous[0]] if previous
                                                                 else []))
        return verdicts, out

    def _bounds_verdict(self, case: Case, out: Outcome, *, lockstep: bool = False
                        ) -> Finding | None:
        """harness.fuzz.bounds: an accepted out-of-bounds range; in a lockstep run, where the
        close is pinned to its step, also a plain in-bounds request refused."""
        if not self.bounds_oracle:
            return None
        worst = bounds.worst(bounds.judge(case, out))
        if worst is not None:
            return Finding(worst.signature(), case, worst.detail, out)
        if lockstep and out.status == CLOSED and out.at is not None:
            sig = bounds.refused_in_bounds(case, out, out.at)
            if sig is not None:
                return Finding(sig, case, f"the server closed at step {out.at}, a request "
                                          "wholly in bounds that every server must accept", out)
        return None

    def _may_refuse_in_bounds(self, case: Case, out: Outcome) -> bool:
        """Could the close of this fast-path run be the refusal of a plain in-bounds request?
        Only where no mutated step could have caused it (a mutation explains a close; pinning
        one costs a lockstep run, 50 ms per unanswered step)."""
        if not self.bounds_oracle or out.status != CLOSED:
            return False
        first, last = out.window(len(case.steps))
        if any(s.mutated for s in case.steps[first:last + 1]):
            return False
        return any(bounds.refused_in_bounds(case, out, k) is not None
                   for k in range(first, last + 1))

    def _settle_before_unproven(self) -> list[Finding]:
        """The next case cannot prove the server alive (no answered HELLO first), or the
        server is already dead, so the one before it is settled now, even one that ended with
        every answer: a server may die after the client has gone (p7+asan reads a 5 GiB
        length prefix, then ASan reports the failed allocation while the next connection is
        being sent, or before it starts)."""
        if (self.pending or self.previous) is None:
            return []
        self.pending = self.pending or self.previous
        verdicts = self._settle_pending()
        if verdicts:
            self.previous = None
        return verdicts

    def _confirm_oracle(self, kind: str, suspects: list[Case]) -> list[Finding]:
        """A campaign sample fired: run the suspects on their own (the case, then the one
        before it, whose tail the sample may have caught); a verdict only if one does it."""
        for suspect in suspects:
            verdict, _ = self.check(suspect)
            if verdict is not None:
                self.previous = None
                return [verdict]
        return []

    def _settle_pending(self) -> list[Finding]:
        """Is the server that closed the previous connection still alive?"""
        case, out = self.pending
        self.pending = None
        verdict = self._serving_verdict(case, out)
        if verdict is None:
            return []
        self.restart()
        return [verdict]

    def _serving_verdict(self, case: Case, out: Outcome, *,
                         lockstep: bool = False) -> Finding | None:
        """After a connection: None if a new one is served within the deadline; else how the
        server failed it: it died, it was busy on the CPU past the deadline (late), or it
        stopped serving."""
        if self.target.exit_info() is None:
            served, seconds = self.target.serves_new_connection(self.deadline)
            if served and seconds <= self.deadline + LATE_SLACK:
                return None
            if served:
                return Finding(late_signature(case, culprit(case, out, hang=True)), case,
                               f"a new connection's HELLO was answered after {seconds:.1f} s "
                               f"(deadline {self.deadline:g} s), the server working on the "
                               f"CPU meanwhile", out)
        info = self.target.wait_exit(1.0)
        if info is not None:
            sig, detail = self.target.death_verdict(info, culprit(case, out, lockstep=lockstep))
            return Finding(sig, case, detail, out)
        return Finding(Signature("hang", "", "server stopped serving new connections",
                                 culprit(case, out, hang=True)), case,
                       "no HELLO answer on a new connection", out)

    def finish(self) -> list[Finding]:
        """Judge a pending connection at the end of a run."""
        return self._settle_pending() if self.pending is not None else []


def late_signature(case: Case, command: str) -> Signature:
    """A server that served a new connection only after the deadline, busy meanwhile. The
    line names the likely cause when the case has it: a frame whose length prefix announced
    over HUGE_PREFIX bytes (the real servers allocate and zero what a prefix announces
    before reading the payload, and free it when the client hangs up)."""
    announced = max((announced_length(s.frame) for s in case.steps
                     if len(s.frame) >= REQUEST_HEADER_SIZE), default=0)
    cause = f" after a length prefix over {HUGE_PREFIX >> 30} GiB" \
        if announced > HUGE_PREFIX else ""
    return Signature("hang", "", "server busy past the deadline before it served a new "
                     "connection" + cause, command)


def _disabling(verdict: Finding) -> bool:
    """Does the target need a restart after this? A protocol violation, a refusal or a read
    out of bounds leave it serving as it was; an accepted write out of bounds may have
    corrupted its memory, which would be blamed on the cases after it."""
    sig = verdict.signature
    if sig.kind == bounds.ACCEPTED_OOB:
        return sig.line.startswith("write")
    return sig.kind not in ("protocol", bounds.REFUSED_IN_BOUNDS)


def _generic(detail: str) -> str:
    """A protocol detail without its numbers, so one bug is one signature."""
    return normalise(_NUMBER.sub("N", detail))
