"""The combinatorial and stateful phases (harness/fuzz/interactions.py, stateful.py, sweep.py):
what the covering arrays cover, that each row sends what its label says, and the proofs the
issue asks for: planted interaction bugs found by these phases and by no single-field case,
and an honest reference that accepts nothing out of bounds in any dialect."""

from __future__ import annotations

import io
import itertools
from collections import Counter

import pytest

from harness.fuzz import bounds, covering, interactions as ia, scale, stateful
from harness.fuzz import sweep as sw
from harness.fuzz.inprocess import InProcessReference
from harness.strategies.basics import _tensor_nbytes
from harness.proto import Cmd, get_dialect
from harness.proto.dialects import DIALECTS
from harness.reference.knobs import parse_knobs

D8 = get_dialect("8.0.0")


def _designs(d=D8):
    return sw._setup(d)[1], sw.designs(d.name)


def test_every_command_covers_every_pair_and_every_placement_triple():
    _, designs = _designs()
    assert set(designs) == set(sw.baselines(D8, sw._setup(D8)[1]))
    for cmd, (dsg, _, roles) in designs.items():
        cov = ia.coverage(dsg, range(dsg.rows))
        assert cov["pairs"][0] == cov["pairs"][1] > 0, cmd
        assert cov["triples"][0] == cov["triples"][1] > 0, cmd
        # every tensor role has its (buffer, data, shape) triple required
        names = {(dsg.factors[i].role, dsg.factors[i].field) for t in dsg.triples for i in t}
        assert {(r, f) for r in roles for f in ia.TRIPLE} <= names, cmd
    copy, _, _ = designs[Cmd.COPY_TENSOR]
    src_data, dst_data = copy.index("src", "data"), copy.index("dst", "data")
    assert any(src_data in t and dst_data in t for t in copy.triples)  # a tensor and its source


def test_the_fields_and_triple_blocks_leave_everything_else_at_its_baseline():
    """No other field can mask what these blocks test (see interactions' docstring)."""
    _, designs = _designs()
    for cmd, (dsg, _, _) in designs.items():
        blocks = dict(dsg.blocks)
        fields = blocks["fields"]
        for i, f in enumerate(dsg.factors):
            if f.field in ia.PLACEMENT:
                assert not fields[:, i].any(), (cmd, f.name)
        for name, rows in dsg.blocks:
            if name in ("pairs", "fields"):
                continue
            moved = {i for i in range(len(dsg.factors)) if rows[:, i].any()}
            assert all(dsg.factors[i].field in ia.TRIPLE for i in moved), (cmd, name)


def test_no_row_holds_a_count_past_int64_unless_it_is_that_combination_alone():
    """ggml's element-count check refuses a tensor whatever else the request says: such a
    combination gets a row of its own (it would mask every other pair of a shared row)."""
    regions, designs = _designs()
    for cmd, (dsg, msg, roles) in designs.items():
        pairs = dict(dsg.blocks)["pairs"]
        fits = ia._CountsFit(D8, list(dsg.factors), msg, roles)
        for row in pairs:
            if not fits(row):
                assert sum(1 for v in row if v) <= 2, (cmd, row)


def test_each_row_sends_what_its_label_says():
    regions, designs = _designs()
    dsg, msg, roles = designs[Cmd.GET_TENSOR]
    rows = {r.label: r for r in ia.rows_of(D8, regions, Cmd.GET_TENSOR, msg, roles, dsg)}
    t = msg.tensor
    r0 = regions[0]
    end = rows["tensor.data=own:end-nbytes+1"].request.tensor
    assert end.data == r0.end - _tensor_nbytes(end) + 1 and end.buffer == r0.handle
    zero = next(r for k, r in rows.items() if k == "tensor.shape=zero_elements")
    assert zero.request.tensor.ne[0] == 0
    combo = next(r for k, r in rows.items()
                 if "tensor.type=f16" in k and "offset=nbytes+1" in k).request
    assert combo.tensor.type == 1 and combo.offset == _tensor_nbytes(combo.tensor) + 1
    assert t.type == 0  # the baseline itself is untouched


def test_the_stateful_phase_pairs_every_changer_on_each_buffer_with_every_use():
    cases = list(stateful.cases(D8))
    assert len(cases) == stateful.size(D8)
    pairs = Counter(c.pair for c in cases)
    assert set(pairs) == set(stateful.pairs_possible(D8))
    assert set(pairs.values()) == {len(stateful.uses(D8))}
    assert "FREE_BUFFER -> GRAPH_RECOMPUTE on target" in pairs  # recompute over freed memory


