"""The fuzzer's parts without a real server: relocation, expectations, signatures, ddmin,
reproducer files, and the executor's connection oracle against the in-process reference."""

from __future__ import annotations

import io
import random
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import strategies as rst
from harness.capture.transcript import Transcript
from harness.fuzz.case import (BASE, HANDLE, Case, Reloc, annotate, find_relocs, relocate,
                               sentinel, step)
from harness.fuzz.display import parse_duration
from harness.fuzz.execute import CLOSED, HANG, OK, PROTOCOL, Executor
from harness.fuzz.generate import cases, steady_session
from harness.fuzz.replay import load
from harness.fuzz.case_runner import culprit
from harness.fuzz.shrink import (Budget, ddmin, drop_unneeded_mutations, minimise_case,
                                 save_reproducer)
from harness.fuzz.signature import Signature, death_line, normalise
from harness.fuzz.target_spec import TargetSpec
from harness.fuzz.errors import TargetError
from harness.reference.knobs import Misbehaviour
from harness.reference.server import ReferenceServer
from harness.reference.server_core import ServerConfig
from harness.proto import RpcTensor, get_dialect, pack_request
from harness.proto import messages as m
from harness.proto.wire import U64

D7 = get_dialect("7.0.0")


def frame(msg) -> bytes:
    return pack_request(D7, msg)


def hello() -> bytes:
    return rst.hello_request_frame(D7)


# ---------------------------------------------------------------- relocation

def test_relocations_follow_the_sentinels_whatever_the_field():
    h, b = sentinel(HANDLE, 1), sentinel(BASE, 1)
    t = RpcTensor.make(id=0x1000, ne=(4,), buffer=h, data=b - 1, src=(b + 4096 + 1,))
    f = frame(m.GetTensorRequest(t, 0, 4))
    relocs = find_relocs(f)
    assert [(r.kind, r.index, r.addend) for r in relocs] == [
        (HANDLE, 1, 0), (BASE, 1, 4097), (BASE, 1, -1)]  # buffer, src[0], data (by offset)
    live = {HANDLE: [0, 0x5555_0000_1000], BASE: [0, 0x5555_0000_8000]}
    out = RpcTensor.unpack_from(relocate(f, relocs, live), 9)
    assert out.buffer == 0x5555_0000_1000
    assert out.data == 0x5555_0000_8000 - 1
    assert out.src[0] == 0x5555_0000_8000 + 4097


def test_relocation_of_an_unlearned_buffer_counts_from_zero():
    f = frame(m.BufferGetBaseRequest(sentinel(HANDLE, 3) + 16))
    (r,) = find_relocs(f)
    assert r == Reloc(9, HANDLE, 3, 16)
    assert U64.unpack_from(relocate(f, [r], {HANDLE: [7], BASE: [0]}), 9)[0] == 16


def test_only_whole_reads_are_relocated_in_the_header():
    """The in-process target relocates inside each of the server's reads (command byte, size,
    payload): a sentinel across a read boundary of the header is not relocated, the size
    field itself and any u64 of the payload are."""
    v = struct.pack("<Q", sentinel(HANDLE, 2) + 5)
    for start in (0, 2, 5, 8):  # across command/size or size/payload
        f = bytearray(bytes([10]) + bytes(8) + bytes(16))
        f[start:start + 8] = v
        assert find_relocs(bytes(f)) == (), start
    for start in (1, 9, 12):
        f = bytearray(bytes([10]) + bytes(8) + bytes(16))
        f[start:start + 8] = v
        assert find_relocs(bytes(f)) == (Reloc(start, HANDLE, 2, 5),), start


def test_relocated_u64s_do_not_overlap():
    """The scan goes on after a relocated u64 (as the in-process target's does): bytes patched
    in must not complete a sentinel that was not in the input."""
    first = struct.pack("<Q", sentinel(HANDLE, 2))
    # 6 bytes on, the first one's tag starts a second valid one (handle 0 + 0xAA5)
    f = bytes([10]) + bytes(8) + first + bytes([0, 0, 0, 0xD0, 0xA5, 0x0A])
    assert U64.unpack_from(f, 15)[0] == sentinel(HANDLE, 0) + 0xAA5
    assert [r.offset for r in find_relocs(f)] == [9]
    apart = bytes([10]) + bytes(8) + first + first
    assert [r.offset for r in find_relocs(apart)] == [9, 17]


