"""The libFuzzer engine: inputs <-> cases, seeds, dictionary, status lines, triage, and (slow,
realpeer) the in-process target of p7 itself."""

from __future__ import annotations

import json
import struct
import subprocess
from pathlib import Path

import pytest

from harness.fuzz.case import BASE, HANDLE, find_relocs, sentinel
from harness.fuzz.libfuzzer import corpus as lfc
from harness.fuzz.libfuzzer.build import HERE, TARGET_NAME
from harness.fuzz.libfuzzer.report import finding_class
from harness.fuzz.libfuzzer.running import Timeline
from harness.fuzz.libfuzzer.triage import _frame_start, signature_of
from harness.fuzz.signature import death_line
from harness.proto import Cmd, get_dialect
from needs import built

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "sanitizer"
D = "7.0.0"


def valid_cases(n=20, seed=3):
    return lfc.draw_cases(D, n, seed=seed, mutation_odds=0)


def test_case_to_input_and_back_keeps_frames_and_learns_what_the_target_learns():
    for case in valid_cases():
        data = lfc.case_to_input(case)
        back = lfc.input_to_case(data, D)
        assert [s.frame for s in back.steps] == [s.frame for s in case.steps]
        # The generator's learn marks are exactly what the C++ transport infers from the
        # stream: n-th ALLOC_BUFFER answer = handle n, GET_BASE of handle i = base i.
        assert [s.learn for s in back.steps] == [s.learn for s in case.steps]


def test_input_cut_mid_frame_ends_with_a_shutdown():
    case = valid_cases(1)[0]
    data = lfc.case_to_input(case)
    cut = lfc.input_to_case(data[:-3], D)
    assert cut.steps[-1].eof and len(cut.steps[-1].frame) == len(case.steps[-1].frame) - 3
    assert not lfc.input_to_case(data, D).steps[-1].eof


def test_get_base_of_an_unknown_handle_learns_nothing():
    d = get_dialect(D)
    frame = bytes([d.id_of(Cmd.BUFFER_GET_BASE)]) + struct.pack("<QQ", 8, 0x1234)
    assert lfc.input_to_case(frame, D).steps[0].learn is None


def test_seed_corpus_has_valid_and_mutated_sessions(tmp_path):
    n = lfc.write_seed_corpus(tmp_path, D, valid=20, mutated=20)
    files = list(tmp_path.iterdir())
    assert n == len(files) > 20
    got = {f.read_bytes() for f in files}
    valid = {lfc.case_to_input(c) for c in lfc.draw_cases(D, 20, seed=0, mutation_odds=0)}
    assert valid <= got and len(got - valid) > 0  # and the mutated sessions besides
    assert all(f.name == lfc.input_name(f.read_bytes()) for f in files)


def test_dictionary_has_every_command_hello_and_sentinels(tmp_path):
    path = tmp_path / "d.dict"
    lfc.write_dictionary(path, D, samples=30)
    text = path.read_text()
    d = get_dialect(D)
    for cmd_id, cmd in d.ids.items():
        assert f'cmd_{cmd.value}="\\x{cmd_id:02x}"' in text
    assert 'hello="\\x0e\\x18' in text
    handle0 = "".join(f"\\x{b:02x}" for b in struct.pack("<Q", sentinel(HANDLE, 0)))
    assert f'handle_0="{handle0}"' in text and "base_0=" in text


def test_checked_in_dictionary_is_the_7_0_0_one():
    text = (HERE / f"{TARGET_NAME}.dict").read_text()
    for cmd_id, cmd in get_dialect(D).ids.items():
        assert f'cmd_{cmd.value}="\\x{cmd_id:02x}"' in text


def test_export_gives_cases_a_live_campaign_loads(tmp_path):
    from harness.fuzz.replay import load
    inputs = tmp_path / "in"
    for case in valid_cases(5):
        lfc.write_input(inputs, lfc.case_to_input(case))
    assert lfc.export_corpus(inputs, tmp_path / "corpus", D) == 5
    loaded = [load(f)[0] for f in sorted((tmp_path / "corpus").glob("*.rpct"))]
    assert {lfc.case_to_input(c) for c in loaded} == {f.read_bytes() for f in inputs.iterdir()}
    # ... and the way back: a live corpus imported as inputs.
    assert lfc.import_live_corpus(tmp_path / "corpus", tmp_path / "again") == 5


# Status lines recorded from libFuzzer 16 runs of the target (fork mode and plain).
FORK_LINE = "#3364: cov: 2016 ft: 1658 corp: 99 exec/s: 88 oom/timeout/crash: 0/2/7 time: 48s " \
            "job: 2 dft_time: 0"
