"""The evolving corpus: cases that made the target do something new are kept and mutated.

A case's *behaviour* is a set of features observed while it ran (:func:`behaviour`): the
answer shapes (command, answer size, value bucket -- an allocation that failed, a hash that
hit, a copy that was refused), where and how the connection ended (status, the command and
mutation of the step it ended at), and the server's own log lines (numbers stripped). A case
that shows a feature no earlier case showed joins the :class:`Corpus`.

Most campaign cases are then not generated afresh but derived from corpus entries with a
plain PRNG (:func:`mutate`, AFL-style stacked operators on whole steps): splice two entries,
insert a step of another entry, delete steps, repeat a step or a run of steps (stateful
depth: repeated allocations, recomputes, frees), overwrite a field of a step with an
interesting value, or insert a registered structured mutation harvested from generated
cases. That costs a few microseconds per step where a hypothesis draw costs hundreds, and it
reaches states that a fresh draw of independent steps rarely does.
"""

from __future__ import annotations

import random
import re
from collections import deque

from ..proto import get_dialect
from ..proto.codec import REQUEST_HEADER_SIZE
from ..proto.dialects import Dialect
from .case import Case, Step, annotate, step
from .execute import Outcome
from .signature import normalise
from ..strategies import MUTATIONS, MutationSite
from ..strategies.fields import INTERESTING_VALUES, overwrite

MAX_EVOLVED_STEPS = 128
_NUMBER = re.compile(r"\b\d+\b")
# Log lines every connection produces: no information about the case.
_ROUTINE = ("Accepted client connection", "Client connection closed")


def behaviour(case: Case, out: Outcome, log_lines: list[str] = ()) -> frozenset:
    """The features of one run (see the module docstring)."""
    feats = set(out.shapes)
    end = out.at if out.at is not None else len(case.steps) - 1
    end_step = case.steps[end] if 0 <= end < len(case.steps) else None
    what = end_step.desc["what"] if end_step is not None and end_step.desc else "valid"
    feats.add(("end", out.status, end_step.cmd if end_step is not None else "-", what,
               out.server_close or ""))
    for line in log_lines:
        line = line.strip()
        if line and not line.startswith(_ROUTINE):
            feats.add(("log", _NUMBER.sub("N", normalise(line))[:160]))
    return frozenset(feats)


# The largest case the corpus keeps (so no step it offers for splicing is larger). The sweep's
# scale classes (64 MiB graphs) are sent whole by the sweep; kept and spliced into derived
# cases they made each of those cost a second (a 10-minute p7 campaign sent 6 GB and derived
# 25k cases where one without them derived 72k).
MAX_ENTRY_BYTES = 1 << 20


class Corpus:
    """Cases kept for new behaviour, bounded (the oldest non-seed entries go first)."""

    def __init__(self, max_entries: int = 2000, pool_size: int = 2000):
        self.entries: deque[Case] = deque(maxlen=max_entries)
        self.features: set = set()
        # Structured-mutation steps seen in generated cases, inserted by the "mutation" op.
        self.mutation_steps: deque[Step] = deque(maxlen=pool_size)

    def __len__(self) -> int:
        return len(self.entries)

    def offer(self, case: Case, features: frozenset) -> bool:
        """Keep ``case`` if it showed a feature never seen before; True if kept."""
        new = features - self.features
        self.features |= features
        if sum(len(s.frame) for s in case.steps) > MAX_ENTRY_BYTES:
            return False  # its behaviour is noted; the sweep sends cases this big itself
        for s in case.steps:
            if s.desc is not None and s.desc.get("at") != "connect":
                self.mutation_steps.append(s)
        if not new or not case.steps or case.steps[0].mutated:
            # A connection refused at its first frame: the server never reads the rest, so
            # mutating it would only repeat the refusal.
            return False
        self.entries.append(case)
        return True

    def pick(self, rng: random.Random) -> Case:
        # Newer entries (the frontier) a little more often than old ones.
        n = len(self.entries)
        return self.entries[max(rng.randrange(n), rng.randrange(n))]