def test_random_bytes_are_not_relocated():
    rng = random.Random(1)
    blob = rng.randbytes(1 << 20)
    assert find_relocs(blob) == ()


# ---------------------------------------------------------------- expectations

def test_annotate_gives_each_step_the_answers_the_spec_requires():
    case = annotate(D7, (step(hello(), "HELLO"),
                         step(frame(m.AllocBufferRequest(0, 256)), "ALLOC_BUFFER"),
                         step(frame(m.BufferClearRequest(1, 0)), "BUFFER_CLEAR"),
                         step(frame(m.GetAlignmentRequest(0)) * 2, "GET_ALIGNMENT")))
    assert [s.expect for s in case.steps] == [(28,), (16,), (), (8, 8)]
    assert case.protocol_error_at is None and not case.open_ended


def test_annotate_marks_the_first_refused_step_and_open_frames():
    bad = annotate(D7, (step(hello(), "HELLO"), step(bytes([200]) + U64.pack(0), "UNKNOWN_200"),
                        step(frame(m.GetAlignmentRequest(0)), "GET_ALIGNMENT")))
    assert bad.protocol_error_at == 1 and bad.steps[2].expect == ()
    # A SET_TENSOR announcing 1 MiB but carrying its header only: the server waits.
    head = frame(m.SetTensorRequest(RpcTensor.make(id=1), 0, 0, b""))
    waiting = bytes([head[0]]) + U64.pack(1 << 20) + head[9:]
    open_case = annotate(D7, (step(hello(), "HELLO"), step(waiting, "SET_TENSOR"),
                              step(frame(m.GetAlignmentRequest(0)), "GET_ALIGNMENT")))
    assert open_case.open_ended and open_case.steps[2].expect == ()


# ---------------------------------------------------------------- generation

@settings(max_examples=60, suppress_health_check=list(HealthCheck))
@given(cases("7.0.0", mutation_odds=0))
def test_valid_sessions_decode_and_start_like_a_client(case):
    assert case.protocol_error_at is None and not case.open_ended
    assert case.steps[0].cmd == "HELLO" and case.steps[-1].cmd == "GET_ALIGNMENT"
    assert case.steps[1].learn == (HANDLE, 0) and case.steps[2].learn == (BASE, 0)
    assert not any(s.mutated for s in case.steps)


@settings(max_examples=60, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(["7.0.0", "9.0.0", "3.6.1"]).flatmap(
    lambda d: cases(d, mutation_odds=2)))
def test_mutated_steps_carry_well_formed_descriptions(case):
    for s in case.steps:
        if s.mutated:
            rst.check_description(s.desc)
            assert s.desc["direction"] == "request"


@pytest.mark.parametrize("dialect", ["3.6.1", "5.0.0", "7.0.0", "8.0.0", "9.0.0"])
def test_steady_sessions_are_valid_in_every_dialect(dialect):
    prologue, body = steady_session(dialect, (4096, 1024), 300, seed=2)
    case = annotate(dialect, tuple(prologue + body))
    assert case.protocol_error_at is None and len(body) == 300


# ---------------------------------------------------------------- signatures

def test_normalise_drops_paths_addresses_and_sizes():
    raw = ("/build/llama.cpp/ggml/src/ggml-rpc.cpp:1414: GGML_ASSERT(tensor->data >= "
           "buffer_start) failed at 0x55d1c0a0 size 123456")
    assert normalise(raw) == ("ggml-rpc.cpp:1414: GGML_ASSERT(tensor->data >= buffer_start) "
                              "failed at 0x? size N")


