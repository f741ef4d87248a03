"""Server-side buffers and the fake address space their handles and bases live in.

The real server hands out heap addresses; the reference server hands out synthetic ones from
disjoint ranges, with guard gaps between buffers so an off-by-one region check can never land
in a neighbour. All backing memory is accounted against one server-wide bound.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from .errors import PeerError

HANDLE_BASE = 0x5A00_0000_0000  # buffer handles ("ggml_backend_buffer_t")
DATA_BASE = 0x7A00_0000_0000  # buffer memory
GUARD = 1 << 20  # unmapped gap after each buffer's memory
ALIGNMENT = 32  # what the CPU backend reports


class OutOfMemory(PeerError):
    pass


@dataclass(eq=False)
class Buffer:
    handle: int
    base: int
    size: int
    mem: np.ndarray  # uint8, length == size

    def contains(self, addr: int, n: int) -> bool:
        return self.base <= addr and addr + n <= self.base + self.size

    def view(self, addr: int, n: int) -> memoryview:
        off = addr - self.base
        return memoryview(self.mem)[off:off + n]


class MemoryPool:
    """Hands out buffers under a byte budget shared by every connection of the server."""

    def __init__(self, budget: int):
        self.budget = budget
        self.used = 0
        self._next_handle = HANDLE_BASE
        self._next_data = DATA_BASE
        self._lock = threading.Lock()

    def allocate(self, size: int) -> Buffer:
        with self._lock:
            if size > self.budget - self.used:
                raise OutOfMemory(f"{size} bytes requested, {self.budget - self.used} available")
            self.used += size
            handle = self._next_handle
            self._next_handle += 0x100
            if size == 0:
                base = 0  # the CPU backend gives a zero-size buffer a NULL base
            else:
                base = self._next_data
                self._next_data += -(-(size + GUARD) // 4096) * 4096
        try:
            # np.zeros maps lazily (calloc), so a large buffer costs nothing until written
            mem = np.zeros(size, dtype=np.uint8)
        except MemoryError:
            with self._lock:
                self.used -= size
            raise OutOfMemory(f"host allocation of {size} bytes failed") from None
        return Buffer(handle, base, size, mem)

    def release(self, buf: Buffer) -> None:
        with self._lock:
            self.used -= buf.size
        buf.mem = np.zeros(0, dtype=np.uint8)

    @property
    def free(self) -> int:
        return self.budget - self.used