# ---------------------------------------------------------------- operators
# Each: (rng, steps, corpus, dialect) -> new steps. Step 0 (HELLO or an opening mutation)
# stays.

def _splice(rng, steps, corpus, d):
    other = corpus.pick(rng).steps
    i = rng.randint(1, max(1, len(steps) - 1))
    j = rng.randint(1, max(1, len(other) - 1))
    return steps[:i] + list(other[j:])


def _insert(rng, steps, corpus, d):
    other = corpus.pick(rng).steps
    donor = other[rng.randrange(1, len(other))] if len(other) > 1 else other[0]
    i = rng.randint(1, len(steps))
    return steps[:i] + [donor] + steps[i:]


def _delete(rng, steps, corpus, d):
    if len(steps) <= 2:
        return steps
    i = rng.randrange(1, len(steps))
    k = rng.randint(1, min(3, len(steps) - i))
    return steps[:i] + steps[i + k:]


def _repeat(rng, steps, corpus, d):
    i = rng.randrange(1, len(steps)) if len(steps) > 1 else 0
    run = steps[i:i + rng.randint(1, 4)]
    times = rng.choice((2, 3, 4, 8, 16))
    return steps[:i] + run * times + steps[i + len(run):]


def _field(rng, steps, corpus, d: Dialect):
    """Overwrite a u32 or u64 of one step's payload with an interesting value (the registered
    ``interesting_value`` field mutation, applied to a corpus step)."""
    candidates = [k for k in range(1, len(steps)) if steps[k].learn is None
                  and len(steps[k].frame) >= REQUEST_HEADER_SIZE + 4
                  and steps[k].frame[0] in d.ids]
    if not candidates:
        return steps
    k = candidates[rng.randrange(len(candidates))]
    s = steps[k]
    room = len(s.frame) - REQUEST_HEADER_SIZE
    width = 8 if room >= 8 and rng.random() < 0.5 else 4
    offset = rng.randrange(0, (room - width) // 4 + 1) * 4
    value = INTERESTING_VALUES[width][rng.randrange(len(INTERESTING_VALUES[width]))]
    site = MutationSite(None, MUTATIONS[("field", "interesting_value")], d, d.ids[s.frame[0]], None)
    mut = site.mutation("payload", overwrite(s.frame, offset, width, value),
                        at="after_setup", value=value, index=offset)
    return steps[:k] + [step(mut.data, s.cmd, desc=mut.description, eof=s.eof)] + steps[k + 1:]


def _mutation(rng, steps, corpus, d):
    if not corpus.mutation_steps:
        return _insert(rng, steps, corpus, d)
    donor = corpus.mutation_steps[rng.randrange(len(corpus.mutation_steps))]
    i = rng.randint(1, len(steps))
    return steps[:i] + [donor] + steps[i:]


OPERATORS = {"splice": _splice, "insert": _insert, "delete": _delete, "repeat": _repeat,
             "field": _field, "mutation": _mutation}


def mutate(case: Case, corpus: Corpus, rng: random.Random, *,
           max_steps: int = MAX_EVOLVED_STEPS) -> Case:
    """A new case from ``case``: 1 to 4 stacked operators of :data:`OPERATORS`."""
    d = get_dialect(case.dialect)
    steps = list(case.steps)
    ops = []
    names = tuple(OPERATORS)
    for _ in range(rng.choice((1, 1, 2, 2, 3, 4))):
        name = names[rng.randrange(len(names))]
        steps = OPERATORS[name](rng, steps, corpus, d)
        ops.append(name)
    steps = steps[:max_steps]
    mutations = [s.desc for s in steps if s.desc is not None]
    return annotate(case.dialect, tuple(steps), meta={"mutations": mutations, "evolved": ops})