PLAIN_LINE = "#1641\tREDUCE cov: 105 ft: 116 corp: 6/72b lim: 38 exec/s: 0 rss: 44Mb L: " \
             "18/33 MS: 1 EraseBytes-"


def test_timeline_parses_fork_and_plain_status_lines():
    t = Timeline()
    assert t.feed("INFO: Seed: 1") is None
    p = t.feed(FORK_LINE)
    assert (p["execs"], p["edges"], p["features"], p["corpus"], p["timeouts"], p["crashes"]) \
        == (3364, 2016, 1658, 99, 2, 7)
    q = t.feed(PLAIN_LINE)
    assert (q["execs"], q["edges"], q["corpus"]) == (1641, 105, 6)
    assert t.last == q and len(t.sampled(1)) == 1


def test_abort_event_signature_is_the_live_campaigns_line():
    text = (FIX / "libfuzzer-ggml-assert.txt").read_text()
    case = valid_cases(1)[0]
    data = lfc.case_to_input(case)
    sig, detail = signature_of(text, D, data)
    assert sig.kind == "crash" and sig.signal == "SIGABRT"
    assert sig.line == death_line(text.splitlines())
    assert finding_class(sig.to_json()) == "GGML_ASSERT"


def test_sanitizer_signature_and_class():
    text = (FIX / "asan-heap-use-after-free.txt").read_text()
    sig, _ = signature_of(text, D, b"")
    assert (sig.kind, sig.signal) == ("crash", "exit 1")
    assert finding_class(sig.to_json()) == "AddressSanitizer: heap-use-after-free"
    assert signature_of("nothing happened\n", D, b"") is None


def test_frame_start_is_the_frame_read_last():
    case = valid_cases(1)[0]
    data = lfc.case_to_input(case)
    sizes = [len(s.frame) for s in case.steps]
    end_of_second = sizes[0] + sizes[1]
    assert _frame_start(data, end_of_second) == sizes[0]  # read position after frame 1
    assert _frame_start(data, sizes[0] + 3) == sizes[0]  # inside frame 1
    assert _frame_start(data, 1) == 0


# ---------------------------------------------------------------- the real target

def _p7_target():
    from harness.fuzz.libfuzzer.build import build_target
    return built("the in-process p7 target", lambda: build_target("p7", "libfuzzer"))


def _traced(binary: Path, data: bytes, tmp_path: Path) -> list[str]:
    """The target's trace lines for ``data`` (its first run of the input; they agree)."""
    path = tmp_path / "input"
    path.write_bytes(data)
    run = subprocess.run([str(binary), str(path)], capture_output=True, text=True, timeout=120,
                         env={"HARNESS_FUZZ_TRACE": "1", "PATH": "/usr/bin:/bin",
                              "ASAN_OPTIONS": "allocator_may_return_null=1:detect_leaks=0"})
    runs: list[list[str]] = []
    for x in run.stderr.splitlines():
        if x.startswith("harness-fuzz: "):
            if x.endswith("command 14 at byte 0") or x.startswith("harness-fuzz: command ") \
                    and x.endswith(" at byte 0"):
                runs.append([])  # libFuzzer may run a file input more than once
            runs[-1].append(x[len("harness-fuzz: "):])
    assert runs and all(r == runs[0] for r in runs)
    return runs[0]


def _commands_read(binary: Path, data: bytes, tmp_path: Path) -> list[int]:
    return [int(x.split()[1]) for x in _traced(binary, data, tmp_path)
            if x.startswith("command ")]


@pytest.mark.realpeer
@pytest.mark.slow
def test_target_relocates_handles_so_valid_sessions_run_to_the_end(tmp_path):
    """A valid session is served to its last request only if every sentinel handle and base
    was replaced by the live one (the server drops the connection on an unknown buffer)."""
    build = _p7_target()
    d = get_dialect(D)
    case = next(c for c in valid_cases(40) if any(s.cmd == "SET_TENSOR" for s in c.steps)
                and len(c.steps) > 6)
    data = lfc.case_to_input(case)
    read = _commands_read(build.binary, data, tmp_path)
    assert read == [s.frame[0] for s in case.steps]
    # Planted fault: the handle sentinels' tag broken, so nothing is relocated -> the server
    # stops at the first request naming a buffer.
    tag = struct.pack("<Q", sentinel(HANDLE, 0))[6:]
    broken = data.replace(tag, b"\x00\x00")
    assert len(_commands_read(build.binary, broken, tmp_path)) < len(case.steps)
    assert d.ids[read[0]] is Cmd.HELLO and sentinel(BASE, 0)


