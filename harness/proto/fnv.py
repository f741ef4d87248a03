"""FNV-1a 64-bit exactly as ggml-rpc's fnv_hash() computes it (spec 9).

Small inputs go through a Python loop; large ones through a compiled kernel
(``_fnv_sliced.sliced``: the same value without the per-byte multiply chain, about 3x the
C client's own loop; see that module for the algorithm). numba is imported only once a process
hashes enough to repay loading it (~0.3 s, ~65 MiB resident), so a reference server without a
cache, or a client agent hashing a few small tensors, starts fast and stays small.
"""

from __future__ import annotations

import threading

import numpy as np

from .constants import FNV_OFFSET_BASIS, FNV_PRIME
from .wire import U64_MAX

_SMALL = 256  # below this a Python loop is cheaper than the call overhead
_LOAD_AT = 1 << 16  # a hash this big loads the kernel (the Python loop would take ~6 ms)...
_PY_BUDGET = 1 << 20  # ...as does the Python loop's running total passing this
_M64 = U64_MAX  # products wrap as the C client's uint64_t


def _fnv_py(data, h: int) -> int:
    for b in bytes(data):
        h = ((h ^ b) * FNV_PRIME) & _M64
    return h


_kernel = None  # (function(u8 array, u64) -> u64) once loaded; False: no numba here
_kernel_lock = threading.Lock()
_py_bytes = 0  # hashed by the Python loop while the kernel was not loaded


def _load_kernel():
    global _kernel
    with _kernel_lock:
        if _kernel is not None:
            return _kernel
        try:
            from . import _fnv_sliced as k
        except ImportError:  # pragma: no cover - numba is a declared dependency
            _kernel = False
            return _kernel

        def sliced(arr, h):
            return k.sliced(arr, h, k.Q, k.P64)

        # Exactness is the contract: check the kernel once against the plain loop (on block
        # edges and a pipelined length) and keep the plain loop if this platform disagrees.
        probe = np.frombuffer(bytes((i * 167 + 13) & 0xFF for i in range(64 * 5 + 7)),
                              dtype=np.uint8)
        ok = all(int(sliced(probe[:n], np.uint64(h))) == int(k.serial(probe[:n], np.uint64(h)))
                 for n in (63, 64, 129, len(probe)) for h in (FNV_OFFSET_BASIS, 0xA5))
        _kernel = sliced if ok else k.serial
        return _kernel


def _as_u8(data) -> np.ndarray:
    if isinstance(data, np.ndarray):
        return data.reshape(-1).view(np.uint8)
    return np.frombuffer(data, dtype=np.uint8)


def fnv1a64_update(h: int, data) -> int:
    """Continue a hash over more bytes (bytes, bytearray, memoryview or numpy array)."""
    global _py_bytes
    n = data.nbytes if isinstance(data, (np.ndarray, memoryview)) else len(data)
    kernel = _kernel
    if kernel is None and n >= _SMALL:
        if n >= _LOAD_AT or _py_bytes + n > _PY_BUDGET:
            kernel = _load_kernel()
        else:
            _py_bytes += n
    if n < _SMALL or not kernel:
        return _fnv_py(data.tobytes() if isinstance(data, np.ndarray) else data, h)
    return int(kernel(_as_u8(data), np.uint64(h)))


def fnv1a64(data) -> int:
    return fnv1a64_update(FNV_OFFSET_BASIS, data)


class Fnv1a64:
    """Incremental hasher for payloads that arrive in chunks."""

    __slots__ = ("value", "length")

    def __init__(self):
        self.value = FNV_OFFSET_BASIS
        self.length = 0

    def update(self, data) -> None:
        self.value = fnv1a64_update(self.value, data)
        self.length += len(data) if not isinstance(data, np.ndarray) else data.nbytes

    def hexdigest(self) -> str:
        return cache_file_name(self.value)


def cache_file_name(h: int) -> str:
    """Cache entries are named by the hash as 16 lowercase, zero-padded hex digits."""
    return f"{h:016x}"
