"""libFuzzer findings replayed against the live server: sanitizer errors against the pin's
sanitizer build, matched by their class and faulting frame whatever the exit status."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from harness.fuzz import sanitizer
from harness.fuzz.libfuzzer.config import LibFuzzerConfig
from harness.fuzz.libfuzzer.findings import replay_target
from harness.fuzz.replay import ReplayResult
from harness.fuzz.signature import Signature
from needs import built, peer

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "fixtures" / "libfuzzer"
OVERLAP = ("AddressSanitizer: memcpy-param-overlap in ggml_backend_cpu_buffer_cpy_tensor "
           "(ggml-backend.cpp) < rpc_server::copy_tensor (ggml-rpc.cpp) < rpc_serve_client "
           "(ggml-rpc.cpp)")
# The same error as the live sanitizer server reports it: its build keeps one more frame.
OVERLAP_LIVE = ("AddressSanitizer: memcpy-param-overlap in ggml_backend_cpu_buffer_cpy_tensor "
                "(ggml-backend.cpp) < ggml_backend_buffer_copy_tensor (ggml-backend.cpp) < "
                "rpc_server::copy_tensor (ggml-rpc.cpp)")
ASSERT = "ggml.c:1644: GGML_ASSERT(ctx->mem_buffer != NULL) failed"


def sig(line: str, signal: str = "exit 1", command: str = "COPY_TENSOR") -> Signature:
    return Signature("crash", signal, line, command)


def result(expected: Signature, observed: Signature | None) -> ReplayResult:
    return ReplayResult(expected, observed, "", "p7+asan+ubsan", 4)


def test_report_key_is_class_and_faulting_frame():
    assert sanitizer.report_key(OVERLAP) == (
        "AddressSanitizer: memcpy-param-overlap", "ggml_backend_cpu_buffer_cpy_tensor "
        "(ggml-backend.cpp)")
    assert sanitizer.report_key("AddressSanitizer: SEGV (zero page) READ") == (
        "AddressSanitizer: SEGV (zero page) READ", "")
    assert sanitizer.report_key(ASSERT) is None
    assert sanitizer.same_report(OVERLAP, OVERLAP_LIVE)
    assert not sanitizer.same_report(ASSERT, ASSERT)  # aborts compare by their whole line


def test_sanitizer_error_replays_whatever_the_exit_status():
    assert result(sig(OVERLAP), sig(OVERLAP_LIVE, "SIGABRT")).reproduced


def test_what_does_not_count_as_reproducing_a_sanitizer_error():
    expected = sig(OVERLAP)
    assert not result(expected, None).reproduced  # the release server survives it
    assert not result(expected, sig(ASSERT, "SIGABRT")).reproduced  # a different death
    other_class = OVERLAP_LIVE.replace("memcpy-param-overlap", "heap-buffer-overflow")
    assert not result(expected, sig(other_class, "SIGABRT")).reproduced
    other_frame = OVERLAP_LIVE.replace("in ggml_backend_cpu_buffer_cpy_tensor",
                                       "in ggml_backend_tensor_copy")
    assert not result(expected, sig(other_frame, "SIGABRT")).reproduced
    hang = Signature("hang", "", OVERLAP_LIVE, "COPY_TENSOR")
    assert not result(expected, hang).reproduced


def test_only_sanitizer_errors_go_to_the_sanitizer_build():
    cfg = LibFuzzerConfig(target="p7", sanitizer_target="p7+asan+ubsan")
    assert replay_target(cfg, sig(ASSERT, "SIGABRT")) == ("p7", None)
    assert replay_target(cfg, Signature("memory", "", "libFuzzer: out-of-memory (malloc)",
                                        "ALLOC_BUFFER")) == ("p7", None)
    # ASan's RSS counts its shadow memory and quarantine: only a sanitizer server has them
    assert replay_target(cfg, Signature("memory", "", "AddressSanitizer: out-of-memory (rss)",
                                        "BUFFER_CLEAR")) == ("p7+asan+ubsan", None)
    assert replay_target(cfg, sig(OVERLAP)) == ("p7+asan+ubsan", None)


def test_one_rss_bound_passed_is_one_finding_whoever_saw_it():
    asan = Signature("memory", "", "AddressSanitizer: out-of-memory (rss)", "BUFFER_CLEAR")
    sampled = Signature("memory", "", "resident memory above the bound", "FREE_BUFFER")
    malloc = Signature("memory", "", "libFuzzer: out-of-memory (malloc)", "ALLOC_BUFFER")
    assert result(asan, sampled).reproduced and result(sampled, asan).reproduced
    assert not result(asan, malloc).reproduced and not result(malloc, sampled).reproduced
    assert not result(asan, Signature("crash", "SIGABRT", "AddressSanitizer: out-of-memory (rss)",
                                      "BUFFER_CLEAR")).reproduced


def test_checked_in_input_is_the_generators():
    sys.path.insert(0, str(FIX))
    try:
        from make_inputs import INPUTS
    finally:
        sys.path.remove(str(FIX))
    assert sorted(INPUTS) == sorted(p.name for p in FIX.glob("*.bin"))
    for name, make in INPUTS.items():
        assert (FIX / name).read_bytes() == make(), "rerun fixtures/libfuzzer/make_inputs.py"


# ---------------------------------------------------------------- the real builds

def _builds(live_peer: str = "p7+asan+ubsan"):
    from harness.fuzz.libfuzzer.build import build_target
    lf = built("the in-process p7 target", lambda: build_target("p7", "libfuzzer"))
    peer(live_peer)  # the live sanitizer server it replays against
    return lf


def _finding(tmp_path: Path, cfg: LibFuzzerConfig, fixture: str = "copy-tensor-overlap.bin",
             line: str = OVERLAP, command: str | None = "COPY_TENSOR",
             live_peer: str = "p7+asan+ubsan") -> tuple[Path, dict]:
    """A fixture input through the engine's triage and save steps, as a campaign would
    (``command`` None: whichever request was running)."""
    from harness.fuzz.libfuzzer.config import rss_baseline_mb, sanitizer_env
    from harness.fuzz.libfuzzer.findings import save_finding as _save
    from harness.fuzz.libfuzzer.running import rerun
    from harness.fuzz.libfuzzer.triage import Failure, signature_of
    binary = _builds(live_peer).binary
    data_path = FIX / fixture
    data = data_path.read_bytes()
    (tmp_path / "work").mkdir(parents=True, exist_ok=True)
    baseline = rss_baseline_mb(binary, "7.0.0", tmp_path / "work", sanitizer_env(cfg, None))
    log = rerun(binary, data_path, sanitizer_env(cfg, None, baseline), cfg.deadline)
    assert log is not None, f"the in-process target ran {fixture} to the end"
    signature, detail = signature_of(log, "7.0.0", data)
    assert signature.line == line and command in (None, signature.command), log[-3000:]
    out = tmp_path / cfg.target.replace("+", "_")
    finding = _save(cfg, Failure(signature, data, detail, "fixture", log), out, "7.0.0",
                    Counter({signature: 1}))
    return out / "crashes" / finding["id"], finding


def _cli_replay(folder: Path, target: str) -> subprocess.CompletedProcess:
    harness = Path(sys.executable).with_name("harness")
    return subprocess.run([str(harness), "replay", str(folder), "--target", target],
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, COLUMNS="200"))


@pytest.mark.realpeer
@pytest.mark.slow
def test_sanitizer_only_finding_replays_against_the_sanitizer_build(tmp_path):
    folder, finding = _finding(tmp_path, LibFuzzerConfig(target="p7"))
    assert finding["replayed_against"] == "p7+asan+ubsan"
    assert finding["replays"] is True, finding["live_observed"]
    saved = json.loads((folder / "finding.json").read_text())
    assert saved["replayed_against"] == "p7+asan+ubsan" and saved["campaign_target"] == "p7"
    assert "--target p7+asan+ubsan" in saved["replay"]

    live = _cli_replay(folder, "p7+asan+ubsan")
    assert live.returncode == 1, live.stdout + live.stderr
    assert "REPRODUCED" in live.stdout and "AddressSanitizer: memcpy-param-overlap" in live.stdout
    # The release server survives the overlap: only the sanitizer build shows it.
    plain = _cli_replay(folder, "p7")
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert "the target survived" in plain.stdout and "not reproduced" in plain.stdout


@pytest.mark.realpeer
@pytest.mark.slow
def test_planted_fault_replay_against_the_release_server_is_not_reproduced(tmp_path):
    """The replay step pointed at the release build: the finding must not count as replayed."""
    _, finding = _finding(tmp_path, LibFuzzerConfig(target="p7", sanitizer_target="p7"))
    assert finding["replayed_against"] == "p7"
    assert finding["replays"] is False and finding["live_observed"] is None


@pytest.mark.realpeer
@pytest.mark.slow
def test_a_sentinel_across_the_header_is_replayed_as_the_target_read_it(tmp_path, monkeypatch):
    """huge-graph-size.bin: a GRAPH_COMPUTE size the server cannot resize to (std::length_error),
    whose last bytes and the payload's first byte look like a handle. The target reads the
    size whole and does not relocate across reads; the replay must send the same size."""
    length_error = "terminate called after throwing an instance of 'std::length_error'"
    folder, finding = _finding(tmp_path, LibFuzzerConfig(target="p7"), "huge-graph-size.bin",
                               length_error, "GRAPH_COMPUTE", "p7")
    assert finding["replayed_against"] == "p7"
    assert finding["replays"] is True, finding["live_observed"]
    # Planted fault: relocation anywhere in the frame, as before -> another size is sent.
    import harness.fuzz.case as case_module
    monkeypatch.setattr(case_module, "_PAYLOAD", 0)
    _, planted = _finding(tmp_path / "planted", LibFuzzerConfig(target="p7"),
                          "huge-graph-size.bin", length_error, "GRAPH_COMPUTE", "p7")
    assert planted["replays"] is False


@pytest.mark.realpeer
@pytest.mark.slow
def test_an_asan_rss_finding_replays_against_the_sanitizer_server_at_the_same_bound(tmp_path):
    """quarantined-buffers.bin passes a 192 MiB RSS bound only under ASan (its quarantine
    keeps the freed buffers): the finding replays against the live sanitizer server, where
    ASan has the same bound, and not against the release server (planted fault)."""
    rss = "AddressSanitizer: out-of-memory (rss)"
    cfg = LibFuzzerConfig(target="p7", rss_limit=192 << 20)
    folder, finding = _finding(tmp_path, cfg, "quarantined-buffers.bin", rss, None)
    assert finding["signature"]["kind"] == "memory"
    assert finding["replayed_against"] == "p7+asan+ubsan"
    assert finding["replays"] is True, finding["live_observed"]
    assert finding["live_observed"].startswith("memory")
    release = LibFuzzerConfig(target="p7", rss_limit=192 << 20, sanitizer_target="p7")
    _, planted = _finding(tmp_path / "planted", release, "quarantined-buffers.bin", rss, None)
    assert planted["replayed_against"] == "p7" and planted["replays"] is False


@pytest.mark.realpeer
@pytest.mark.slow
def test_sanitizer_server_allocates_under_its_bound_instead_of_rlimit_as(tmp_path):
    """RLIMIT_AS made every allocation of an ASan server fail (ggml_init asserted on the first
    request); its bound is ASan's max_allocation_size_mb: a buffer under it is allocated, one
    over it fails the way ALLOC_BUFFER fails, and the server lives on."""
    from harness.fuzz.target import Target
    from harness.fuzz.target_spec import TargetSpec
    from harness.reference.client import RefClient
    _builds()
    t = Target(TargetSpec.parse("p7+asan+ubsan"), tmp_path / "t", as_limit=256 << 20,
               rss_limit=192 << 20)
    t.start()
    try:
        assert t.sanitized
        environ = Path(f"/proc/{t.server.pid}/environ").read_bytes().split(b"\0")
        asan = next(e for e in environ if e.startswith(b"ASAN_OPTIONS="))
        # both bounds in ASan's terms: the RSS one as the in-process target has it
        assert b"max_allocation_size_mb=256" in asan and b"hard_rss_limit_mb=192" in asan
        client = RefClient.connect(t.host, t.port, t.dialect, timeout=60)  # says HELLO
        small, _ = client.alloc_buffer(64 << 20)
        big, _ = client.alloc_buffer(512 << 20)
        client.close()
        assert small != 0 and big == 0
        assert t.exit_info() is None
    finally:
        t.stop()


def test_one_abort_two_compilers_is_one_finding():
    """binary-ops.cpp's GGML_ABORT spans two lines: the gcc-built p7 reports 135, the clang-
    built target 136 (a p7 finding that did not replay). Other aborts stay apart."""
    clang = sig("binary-ops.cpp:136: binary_op: ...", "SIGABRT", "GRAPH_COMPUTE")
    gcc = sig("binary-ops.cpp:135: binary_op: ...", "SIGABRT", "GRAPH_COMPUTE")
    assert result(clang, gcc).reproduced and result(gcc, clang).reproduced
    far = sig("binary-ops.cpp:95: binary_op: ...", "SIGABRT", "GRAPH_COMPUTE")
    other_file = sig("unary-ops.cpp:135: binary_op: ...", "SIGABRT", "GRAPH_COMPUTE")
    other_msg = sig("binary-ops.cpp:135: apply_unary_op: ...", "SIGABRT", "GRAPH_COMPUTE")
    other_end = sig("binary-ops.cpp:135: binary_op: ...", "SIGSEGV", "GRAPH_COMPUTE")
    for observed in (far, other_file, other_msg, other_end):
        assert not result(clang, observed).reproduced, observed


@pytest.mark.realpeer
@pytest.mark.slow
def test_a_failure_on_never_written_memory_replays_against_the_sanitizer_server(tmp_path):
    """unwritten-ids.bin reads row ids from a buffer nobody wrote: zero in the release server
    (it survives), ASan's 0xbe fill in process and in the sanitizer server (the row-id assert).
    The release replay fails, so the finding replays against the sanitizer server and says
    so; the planted fault (a 'sanitizer server' that is the release one) does not replay."""
    line = "ops.cpp:5614: GGML_ASSERT(r >= 0 && r < dst->ne[1]) failed"
    folder, finding = _finding(tmp_path, LibFuzzerConfig(target="p7"), "unwritten-ids.bin",
                               line, "GRAPH_COMPUTE")
    assert finding["replayed_against"] == "p7+asan+ubsan" and finding["replays"] is True
    assert finding["release_replays"] is False and finding["release_observed"] is None
    saved = json.loads((folder / "finding.json").read_text())
    assert "--target p7+asan+ubsan" in saved["replay"]
    _, planted = _finding(tmp_path / "planted", LibFuzzerConfig(
        target="p7", sanitizer_target="p7"), "unwritten-ids.bin", line, "GRAPH_COMPUTE")
    assert planted["replays"] is False and "release_replays" not in planted


# ------------------------------------------------------------------ replay means the same bug
def test_a_reproducer_without_a_saved_signature_reproduces_nothing():
    # planted: the old rule counted any failure as reproduced when nothing was saved
    assert not result(None, sig(ASSERT, "SIGABRT")).reproduced


def test_the_command_is_part_of_the_bug():
    assert result(sig(ASSERT, "SIGABRT"), sig(ASSERT, "SIGABRT")).reproduced
    assert not result(sig(ASSERT, "SIGABRT"), sig(ASSERT, "SIGABRT", "GRAPH_COMPUTE")).reproduced


def test_silent_deaths_match_on_signal_and_command_only_when_both_are_silent():
    silent = Signature("crash", "SIGSEGV", "", "MEMSET_TENSOR")
    assert result(silent, silent).reproduced
    assert not result(silent, Signature("crash", "SIGSEGV", "", "INIT_TENSOR")).reproduced
    # planted: one side names the fault, the other does not: not shown to be the same bug
    named = Signature("crash", "SIGSEGV", "SIGSEGV in libggml-cpu.so: ggml_vec_add_f32",
                      "MEMSET_TENSOR")
    assert not result(silent, named).reproduced and not result(named, silent).reproduced


def test_a_finding_without_a_signature_cannot_be_saved(tmp_path):
    from harness.fuzz.case import annotate
    from harness.fuzz.shrink import save_reproducer
    with pytest.raises(ValueError, match="needs a signature"):
        save_reproducer(tmp_path / "f", signature=None, case=annotate("7.0.0", ()),
                        outcome=None, target="p7", dialect="7.0.0")
    assert not (tmp_path / "f").exists()


# The libFuzzer p7 campaign of 2026-12-05: the in-process target read freed heap, the live
# sanitizer server an unmapped page, at the same frame (ROLL copying a row from a source
# whose rows the request placed outside any buffer).
ROLL_UAF = ("AddressSanitizer: heap-use-after-free READ size 4 in ggml_vec_cpy_f32 (vec.h) < "
            "ggml_compute_forward_roll_f32 (ops.cpp) < ggml_compute_forward_roll (ops.cpp)")
ROLL_SEGV = ("AddressSanitizer: SEGV READ in ggml_vec_cpy_f32 (vec.h) < "
             "ggml_compute_forward_roll_f32 (ops.cpp) < ggml_compute_forward_roll (ops.cpp)")


def test_a_bad_read_at_one_frame_replays_wherever_the_address_landed():
    assert result(sig(ROLL_UAF, command="GRAPH_COMPUTE"),
                  sig(ROLL_SEGV, "SIGABRT", "GRAPH_COMPUTE")).reproduced
    # planted near misses: a write, another frame, a class that is not an address's
    write = ROLL_SEGV.replace("SEGV READ", "SEGV WRITE")
    frame = ROLL_SEGV.replace("in ggml_vec_cpy_f32", "in ggml_vec_add_f32")
    double_free = ROLL_SEGV.replace("SEGV READ", "attempting double-free")
    for other in (write, frame, double_free):
        assert not result(sig(ROLL_UAF, command="GRAPH_COMPUTE"),
                          sig(other, "SIGABRT", "GRAPH_COMPUTE")).reproduced, other
    assert not sanitizer.same_bad_access(OVERLAP, OVERLAP_LIVE.replace(
        "memcpy-param-overlap", "heap-buffer-overflow READ"))