@pytest.mark.realpeer
@pytest.mark.slow
def test_target_and_live_executor_relocate_the_same_u64s(tmp_path):
    """What the C target relocates (its trace) is what find_relocs relocates, where the two
    could differ: a u64 whose patched bytes would complete a sentinel of their own (seen in a
    p7 finding that did not replay), two overlapping sentinels, one across two fields."""
    build = _p7_target()
    d = get_dialect(D)
    h2, b0 = struct.pack("<Q", sentinel(HANDLE, 2)), struct.pack("<Q", sentinel(BASE, 0) + 16)
    payload = bytes(12) + h2 + bytes([0, 0xD0, 0xA5, 0x0A]) + bytes(5) \
        + h2 + bytes([0, 0, 0, 0xD0, 0xA5, 0x0A]) + bytes(3) + b0 + bytes(7) + h2[:5] + bytes(9)
    graph = bytes([d.id_of(Cmd.GRAPH_COMPUTE)]) + struct.pack("<Q", len(payload)) + payload
    hello_alloc = lfc.case_to_input(valid_cases(1)[0])[:54]  # HELLO + ALLOC_BUFFER
    assert [d.ids[f[0]] for f in lfc.split_frames(hello_alloc)] == [Cmd.HELLO, Cmd.ALLOC_BUFFER]
    data = hello_alloc + graph
    traced = [x for x in _traced(build.binary, data, tmp_path) if x.startswith("relocated ")]
    ours, pos = [], 0
    for frame in lfc.split_frames(data):
        ours += [f"relocated {r.kind} {r.index} at byte {pos + r.offset}"
                 for r in find_relocs(frame)]
        pos += len(frame)
    assert len(ours) == 3 and traced == ours


@pytest.mark.realpeer
@pytest.mark.slow
def test_short_libfuzzer_campaign_reports_and_replays(tmp_path):
    from harness.fuzz.libfuzzer.config import LibFuzzerConfig
    from harness.fuzz.libfuzzer.engine import run_libfuzzer_campaign
    _p7_target()
    folder, report = run_libfuzzer_campaign(LibFuzzerConfig(
        target="p7", duration=75, seed=1, out=tmp_path / "r", seeds_valid=30,
        seeds_mutated=30, coverage=False))
    log = folder / "libfuzzer.log"
    assert report["engine"] == "libfuzzer" and report["executions"] > 0, \
        log.read_text()[-6000:] if log.exists() else report.get("errors")
    assert report["edges_over_time"] and report["edges"] > 0
    # the rate per CPU second of the fuzzer's processes, and the cap it fuzzed under
    assert report["executions_per_cpu_s"] > 0 and 0 < report["fuzz_cpu_seconds"]
    assert report["alloc_limit"] == LibFuzzerConfig.alloc_limit
    assert report["problems"] == []  # `harness fuzz` exits 0 on it, not 2
    md = (folder / "report.md").read_text()
    assert "did not test the target" not in md
    assert "## In-process engine (libFuzzer)" in md and "Edges over time" in md
    assert "per CPU second" in md and "allocation cap while fuzzing | 16 MiB" in md
    assert report["findings"], "the 7.0.0 server has GGML_ASSERTs any campaign reaches"
    for f in report["findings"]:
        saved = json.loads((folder / "crashes" / f["id"] / "finding.json").read_text())
        assert (folder / "crashes" / f["id"] / "repro.rpct").exists()
        assert "replays" in saved
    # Aborts are what the live server does too: they must replay against it.
    aborts = [f for f in report["findings"] if f["signature"]["signal"] == "SIGABRT"]
    assert aborts and any(f["replays"] for f in aborts)


