"""Run the real ggml-rpc server loop from a directory of libggml*.so (no server executable needed).

usage: python -m harness.impls.wheel_server LIBDIR HOST:PORT [--threads N] [--cache-dir D]

For builds that ship the libraries but no ggml-rpc-server, like the llama-cpp-py-sync wheel
(proto 8). It calls ``ggml_backend_rpc_start_server`` on the CPU device and blocks, serving one
client at a time, until killed. ``--cache-dir`` is the directory cached tensors are stored in
(the binary's ``$LLAMA_CACHE/rpc``); without it the hash cache is off.

The library prints its banner with printf; stdout is switched to line buffering so the banner
shows up at once when redirected to a file (the proto-8 library prints it on stderr anyway).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys

_IOLBF = 1
_DEVICE_TYPE_CPU = 0


def _line_buffer_c_stdout() -> None:
    libc = ctypes.CDLL(None)
    libc.setvbuf(ctypes.c_void_p.in_dll(libc, "stdout"), None, _IOLBF, 0)


def _load(libdir: str, name: str) -> ctypes.CDLL:
    for candidate in (name, name + ".0"):
        path = os.path.join(libdir, candidate)
        if os.path.exists(path):
            # RTLD_GLOBAL so the ggml libraries resolve each other's symbols.
            return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    raise FileNotFoundError(f"{name} not found in {libdir}")


def serve(libdir: str, endpoint: str, threads: int = 1, cache_dir: str | None = None) -> None:
    """Block in the library's accept loop. Returns only if it gives up (e.g. bind failed)."""
    _line_buffer_c_stdout()
    _load(libdir, "libggml-base.so")
    ggml = _load(libdir, "libggml.so")
    rpc = _load(libdir, "libggml-rpc.so")

    # A no-op for builds with linked-in backends; loads them for GGML_BACKEND_DL builds.
    ggml.ggml_backend_load_all.restype = None
    ggml.ggml_backend_load_all()
    ggml.ggml_backend_dev_by_type.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
    cpu = ggml.ggml_backend_dev_by_type(_DEVICE_TYPE_CPU)
    if not cpu:
        raise RuntimeError("no CPU device in this ggml build")
    devices = (ctypes.c_void_p * 1)(cpu)

    if cache_dir:
        os.makedirs(cache_dir, exist_ok=True)
    start = rpc.ggml_backend_rpc_start_server
    start.restype = None
    start.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t,
                      ctypes.POINTER(ctypes.c_void_p)]
    start(endpoint.encode(), cache_dir.encode() if cache_dir else None, threads, 1, devices)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.impls.wheel_server",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("libdir")
    parser.add_argument("endpoint", metavar="HOST:PORT")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cache-dir", default=None)
    args = parser.parse_args(argv)
    serve(args.libdir, args.endpoint, args.threads, args.cache_dir)
    print("server loop returned (bind failed?)", file=sys.stderr, flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
