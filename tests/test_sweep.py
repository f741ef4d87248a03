"""The deterministic sweep (harness/fuzz/sweep.py) and the boundary tables it walks
(harness/strategies/boundaries.py): the same cases on every machine, every case what its
label says, counted right, and a planted boundary bug found by the sweep alone."""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from dataclasses import fields

import pytest

from harness.fuzz import sweep as sw
from harness.fuzz.differential import DifferentialConfig, run_differential
from harness.fuzz.report import systematic_problems
from harness.strategies.basics import BufferRegion
from harness.strategies.boundaries import (MAX_GRAPH_TENSORS, field_cases, graph_cases,
                                                placement_cases, range_cases, scalar_cases)
from harness.proto import get_dialect
from harness.proto import messages as m
from harness.proto.codec import REQUEST_HEADER_SIZE, unpack_request_payload
from harness.proto.tensor import RpcTensor
from harness.reference.server_core import ServerConfig

D8 = get_dialect("8.0.0")


def _digest(cases) -> list[tuple[str, str]]:
    return [(c.label, hashlib.sha256(b"".join(s.frame for s in c.case.steps)).hexdigest())
            for c in cases]


# ------------------------------------------------------------------ the tables
def test_placement_puts_data_at_and_around_both_edges_of_every_buffer():
    regions = (BufferRegion(0x1000, 0x10_0000, 4096), BufferRegion(0x2000, 0x20_0000, 8192))
    cases = {case: (handle, data) for case, handle, data in placement_cases(regions, 0, 256)}
    own, other = regions
    assert cases["buffer=own data=own:end-nbytes"] == (own.handle, own.end - 256)
    assert cases["buffer=own data=own:end-nbytes+1"] == (own.handle, own.end - 255)
    # the buffer field names one buffer, the data lies in the other: a case of its own
    assert cases["buffer=own data=other:base"] == (own.handle, other.base)
    assert cases["buffer=other data=own:end-1"] == (other.handle, own.end - 1)


def test_ranges_and_fields_reach_their_edges():
    r = dict((c, (o, s)) for c, o, s in range_cases(256, 4096))
    assert any(o + s > (1 << 64) - 1 for o, s in r.values())  # a sum that wraps u64
    t = RpcTensor(id=5, type=0, buffer=0x1000, ne=(64, 1, 1, 1), nb=(4, 256, 256, 256),
                  data=0x10_0000)
    changed = field_cases(t, 9, BufferRegion(0x1000, 0x10_0000, 4096))
    # each case changes exactly the field it names and nothing else
    for case, field, new in changed:
        diff = {f.name for f in fields(RpcTensor) if getattr(new, f.name) != getattr(t, f.name)}
        assert diff <= {field}, (case, diff)
    names = Counter(field for _, field, _ in changed)
    assert set(names) == {"id", "view_src", "src", "ne", "nb", "type", "op", "op_params",
                          "flags", "view_offs", "use_count", "name"}
    msg = m.MemsetTensorRequest(t, 0, 256, 7)
    assert {f for _, f, _ in scalar_cases(msg)} == {"value"}


@pytest.mark.parametrize("nbytes", [0, 1, 256, (1 << 64) - 1])
def test_every_range_case_is_a_u64_pair_for_any_tensor_size(nbytes):
    """A zero-size tensor made 'nbytes - 1' negative, which cannot be packed: a 10-minute p7
    differential stopped at it (LocalProtocolError in the generated phase)."""
    for case, offset, size in range_cases(nbytes, 4096):
        assert 0 <= offset < 1 << 64 and 0 <= size < 1 << 64, case


def test_the_graph_cases_reach_the_reference_bound_exactly_and_one_past_it():
    assert MAX_GRAPH_TENSORS == ServerConfig.max_graph_tensors
    regions = (BufferRegion(0x1000, 0x10_0000, 4096), BufferRegion(0x2000, 0x20_0000, 8192))
    sizes = {case: len(tensors) for case, _, tensors in graph_cases(regions)}
    assert max(n for c, n in sizes.items() if c != "tensors_past_bound") == MAX_GRAPH_TENSORS
    assert sizes["tensors_past_bound"] == MAX_GRAPH_TENSORS + 1


# ------------------------------------------------------------------ the sweep
def test_every_boundary_case_sends_the_request_it_is_labelled_with():
    """Each frame decodes, with the dialect's own codec, to a request of the labelled
    command, and no two cases send the same bytes (an edge equal to the baseline is sent
    once)."""
    head, regions = sw._setup(D8)
    seen: Counter = Counter()
    frames: dict[bytes, str] = {}
    for label, cmd, desc, req in sw._boundary_requests(D8, regions):
        frame = sw._frame(D8, req)
        assert frame[0] == D8.id_of(cmd) and desc["cmd"] == cmd.value, label
        if len(frame) < 1 << 20:  # the deep graphs: decoding 65,536 tensors is costly
            assert unpack_request_payload(D8, cmd, frame[REQUEST_HEADER_SIZE:]) == req, label
            assert frames.setdefault(frame, label) == label, (frames[frame], label)
        seen[desc["what"]] += 1
    assert set(seen) == {"placement", "shape_class", "field_class", "error_path",
                         "scalar_class", "range_class", "graph_class", "cache_flag"}


