"""Build the in-process target of a pin: its sdist unpacked, ``build.sh`` run with clang-16.

Two flavours, each a cache entry of its own next to the pin's peer build
(``<cache>/peers/<package>==<version>+<flavour>-<hash of the harness sources>``):

* ``libfuzzer`` -- ``-fsanitize=fuzzer,address,undefined``: the fuzz target;
* ``coverage`` -- ``-fprofile-instr-generate -fcoverage-mapping`` and the harness's own
  replay driver (``replay_main.c``) as the engine: runs a corpus once for llvm-cov.

Like peer builds, the target is staged in a temp dir in the cache and renamed into place only
when it exists; a second call only looks. The unpacked sources and ggml's objects stay in a
work dir of their own (:func:`work_dir`), so a change of the harness's C++ only recompiles it.
clang-16, libclang-rt-16-dev (the fuzzer and sanitizer runtimes) and llvm-16 (symbolizer,
profdata, cov) are installed with apt-get when missing and the harness runs as root.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import FuzzError
from ...impls.cache import peers_dir
from ...impls.errors import BuildError
from ...impls.fetch import download, unpack_sdist
from ...impls.progress import as_progress
from ...impls.registry import resolve_pin
from ...impls.sanitize import CLANG_VERSION, RECOVERABLE, compile_flag
from ...impls.tools import run_logged, tool_env

HERE = Path(__file__).resolve().parent
TARGET_NAME = "ggml_rpc_server_fuzzer"
LLVM_VERSION = CLANG_VERSION  # one clang for the in-process target and the sanitizer peers
APT_PACKAGES = (f"clang-{LLVM_VERSION}", f"libclang-rt-{LLVM_VERSION}-dev", f"llvm-{LLVM_VERSION}")
SOURCES = ("build.sh", "rpc_server_fuzzer.cpp", "replay_main.c", f"{TARGET_NAME}.dict")
FLAVOURS = ("libfuzzer", "coverage")

# ASan and UBSan with the checks the clang-built live sanitizer servers have
# (harness.impls.sanitize), so every sanitizer finding of this target can replay against one.
# Every report is fatal but those of the checks ubsan.supp may suppress: a suppression only
# applies to a recoverable check (halt_on_error=1 still stops at what it does not name).
SANITIZER_FLAGS = "-O1 -g -fno-omit-frame-pointer " \
                  f"{compile_flag(('address', 'undefined'), clang=True)} " \
                  f"-fno-sanitize-recover=all -fsanitize-recover={','.join(RECOVERABLE)}"
COVERAGE_FLAGS = "-O1 -g -fprofile-instr-generate -fcoverage-mapping"


class ToolchainMissing(BuildError, FuzzError):
    """clang-16 / its runtimes / llvm tools are not installed and cannot be."""


def tool(name: str) -> str | None:
    """``clang`` -> the path of clang-16 (or a clang whose version is 16)."""
    return shutil.which(f"{name}-{LLVM_VERSION}")


def _probe_fuzzer_runtime(clang: str) -> bool:
    """Does ``clang -fsanitize=fuzzer`` link (libclang-rt-16-dev present)?"""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "t.c"
        src.write_text("#include <stdint.h>\n#include <stddef.h>\nint LLVMFuzzerTestOneInput("
                       "const uint8_t *d, size_t n) { return 0; }\n")
        try:
            r = subprocess.run([clang, "-fsanitize=fuzzer,address,undefined", str(src), "-o",
                                str(Path(tmp) / "t")], capture_output=True, timeout=120)
        except (OSError, subprocess.SubprocessError):
            return False
        return r.returncode == 0


def ensure_toolchain(*, install: bool = True) -> dict[str, str]:
    """The paths of clang/clang++/llvm-profdata/llvm-cov/llvm-symbolizer (version 16),
    installing the Debian packages first when something is missing (root only)."""
    def found() -> dict[str, str] | None:
        paths = {n: tool(n) for n in ("clang", "clang++", "llvm-profdata", "llvm-cov",
                                      "llvm-symbolizer")}
        if any(v is None for v in paths.values()) or not _probe_fuzzer_runtime(paths["clang"]):
            return None
        return paths  # type: ignore[return-value]

    paths = found()
    if paths is not None:
        return paths
    apt = shutil.which("apt-get")
    if install and apt and os.geteuid() == 0:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        for cmd in ([apt, "update", "-q"], [apt, "install", "-y", "-q", *APT_PACKAGES]):
            r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
            if r.returncode != 0:
                raise ToolchainMissing(f"{' '.join(cmd)} failed (exit {r.returncode})",
                                       command=cmd, output_tail=r.stdout.splitlines()[-10:])
        paths = found()
        if paths is not None:
            return paths
    raise ToolchainMissing("the libFuzzer engine needs clang-16 with its fuzzer runtime: "
                           f"apt-get install {' '.join(APT_PACKAGES)}")


def sources_hash() -> str:
    """What the built target depends on besides the tree: the harness's sources and flags."""
    h = hashlib.sha1(SANITIZER_FLAGS.encode() + b"\0" + COVERAGE_FLAGS.encode() + b"\0")
    for name in SOURCES:
        h.update(name.encode() + b"\0" + (HERE / name).read_bytes())
    return h.hexdigest()[:10]


