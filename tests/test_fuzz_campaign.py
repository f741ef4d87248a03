"""Bounded fuzz campaigns: the reference server must come out clean (this is the CI run the
issue asks for), the real 7.0.0 server must not, and every reproducer must replay in one
command. Also the client target and the throughput bar against a live C server."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from harness.fuzz.campaign import CampaignConfig, run_campaign
from harness.fuzz.oracles import KINDS
from harness.fuzz.replay import replay
from harness.fuzz.signature import death_line
from harness.strictness import TOOL_MISSING
from needs import peer, skip

from test_realclient_support import realpeer, require_peer_dir

slow = pytest.mark.slow


@slow
def test_reference_server_survives_a_bounded_campaign(honest_reference_campaign):
    out, report = honest_reference_campaign  # every oracle on: tests/conftest.py
    assert report["nothing_found"], json.dumps(report["findings"], indent=1)[:4000]
    assert not report["errors"]
    assert report["messages_sent"] > 5_000 and report["cases"] > 200
    assert report["restarts"] == 0
    assert 0 < report["rss_peak_bytes"] < report["rss_limit_bytes"]
    # Mutations of every kind reached it, not just valid traffic.
    by_kind = report["coverage"]["by_kind"]
    assert all(v["exercised"] > 0 for v in by_kind.values()), by_kind
    text = (out / "report.md").read_text()
    assert "**Nothing found**" in text and "it did not" in text
    assert json.loads((out / "report.json").read_text())["nothing_found"] is True


@slow
@realpeer
def test_campaign_against_real_7_finds_minimal_reproducers_that_replay(real_7_campaign,
                                                                       tmp_path):
    out, report = real_7_campaign  # every oracle on: tests/conftest.py
    findings = report["findings"]
    deaths = [f for f in findings if f["signature"]["kind"] not in KINDS]
    assert deaths, "45 s against the real 7.0.0 server found no crash"
    assert report["messages_sent"] > 0 and report["restarts"] > 0  # rates: `harness bench`
    for f in findings:
        assert f["confirmed"] and f["replays"], f
        assert f["steps"] <= 6, f["listing"]
        folder = out / "crashes" / f["id"]
        assert {"repro.rpct", "repro.pcap", "finding.json", "test_repro.py"} <= \
            {p.name for p in folder.iterdir()}
    # One command replays it (exit 1: the bug is there), and the Python API agrees.
    first = out / "crashes" / deaths[0]["id"] / "repro.rpct"
    proc = subprocess.run([sys.executable, "-m", "harness", "replay", str(first), "--target",
                           "p7"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "REPRODUCED" in proc.stdout
    assert replay(first, "p7").reproduced
    # The same reproducer does nothing to the reference server.
    assert not replay(first, "ref").reproduced
    # The generated regression test fails while the bug is there (pytest exit status 1).
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                           str(first.with_name("test_repro.py"))], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 1 and "1 failed" in proc.stdout, proc.stdout + proc.stderr


@realpeer
def test_throughput_against_a_live_c_server():
    require_peer_dir()
    from harness.fuzz.throughput import measure
    result = measure("p7", seconds=2.0)
    # Valid steady traffic: the server answers everything and survives. The rate itself is a
    # `harness bench` figure (fuzz-conn), not something a test times.
    assert result["target_survived"], result
    assert result["answered"] > 0 and result["messages"] > result["answered"], result
    assert result["messages_per_s"] > 0


@realpeer
def test_client_target_classifies_defences_and_successes():
    require_peer_dir()
    from harness.fuzz.client_targets import _peer_client, run_client_case
    lib, proto, dialect = _peer_client("p7")
    ok, _ = run_client_case(lib, proto, dialect, {"hello_flags": 0x80}, step_timeout=10)
    assert ok.category == "ok"  # a 7.0.0 client ignores HELLO byte 3
    mismatch, _ = run_client_case(lib, proto, dialect, {"hello_version": [8, 0, 0]},
                                  step_timeout=10)
    assert (mismatch.category, mismatch.step, mismatch.message) == \
        ("defence", "connect", "version mismatch")
    garbled, transcripts = run_client_case(lib, proto, dialect,
                                           {"garble_response_len": "GET_TENSOR"},
                                           step_timeout=10, record=True)
    assert (garbled.category, garbled.step, garbled.message) == \
        ("defence", "get", "malformed response")
    assert transcripts and transcripts[0].total("c2s") > 0


@slow
@realpeer
def test_client_campaign_reports_only_defences(tmp_path):
    require_peer_dir()
    from harness.fuzz.client_targets import ClientCampaignConfig, run_client_campaign
    out, report = run_client_campaign(ClientCampaignConfig(peer="p7", duration=20, seed=5,
                                                           out=tmp_path / "client"))
    assert report["cases"] >= 5
    assert report["nothing_found"], report["findings"]
    assert any(k.startswith("defence") for k in report["statuses"]), report["statuses"]
    text = (out / "report.md").read_text()
    assert "| session outcomes | " in text and "defence: " in text
    assert "messages sent" not in text  # server-campaign rows have no meaning for a client
    assert report["messages_sent"] is None


@slow
@realpeer
def test_workers_each_run_a_target_and_share_one_dedupe(tmp_path):
    require_peer_dir()
    out, report = run_campaign(CampaignConfig(target="p7", duration=20, seed=5, workers=2,
                                              out=tmp_path / "two", shrink_seconds=10))
    assert not report["errors"], report["errors"]
    assert report["workers"] == 2 and report["cases"] > 100
    ids = [f["id"] for f in report["findings"]]
    assert ids and len(ids) == len(set(ids))
    assert {f["worker"] for f in report["findings"]} <= {0, 1}
    assert not (out / "work").exists()  # work dirs (target logs) are removed at the end


@slow
def test_fuzz_and_replay_commands(tmp_path):
    out = tmp_path / "cli"
    proc = subprocess.run([sys.executable, "-m", "harness", "fuzz", "--target", "ref",
                           "--duration", "6s", "--seed", "2", "--out", str(out),
                           "--fail-on-findings"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"report: {out}/report.md" in proc.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["seed"] == 2 and report["nothing_found"]
    # A corpus entry replays cleanly: exit status 0 means "not reproduced".
    entry = sorted((out / "corpus").glob("*.rpct"))[0]
    proc = subprocess.run([sys.executable, "-m", "harness", "replay", str(entry), "--target",
                           "ref"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "not reproduced" in proc.stdout
    bad = subprocess.run([sys.executable, "-m", "harness", "replay", str(entry), "--target",
                          "no-such-peer"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2


def test_fault_shim_line_parses_when_the_caller_has_a_long_cpp_name(tmp_path):
    """A fault inside libc named by a caller whose (mangled C++) name runs to hundreds of
    bytes: the shim cuts the name, not the line, so the line still parses to its site."""
    import shutil
    from harness.fuzz.faultinfo import LINE_PREFIX, shim_path
    cc = shutil.which("cc") or shutil.which("gcc")
    if shim_path() is None or cc is None:
        skip(TOOL_MISSING, "no C compiler for the fault shim")
    name = "caller_" + "x" * 400
    (tmp_path / "lib.c").write_text(
        "#include <string.h>\n"
        f"size_t {name}(const char *p) {{ return strlen(p); }}\n")
    (tmp_path / "main.c").write_text(
        "#include <stddef.h>\n"
        f"size_t {name}(const char *p);\n"
        "int main(void) { volatile const char *p = NULL;\n"
        f"  return (int){name}((const char *)p); }}\n")
    subprocess.run([cc, "-O0", "-shared", "-fPIC", "-o", tmp_path / "liblong.so",
                    tmp_path / "lib.c"], check=True, timeout=60)
    subprocess.run([cc, "-O0", "-o", tmp_path / "main", tmp_path / "main.c",
                    f"-L{tmp_path}", "-llong", f"-Wl,-rpath,{tmp_path}"], check=True, timeout=60)
    run = subprocess.run([tmp_path / "main"], capture_output=True, text=True, timeout=60,
                         env={"LD_PRELOAD": str(shim_path())})
    assert run.returncode == -11, run
    line = next(x for x in run.stderr.splitlines() if x.startswith(LINE_PREFIX))
    assert len(line) < 1000 and line.endswith(")"), line
    site = death_line([line])
    assert site.startswith("SIGSEGV null page in libc.so") and \
        site.endswith(f" from liblong.so ({name[:200]})"), site


@realpeer
def test_fault_shim_tells_a_stack_overflow_from_a_null_write(tmp_path):
    """Two segfaults of the 7.0.0 server that print nothing themselves get distinct
    signatures: a graph chain listed by its output only (create_node recursion) overflows
    the stack; a node without memory is computed through a null pointer."""
    require_peer_dir()
    from harness import strategies as rst
    from harness.fuzz.case import BASE, HANDLE, annotate, sentinel, step
    from harness.fuzz.faultinfo import shim_path
    from harness.fuzz.case_runner import CaseRunner
    from harness.strategies.graphs import _deep_chain
    from harness.fuzz.target import Target
    from harness.fuzz.target_spec import TargetSpec
    from harness.proto import RpcTensor, get_dialect, ggml, pack_request
    from harness.proto import messages as m
    if shim_path() is None:
        skip(TOOL_MISSING, "no C compiler for the fault shim")
    d = get_dialect("7.0.0")
    hello = step(rst.hello_request_frame(d), "HELLO")
    alloc = [step(pack_request(d, m.AllocBufferRequest(0, 4096)), "ALLOC_BUFFER",
                  learn=(HANDLE, 0)),
             step(pack_request(d, m.BufferGetBaseRequest(sentinel(HANDLE, 0))),
                  "BUFFER_GET_BASE", learn=(BASE, 0))]
    region = rst.BufferRegion(sentinel(HANDLE, 0), sentinel(BASE, 0), 4096)
    deep = _deep_chain(1 << 17, region, "output_only")
    leaf = RpcTensor.make(id=0x10, ne=(64,))
    null = m.GraphComputeRequest(nodes=(0x20,), tensors=(leaf, RpcTensor.make(
        id=0x20, ne=(64,), op=ggml.OP["ADD"], flags=ggml.FLAG_COMPUTE, src=(0x10, 0x10))))
    target = Target(TargetSpec.parse("p7"), tmp_path / "t")
    target.start()
    try:
        runner = CaseRunner(target, deadline=20)
        overflow, _ = runner.check(annotate(d, (hello, *alloc,
                                                step(pack_request(d, deep), "GRAPH_COMPUTE"))))
        nullptr, _ = runner.check(annotate(d, (hello, step(pack_request(d, null),
                                                           "GRAPH_COMPUTE"))))
    finally:
        target.stop()
    assert overflow.signature.signal == nullptr.signature.signal == "SIGSEGV"
    assert overflow.signature.line == "SIGSEGV stack overflow"
    assert overflow.detail.startswith("SIGSEGV stack overflow in ")
    assert nullptr.signature.line.startswith("SIGSEGV null page in ")
    assert overflow.signature != nullptr.signature


def _late_death_then_no_hello(tmp_path):
    """p7+asan+ubsan given a 5 GiB SET_TENSOR length prefix (the client gone once it is
    sent), then a case without HELLO: who gets the death?"""
    import struct
    from harness import strategies as rst
    from harness.fuzz.case import Case, annotate, step
    from harness.fuzz.case_runner import CaseRunner
    from harness.fuzz.oracles import OracleLimits, Oracles
    from harness.fuzz.target import Target
    from harness.fuzz.target_spec import TargetSpec
    from harness.proto import get_dialect, pack_request
    from harness.proto import messages as m
    peer("p7+asan+ubsan")
    d = get_dialect("7.0.0")
    huge = bytearray(pack_request(d, m.GetAlignmentRequest(0)))
    huge[0] = d.id_of(m.Cmd.SET_TENSOR)
    struct.pack_into("<Q", huge, 1, 5 << 30)
    late = Case(d.name, (step(rst.hello_request_frame(d), "HELLO"),
                         step(bytes(huge), "SET_TENSOR", desc={"kind": "framing",
                                                               "what": "len_huge"})),
                open_ended=True)
    no_hello = annotate(d, (step(pack_request(d, m.AllocBufferRequest(0, 64)), "ALLOC_BUFFER",
                                 desc={"kind": "framing", "what": "hello_missing"}),
                            step(pack_request(d, m.GetAlignmentRequest(0)), "GET_ALIGNMENT")))
    target = Target(TargetSpec.parse("p7+asan+ubsan", "7.0.0"), tmp_path / "t")
    target.start()
    try:
        runner = CaseRunner(target, oracles=Oracles(target, OracleLimits.from_json({})))
        verdicts = runner.run_fast(late)[0] + runner.run_fast(no_hello)[0]
    finally:
        target.stop()
    return late, no_hello, verdicts


@pytest.mark.slow
def test_a_death_after_the_client_left_is_the_case_that_caused_it(tmp_path):
    """ASan reports the failed 5 GiB allocation after the harness has closed that connection;
    a following case with no HELLO cannot prove the server alive, so the one before is
    settled first (the p4+asan campaigns' 'out of memory in recv_msg' findings were pinned
    on a truncated HELLO and a HELLO-less ALLOC_BUFFER that never reproduced alone)."""
    late, no_hello, verdicts = _late_death_then_no_hello(tmp_path)
    (v,) = verdicts
    assert "out of memory in recv_msg" in v.signature.line, v.signature
    assert v.case is late, v.case


@pytest.mark.slow
def test_planted_a_no_hello_case_not_settling_its_predecessor_takes_the_blame(tmp_path,
                                                                              monkeypatch):
    from harness.fuzz.case_runner import CaseRunner
    # the old rule: a case that ended with every answer was never settled afterwards
    monkeypatch.setattr(CaseRunner, "_settle_before_unproven", lambda self: [])
    late, no_hello, verdicts = _late_death_then_no_hello(tmp_path)
    # the death is pinned on the HELLO-less case, or lost when the server was found dead
    # and restarted before that case (which of the two is timing)
    assert not any(v.case is late for v in verdicts), verdicts


@realpeer
def test_standby_target_restarts_by_swapping_to_a_ready_process(tmp_path):
    """Without restarts by fork (a target the zygote cannot hold), after the first death a
    pool of spare processes is kept listening: a restart hands over a live server on another
    port, and stop() leaves no process behind."""
    require_peer_dir()
    import os
    import signal
    import time
    from harness.fuzz.target import SPARES, Target
    from harness.fuzz.target_spec import TargetSpec
    target = Target(TargetSpec.parse("p7"), tmp_path / "t", standby=True, fork=False)
    target.start()
    pids = [target.server.pid]
    try:
        for _ in range(4):
            os.kill(target.server.pid, signal.SIGKILL)  # a crash
            assert target.wait_exit(5.0) is not None
            target.restart()
            pids.append(target.server.pid)
            assert target.exit_info() is None and target.answers_hello(timeout=5.0)
        spares = [f.result(timeout=30) for f in target._spares]  # a pool of them
        assert len(spares) == SPARES and all(s.poll() is None for s in spares)
        assert not {s.pid for s in spares} & set(pids)
        t0 = time.monotonic()
        os.kill(target.server.pid, signal.SIGKILL)
        target.wait_exit(5.0)
        target.restart()
        assert target.server.pid == spares[0].pid  # the swap, not a launch
        assert time.monotonic() - t0 < 5.0
    finally:
        target.stop()
    assert len(set(pids)) == len(pids)
    for pid in pids + [s.pid for s in spares]:  # stopped and reaped (no zombie left)
        assert not os.path.exists(f"/proc/{pid}"), pid


@slow
@realpeer
def test_fail_on_findings_gates_ci(tmp_path):
    require_peer_dir()
    proc = subprocess.run([sys.executable, "-m", "harness", "fuzz", "--target", "p7",
                           "--duration", "8s", "--seed", "3", "--shrink-seconds", "3",
                           "--out", str(tmp_path / "p7"), "--fail-on-findings"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert json.loads((tmp_path / "p7" / "report.json").read_text())["findings"]


@slow
@pytest.mark.parametrize("knob, kind, command, most_steps", [
    # BUFFER_CLEAR has no answer: the stall shows at the next request, and is still named.
    ("stall_on=BUFFER_CLEAR", "hang", "BUFFER_CLEAR", 3),
    ("garble_response_len=GET_ALIGNMENT", "protocol", "GET_ALIGNMENT", 2),
])
def test_planted_bugs_are_found_named_and_minimised(tmp_path, knob, kind, command, most_steps):
    """The oracle works: a reference server with one planted bug (a misbehaviour knob) gives
    exactly that finding, minimised, and it replays against the same planted target only."""
    target = f"ref:{knob}"
    out, report = run_campaign(CampaignConfig(target=target, duration=15, seed=4, deadline=1.0,
                                              out=tmp_path / "c", shrink_seconds=15))
    assert not report["errors"], report["errors"]
    found = [(x["signature"]["kind"], x["signature"]["command"]) for x in report["findings"]]
    # One bug, named after its command. A stalled command also never closes a connection
    # whose frame of it must be refused (the sweep sends those): a protocol finding of the same
    # command and line may come with the hang, nothing else.
    extra = {("protocol", command)} if kind == "hang" else set()
    assert (kind, command) in found and set(found) <= {(kind, command)} | extra, \
        report["findings"]
    f = next(x for x in report["findings"] if x["signature"]["kind"] == kind)
    assert f["confirmed"] and f["replays"] and f["steps"] <= most_steps, f["listing"]
    repro = out / "crashes" / f["id"] / "repro.rpct"
    assert replay(repro, target, deadline=1.0).reproduced
    assert not replay(repro, "ref", deadline=1.0).reproduced


def test_found_after_is_when_a_finding_was_first_seen_not_when_it_was_minimised(tmp_path,
                                                                              monkeypatch):
    """Confirming, shrinking and minimising take seconds each: a finding's found_after_s is
    the time of the case that first showed it (planted fault: stamped when it was saved, a
    late finding looked like one the campaign barely made)."""
    import harness.fuzz.campaign as campaign
    from harness.fuzz.case import annotate, step
    from harness.fuzz.case_runner import Finding
    from harness.fuzz.signature import Signature
    from harness.strategies import hello_request_frame
    from harness.proto import get_dialect
    from harness.proto.codec import pack_request
    from harness.proto.messages import GetAlignmentRequest

    d7 = get_dialect("7.0.0")
    case = annotate(d7, (step(hello_request_frame(d7), "HELLO"),
                         step(pack_request(d7, GetAlignmentRequest(0)), "GET_ALIGNMENT")))
    sig = Signature("crash", "SIGSEGV", "planted", "GET_ALIGNMENT")
    clock = [1000.0]

    class Runner:  # each check costs ten simulated seconds
        restarts = 0

        def check(self, c, **_):
            clock[0] += 10
            return Finding(sig, c, seen_at=clock[0]), None

    monkeypatch.setattr(campaign.time, "time", lambda: clock[0])
    monkeypatch.setattr(campaign, "minimise_case", lambda c, same, budget: same(c) and c)
    monkeypatch.setattr(campaign, "drop_unneeded_mutations", lambda c, same: c)
    monkeypatch.setattr(campaign, "replay", lambda *a, **k: type("R", (), {"reproduced": 1}))
    events: list[dict] = []
    worker = campaign._Worker(CampaignConfig(target="ref", duration=60, out=tmp_path), 0, 1,
                              tmp_path, events.append)
    (tmp_path / "claims").mkdir()
    worker.t0, worker.runner = 1000.0, Runner()
    worker._consider(Finding(sig, case, seen_at=1003.0))  # queued after confirming
    worker._drain_queue()
    found = [e["finding"] for e in events if e["type"] == "finding"]
    assert [f["found_after_s"] for f in found] == [3.0], found
    assert clock[0] >= 1030.0  # confirmed, minimised and checked once more meanwhile
    # A hunted signature (shrunk by hypothesis first) keeps its time the same way.
    other = Signature("crash", "SIGABRT", "planted", "GET_ALIGNMENT")
    worker._consider(Finding(other, case, seen_at=1040.0), hunt=True, confirmed=True)
    assert worker.hunting == other and worker.hunt_seen_at == 1040.0


def _killer_then_session(tmp_path, monkeypatch, *, again: bool):
    """A p7 abort (the shipped GET_TENSOR reproducer), then a valid sweep session that
    starts while the server is still dying (exit_info not yet set: the race a sweep full of
    aborts meets), run by the fast path."""
    from harness.data import shipped
    from harness.fuzz import sweep as sw
    from harness.fuzz.case_runner import CaseRunner
    from harness.fuzz.replay import load
    from harness.fuzz.target import Target
    from harness.fuzz.target_spec import TargetSpec
    require_peer_dir()
    killer, _, _ = load(shipped("reproducers") / "p7-crash-get_tensor-671d0589" / "repro.rpct")
    session = next(c.case for c in sw.sweep("7.0.0", only={"stateful"}))
    target = Target(TargetSpec.parse("p7", "7.0.0"), tmp_path / "t")
    target.start()
    try:
        runner = CaseRunner(target)
        # the race: the server's exit is not seen until the runner settles the killer (after
        # the next case found no HELLO answer)
        dying = [True]
        real_exit, real_settle = target.exit_info, runner._settle_pending
        monkeypatch.setattr(target, "exit_info", lambda: None if dying[0] else real_exit())

        def settle():
            dying[0] = False
            target.wait_exit(5.0)
            return real_settle()
        monkeypatch.setattr(runner, "_settle_pending", settle)
        first, _ = runner.run_fast(killer)
        verdicts, out = runner.run_fast(session, again=again)
        return first + verdicts, out, killer, session
    finally:
        target.stop()


@realpeer
def test_a_case_that_finds_the_server_still_dying_runs_on_the_restarted_one(tmp_path,
                                                                            monkeypatch):
    verdicts, out, killer, session = _killer_then_session(tmp_path, monkeypatch, again=True)
    assert any(v.case is killer for v in verdicts), verdicts  # the abort is the killer's
    assert out.status == "ok" and out.proven == len(session.steps), out  # and it ran


@realpeer
def test_planted_a_case_that_finds_the_server_dying_is_not_run(tmp_path, monkeypatch):
    """The old fast path: the predecessor settled, the case itself returned unrun."""
    verdicts, out, killer, _ = _killer_then_session(tmp_path, monkeypatch, again=False)
    assert any(v.case is killer for v in verdicts), verdicts
    assert out.status != "ok" and out.proven == 0, out
