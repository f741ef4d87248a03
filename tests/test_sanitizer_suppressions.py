"""The reviewed UBSan suppressions (harness/impls/ubsan.supp) against the real UBSan runtime of
clang-16, with the flags and options of both kinds of sanitizer build: each entry hides exactly
its report (the check and the function it names) and nothing near it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from harness.fuzz.libfuzzer.build import SANITIZER_FLAGS
from harness.impls import sanitize
from needs import tool

# The pre-7.0.0 ggml.c idiom (written here from its description, not copied): a size computed
# by "allocating" from a null base through an inlined helper, as -O1 compiles it. The same
# helper inlined into another function, and a different check inside the suppressed function,
# are what the entries must not hide.
PROGRAM = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
static inline __attribute__((always_inline)) void *incr_ptr_aligned(void **p, size_t size) {
    char *ptr = *p;
    *p = ptr + size;
    return ptr;
}
__attribute__((noinline)) size_t ggml_graph_nbytes(size_t size, int overflow) {
    void *p = 0;
    if (overflow) { volatile int big = 2147483647; big += overflow; }  /* signed overflow */
    incr_ptr_aligned(&p, size);
    return (size_t) p;
}
__attribute__((noinline)) size_t graph_nbytes_elsewhere(size_t size) {
    void *p = 0;
    incr_ptr_aligned(&p, size);
    return (size_t) p;
}
int main(int argc, char **argv) {
    size_t size = (size_t) atoi(argv[2]), end = 0;
    if (argv[1][0] == 's') end = ggml_graph_nbytes(size, 0);   /* the suppressed report */
    if (argv[1][0] == 'o') end = ggml_graph_nbytes(size, 1);   /* another check, same place */
    if (argv[1][0] == 'n') end = graph_nbytes_elsewhere(size); /* same check, another caller */
    printf("end %zu\n", end);
    return 0;
}
"""


def _compile(tmp_path: Path, name: str, flags: list[str]) -> Path:
    clang = tool(sanitize.clang_toolchain(), "clang-16 with its sanitizer runtimes "
                 "(apt-get install clang-16 libclang-rt-16-dev)")
    src = tmp_path / "idiom.c"
    src.write_text(PROGRAM)
    out = tmp_path / name
    r = subprocess.run([clang.cc, *flags, "-shared-libsan", f"-Wl,-rpath,{clang.runtime_dir}",
                        str(src), "-o", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return out


def _run(binary: Path, case: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([str(binary), case, "288"], capture_output=True, text=True, timeout=60,
                          env=env)


def _builds(tmp_path: Path):
    """(name, binary, environment) of the live server's and the in-process target's flavour."""
    live_flags = [*sanitize.compile_flag(("undefined",), clang=True).split(),
                  *sanitize.COMPILE_FLAGS]
    live_env = sanitize.runtime_env(("undefined",), env={})
    in_process = [f for f in SANITIZER_FLAGS.split() if "address" not in f]
    in_process_env = {"UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1:"
                                       f"suppressions={sanitize.UBSAN_SUPPRESSIONS}"}
    return [("live", _compile(tmp_path, "live", live_flags), live_env),
            ("in-process", _compile(tmp_path, "inproc", in_process + ["-fsanitize=undefined"]),
             in_process_env)]


def test_the_suppression_file_is_the_one_both_builds_read():
    assert sanitize.UBSAN_SUPPRESSIONS.is_file()
    entries = [line for line in sanitize.UBSAN_SUPPRESSIONS.read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    # reviewed: one report, matched inlined (-O1) or out of line
    assert entries == ["pointer-overflow:ggml_graph_nbytes", "pointer-overflow:incr_ptr_aligned"]
    assert {e.split(":")[0] for e in entries} <= set(sanitize.RECOVERABLE)
    assert sanitize.RUNTIME_OPTIONS["undefined"]["suppressions"] == str(sanitize.UBSAN_SUPPRESSIONS)
    assert "-fsanitize-recover=pointer-overflow" in SANITIZER_FLAGS.split()
    from harness.fuzz.libfuzzer.config import LibFuzzerConfig, sanitizer_env
    env = sanitizer_env(LibFuzzerConfig(target="p7"), None)
    assert f"suppressions={sanitize.UBSAN_SUPPRESSIONS}" in env["UBSAN_OPTIONS"]


@pytest.mark.parametrize("flavour", ["live", "in-process"])
def test_the_entry_hides_its_report_and_nothing_near_it(tmp_path, flavour):
    name, binary, env = next(b for b in _builds(tmp_path) if b[0] == flavour)
    suppressed = _run(binary, "s", env)
    assert suppressed.returncode == 0 and "runtime error" not in suppressed.stderr, \
        suppressed.stderr
    assert suppressed.stdout.strip() == "end 288"
    for case, report in (("o", "signed integer overflow"), ("n", "applying non-zero offset")):
        r = _run(binary, case, env)
        assert r.returncode != 0 and report in r.stderr, (case, r.returncode, r.stderr)
    # Planted fault: without the suppressions the suppressed case stops too.
    bare = {k: v.replace(f"suppressions={sanitize.UBSAN_SUPPRESSIONS}", "")
            for k, v in env.items()}
    r = _run(binary, "s", bare)
    assert r.returncode != 0 and "applying non-zero offset 288 to null pointer" in r.stderr
