"""The LD_PRELOAD shim that gives llama-simple RPC devices (``rpc_preload.c``, registering
``$GGML_RPC_SERVERS`` before main(), as ``--rpc`` does in the tools that have it), compiled
against one build's own libraries and cached; and the atomic shared-object compile it shares
with the loopback shim."""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

from .cache import cache_root

SHIM_SOURCE = Path(__file__).with_name("rpc_preload.c")
SHIM_NAME = "librpc_preload.so"
SHIM_EXIT_REFUSED = 3  # rpc_preload.c's exit code when ggml_backend_rpc_add_server returns NULL


def _lib(bin_dir: Path, name: str) -> Path:
    for cand in (name, name + ".0"):
        p = bin_dir / cand
        if p.exists():
            return p
    raise FileNotFoundError(f"{name} not found in {bin_dir}")


def ensure_shim(bin_dir: str | os.PathLike, include_dirs=(), *, out_dir=None,
                cc: str = "gcc", timeout: float = 120.0) -> Path:
    """Compile rpc_preload.c against ``bin_dir``'s libggml/libggml-rpc; cached per build.

    The shim declares the two functions it calls, so no headers are needed; ``include_dirs``
    (a build's ggml/include) switches to the real headers as a check of those declarations.
    The cache key covers the source, the build's library files and the flags, so a rebuilt
    peer gets a fresh shim. Raises RuntimeError with the compiler's output on failure.
    """
    bin_dir = Path(bin_dir).resolve()
    libs = [_lib(bin_dir, "libggml-rpc.so"), _lib(bin_dir, "libggml.so")]
    include_dirs = [str(Path(d).resolve()) for d in include_dirs]
    h = hashlib.sha256(SHIM_SOURCE.read_bytes())
    h.update(str(bin_dir).encode())
    for lib in libs:
        st = lib.stat()  # follows the symlink: the real file's identity
        h.update(f"{lib.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    h.update(repr((include_dirs, cc)).encode())
    d = Path(out_dir) if out_dir else cache_root() / "shims" / h.hexdigest()[:16]
    out = d / SHIM_NAME
    if out.exists():
        return out
    args = ["-O2", "-shared", "-fPIC", str(SHIM_SOURCE)]
    if include_dirs:
        args += ["-DRPC_PRELOAD_USE_HEADERS"] + [f"-I{p}" for p in include_dirs]
    # Link the build's own libraries (their constructors then run before the shim's) and find
    # them at run time in that bin dir, the same files the tool itself loads.
    args += [str(p) for p in libs] + [f"-Wl,-rpath,{bin_dir}"]
    return compile_shared_object(cc, args, out, timeout)


def compile_shared_object(cc: str, args: list[str], out: Path, timeout: float) -> Path:
    """``cc args -o out``, written atomically (a concurrent user never sees half a file).
    Raises RuntimeError with the compiler's output on failure."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=".so.tmp")
    os.close(fd)
    cmd = [cc, *args, "-o", tmp]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"shim compile failed ({' '.join(cmd)}):\n{r.stderr.strip()}")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out