def test_the_sweep_credits_every_tensor_role_with_its_buffer_and_data_fields():
    """A placement naming another buffer is about the buffer field, one in the tensor's own
    buffer about its data pointer: both are reached for every role (a 10-minute p8 campaign
    had left srcs[].buffer of GET_ALLOC_SIZE unreached)."""
    _, regions = sw._setup(D8)
    fields = {(desc["cmd"], desc["field"]) for _, _, desc, _ in sw._boundary_requests(D8, regions)
              if desc["what"] == "placement"}
    for cmd, (msg, roles) in sw.baselines(D8, regions).items():
        for slot, _ in roles.values():
            assert {(cmd.value, f"{slot}.buffer"), (cmd.value, f"{slot}.data")} <= fields, slot


def test_the_walk_draws_every_operator_and_command_the_same_way_twice():
    first = list(sw.catalogue_walk("7.0.0", local_only=False))
    pairs = {f"{op.kind}:{op.what}:{c.value if c is not None else 'UNKNOWN'}"
             for op, c in sw._walk_pairs(get_dialect("7.0.0"))}
    assert {c.label for c in first} == pairs
    assert _digest(first) == _digest(sw.catalogue_walk("7.0.0", local_only=False))


def test_size_bounds_the_sweep_and_shards_partition_it(monkeypatch):
    whole = _digest(sw.sweep("7.0.0"))
    assert len(whole) <= sw.size("7.0.0")
    assert sum(sw.size("7.0.0", shard=(i, 3)) for i in (1, 2, 3)) == sw.size("7.0.0")
    # a shard builds only its own graphs (a worker built all 60 MB scale graphs of the others)
    from harness.fuzz import scale
    built, plan = [], scale.plan

    def counted(d, r):
        return [(label, n, lambda b=b, label=label: built.append(label) or b())
                for label, n, b in plan(d, r)]
    monkeypatch.setattr(scale, "plan", counted)
    assert _digest(sw.sweep("7.0.0", shard=(2, 3))) == whole[1::3]
    scaled = [label for label, _ in whole if label.startswith("scale_class:")]
    assert [f"scale_class:GRAPH_COMPUTE {b}" for b in built] == \
        [label for label, _ in whole[1::3] if label in scaled] and len(built) < len(scaled)


def test_a_sweep_stopped_by_its_share_is_a_problem_and_an_exhausted_one_is_complete(tmp_path,
                                                                                     monkeypatch):
    import harness.fuzz.differential as diff
    few = list(sw.boundary_sweep("7.0.0"))[:6]
    monkeypatch.setattr(diff, "sweep_cases", lambda *a, **k: iter(few))
    monkeypatch.setattr(diff, "sweep_size", lambda *a, **k: 10)  # an upper bound, as size()
    _, report = run_differential(DifferentialConfig(a="ref", b="ref-7.0.0", seed=1,
                                                    duration=30, max_cases=8,
                                                    out=tmp_path / "d"))
    assert report["sweep"]["complete"] and report["sweep"]["cases"] == 6, report["sweep"]
    stopped = {"duration_s": 600, "sweep": {"cases": 3000, "done": 10, "complete": False}}
    assert systematic_problems(stopped) and not systematic_problems(
        {"duration_s": 600, "sweep": report["sweep"]})
    # a 150 s campaign's 30 s share may not hold the whole sweep; its catalogue walk must
    assert not systematic_problems({**stopped, "duration_s": 150})
    assert systematic_problems({**stopped, "duration_s": 150,
                                "coverage": {"missing": ["framing:truncated:HELLO"]}})