@pytest.mark.realpeer
@pytest.mark.slow
def test_execution_profile_accounts_for_every_phase_of_every_run(tmp_path):
    """The target's phase clock: one set-up and one teardown per execution, one phase per
    request read, shares that add up; a GRAPH_COMPUTE input puts time under GRAPH_COMPUTE."""
    from harness.fuzz.libfuzzer.config import LibFuzzerConfig, sanitizer_env
    from harness.fuzz.libfuzzer.phase_clock import PhaseClockError, profile_corpus, render_markdown
    build = _p7_target()
    cases = [c for c in valid_cases(60) if any(s.cmd == "GRAPH_COMPUTE" for s in c.steps)][:3]
    assert cases
    for c in cases:
        lfc.write_input(tmp_path / "in", lfc.case_to_input(c))
    env = sanitizer_env(LibFuzzerConfig(target="p7"), None)
    p = profile_corpus(build.binary, [tmp_path / "in"], env, D, runs_each=2)
    n = len(list((tmp_path / "in").iterdir()))
    phases = {x["phase"]: x for x in p["phases"]}
    # an input that ends the process (a sanitizer report) is left out, the others all count
    assert p["inputs"] + len(p["left_out"]) == n and p["inputs"] >= 1
    assert p["executions"] >= p["inputs"] * 2
    assert phases["set-up"]["count"] == phases["teardown"]["count"] == p["executions"]
    assert phases["HELLO"]["count"] == p["executions"]
    assert phases["GRAPH_COMPUTE"]["us_per_execution"] > 0
    assert abs(sum(x["share"] for x in p["phases"]) - 1) < 1e-6
    assert "| GRAPH_COMPUTE |" in "\n".join(render_markdown(p, 1000.0))
    # Planted fault: a binary that writes no profile (a target built before the clock) is an
    # error, not an empty table.
    with pytest.raises(PhaseClockError, match="without its profile"):
        profile_corpus(Path("/bin/true"), [tmp_path / "in"], env, D)


def test_cli_engine_option_refuses_what_it_cannot_run():
    from typer.testing import CliRunner

    from harness.cli import app
    runner = CliRunner()
    bad = runner.invoke(app, ["fuzz", "--engine", "afl", "--target", "ref", "--duration", "1s"])
    assert bad.exit_code == 2 and "unknown engine" in bad.output
    # The reference server is Python: there is no server code to build in process.
    ref = runner.invoke(app, ["fuzz", "--engine", "libfuzzer", "--target", "ref",
                              "--duration", "1s"])
    assert ref.exit_code == 2 and "pin built from sources" in ref.output


def test_a_campaign_that_executes_nothing_says_so_and_keeps_the_log(tmp_path, monkeypatch):
    """A fuzzer that never reaches its first status line is an error with its log, not a
    clean zero-execution report."""
    from types import SimpleNamespace

    from harness.fuzz.libfuzzer import engine
    from harness.fuzz.libfuzzer.config import LibFuzzerConfig
    silent = tmp_path / "silent-fuzzer"
    silent.write_text("#!/bin/sh\necho 'INFO: Seed: 1' >&2\necho 'ERROR: planted' >&2\nexit 1\n")
    silent.chmod(0o755)
    monkeypatch.setattr(engine, "build_target",
                        lambda *a, **k: SimpleNamespace(binary=silent))
    folder, report = engine.run_libfuzzer_campaign(LibFuzzerConfig(
        target="p7", duration=1, seed=1, out=tmp_path / "r", seeds_valid=2, seeds_mutated=2,
        coverage=False))
    assert report["executions"] == 0
    assert any("no executions" in e["error"] for e in report["errors"])
    assert "ERROR: planted" in (folder / "libfuzzer.log").read_text()


def test_fuzzer_stuck_in_a_child_does_not_hang_the_campaign(tmp_path):
    """A fork-mode job that never ends (one deadlocked in the sanitizer runtime) and the shell
    running it keep the parent's stderr open: the hard stop must end the whole group."""
    import time

    from harness.fuzz.libfuzzer.running import run_fuzzer
    fake = tmp_path / "fuzzer"
    fake.write_text("#!/bin/sh\necho '#5: cov: 7 ft: 7 corp: 1 exec/s: 5' >&2\n"
                    "sleep 300 &\nsleep 300\n")
    fake.chmod(0o755)
    timeline = Timeline()
    started = time.monotonic()
    rc = run_fuzzer(fake, [], {"PATH": "/usr/bin:/bin"}, tmp_path / "log", timeline,
                     time.monotonic() + 2, None)
    assert rc < 0 and time.monotonic() - started < 120  # killed, not waited for
    assert timeline.last["execs"] == 5
    assert "cov: 7" in (tmp_path / "log").read_text()


def test_hard_rss_limit_report_is_a_memory_finding():
    from harness.fuzz import sanitizer
    text = ("Running: input\n==31923==AddressSanitizer: hard rss limit exhausted (512Mb vs 555Mb)\n"
            "==31923==Process memory map follows:\n==31923==End of process memory map.\n")
    r = sanitizer.parse(text)
    assert (r.tool, r.bug_type, r.kind) == ("AddressSanitizer", "out-of-memory (rss)", "memory")
    sig, _ = signature_of(text, D, b"")
    assert (sig.kind, sig.signal, sig.line) == ("memory", "", "AddressSanitizer: out-of-memory "
                                                              "(rss)")
    assert finding_class(sig.to_json()) == "memory"


