"""FNV-1a 64-bit exactly as ggml-rpc's fnv_hash() computes it (spec 9).

The hash is a serial xor/multiply chain, so its speed is bounded by multiply latency; a
compiled loop reaches the same rate as the C client's own (measured side by side in
``harness bench``). numba compiles it once and caches the machine code.
"""

from __future__ import annotations

import numpy as np

from .constants import FNV_OFFSET_BASIS, FNV_PRIME

try:
    from numba import njit
except ImportError:  # pragma: no cover - numba is a declared dependency
    njit = None

_SMALL = 256  # below this a Python loop is cheaper than the call overhead


def _fnv_py(data, h: int) -> int:
    for b in bytes(data):
        h = ((h ^ b) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h


if njit is not None:
    @njit(cache=True, nogil=True)
    def _fnv_nb(arr, h):  # pragma: no cover - compiled
        p = np.uint64(FNV_PRIME)
        for i in range(arr.shape[0]):
            h = (h ^ np.uint64(arr[i])) * p
        return h
else:  # pragma: no cover
    _fnv_nb = None


def _as_u8(data) -> np.ndarray:
    if isinstance(data, np.ndarray):
        return data.reshape(-1).view(np.uint8)
    return np.frombuffer(data, dtype=np.uint8)


def fnv1a64_update(h: int, data) -> int:
    """Continue a hash over more bytes (bytes, bytearray, memoryview or numpy array)."""
    n = data.nbytes if isinstance(data, (np.ndarray, memoryview)) else len(data)
    if n < _SMALL or _fnv_nb is None:
        return _fnv_py(data.tobytes() if isinstance(data, np.ndarray) else data, h)
    return int(_fnv_nb(_as_u8(data), np.uint64(h)))


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