@dataclass
class FuzzBuild:
    pin: str
    flavour: str
    entry: Path
    cached: bool
    seconds: float

    @property
    def binary(self) -> Path:
        return self.entry / TARGET_NAME

    @property
    def dictionary(self) -> Path:
        return self.entry / f"{TARGET_NAME}.dict"

    @property
    def manifest(self) -> dict:
        return json.loads((self.entry / "manifest.json").read_text())


def _flags(flavour: str) -> str:
    return SANITIZER_FLAGS if flavour == "libfuzzer" else COVERAGE_FLAGS


def entry_dir(pin_name: str, flavour: str) -> Path:
    """The target's cache entry: per pin, flavour, harness sources and compiler flags."""
    pin = resolve_pin(pin_name)
    key = hashlib.sha1(f"{sources_hash()}\0{_flags(flavour)}".encode()).hexdigest()[:10]
    return peers_dir() / f"{pin.key}+{flavour}-{key}"


def work_dir(pin_name: str, flavour: str) -> Path:
    """Where the pin's unpacked sources and ggml's objects stay between builds (per flavour
    and flags): a change of the harness's sources recompiles only its translation unit."""
    pin = resolve_pin(pin_name)
    key = hashlib.sha1(_flags(flavour).encode()).hexdigest()[:8]
    return peers_dir() / f".{pin.key}+{flavour}-work-{key}"


def build_target(pin_name: str, flavour: str = "libfuzzer", *, jobs: int = 2,
                 progress=None) -> FuzzBuild:
    """The cached in-process target of ``pin_name`` (building it on first use)."""
    if flavour not in FLAVOURS:
        raise ValueError(f"unknown flavour {flavour!r}: one of {', '.join(FLAVOURS)}")
    pin = resolve_pin(pin_name)
    if pin.kind != "sdist":
        raise BuildError(f"{pin.name} is a prebuilt wheel: the in-process target is built "
                         "from sources (pins of kind sdist)")
    started = time.monotonic()
    entry = entry_dir(pin.name, flavour)
    if (entry / TARGET_NAME).is_file():
        return FuzzBuild(pin.name, flavour, entry, True, 0.0)
    tools = ensure_toolchain()
    progress = as_progress(progress)
    peers_dir().mkdir(parents=True, exist_ok=True)
    work = work_dir(pin.name, flavour)
    with open(peers_dir() / f".{pin.key}+{flavour}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second builder waits, then finds the entry
        if (entry / TARGET_NAME).is_file():
            return FuzzBuild(pin.name, flavour, entry, True, 0.0)
        stage = Path(tempfile.mkdtemp(prefix=f".tmp-{entry.name}-pid{os.getpid()}-",
                                      dir=peers_dir()))
        try:
            _build_in(pin, flavour, stage, work, tools, jobs, progress)
            stage.chmod(0o755)
            os.rename(stage / "out", entry)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    progress.finish(pin.name, f"{flavour} target built in {time.monotonic() - started:.0f} s "
                              f"-> {entry}")
    return FuzzBuild(pin.name, flavour, entry, False, time.monotonic() - started)


def pin_source(pin_name: str, progress=None) -> tuple[Path, str]:
    """(the pin's unpacked llama.cpp tree, its dialect), fetched once into the work dir of its
    libFuzzer target: what an outside OSS-Fuzz-style build compiles."""
    pin = resolve_pin(pin_name)
    if pin.kind != "sdist":
        raise BuildError(f"{pin.name} is a prebuilt wheel: no sources to build a target from")
    source, _ = _sources(pin, work_dir(pin.name, "libfuzzer"), as_progress(progress))
    return source, pin.dialect or pin.proto


def _sources(pin, work: Path, progress) -> tuple[Path, str | None]:
    """The pin's llama.cpp tree, unpacked once into ``work`` (renamed into place whole)."""
    done = work / "src.json"
    if done.is_file():
        meta = json.loads(done.read_text())
        return Path(meta["source"]), meta.get("commit")
    work.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="unpack-", dir=work))
    try:
        archive, _ = download(pin, tmp, progress, keep=True)
        progress.stage(pin.name, "unpack", archive.name)
        source, commit = unpack_sdist(pin, archive, tmp / "src")
        shutil.rmtree(work / "src", ignore_errors=True)
        os.rename(tmp / "src", work / "src")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    source = work / "src" / source.relative_to(tmp / "src")
    done.write_text(json.dumps({"source": str(source), "commit": commit}) + "\n")
    return source, commit


