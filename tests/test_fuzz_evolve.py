"""The evolving corpus: which runs count as new behaviour, and what each corpus operator does
to a case (every result is a well-formed, annotated case that still starts like its parent)."""

from __future__ import annotations

import io
import random

import pytest

from harness import strategies as rst
from harness.fuzz.case import BASE, HANDLE, annotate, sentinel, step
from harness.fuzz.evolve import OPERATORS, Corpus, behaviour, mutate
from harness.fuzz.execute import CLOSED, OK, Executor, Outcome
from harness.fuzz.generate import steady_session
from harness.reference.server import ReferenceServer
from harness.reference.server_core import ServerConfig
from harness.proto import get_dialect, pack_request
from harness.proto import messages as m

D7 = get_dialect("7.0.0")


def _case(n_body: int = 12, seed: int = 0):
    prologue, body = steady_session(D7, (4096, 1024), n_body, seed=seed)
    return annotate(D7, tuple(prologue + body))


def test_behaviour_is_answer_shapes_close_point_and_log_lines():
    case = _case()
    ok = Outcome(OK, shapes={("ALLOC_BUFFER", 16, "large")})
    closed = Outcome(CLOSED, at=4, shapes={("ALLOC_BUFFER", 16, "large")}, server_close="fin")
    a, b = behaviour(case, ok), behaviour(case, closed)
    assert ("ALLOC_BUFFER", 16, "large") in a and a != b
    assert ("end", CLOSED, case.steps[4].cmd, "valid", "fin") in b
    logged = behaviour(case, ok, ["Accepted client connection", "Unknown command: 171",
                                  "[set_tensor] tensor->data 0x55d1c0a0 out of bounds"])
    logs = {f[1] for f in logged if f[0] == "log"}
    # Routine lines say nothing; numbers and addresses do not make a line new.
    assert logs == {"Unknown command: N", "[set_tensor] tensor->data 0x? out of bounds"}


def test_corpus_keeps_only_new_behaviour():
    corpus = Corpus()
    case = _case()
    assert corpus.offer(case, frozenset({("x",), ("y",)}))
    assert not corpus.offer(case, frozenset({("y",)}))
    assert corpus.offer(case, frozenset({("y",), ("z",)}))
    assert len(corpus) == 2


def test_connections_refused_at_their_first_frame_are_not_parents():
    refused = annotate(D7, (step(b"\x0e" + bytes(8), "HELLO",
                                 desc={"kind": "framing", "what": "len_too_small"}),))
    corpus = Corpus()
    assert not corpus.offer(refused, frozenset({("new",)}))
    assert len(corpus) == 0


def test_a_case_past_the_size_bound_is_noted_not_kept(monkeypatch):
    """A sweep scale case (a 64 MiB graph) shows new behaviour but is not a parent, and its
    steps are not offered for splicing: each derived case would send it again."""
    import harness.fuzz.evolve as evolve
    big = step(b"\x0b" + (2 << 20).to_bytes(8, "little") + bytes(2 << 20), "GRAPH_COMPUTE",
               desc={"kind": "field", "what": "scale_class"})
    case = annotate(D7, _case().steps + (big,))
    corpus = Corpus()
    assert not corpus.offer(case, frozenset({("big",)}))
    assert len(corpus) == 0 and not corpus.mutation_steps and ("big",) in corpus.features
    monkeypatch.setattr(evolve, "MAX_ENTRY_BYTES", 4 << 20)  # planted: a bound over it
    assert Corpus().offer(case, frozenset({("big",)}))


def _corpus(*cases) -> Corpus:
    corpus = Corpus()
    for i, c in enumerate(cases):
        corpus.offer(c, frozenset({("seed", i)}))
    return corpus


@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_each_operator_gives_a_case_that_starts_like_its_parent(name):
    parent, other = _case(seed=1), _case(seed=2)
    corpus = _corpus(parent, other)
    corpus.mutation_steps.append(step(pack_request(D7, m.GetAlignmentRequest(5)),
                                      "GET_ALIGNMENT", desc={"kind": "field"}))
    rng = random.Random(3)
    for _ in range(30):
        steps = OPERATORS[name](rng, list(parent.steps), corpus, D7)
        assert steps[0] == parent.steps[0] and steps[0].cmd == "HELLO"
        if name == "delete":
            assert len(steps) < len(parent.steps)
        elif name in ("insert", "mutation"):
            assert len(steps) == len(parent.steps) + 1
        elif name == "repeat":
            assert len(steps) > len(parent.steps)
        elif name == "field":
            changed = [s for s in steps if s.desc is not None]
            assert len(changed) == 1 and changed[0].desc["what"] == "interesting_value"
            rst.check_description(changed[0].desc)
            desc, payload = changed[0].desc, changed[0].frame[9:]
            at = desc["index"]
            assert any(payload[at:at + w] == desc["value"].to_bytes(w, "little")
                       for w in (4, 8) if desc["value"] < 1 << (8 * w))


def test_mutate_stacks_operators_and_annotates():
    corpus = _corpus(_case(seed=1), _case(seed=2))
    rng = random.Random(1)
    for _ in range(200):
        child = mutate(corpus.pick(rng), corpus, rng, max_steps=40)
        assert 1 <= len(child.steps) <= 40 and child.meta["evolved"]
        assert child.steps[0].cmd == "HELLO"
        # Annotated afresh: what the spec says the server must answer to these steps.
        assert child == annotate(D7, child.steps)


@pytest.fixture()
def reference():
    srv = ReferenceServer(ServerConfig(dialect=D7, memory_budget=64 << 20), serial=True,
                          idle_timeout=5, out=io.StringIO(), err=io.StringIO())
    srv.start()
    yield srv
    srv.stop()


def test_executor_records_answer_shapes(reference):
    steps = [step(rst.hello_request_frame(D7), "HELLO"),
             step(pack_request(D7, m.AllocBufferRequest(0, 1024)), "ALLOC_BUFFER",
                  learn=(HANDLE, 0)),
             step(pack_request(D7, m.BufferGetBaseRequest(sentinel(HANDLE, 0))),
                  "BUFFER_GET_BASE", learn=(BASE, 0)),
             step(pack_request(D7, m.AllocBufferRequest(0, 1 << 62)), "ALLOC_BUFFER")]
    out = Executor(reference.host, reference.port, deadline=5).run(annotate(D7, tuple(steps)))
    assert out.status == OK
    # The failed allocation answers zeros: a different shape from the one that worked.
    assert ("ALLOC_BUFFER", 16, "large") in out.shapes
    assert ("ALLOC_BUFFER", 16, "0") in out.shapes