@pytest.mark.slow
def test_the_sweep_finds_a_planted_boundary_bug(tmp_path):
    """The reference with a bounds check one byte short (tensor_bounds_slack=1) against the
    correct one: the sweep's boundary classes alone find it, at a placement of one byte past
    a buffer's end; each divergence is the plant's (two correct servers agree on it)."""
    from harness.fuzz.allow_list import load_allow
    from harness.fuzz.differential import _Pair
    from harness.fuzz.replay import load
    planted = "ref-7.0.0:tensor_bounds_slack=1"
    single = ("boundary",)  # the placements: the single-field sweep before issue 30
    out = tmp_path / "d"
    _, report = run_differential(DifferentialConfig(
        a="ref-7.0.0", b=planted, seed=1, duration=300, sweep_share=1.0, phases=single,
        max_cases=sw.size("7.0.0", only=single), shrink_seconds=10, out=out))
    assert not report["errors"], report["errors"]
    assert report["findings"] and report["sweep"]["complete"], report["stats"]
    cases = {f["listing"][-1] if f["listing"] else "" for f in report["findings"]}
    assert any("end-nbytes+1" in line or "end-1" in line for line in cases), cases
    # the control: each minimised divergence is the plant's, not the pipeline's (the sweep's
    # cases between identical servers: tests/test_interactions.py, in process, every phase).
    # One pair of servers each way for all of them; `harness replay --differential` starts a
    # fresh pair per finding (tests/test_fuzz_differential.py).
    cases = {f["title"]: load(out / "divergences" / f["id"] / "repro.rpct")[0]
             for f in report["findings"]}
    for b, diverges in ((planted, True), ("ref-7.0.0", False)):
        pair = _Pair(DifferentialConfig(a="ref-7.0.0", b=b, dialect="7.0.0"),
                     tmp_path / ("control-" + b.replace(":", "-")))
        pair.start()
        try:
            for title, case in cases.items():
                div, _ = pair.judge(case, load_allow(None))
                assert (div is not None) == diverges, (b, title, div)
        finally:
            pair.stop()


def test_comm_init_pairs_the_loopback_rule_forbids_are_withheld_not_missing():
    from collections import Counter as C
    from harness.fuzz.report import coverage_summary
    cov = coverage_summary("8.0.0", C())
    assert "field:comm_params:COMM_INIT" in cov["withheld"]
    assert not set(cov["withheld"]) & set(cov["missing"])
    # the refused framings are sent (the server stops at the length check): still counted
    assert "framing:len_huge:COMM_INIT" in cov["missing"]
    # a campaign that swept everything else has no problem left
    every = C({f"{k.replace(':', '|')}|x": 1 for k in cov["missing"]})
    done = coverage_summary("8.0.0", every)
    assert done["missing"] == [] and not systematic_problems(
        {"duration_s": 600, "coverage": done})
    assert coverage_summary("8.0.0", C(), local_only=False)["withheld"] == []


def test_the_in_process_engine_is_seeded_with_the_sweep(tmp_path):
    from harness.fuzz.libfuzzer import corpus as lfc
    n = lfc.write_seed_corpus(tmp_path, "7.0.0", valid=2, mutated=2, sweep_max_len=1 << 16)
    files = {p.read_bytes() for p in tmp_path.iterdir()}
    past_end = next(c for c in sw.boundary_sweep("7.0.0") if "error_path" in c.label)
    assert lfc.case_to_input(past_end.case) in files
    deep = next(c for c in sw.boundary_sweep("7.0.0") if "tensors_past_bound" in c.label)
    assert lfc.case_to_input(deep.case) not in files  # 19 MB: past max_len
    assert n == len(files) > sw.size("7.0.0") // 2


def test_the_sweeps_seed_folder_is_written_once_and_replaces_an_older_one(tmp_path,
                                                                          monkeypatch):
    """libFuzzer reads the sweep's inputs from one folder in the cache: named as libFuzzer
    names corpus files, written once per version of the code (no half folder left), an older
    version's removed."""
    from harness.fuzz.libfuzzer import corpus as lfc
    from harness.impls.cache import CACHE_ENV
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(lfc, "sweep_inputs", lambda dialect, n: [b"a", b"bb"])
    old = tmp_path / "sweep" / "seed-dir-7.0.0-64-0123456789abcdef"
    old.mkdir(parents=True)
    made = lfc.sweep_seed_dir("7.0.0", 64)
    assert {p.name: p.read_bytes() for p in made.iterdir()} == \
        {lfc.input_name(x): x for x in (b"a", b"bb")}
    assert not old.exists() and [p.name for p in made.parent.iterdir()] == [made.name]
    monkeypatch.setattr(lfc, "sweep_inputs", lambda dialect, n: pytest.fail("written again"))
    assert lfc.sweep_seed_dir("7.0.0", 64) == made


def test_the_cached_walk_is_the_walk_and_a_damaged_cache_is_drawn_again(tmp_path, monkeypatch):
    from harness.impls.cache import CACHE_ENV
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    fresh = [c.case for c in sw.catalogue_walk("7.0.0")]
    assert [c.case for c in sw.cached_walk("7.0.0")] == fresh
    (stored,) = (tmp_path / "sweep").glob("walk-7.0.0-*.pickle")
    assert [c.case for c in sw.cached_walk("7.0.0")] == fresh  # read back
    stored.write_bytes(stored.read_bytes()[:100])  # a killed writer's half file
    assert [c.case for c in sw.cached_walk("7.0.0")] == fresh
    older = tmp_path / "sweep" / "walk-7.0.0-2-1-0000000000000000.pickle"
    older.write_bytes(b"x")
    stored.unlink()
    sw.cached_walk("7.0.0")
    assert not older.exists()  # a walk of another harness version is not kept