@pytest.mark.parametrize("path", [
    "/build/cache/ggml-rpc-harness/build/src/llama.cpp/ggml/src/ggml.c",
    # a peer cache elsewhere, built through ccache with a base directory: __FILE__ is relative
    "../src/llama_cpp_python-0.3.36/vendor/llama.cpp/ggml/src/ggml.c",
    "./ggml/src/ggml.c", "../ggml.c", "ggml.c"])
def test_an_assert_names_its_file_alone_wherever_the_build_was(path):
    """The shipped reproducers and allow-lists name ``ggml.c:1787``: the same assert must give
    that line whatever directory the peer was built in (stop 38's cold CI run, with the cache
    under XDG_CACHE_HOME, saw ``..ggml.c:1787`` and replayed nothing)."""
    line = f"{path}:1787: GGML_ASSERT(INT64_MAX / ne[i] > current_nelements) failed"
    want = "ggml.c:1787: GGML_ASSERT(INT64_MAX / ne[i] > current_nelements) failed"
    assert normalise(line) == want
    assert death_line(["Accepted client connection", line]) == want


def test_what_is_not_a_path_keeps_its_slashes():
    for text in ("GGML_ASSERT(a / b > c) failed", "5 MB/s", "x..y", "ratio 1/2"):
        assert normalise(text) == text


def test_death_line_prefers_the_assert_and_reads_python_tracebacks():
    log = ["Accepted client connection", "/a/b/ggml.c:1787: GGML_ASSERT(x > y) failed",
           "Expected HELLO command"]
    assert death_line(log) == "ggml.c:1787: GGML_ASSERT(x > y) failed"
    tb = ["Traceback (most recent call last):",
          '  File "/srv/harness/reference/server_core.py", line 10, in _alloc_buffer',
          "    x = y[3]", "KeyError: 3"]
    assert death_line(tb) == "KeyError: 3 at server_core.py:_alloc_buffer"
    assert death_line(["terminate called after throwing an instance of 'std::bad_alloc'"]) \
        == "terminate called after throwing an instance of 'std::bad_alloc'"
    # The fault shim's line wins, reduced to the function (or module page) it names.
    assert death_line(["Accepted client connection",
                       "harness-fault: SIGSEGV null page in libc.so.6+0x16d870"]) \
        == "SIGSEGV null page in libc.so.6 page 0x16d000"
    # ... and a fault inside libc keeps the caller the shim names (whose pointer it was)
    assert death_line(["harness-fault: SIGSEGV null page in libc.so.6+0x167ad8 from "
                       "libggml-base.so+0x1c2f1 (ggml_log_internal+0x71)"]) \
        == "SIGSEGV null page in libc.so.6 page 0x167000 from libggml-base.so (ggml_log_internal)"
    add = ("harness-fault: SIGSEGV null page in libggml-cpu.so.0+0x79b78 "
           "(ggml_compute_forward_add_non_quantized+0x478)")
    assert death_line([add]) == \
        "SIGSEGV null page in libggml-cpu.so.0 (ggml_compute_forward_add_non_quantized)"
    assert death_line([add], raw=True) == add[len("harness-fault: "):]
    assert death_line(["harness-fault: SIGSEGV stack overflow in libggml-base.so.0+0x1dbb2 "
                       "(ggml_row_size+0x12)"]) == "SIGSEGV stack overflow"
    # ... also when the site is in libc and the caller's long C++ name did not fit the line
    assert death_line(["harness-fault: SIGSEGV stack overflow in libc.so.6+0x98098 from "
                       "libggml-rpc.so.0+0x238d2 (_ZNSt8__detail9_Map_baseImSt4pairIKmP11+0"]) \
        == "SIGSEGV stack overflow"
    # A formatted abort message: its site, not every type combination, is the bug.
    assert death_line(["/x/binary-ops.cpp:135: binary_op: unsupported types: dst: q4_0, "
                       "src0: f32, src1: f32"]) == "binary-ops.cpp:135: binary_op: ..."
    assert death_line(["/x/ops.cpp:571: fatal error"]) == "ops.cpp:571: fatal error"