def test_sweep_coverage_counts_what_was_sent():
    d = "7.0.0"
    parts = {p: n for p, _, n in sw.parts(d)}
    total = sum(parts.values())
    everything = sw.coverage(d, set(range(total)))
    assert all(done == n for done, n in everything["parts"].values())
    assert everything["stateful"]["pairs"][0] == everything["stateful"]["pairs"][1]
    start = parts["catalogue"] + parts["boundary"]
    half = sw.coverage(d, set(range(start + parts["combinatorial"] // 2)))
    pairs = [c["pairs"] for c in half["commands"].values()]
    assert sum(p[0] for p in pairs) < sum(p[1] for p in pairs)  # the other half is missing
    assert half["stateful"]["pairs"][0] == 0
    # a worker's shard: every n-th case from its own; of chosen parts, their cases only
    assert sw.sent(d, [((2, 3), 4)]) == {1, 4, 7, 10}
    first = parts["catalogue"] + parts["boundary"]
    assert sw.sent(d, [((1, 2), 3)], only={"combinatorial"}) == \
        {first + (-first) % 2, first + (-first) % 2 + 2, first + (-first) % 2 + 4}


# ---------------------------------------------------------------- the planted interaction bugs

# knob -> (the commands its deterministic phase sends it, the phase that must find it)
KNOBS = {
    "skip_region_f16_offset": ({"SET_TENSOR", "GET_TENSOR", "MEMSET_TENSOR"}, "combinatorial"),
    "skip_region_size_nbytes_minus_1": ({"GET_TENSOR"}, "combinatorial"),
    "skip_view_bounds_cross_buffer": ({"GRAPH_COMPUTE"}, "combinatorial"),
    "skip_bounds_after_free": (None, "stateful"),
}


def _cmd(item) -> str | None:
    mutated = [s for s in item.case.steps if s.desc]
    return mutated[-1].desc["cmd"] if mutated else None


def _findings(dialect: str, knobs, parts, cmds) -> Counter:
    """Accepted-out-of-bounds findings per sweep part, the reference in process."""
    ref = InProcessReference(dialect, knobs)
    found: Counter = Counter()
    for item in sw.sweep(dialect, only=parts):
        if cmds is not None and _cmd(item) not in cmds:
            continue
        if bounds.judge(item.case, ref.run(item.case)):
            found[item.part] += 1
    return found


@pytest.mark.slow
@pytest.mark.parametrize("knob", list(KNOBS))
def test_a_planted_interaction_bug_is_found_by_the_new_phases_and_no_single_field_case(knob):
    cmds, phase = KNOBS[knob]
    found = _findings("8.0.0", parse_knobs([f"{knob}=true"]),
                      {"catalogue", "boundary", phase}, cmds)
    assert found[phase] > 0, found
    assert found["catalogue"] == found["boundary"] == 0, found


@pytest.mark.slow
@pytest.mark.parametrize("dialect", list(DIALECTS))
def test_the_honest_reference_accepts_nothing_out_of_bounds(dialect):
    """Every deterministic phase but the scale classes (graphs of 60 MB, for the live
    oracles), with the oracle and its converse: nothing."""
    ref = InProcessReference(dialect)
    found = []
    for item in sw.sweep(dialect, only=set(sw.PARTS) - {"scale"}):
        out = ref.run(item.case)
        found += [(item.label, v.line) for v in bounds.judge(item.case, out)]
        if out.status == "closed" and out.at is not None:
            sig = bounds.refused_in_bounds(item.case, out, out.at)
            if sig is not None:
                found.append((item.label, sig.line))
    assert found == []


def test_planted_an_oracle_blind_to_the_end_misses_the_knobs(monkeypatch):
    """The knob test is not vacuous: an oracle that never flags the end of a buffer finds
    nothing where the knob wrote past it."""
    monkeypatch.setattr(bounds._Buffers, "judge", lambda self, a: None)
    found = _findings("8.0.0", parse_knobs(["skip_region_size_nbytes_minus_1=true"]),
                      {"combinatorial"}, {"GET_TENSOR"})
    assert not found


def test_annotating_only_a_sessions_tail_is_annotating_the_whole_session():
    """The sweep annotates its shared set-up once (case.annotate_after): the same expected
    answers and protocol-error step as decoding every step, on every kind of sweep case."""
    from harness.fuzz.case import annotate
    for part in ("catalogue", "boundary", "combinatorial", "stateful"):
        for item in itertools.islice(sw.sweep("8.0.0", only={part}), 0, None, 97):
            whole = annotate(item.case.dialect, item.case.steps)
            assert (whole.steps, whole.protocol_error_at, whole.open_ended) == \
                (item.case.steps, item.case.protocol_error_at, item.case.open_ended), item.label


def test_planted_a_tail_decoded_as_a_new_connection_differs():
    from harness.fuzz.case import annotate, annotate_after
    case = next(c.case for c in sw.sweep("8.0.0", only={"combinatorial"}))
    head = annotate(case.dialect, case.steps[:5])
    fresh = annotate(case.dialect, case.steps[5:])  # no HELLO before it: refused at once
    assert fresh.protocol_error_at == 0
    assert annotate_after(head, case.steps[5:]).protocol_error_at is None


def test_every_scale_session_expects_its_probes_answer():
    """The scale sessions are annotated without decoding their graphs: the probe after them
    must still expect its answer (a client that does not wait for it hangs up first, and a
    real server then dies writing it: the SIGPIPE a p7 differential showed)."""
    d = get_dialect("7.0.0")
    head, regions = sw._setup(d)
    for label, case in scale.cases(d, head, regions[0], sw._probe(d)):
        assert case.steps[-1].cmd == "GET_ALIGNMENT" and case.steps[-1].expect == (8,), label
        assert case.protocol_error_at is None and all(s.expect for s in case.steps[:5]), label
        break  # building each costs a second: the first shows the rule


def test_the_live_display_shows_each_phase_as_it_runs():
    from rich.console import Console
    from harness.fuzz.campaign import Progress
    from harness.fuzz.display import LiveProgress
    progress = Progress()
    progress.handle({"type": "stats", "worker": 0, "stats": {"sweep_total": 100,
                                                             "sweep_done": 40},
                     "sweep_parts": {"catalogue": 10, "boundary": 20, "combinatorial": 10}})
    console = Console(width=100, record=True, file=io.StringIO())
    with LiveProgress(console, "p7", 60) as live:
        live.update(progress)
    text = console.export_text()
    assert "40 / 100 cases" in text and "catalogue 10, boundary 20, combinatorial 10" in text