def _slow_walk(tmp_path, monkeypatch):
    """No walk in the cache, and drawing it takes 4 s. Only the walk: the sweep's other parts
    come from the cache as in any campaign (an empty cache made each of these tests build
    every part again, 30 s of their 40)."""
    real_cached = sw._cached
    monkeypatch.setattr(sw, "_cached", lambda kind, key, build: build() if kind == "walk"
                        else real_cached(kind, key, build))
    sw._prepare.cache_clear()  # nor in this process's memory of an earlier campaign
    real = sw.catalogue_walk

    def slow(*a, **kw):
        time.sleep(4.0)
        return real(*a, **kw)
    monkeypatch.setattr(sw, "catalogue_walk", slow)


def _slow_walk_campaign(tmp_path, monkeypatch):
    """A 3 s campaign whose walk is not in the cache and takes 4 s to draw."""
    from harness.fuzz.campaign import CampaignConfig, run_campaign
    _slow_walk(tmp_path, monkeypatch)
    _, report = run_campaign(CampaignConfig(target="ref", duration=3, seed=3,
                                            out=tmp_path / "out", shrink_seconds=2))
    return report


def _slow_walk_differential(tmp_path, monkeypatch):
    _slow_walk(tmp_path, monkeypatch)
    _, report = run_differential(DifferentialConfig(a="ref", b="ref-7.0.0", duration=3,
                                                    seed=3, out=tmp_path / "d"))
    return report


def test_a_differential_draws_the_walk_before_its_clock_starts(tmp_path, monkeypatch):
    report = _slow_walk_differential(tmp_path, monkeypatch)
    assert report["cases"] > 0 and not report["errors"], report["stats"]


def test_planted_a_differential_drawing_the_walk_on_the_clock_runs_no_session(tmp_path,
                                                                              monkeypatch):
    import harness.fuzz.differential as diff
    monkeypatch.setattr(diff, "prepare", lambda *a, **kw: None)
    report = _slow_walk_differential(tmp_path, monkeypatch)
    assert report["cases"] == 0, report["stats"]


def test_a_campaign_draws_the_walk_before_its_clock_starts(tmp_path, monkeypatch):
    # the CI failure of stop 28: `harness bench --quick` ran the first campaign of a new
    # harness version for 4 s, all of them spent drawing the walk: 0 messages/s
    report = _slow_walk_campaign(tmp_path, monkeypatch)
    # (3 s is too short for the sweep's share after the warm-up: the random phase sends)
    assert report["messages_sent"] > 0 and report["cases"] > 0, report["timing_s"]


def test_planted_a_walk_drawn_on_the_clock_leaves_a_short_campaign_nothing(tmp_path,
                                                                          monkeypatch):
    import harness.fuzz.campaign as campaign
    monkeypatch.setattr(campaign, "prepare", lambda dialect: None)
    report = _slow_walk_campaign(tmp_path, monkeypatch)
    assert report["messages_sent"] == 0, report["timing_s"]  # the walk took its time


def test_the_boundary_part_from_the_cache_is_the_part_built(tmp_path, monkeypatch):
    """The boundary part's small cases come from the cache and its graph cases are built in
    their place: the same cases in the same order as building every one, on a cold cache
    and a warm one."""
    from harness.impls.cache import CACHE_ENV
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    # the graph cases stand in as their small baseline graph: building the 2^16-tensor ones
    # three times would be most of the test, and they are built the same way in both paths
    monkeypatch.setattr(sw, "_built_graph", lambda d, build, template: template)
    d = sw.get_dialect("7.0.0")
    head, regions = sw._setup(d)
    built = [sw.SweepCase("boundary", label, sw._session(d, head, sw._frame(d, req),
                                                          cmd.value, desc))
             for label, cmd, desc, req in sw._boundary_requests(d, regions)]
    cold = list(sw.boundary_sweep("7.0.0"))
    assert list((tmp_path / "sweep").glob("boundary-7.0.0-*.pickle"))
    assert cold == built and list(sw.boundary_sweep("7.0.0")) == built
    # planted: an entry that lost a case is caught
    entry = next((tmp_path / "sweep").glob("boundary-7.0.0-*.pickle"))
    import pickle
    planted = pickle.loads(entry.read_bytes())
    entry.write_bytes(pickle.dumps(planted[:10] + planted[11:]))
    assert list(sw.boundary_sweep("7.0.0")) != built