def test_signatures_dedupe_on_signal_line_and_command():
    a = Signature("crash", "SIGABRT", "ggml.c:1: GGML_ASSERT(x) failed", "GET_TENSOR")
    b = Signature("crash", "SIGABRT", "ggml.c:1: GGML_ASSERT(x) failed", "GET_TENSOR")
    c = Signature("crash", "SIGABRT", "ggml.c:1: GGML_ASSERT(x) failed", "SET_TENSOR")
    assert a == b and a.id == b.id and len({a, b, c}) == 2
    assert a.same_bug(c, command=False) and not a.same_bug(c)
    assert a.id.startswith("crash-get_tensor-") and a.id != c.id
    assert Signature.from_json(a.to_json()) == a


def test_culprit_is_the_mutated_step_in_the_window():
    steps = (step(hello(), "HELLO"), step(frame(m.GetAlignmentRequest(0)), "GET_ALIGNMENT"),
             step(frame(m.BufferClearRequest(1, 0)), "BUFFER_CLEAR", desc={"kind": "field"}),
             step(frame(m.GetMaxSizeRequest(0)), "GET_MAX_SIZE"))
    case = annotate(D7, steps)
    from harness.fuzz.execute import Outcome
    out = Outcome(CLOSED, progress=4, proven=2, at=3)
    assert culprit(case, out) == "BUFFER_CLEAR"
    assert culprit(case, out, lockstep=True) == "BUFFER_CLEAR"
    # Lockstep: nothing mutated in the window -> the step the end was seen at.
    valid = annotate(D7, steps[:2] + (step(frame(m.BufferClearRequest(1, 0)), "BUFFER_CLEAR"),
                                      steps[3]))
    assert culprit(valid, out) == "BUFFER_CLEAR"
    assert culprit(valid, out, lockstep=True) == "GET_MAX_SIZE"
    # A hang is not seen at its step: GET_MAX_SIZE went unanswered, but the server may be
    # stuck in the BUFFER_CLEAR before it (no answer due), the first suspect.
    hung = Outcome(HANG, progress=2, proven=2, at=3)
    assert culprit(valid, hung, lockstep=True, hang=True) == "BUFFER_CLEAR"


# ---------------------------------------------------------------- minimisation

def test_ddmin_finds_the_one_minimal_subsequence():
    calls = []

    def fails(xs):
        calls.append(len(xs))
        return 3 in xs and 17 in xs
    assert ddmin(list(range(40)), fails, Budget(10)) == [3, 17]
    assert len(calls) < 200


def test_ddmin_stops_on_its_budget_with_a_failing_list():
    out = ddmin(list(range(64)), lambda xs: 5 in xs, Budget(10, attempts=3))
    assert 5 in out and len(out) < 64


def test_minimise_case_keeps_order_and_the_signature():
    # A "target" that breaks when an unknown command follows a BUFFER_CLEAR.
    steps = [step(hello(), "HELLO")] + [step(frame(m.GetAlignmentRequest(0)), "GET_ALIGNMENT")
                                         for _ in range(10)]
    steps.insert(4, step(frame(m.BufferClearRequest(1, 0)), "BUFFER_CLEAR"))
    steps.insert(9, step(bytes([99]) + U64.pack(0), "UNKNOWN_99"))
    case = annotate(D7, tuple(steps))

    def same(c: Case) -> bool:
        cmds = [s.cmd for s in c.steps]
        return "BUFFER_CLEAR" in cmds and "UNKNOWN_99" in cmds[cmds.index("BUFFER_CLEAR"):]
    small = minimise_case(case, same, Budget(10))
    assert [s.cmd for s in small.steps] == ["BUFFER_CLEAR", "UNKNOWN_99"]


