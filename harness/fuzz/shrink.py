"""Minimise a finding to the shortest step sequence that still breaks the target the same way,
and save it as a replayable reproducer.

Minimisation here is delta debugging (Zeller's ddmin) over the case's steps, with the live
target checked (and restarted when it broke) per attempt; the campaign runs hypothesis's own
shrinker on the generating choices first, so this pass starts from an already simplified case.
"Same way" means the same kind, signal and log line; the command is settled afterwards by a
lockstep run of the minimal case, which sees exactly which step ended the connection.

A reproducer folder holds ``repro.rpct`` (the transcript of the final run: the bytes sent,
relocated, and what came back; the portable steps with their relocations in its metadata),
``repro.pcap`` (the same conversation for Wireshark), ``finding.json`` and ``test_repro.py``
(a pytest regression test that fails while the bug is there).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable, Sequence, TypeVar

from ..capture.pcap import write_pcap
from ..capture.transcript import C2S, S2C, Transcript
from .case import Case
from .execute import Outcome
from .signature import Signature

T = TypeVar("T")
FORMAT = "ggml-rpc-fuzz-finding/1"


class Budget:
    """Attempts and seconds a minimisation may spend."""

    def __init__(self, seconds: float, attempts: int = 10_000):
        self.end = time.monotonic() + seconds
        self.attempts_left = attempts
        self.attempts = 0

    def spend(self) -> bool:
        if self.attempts_left <= 0 or time.monotonic() >= self.end:
            return False
        self.attempts_left -= 1
        self.attempts += 1
        return True


def ddmin(items: Sequence[T], fails: Callable[[list[T]], bool], budget: Budget) -> list[T]:
    """A 1-minimal sublist of ``items`` on which ``fails`` holds (``fails(items)`` is assumed).

    Classic ddmin: try each of n chunks, then each complement; on success restart from the
    smaller list, otherwise double n. Stops early (returning the best so far) when the budget
    runs out. Order is kept, so a step never moves before the steps it depended on.
    """
    current = list(items)
    n = 2
    while len(current) >= 2:
        size = -(-len(current) // n)
        parts = [current[i:i + size] for i in range(0, len(current), size)]
        reduced = False
        for part in parts:
            if not budget.spend():
                return current
            if fails(part):
                current, n, reduced = part, 2, True
                break
        if not reduced and len(parts) > 2:  # with two parts the complements are the parts
            for i in range(len(parts)):
                if not budget.spend():
                    return current
                complement = [x for j, p in enumerate(parts) if j != i for x in p]
                if fails(complement):
                    current, n, reduced = complement, max(n - 1, 2), True
                    break
        if not reduced:
            if n >= len(current):
                break
            n = min(n * 2, len(current))
    return current


def minimise_case(case: Case, same: Callable[[Case], bool], budget: Budget) -> Case:
    """The shortest case (by steps, then bytes) for which ``same`` holds, within ``budget``.

    First cut everything after the earliest prefix that still fails (steps after the culprit
    never matter), then ddmin over what is left, then one greedy pass of single removals.
    """
    steps = list(case.steps)
    # Prefixes, shortest first, by bisection: the culprit is usually near the end.
    lo, hi = 1, len(steps)
    while lo < hi and budget.spend():
        mid = (lo + hi) // 2
        if same(case.with_steps(steps[:mid])):
            hi = mid
        else:
            lo = mid + 1
    steps = steps[:hi]

    def fails(sub: list) -> bool:
        return bool(sub) and same(case.with_steps(sub))
    steps = ddmin(steps, fails, budget)
    i = 0
    while i < len(steps) and len(steps) > 1:
        trial = steps[:i] + steps[i + 1:]
        if not budget.spend():
            break
        if fails(trial):
            steps = trial
        else:
            i += 1
    return case.with_steps(steps)


MAX_NAMING_CHECKS = 8  # runs drop_unneeded_mutations may add after the budget is spent


def drop_unneeded_mutations(case: Case, same: Callable[[Case], bool]) -> Case:
    """``case`` without each mutated step it reproduces without, tried once each, last first.

    A finding is named after the first mutated step of the window it showed in. When the
    budget ran out before ddmin dropped a bystander (a loaded machine), that name would be a
    guess: an amplification by a valid SET_TENSOR was filed a second time under the mutated
    MEMSET_TENSOR after it. These few runs are outside the budget, so the name does not
    depend on how much CPU minimisation got."""
    steps = list(case.steps)
    mutated = [i for i, s in enumerate(steps) if s.mutated][-MAX_NAMING_CHECKS:]
    for i in reversed(mutated):
        trial = steps[:i] + steps[i + 1:]
        if trial and same(case.with_steps(trial)):
            steps = trial
    return case.with_steps(steps)


# ---------------------------------------------------------------- artefacts

def transcript_of(case: Case, out: Outcome | None, meta: dict) -> Transcript:
    """The run's bytes as a transcript (or, without a recorded run, the case's own frames)."""
    tr = Transcript(meta={"fuzz": meta, "client": ["127.0.0.1", 40000],
                          "server": ["127.0.0.1", 50052]})
    t0 = time.time()
    if out is not None and out.log:
        start = out.log[0][1]
        for direction, t, data in out.log:
            tr.add(t0 + (t - start), C2S if direction == "c2s" else S2C, data)
        end = t0 + (out.log[-1][1] - start) + 1e-4
    else:
        for i, s in enumerate(case.steps):
            tr.add(t0 + i * 1e-4, C2S, s.frame)
        end = t0 + len(case.steps) * 1e-4
    if out is not None and out.server_close:
        tr.close(end, S2C, out.server_close)
    tr.close(end + 1e-4, C2S, "fin")
    return tr


def save_reproducer(folder: Path, *, signature: Signature, case: Case, outcome: Outcome | None,
                    target: str, dialect: str, detail: str = "", extra: dict | None = None,
                    ) -> dict:
    """Write the reproducer folder; returns the finding.json content. A finding without a
    signature is refused: its replay could match nothing (harness.fuzz.replay)."""
    if not isinstance(signature, Signature) or not signature.kind:
        raise ValueError(f"a finding needs a signature to be saved, not {signature!r}")
    folder.mkdir(parents=True, exist_ok=True)
    meta = {"format": FORMAT, "signature": signature.to_json(), "target": target,
            "dialect": dialect, "case": case.to_json()}
    tr = transcript_of(case, outcome, meta)
    tr.save(folder / "repro.rpct")
    write_pcap(tr, folder / "repro.pcap")
    rel = folder.name
    finding = {
        "format": FORMAT, "id": signature.id, "signature": signature.to_json(),
        "title": signature.title(), "target": target, "dialect": dialect, "detail": detail,
        "steps": len(case.steps), "bytes": sum(len(s.frame) for s in case.steps),
        "listing": case.describe(), "reproducer": "repro.rpct", "pcap": "repro.pcap",
        "replay": f"harness replay {folder}/repro.rpct --target {target}",
        **(extra or {}),
    }
    (folder / "finding.json").write_text(json.dumps(finding, indent=1) + "\n")
    (folder / "test_repro.py").write_text(_pytest_file(rel, signature, target))
    return finding


def _pytest_file(name: str, signature: Signature, target: str) -> str:
    return f'''"""Regression test generated by `harness fuzz` for finding {name}.

{signature.title()}

Fails while the target still breaks this way; passes once it is fixed. Run with
``pytest {name}/test_repro.py`` (needs the target, e.g. `harness peers build`).
"""

from pathlib import Path

import pytest

from harness.fuzz.replay import replay
from harness.fuzz.errors import TargetError

TARGET = {target!r}


def test_{name.replace("-", "_")}_is_fixed(tmp_path):
    try:
        result = replay(Path(__file__).with_name("repro.rpct"), TARGET, workdir=tmp_path)
    except TargetError as e:  # this machine has no such target
        pytest.skip(f"[peer-missing] cannot start {{TARGET}}: {{e}}")
    assert not result.reproduced, result.summary()
'''
