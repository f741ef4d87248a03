"""Sanitizer reports -> finding signatures (harness.fuzz.sanitizer), on real recorded reports.

The fixtures in fixtures/sanitizer/ are reports printed by real runs (paths rewritten to
/src/...): a toy program with planted memory bugs built with clang-16 -fsanitize=address,
undefined (toy_bugs.cpp), and the 7.0.0 server in the in-process libFuzzer target (a
GGML_ASSERT abort, a UBSan misaligned reference in graph_compute).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path


from harness.fuzz import sanitizer
from harness.fuzz.faultinfo import is_sanitized
from harness.fuzz.signature import Signature, death_line
from needs import tool_marker

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "sanitizer"


def report(name: str) -> sanitizer.SanitizerReport:
    r = sanitizer.parse((FIX / name).read_text())
    assert r is not None, name
    return r


def test_heap_use_after_free_is_read_of_8_in_its_function():
    r = report("asan-heap-use-after-free.txt")
    assert (r.tool, r.bug_type, r.access, r.size) == ("AddressSanitizer", "heap-use-after-free",
                                                      "READ", 8)
    # The first project frame is where the bad read happened, not main or libc; the trace of
    # where the memory was freed is not the bug's.
    assert r.project_frames[0].func.startswith("get_u64")
    assert all(f.func != "main" for f in r.project_frames)
    assert r.signature_line() == "AddressSanitizer: heap-use-after-free READ size 8 in " \
                                 "get_u64 (bugs.cpp)"


def test_overflow_through_memcpy_names_the_caller_and_drops_the_fuzzed_size():
    r = report("asan-heap-overflow-memcpy.txt")
    assert (r.bug_type, r.access, r.size) == ("heap-buffer-overflow", "WRITE", 100)
    assert r.project_frames[0].func.startswith("set_tensor")  # not __asan_memcpy
    assert "size" not in r.signature_line()  # a memcpy's size is the fuzzed length


def test_scalar_overflow_keeps_its_size():
    r = report("asan-heap-overflow-write4.txt")
    assert r.signature_line() == "AddressSanitizer: heap-buffer-overflow WRITE size 4 in " \
                                 "store_i32 (bugs.cpp)"


def test_segv_on_the_zero_page_is_a_class_of_its_own():
    r = report("asan-segv-zero-page.txt")
    assert r.bug_type == "SEGV (zero page)" and r.access == "READ"


def test_ubsan_runtime_error_without_numbers():
    a = report("ubsan-shift.txt")
    assert a.tool == "UndefinedBehaviorSanitizer"
    assert a.signature_line().startswith("UndefinedBehaviorSanitizer: shift exponent N is too "
                                         "large for N-bit type 'int'")
    b = report("ubsan-misaligned-graph-compute.txt")
    assert "misaligned address ADDR for type 'const uint64_t'" in b.signature_line()
    assert b.signature_line().endswith("in ggml-rpc.cpp:1759")


def test_ggml_assert_under_libfuzzer_is_the_assert_line():
    r = report("libfuzzer-ggml-assert.txt")
    assert r.tool == "libFuzzer" and r.bug_type == "deadly signal" and r.is_abort
    assert r.signature_line() == (
        "ggml-rpc.cpp:1414: GGML_ASSERT(tensor->data >= buffer_start && tensor->data + "
        "tensor_size <= buffer_start + buffer_size) failed")


def test_uaf_overflow_and_assert_are_three_findings():
    lines = {name: death_line((FIX / name).read_text().splitlines())
             for name in ("asan-heap-use-after-free.txt", "asan-heap-overflow-write4.txt",
                          "libfuzzer-ggml-assert.txt")}
    sigs = {Signature("crash", "exit 1", line, "SET_TENSOR") for line in lines.values()}
    assert len(sigs) == 3, lines
    # The assert keeps the line a live campaign has always read from the server's log.
    assert lines["libfuzzer-ggml-assert.txt"].startswith("ggml-rpc.cpp:1414: GGML_ASSERT(")


def test_signature_is_stable_across_runs_and_changes_with_the_bug():
    text = (FIX / "asan-heap-use-after-free.txt").read_text()
    base = sanitizer.parse(text).signature_line()
    # Another run: other pid, other addresses, other build path -- the same bug.
    other_run = re.sub(r"0x[0-9a-f]+", "0x7f0000001234", text).replace("==32056==", "==99==")
    other_run = other_run.replace("/src/toy/", "/elsewhere/build/")
    assert sanitizer.parse(other_run).signature_line() == base
    # Planted differences: a write instead of a read, another function: other bugs.
    assert sanitizer.parse(text.replace("READ of size 8", "WRITE of size 8")
                           ).signature_line() != base
    assert sanitizer.parse(text.replace("in get_u64(", "in get_u32(")).signature_line() != base


def test_no_report_in_an_ordinary_log():
    assert sanitizer.parse("Accepted client connection\nClient connection closed\n") is None


def test_death_line_without_a_report_is_unchanged():
    lines = ["/x/ggml/src/ggml.c:1787: GGML_ASSERT(INT64_MAX / ne[i] > current_nelements) "
             "failed"]
    assert death_line(lines) == "ggml.c:1787: GGML_ASSERT(INT64_MAX / ne[i] > " \
                                "current_nelements) failed"


CLANG = shutil.which("clang++-16")


@tool_marker(CLANG is None, "needs clang++-16 (apt-get install clang-16)")
def test_fixtures_match_a_fresh_run_of_the_toy(tmp_path):
    """The toy's reports, recorded again now, give the recorded signatures; its binary is
    recognised as a sanitizer build (the fault shim stays out of its way)."""
    exe, src = tmp_path / "bugs", tmp_path / "bugs.cpp"  # the name it was recorded under
    shutil.copyfile(FIX / "toy_bugs.cpp", src)
    subprocess.run([CLANG, "-g", "-O0", "-fsanitize=address,undefined",
                    "-fno-sanitize-recover=undefined", str(src), "-o", str(exe)],
                   check=True, capture_output=True, timeout=300)
    assert is_sanitized(exe) and not is_sanitized(sys.executable)
    for arg, fixture in (("0", "asan-heap-use-after-free.txt"),
                         ("2", "asan-heap-overflow-write4.txt"),
                         ("4", "asan-segv-zero-page.txt")):
        run = subprocess.run([str(exe), arg], capture_output=True, text=True, timeout=60)
        assert run.returncode != 0
        live = sanitizer.parse(run.stderr)
        assert live is not None and live.signature_line() == report(fixture).signature_line()


def test_server_memcpy_overlap_in_copy_tensor():
    """Found by the in-process p7 target: COPY_TENSOR between overlapping ranges of one
    buffer reaches memcpy (harmless-looking on the live server, undefined behaviour)."""
    r = report("server-asan-memcpy-param-overlap-copy-tensor.txt")
    assert (r.tool, r.bug_type) == ("AddressSanitizer", "memcpy-param-overlap")
    assert r.signature_line() == (
        "AddressSanitizer: memcpy-param-overlap in ggml_backend_cpu_buffer_cpy_tensor "
        "(ggml-backend.cpp) < rpc_server::copy_tensor (ggml-rpc.cpp) < rpc_serve_client "
        "(ggml-rpc.cpp)")


def test_harness_frames_are_not_project_frames():
    """A UBSan report inside the fuzz target's own transport (a memcpy of 0 bytes to null,
    since fixed) names the server frame that called it, not the harness."""
    r = report("harness-ubsan-null-argument.txt")
    assert r.frames[0].func.startswith("harness_fuzz::Connection::read")
    assert r.project_frames[0].func.startswith("rpc_serve_client")


def test_a_recoverable_ubsan_report_does_not_hide_what_killed_the_process():
    ubsan = (FIX / "ubsan-misaligned-graph-compute.txt").read_text().splitlines()
    asan = (FIX / "asan-heap-use-after-free.txt").read_text().splitlines()
    assert sanitizer.parse(ubsan + asan).bug_type == "heap-use-after-free"
    assert_line = "/src/ggml/src/ggml.c:1787: GGML_ASSERT(INT64_MAX / ne[i] > current_nelements) " \
                  "failed"
    assert sanitizer.parse(ubsan + [assert_line]) is None  # the assert is the death
    assert death_line(ubsan + [assert_line]).startswith("ggml.c:1787: GGML_ASSERT(")
    # Alone, it is the last thing that happened: the report.
    assert sanitizer.parse(ubsan).tool == "UndefinedBehaviorSanitizer"


def test_a_death_is_named_after_the_request_the_report_shows_the_server_serving(tmp_path):
    """A live sanitizer server dies while it prints: the runner's wire view may blame the next
    request (unanswered because the process was still printing, as seven in-process p7
    findings were blamed on GET_ALIGNMENT). The report's rpc_server::<method> frame names
    the request; a report without one leaves the runner's choice alone."""
    from harness.fuzz.target import Target, TargetSpec
    from harness.impls.driver import ExitInfo
    assert report("server-asan-memcpy-param-overlap-copy-tensor.txt").server_method() \
        == "copy_tensor"
    assert report("asan-heap-use-after-free.txt").server_method() is None
    target = Target(TargetSpec.parse("ref"), tmp_path / "t")
    for fixture, blamed in (("server-asan-memcpy-param-overlap-copy-tensor.txt", "COPY_TENSOR"),
                            ("asan-heap-use-after-free.txt", "GET_ALIGNMENT")):
        target.log_lines = lambda f=fixture: (FIX / f).read_text().splitlines()
        sig, _ = target.death_verdict(ExitInfo(returncode=None, signal=6), "GET_ALIGNMENT")
        assert sig.command == blamed, fixture


def test_one_template_frame_is_one_report_however_its_arguments_are_spelt():
    """The in-process target and the live sanitizer server symbolise a template's arguments
    differently (a p6 finding did not replay for it); the class and frame still decide."""
    inproc = ("UndefinedBehaviorSanitizer: store to null pointer of type 'unsigned short' in "
              "void vec_binary_op_contiguous<&op_div (binary-ops.cpp) < "
              "void apply_binary_op<&op_div (binary-ops.cpp)")
    live = ("UndefinedBehaviorSanitizer: store to null pointer of type 'unsigned short' in "
            "void vec_binary_op_contiguous<& (binary-ops.cpp) < void apply_binary_op<& "
            "(binary-ops.cpp)")
    other = live.replace("vec_binary_op_contiguous", "vec_unary_op")
    assert sanitizer.same_report(inproc, live)
    assert not sanitizer.same_report(inproc, other)