def test_a_spent_budget_does_not_name_a_finding_after_a_bystander():
    """A valid SET_TENSOR grows memory; a mutated MEMSET_TENSOR after it is a bystander that
    a spent budget left in. The naming pass drops it (and keeps a mutated step the finding
    needs), so the culprit is the SET_TENSOR, as it is with time to spare."""
    mut = {"kind": "field", "what": "size_near_bounds", "cmd": "MEMSET_TENSOR"}
    steps = (step(hello(), "HELLO"),
             step(frame(m.AllocBufferRequest(0, 256)), "ALLOC_BUFFER"),
             step(b"set", "SET_TENSOR"),
             step(b"memset", "MEMSET_TENSOR", desc=mut),
             step(b"clear", "BUFFER_CLEAR", desc={**mut, "cmd": "BUFFER_CLEAR"}))
    case = annotate(D7, steps)
    assert culprit(case, None) == "BUFFER_CLEAR"  # no outcome: the last step

    def same(c: Case) -> bool:  # needs the upload and the mutated clear
        cmds = [s.cmd for s in c.steps]
        return "SET_TENSOR" in cmds and "BUFFER_CLEAR" in cmds
    spent = minimise_case(case, same, Budget(10, attempts=0))
    assert [s.cmd for s in spent.steps] == [s.cmd for s in steps]  # nothing tried
    named = drop_unneeded_mutations(spent, same)
    assert [s.cmd for s in named.steps] == ["HELLO", "ALLOC_BUFFER", "SET_TENSOR",
                                            "BUFFER_CLEAR"]
    # planted: a pass that drops nothing would leave the bystander to be named
    assert [s.cmd for s in drop_unneeded_mutations(case, lambda c: len(c.steps) == 5).steps] \
        == [s.cmd for s in steps]


# ---------------------------------------------------------------- reproducer files

def test_reproducer_round_trip(tmp_path):
    steps = (step(hello(), "HELLO"),
             step(frame(m.AllocBufferRequest(0, 256)), "ALLOC_BUFFER", learn=(HANDLE, 0)),
             step(frame(m.BufferGetBaseRequest(sentinel(HANDLE, 0))), "BUFFER_GET_BASE",
                  learn=(BASE, 0)),
             step(frame(m.GetTensorRequest(RpcTensor.make(id=1, ne=(4,), buffer=sentinel(
                 HANDLE, 0), data=sentinel(BASE, 0) + 250), 0, 16)), "GET_TENSOR",
                  desc={"kind": "field", "what": "data_near_bounds", "field": "tensor.data"}))
    case = annotate(D7, steps)
    sig = Signature("crash", "SIGABRT", "ggml-rpc.cpp:1414: GGML_ASSERT(x) failed", "GET_TENSOR")
    finding = save_reproducer(tmp_path / sig.id, signature=sig, case=case, outcome=None,
                              target="p7", dialect="7.0.0", detail="test")
    folder = tmp_path / sig.id
    assert {p.name for p in folder.iterdir()} == {"repro.rpct", "repro.pcap", "finding.json",
                                                  "test_repro.py"}
    assert finding["replay"] == f"harness replay {folder}/repro.rpct --target p7"
    for path in (folder, folder / "repro.rpct", folder / "finding.json"):
        loaded, loaded_sig, meta = load(path)
        assert loaded.steps == case.steps and loaded_sig == sig and meta["target"] == "p7"
    session = Transcript.load(folder / "repro.rpct").decode("7.0.0")
    assert [e.cmd.value for e in session.exchanges] == ["HELLO", "ALLOC_BUFFER",
                                                        "BUFFER_GET_BASE", "GET_TENSOR"]
    compile((folder / "test_repro.py").read_text(), "test_repro.py", "exec")


def test_plain_transcripts_replay_verbatim(tmp_path):
    tr = Transcript(meta={"dialect": "7.0.0"})
    tr.add(0.0, "c2s", hello())
    tr.add(0.1, "c2s", frame(m.GetAlignmentRequest(0)))
    tr.save(tmp_path / "x.rpct")
    case, sig, _ = load(tmp_path / "x.rpct")
    assert sig is None and [s.expect for s in case.steps] == [(28,), (8,)]


# ---------------------------------------------------------------- options and targets

def test_parse_duration():
    assert parse_duration("10m") == 600 and parse_duration("90s") == 90
    assert parse_duration("1m30s") == 90 and parse_duration("45") == 45
    with pytest.raises(ValueError):
        parse_duration("ten minutes")