_CACHED_TOOL = re.compile(r"^CMAKE_(?:MAKE_PROGRAM|C_COMPILER|CXX_COMPILER):\w+=(?P<path>/.*)$",
                          re.M)


def drop_stale_cmake_cache(build_dir: Path) -> bool:
    """Remove a kept ggml build dir whose CMake cache names a tool that is gone (a ninja of a
    since-deleted virtualenv: configure then fails at once, on every later build). True if
    it was removed."""
    try:
        cache = (build_dir / "CMakeCache.txt").read_text(errors="replace")
    except OSError:
        return False
    if all(Path(m.group("path").strip()).exists() for m in _CACHED_TOOL.finditer(cache)):
        return False
    shutil.rmtree(build_dir, ignore_errors=True)
    return True


def _build_in(pin, flavour: str, stage: Path, work: Path, tools: dict, jobs: int,
              progress) -> None:
    source, commit = _sources(pin, work, progress)
    drop_stale_cmake_cache(work / "build" / "ggml")  # build.sh configures into build/ggml
    out = stage / "out"
    out.mkdir()
    env = dict(tool_env(), SRC=str(source.parent), LLAMA_CPP=str(source), OUT=str(out),
               WORK=str(work / "build"), CC=tools["clang"], CXX=tools["clang++"],
               JOBS=str(jobs))
    if flavour == "libfuzzer":
        flags = f"{SANITIZER_FLAGS} -fsanitize=fuzzer-no-link"
        env.update(CFLAGS=flags, CXXFLAGS=flags, LIB_FUZZING_ENGINE="-fsanitize=fuzzer")
    else:
        engine = stage / "replay_main.o"
        run_logged([tools["clang"], *COVERAGE_FLAGS.split(), "-c", str(HERE / "replay_main.c"),
                     "-o", str(engine)], log_path=stage / "engine.log", what="replay driver",
                    env=env)
        env.update(CFLAGS=COVERAGE_FLAGS, CXXFLAGS=COVERAGE_FLAGS,
                   LIB_FUZZING_ENGINE=f"{engine} -fprofile-instr-generate")
    progress.stage(pin.name, "build", f"build.sh ({flavour}, -j{jobs}, clang-{LLVM_VERSION})")
    nice = shutil.which("nice")
    run_logged(([nice] if nice else []) + ["bash", str(HERE / "build.sh")],
                log_path=stage / "build.log", what=f"build.sh ({flavour})", env=env)
    # The sources stay in the work dir: llvm-cov reads them, the symbolizer names them.
    (out / "manifest.json").write_text(json.dumps({
        "format": "ggml-rpc-harness-fuzz-target/1", "pin": pin.name, "package": pin.key,
        "proto": pin.proto, "flavour": flavour, "commit": commit, "clang": tools["clang"],
        "sources_hash": sources_hash(), "source_root": str(source),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, indent=1) + "\n")
