"""Sanitizer builds: the compile flags that make their reports useful, and the runtime options
a sanitizer server is started with.

The options make every report end the process the way the fuzz campaign can see and bucket:
``abort_on_error`` (SIGABRT, not exit 1), ``halt_on_error`` (UBSan stops at its first report
instead of going on), ``detect_leaks=0`` (a server killed by the harness is no leak). Two are
about running under the harness rather than about bugs: ``verify_asan_link_order=0`` because
the server is started through ``stdbuf`` (an LD_PRELOAD that would otherwise come before the
ASan runtime), and ``allocator_may_return_null=1`` so an oversized ALLOC_BUFFER fails the way
it does in the release build (NULL, answered on the wire) instead of as an ASan report.
UBSan reads the reviewed suppressions of ``ubsan.supp`` (shared with the in-process target).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

# -g and frame pointers: symbolised, complete stacks in the reports; -O1 keeps them readable
# and the build about as fast as the release one.
COMPILE_FLAGS = ("-g", "-O1", "-fno-omit-frame-pointer")

_COMMON = {"abort_on_error": "1", "print_summary": "1", "symbolize": "1"}
# A suppressed check must be recoverable to be skipped (clang and gcc build UBSan's checks
# recoverable by default; halt_on_error still stops at every report not suppressed).
UBSAN_SUPPRESSIONS = Path(__file__).with_name("ubsan.supp")
RECOVERABLE = ("pointer-overflow",)  # the checks ubsan.supp names
RUNTIME_OPTIONS: dict[str, dict[str, str]] = {
    "address": {**_COMMON, "halt_on_error": "1", "detect_leaks": "0",
                "verify_asan_link_order": "0", "allocator_may_return_null": "1"},
    "undefined": {**_COMMON, "halt_on_error": "1", "print_stacktrace": "1",
                  "suppressions": str(UBSAN_SUPPRESSIONS)},
    "thread": {**_COMMON, "halt_on_error": "1"},
    "leak": {**_COMMON},
}
OPTIONS_ENV = {"address": "ASAN_OPTIONS", "undefined": "UBSAN_OPTIONS",
               "thread": "TSAN_OPTIONS", "leak": "LSAN_OPTIONS"}


# UBSan's alignment check is left out: ggml-rpc reads its wire structs in place from the
# receive buffer, so the real 7.0.0 server trips it on every GRAPH_COMPUTE (reference binding to
# a misaligned uint64_t, ggml-rpc.cpp:1759 in graph_compute). That is harmless on the CPUs it
# runs on, and with halt_on_error it would stop every session at its first graph.
UNCHECKED = {"undefined": ("alignment",)}
# clang's UBSan also has checks gcc's lacks that need typed RTTI (vptr, function); OSS-Fuzz
# leaves them out, and so do the in-process target and the clang-built servers alike.
CLANG_UNCHECKED = {"undefined": ("vptr", "function")}


def compile_flag(sanitizers: tuple[str, ...], *, clang: bool = False) -> str:
    """``-fsanitize=...`` (plus ``-fno-sanitize=...`` for the checks left out)."""
    off = [check for table in ((CLANG_UNCHECKED,) if clang else ()) + (UNCHECKED,)
           for name in sanitizers for check in table.get(name, ())]
    return "-fsanitize=" + ",".join(sanitizers) + (
        " -fno-sanitize=" + ",".join(off) if off else "")


CLANG_VERSION = "16"  # the in-process libFuzzer target's compiler (harness.fuzz.libfuzzer)


@dataclass(frozen=True)
class Clang:
    """The clang a sanitizer build is made with, and where its shared runtimes are."""

    cc: str
    cxx: str
    runtime_dir: str


@functools.cache
def clang_toolchain() -> Clang | None:
    """clang-16 when it is installed with its shared sanitizer runtimes (libclang-rt-16-dev),
    else None (gcc then). With clang a live sanitizer server checks what the in-process libFuzzer
    target checks: gcc 12's UBSan has no pointer-overflow or null-pointer-arithmetic check, so
    such a finding of the target could not replay against a gcc-built server. ``CC`` set in
    the environment is the user's choice and wins."""
    if os.environ.get("CC"):
        return None
    cc, cxx = shutil.which(f"clang-{CLANG_VERSION}"), shutil.which(f"clang++-{CLANG_VERSION}")
    if not cc or not cxx:
        return None
    try:
        runtime_dir = subprocess.run([cc, "-print-runtime-dir"], capture_output=True, text=True,
                                     timeout=30, check=True).stdout.strip()
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / "probe.c"
            src.write_text("int main(void) { return 0; }\n")
            linked = subprocess.run([cc, "-fsanitize=address,undefined", "-shared-libsan",
                                     str(src), "-o", str(Path(tmp) / "probe")],
                                    capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return None
    return Clang(cc, cxx, runtime_dir) if linked and runtime_dir else None


def cmake_flags(sanitizers: tuple[str, ...], clang: Clang | None = None) -> list[str]:
    """cmake -D options that build every target (libraries included) with ``sanitizers``,
    with ``clang`` when given (else the default compiler). clang links its runtime shared
    (-shared-libsan, found through the rpath), as gcc does: a Python process loading the
    instrumented libraries (the ctypes client) preloads that one runtime."""
    if not sanitizers:
        return []
    fsan = compile_flag(sanitizers, clang=clang is not None)
    cflags = " ".join([fsan, *COMPILE_FLAGS])
    link = f"{fsan} -shared-libsan -Wl,-rpath,{clang.runtime_dir}" if clang else fsan
    compilers = [f"-DCMAKE_C_COMPILER={clang.cc}", f"-DCMAKE_CXX_COMPILER={clang.cxx}"] \
        if clang else []
    return [*compilers, f"-DCMAKE_C_FLAGS={cflags}", f"-DCMAKE_CXX_FLAGS={cflags}",
            f"-DCMAKE_EXE_LINKER_FLAGS={link}", f"-DCMAKE_SHARED_LINKER_FLAGS={link}",
            "-DCMAKE_BUILD_TYPE=RelWithDebInfo", "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-DNDEBUG",
            "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-DNDEBUG"]


def _merge(ours: Mapping[str, str], theirs: str) -> str:
    # Options already in the environment win: a user debugging a report may set their own.
    options = dict(ours)
    for item in filter(None, theirs.split(":")):
        key, _, value = item.partition("=")
        options[key] = value
    return ":".join(f"{k}={v}" for k, v in options.items())


def runtime_env(sanitizers: tuple[str, ...], env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The *_OPTIONS variables (merged with those in ``env``) a sanitizer server needs."""
    env = os.environ if env is None else env
    out = {}
    for name in sanitizers:
        var = OPTIONS_ENV[name]
        out[var] = _merge(RUNTIME_OPTIONS[name], env.get(var, ""))
    symbolizer = shutil.which("llvm-symbolizer") or shutil.which("llvm-symbolizer-16")
    if sanitizers and symbolizer and "ASAN_SYMBOLIZER_PATH" not in env:
        out["ASAN_SYMBOLIZER_PATH"] = symbolizer  # clang builds need it; gcc's runtime has its own
    return out