@pytest.mark.realpeer
@pytest.mark.slow
def test_rss_is_bounded_by_the_sanitizer_runtime_not_libfuzzers_rss_thread(tmp_path):
    """libFuzzer's -rss_limit_mb handler stops the world to print a memory profile, which can
    deadlock a job for good; the bound is ASan's hard_rss_limit_mb, a memory finding."""
    from harness.fuzz.case import HANDLE, sentinel
    from harness.fuzz.libfuzzer.config import LibFuzzerConfig, libfuzzer_args, sanitizer_env
    from harness.fuzz.libfuzzer.running import rerun
    from harness.proto.codec import pack_request
    from harness.proto.messages import AllocBufferRequest, BufferClearRequest, HelloRequest
    build = _p7_target()
    d = get_dialect(D)
    frames = [pack_request(d, HelloRequest())]
    for i in range(3):  # 3 x 200 MiB, every page written by BUFFER_CLEAR
        frames += [pack_request(d, AllocBufferRequest(device=0, size=200 << 20)),
                   pack_request(d, BufferClearRequest(remote_ptr=sentinel(HANDLE, i), value=1))]
    data = b"".join(frames)
    path = tmp_path / "input"
    path.write_bytes(data)
    cfg = LibFuzzerConfig(target="p7", rss_limit=256 << 20)
    assert "-rss_limit_mb=0" in libfuzzer_args(cfg, 1, path, tmp_path, 10)
    log = rerun(build.binary, path, sanitizer_env(cfg, None), 30)
    assert log is not None and "hard rss limit exhausted" in log
    sig, _ = signature_of(log, D, data)
    assert sig.kind == "memory" and sig.line == "AddressSanitizer: out-of-memory (rss)"
    # Planted fault: without a bound the same input runs to its end.
    unbounded = LibFuzzerConfig(target="p7", rss_limit=0)
    assert rerun(build.binary, path, sanitizer_env(unbounded, None), 60) is None


@pytest.mark.realpeer
@pytest.mark.slow
def test_in_process_rss_bound_is_the_limit_above_the_targets_own_memory(tmp_path):
    """An input passes the bound in process only if it grew the target's RSS by --rss-limit:
    libFuzzer's and the target's own memory (tens of MiB a live server does not have) does
    not count, so a memory finding is not an artefact of running in process."""
    from harness.fuzz.libfuzzer.config import LibFuzzerConfig, rss_baseline_mb, sanitizer_env
    build = _p7_target()
    cfg = LibFuzzerConfig(target="p7", rss_limit=256 << 20)
    baseline = rss_baseline_mb(build.binary, D, tmp_path, sanitizer_env(cfg, None))
    assert 8 < baseline < 256, baseline
    options = sanitizer_env(cfg, None, baseline)["ASAN_OPTIONS"]
    assert f"hard_rss_limit_mb={256 + baseline}:" in options
    assert "hard_rss_limit_mb" not in sanitizer_env(LibFuzzerConfig(target="p7", rss_limit=0),
                                                    None, baseline)["ASAN_OPTIONS"]


def test_a_kept_build_dir_naming_a_vanished_tool_is_configured_afresh(tmp_path):
    from harness.fuzz.libfuzzer.build import drop_stale_cmake_cache
    stale, fresh = tmp_path / "stale", tmp_path / "fresh"
    for d, ninja in ((stale, tmp_path / "gone-venv" / "bin" / "ninja"), (fresh, Path("/bin/sh"))):
        d.mkdir()
        (d / "CMakeCache.txt").write_text(f"CMAKE_MAKE_PROGRAM:FILEPATH={ninja}\n"
                                          "CMAKE_C_COMPILER:UNINITIALIZED=/bin/sh\n")
    assert drop_stale_cmake_cache(stale) and not stale.exists()
    assert not drop_stale_cmake_cache(fresh) and fresh.exists()
    assert not drop_stale_cmake_cache(tmp_path / "never-configured")


def test_in_process_campaign_is_judged_by_executions_not_messages():
    from harness.fuzz.report import campaign_problems
    ran = {"engine": "libfuzzer", "executions": 5000, "messages_sent": 0,
           "workers_never_listened": [0]}
    assert campaign_problems(ran, 100) == []
    assert campaign_problems({**ran, "executions": 0}, 0) == [
        "only 0 executions, fewer than the minimum 1 (--min-messages)"]
    # The live engine's rules are unchanged: no messages is no campaign.
    live = {"messages_sent": 0, "workers_never_listened": [0]}
    assert len(campaign_problems(live, 100)) == 2