def test_target_specs():
    assert TargetSpec.parse("ref") == TargetSpec("ref", "ref-7.0.0", "7.0.0")
    assert TargetSpec.parse("ref-9").dialect == "9.0.0"
    assert TargetSpec.parse("ref", "7f").name == "ref-7.0.0+flags"
    with pytest.raises(TargetError):
        TargetSpec.parse("no-such-peer-anywhere")


def test_a_peer_name_wins_over_a_folder_of_that_name(tmp_path, monkeypatch):
    # A campaign's out dir is often named after its target (reports/.../p7): `p7` is still
    # the peer; `./p7` is the folder (which holds no server).
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p7").mkdir()
    assert TargetSpec.parse("p7").kind == "peer"
    with pytest.raises(TargetError, match="no ggml-rpc-server"):
        TargetSpec.parse("./p7")


# ---------------------------------------------------------------- the connection oracle

@pytest.fixture
def reference():
    servers = []

    def start(**knobs) -> ReferenceServer:
        srv = ReferenceServer(ServerConfig(dialect=D7, memory_budget=64 << 20,
                                           knobs=Misbehaviour(**knobs)),
                              serial=True, idle_timeout=5, out=io.StringIO(), err=io.StringIO())
        srv.start()
        servers.append(srv)
        return srv
    yield start
    for s in servers:
        s.stop()


def _session(*extra: bytes) -> Case:
    steps = [step(hello(), "HELLO"),
             step(frame(m.AllocBufferRequest(0, 1024)), "ALLOC_BUFFER", learn=(HANDLE, 0)),
             step(frame(m.BufferGetBaseRequest(sentinel(HANDLE, 0))), "BUFFER_GET_BASE",
                  learn=(BASE, 0))]
    steps += [step(e, "X") for e in extra]
    return annotate(D7, tuple(steps))


def test_executor_learns_live_values_and_relocates(reference):
    srv = reference()
    t = RpcTensor.make(id=1, ne=(4,), buffer=sentinel(HANDLE, 0), data=sentinel(BASE, 0) + 32)
    case = _session(frame(m.SetTensorRequest(t, 0, 0, b"\1\2\3\4" * 4)),
                    frame(m.GetTensorRequest(t, 0, 16)))
    out = Executor(srv.host, srv.port, deadline=5).run(case, record=True)
    assert out.status == OK and out.proven == len(case.steps)
    assert out.live[HANDLE][0] and out.live[BASE][0]
    assert out.log[-1][0] == "s2c" and out.log[-1][2].endswith(b"\1\2\3\4" * 4)


def test_executor_sees_a_close_a_bad_length_and_a_hang(reference):
    srv = reference()
    closed = Executor(srv.host, srv.port).run(_session(frame(m.BufferGetBaseRequest(12345))))
    assert closed.status == CLOSED and closed.at == 3
    garbled = reference(garble_response_len="GET_ALIGNMENT")
    out = Executor(garbled.host, garbled.port).run(_session(frame(m.GetAlignmentRequest(0))))
    assert out.status == PROTOCOL and "9-byte payload" in out.detail
    stalled = reference(stall_on="GET_MAX_SIZE")
    out = Executor(stalled.host, stalled.port, deadline=0.5).run(
        _session(frame(m.GetMaxSizeRequest(0))))
    assert out.status == HANG and out.at == 3


def test_executor_requires_a_close_after_a_refused_request(reference):
    srv = reference()
    out = Executor(srv.host, srv.port).run(_session(bytes([200]) + U64.pack(0)))
    assert out.status == CLOSED  # the reference closes, as the spec says


def test_deep_chains_can_list_only_their_output():
    from harness.strategies.graphs import _deep_chain
    region = rst.BufferRegion(sentinel(HANDLE, 0), sentinel(BASE, 0), 4096)
    every = _deep_chain(100, region)
    last = _deep_chain(100, region, "output_only")
    assert len(every.nodes) == 100 and last.nodes == (every.nodes[-1],)
    assert last.tensors == every.tensors
    case = annotate(D7, (step(hello(), "HELLO"), step(frame(last), "GRAPH_COMPUTE")))
    assert case.protocol_error_at is None
    chain = {t.id: t.src[0] for t in last.tensors}
    depth, node = 0, last.nodes[0]
    while chain.get(node):
        node, depth = chain[node], depth + 1
    assert depth == 100  # resolving the one listed node walks the whole chain


