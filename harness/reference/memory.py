"""Server-side buffers and the fake address space their handles and bases live in.

The real server hands out heap addresses; the reference server hands out synthetic ones from
disjoint ranges, with guard gaps between buffers so an off-by-one region check can never land
in a neighbour. All backing memory is accounted against one server-wide bound.

Reuse after free follows what the real 7.0.0 and 8.0.0 servers showed (4 KiB and 1 MiB buffers,
ALLOC, ALLOC, FREE, FREE, ALLOC, ALLOC), because it decides answers: a freed buffer's handle (a
small fixed-size struct from malloc) is the next ALLOC_BUFFER's handle, last freed first, so a
stale handle is live again on both servers ([V] real build: only when no request in between took
the chunk, which the process's earlier connections also decide; differential fuzzing compares
such steps as "stale-handle", harness/data/differential/); buffer memory is never handed out
twice (the real bases were fresh each time), so a stale data pointer stays outside every
buffer. Handles are HANDLE_STEP apart, far more than any small offset a client adds to one, so
handle+k names no other buffer (on the real server the next struct is heap chunks away).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from .errors import ReferencePeerError

HANDLE_BASE = 0x5A00_0000_0000  # buffer handles ("ggml_backend_buffer_t")
DATA_BASE = 0x7A00_0000_0000  # buffer memory
HANDLE_STEP = 1 << 20
GUARD = 1 << 20  # unmapped gap after each buffer's memory
ALIGNMENT = 32  # what the CPU backend reports


class OutOfMemory(ReferencePeerError):
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

    def read_clamped(self, addr: int, n: int) -> bytes:
        """``n`` bytes at ``addr``, zeros where they fall outside the buffer (what a planted
        bug reads: the reference has no memory beyond its buffers)."""
        out = bytearray(n)
        lo, hi = max(addr, self.base), min(addr + n, self.base + self.size)
        if lo < hi:
            out[lo - addr:hi - addr] = self.mem[lo - self.base:hi - self.base].tobytes()
        return bytes(out)

    def write_clamped(self, addr: int, data) -> None:
        """``data`` at ``addr``; bytes outside the buffer are dropped (a planted bug's write)."""
        lo, hi = max(addr, self.base), min(addr + len(data), self.base + self.size)
        if lo < hi:
            self.mem[lo - self.base:hi - self.base] = np.frombuffer(
                bytes(data[lo - addr:hi - addr]), dtype=np.uint8)


class MemoryPool:
    """Hands out buffers under a byte budget shared by every connection of the server."""

    def __init__(self, budget: int):
        self.budget = budget
        self.used = 0
        self._next_handle = HANDLE_BASE
        self._next_data = DATA_BASE
        self._free_handles: list[int] = []  # freed, most recent last
        self._lock = threading.Lock()

    def allocate(self, size: int) -> Buffer:
        with self._lock:
            if size > self.budget - self.used:
                raise OutOfMemory(f"{size} bytes requested, {self.budget - self.used} available")
            self.used += size
            if self._free_handles:
                handle = self._free_handles.pop()
            else:
                handle = self._next_handle
                self._next_handle += HANDLE_STEP
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
                self._free_handles.append(handle)
            raise OutOfMemory(f"host allocation of {size} bytes failed") from None
        return Buffer(handle, base, size, mem)

    def release(self, buf: Buffer) -> None:
        with self._lock:
            self.used -= buf.size
            self._free_handles.append(buf.handle)
        buf.mem = np.zeros(0, dtype=np.uint8)

    @property
    def free(self) -> int:
        return self.budget - self.used