def test_runner_reports_memory_above_the_bound_and_restarts(tmp_path):
    from harness.fuzz.case_runner import CaseRunner
    from harness.fuzz.target import Target
    target = Target(TargetSpec.parse("ref"), tmp_path / "t", rss_limit=1 << 20)  # 1 MiB: always over
    target.start()
    try:
        runner = CaseRunner(target, deadline=5)
        pid = target.server.pid
        verdict, out = runner.check(_session(frame(m.GetAlignmentRequest(0))))
        assert out.status == OK
        assert verdict.signature.kind == "memory" and verdict.signature.command == "X"
        assert "bound 1 MiB" in verdict.detail
        assert runner.restarts == 1 and target.server.pid != pid and target.exit_info() is None
    finally:
        target.stop()


def test_a_libc_fault_saved_without_its_caller_is_the_one_now_named_with_it():
    from harness.fuzz.replay import ReplayResult
    from harness.fuzz.signature import Signature
    old = Signature("crash", "SIGSEGV", "SIGSEGV null page in libc.so.6 page 0x167000",
                    "SET_TENSOR")
    new = Signature("crash", "SIGSEGV", old.line + " from libggml-base.so page 0x16000",
                    "SET_TENSOR")
    assert ReplayResult(old, new, "", "p8", 3).matches(across_builds=False)
    # not the other way (the saved caller is part of the bug), and not another page of libc
    assert not ReplayResult(new, old, "", "p8", 3).matches(across_builds=False)
    other = Signature("crash", "SIGSEGV", "SIGSEGV null page in libc.so.6 page 0x168000 from "
                      "libggml-base.so page 0x16000", "SET_TENSOR")
    assert not ReplayResult(old, other, "", "p8", 3).matches(across_builds=False)


# ---------------------------------------------------------------- pinning a close

def _closing_server(close_after: int):
    """A server that answers nothing and closes once it has read ``close_after`` bytes."""
    import socket
    import threading
    listener = socket.create_server(("127.0.0.1", 0))

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            got = 0
            with conn:
                while got < close_after:
                    data = conn.recv(close_after - got)
                    if not data:
                        break
                    got += len(data)
    threading.Thread(target=serve, daemon=True).start()
    return listener


def _silent_steps(n: int) -> Case:
    from harness.fuzz.case import Step
    return Case("7.0.0", tuple(Step(bytes([i]) * 16, f"S{i}") for i in range(n)))


@pytest.mark.parametrize("pin_from", [0, 4])
def test_lockstep_pins_the_close_and_waits_only_from_pin_from(pin_from, monkeypatch):
    """Steps before pin_from get no close wait but the last of them; the close is still pinned
    to its step when it lies at or after pin_from - 1."""
    from harness.fuzz.execute import Executor
    listener = _closing_server(16 * 6)  # closes on step 5
    waits = []
    real = Executor._peek_end
    monkeypatch.setattr(Executor, "_peek_end",
                        lambda self, sock, out, cmd, wait: (waits.append(cmd),
                                                            real(self, sock, out, cmd, 0.5))[1])
    try:
        out = Executor("127.0.0.1", listener.getsockname()[1]).run(
            _silent_steps(8), lockstep=True, pin_from=pin_from)
    finally:
        listener.close()
    assert out.status == CLOSED and out.at == 5, (out.status, out.at, out.detail)
    assert waits == [f"S{i}" for i in range(max(pin_from - 1, 0), 6)]


def test_a_close_before_pin_from_is_pinned_by_a_full_lockstep_run(tmp_path, monkeypatch):
    """A close among the steps not pinned (a run unlike the one that chose pin_from) shows at
    pin_from - 1 or before: the runner runs the case again, pinning every step."""
    from harness.fuzz.case_runner import CaseRunner
    from harness.fuzz.execute import Executor
    from harness.fuzz.target import Target
    listener = _closing_server(16 * 2)  # closes on step 1
    target = Target(TargetSpec.parse("ref"), tmp_path / "t")
    target.start()
    pins = []
    real = Executor.run

    def run(self, case, **k):
        pins.append(k.get("pin_from", 0))
        _at_the_closing_server(self)
        return real(self, case, **k)

    def _at_the_closing_server(ex):
        ex.port = listener.getsockname()[1]  # the case meets the closing server
        # The idle probe watches the ref target, not this server: it would end each wait at
        # once, before a loaded machine has run the closing thread. A plain wait instead.
        ex.idle_probe, ex.lockstep_wait = None, 0.5
    monkeypatch.setattr(Executor, "run", run)
    try:
        runner = CaseRunner(target, deadline=5)
        runner.bounds_oracle = False
        _, out = runner.check(_silent_steps(8), lockstep=True, pin_from=6)
        assert pins == [6, 0] and out.status == CLOSED and out.at == 1, (pins, out.at)
        # planted: without the fallback the close is put on a later step
        _at_the_closing_server(runner.executor)
        out = real(runner.executor, _silent_steps(8), lockstep=True, pin_from=6)
        assert out.status == CLOSED and out.at not in (None, 1), out.at
    finally:
        listener.close()
        target.stop()


def test_a_null_page_and_a_wild_address_at_one_site_are_one_crash(monkeypatch):
    """The fault shim classes a faulting address as null page (< 64 KiB) or wild address. For a
    pointer read out of bounds (p8's ggml_op_name indexing its table with an op past the enum)
    the class is whatever value lies there, which the process's layout decides: CI saw the
    shipped 'wild address' reproducer die of a 'null page' on one zygote. Same signal and
    site: reproduced. Another module, symbol or class (stack overflow) is another crash."""
    from harness.fuzz import signature as sig
    saved = sig.Signature("crash", "SIGSEGV",
                          "SIGSEGV wild address in libggml-base.so (ggml_op_name)", "SET_TENSOR")

    def seen(line: str, signal: str = "SIGSEGV") -> bool:
        return sig.reproduces(saved, sig.Signature("crash", signal, line, "SET_TENSOR"))
    assert seen("SIGSEGV null page in libggml-base.so (ggml_op_name)")
    assert not seen("SIGSEGV null page in libggml-cpu.so (ggml_op_name)")
    assert not seen("SIGSEGV null page in libggml-base.so (ggml_type_name)")
    assert not seen("SIGSEGV stack overflow in libggml-base.so (ggml_op_name)")
    assert not seen("SIGBUS null page in libggml-base.so (ggml_op_name)", "SIGBUS")
    # planted: the class read as part of the site
    monkeypatch.setattr(sig, "bug_line", lambda line: line)
    assert not seen("SIGSEGV null page in libggml-base.so (ggml_op_name)")


def test_a_campaign_claims_a_null_page_and_a_wild_address_at_one_site_once(monkeypatch):
    """A campaign dedupes by the signature's id (the claim folder) and its same_bug: the two
    classes of one faulting site are one finding there too, not two (the replay rule already
    took them as one). The line itself keeps the class that was seen."""
    from harness.fuzz import signature as sig

    def crash(line: str, module: str = "SET_TENSOR") -> sig.Signature:
        return sig.Signature("crash", "SIGSEGV", line, module)
    wild = crash("SIGSEGV wild address in libggml-base.so (ggml_op_name)")
    null = crash("SIGSEGV null page in libggml-base.so (ggml_op_name)")
    other = crash("SIGSEGV null page in libggml-base.so (ggml_type_name)")
    assert wild.id == null.id and wild.same_bug(null) and "wild address" in wild.title()
    assert other.id != null.id and not other.same_bug(null)
    assert crash("SIGSEGV stack overflow in libggml-base.so (ggml_op_name)").id != null.id
    monkeypatch.setattr(sig, "bug_line", lambda line: line)  # planted: the class kept
    assert wild.id != null.id and not wild.same_bug(null)
