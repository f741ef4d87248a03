"""The real C client for ``harness bench``: the ctypes agent plus timed transfer steps.

usage: python -m harness.bench.agent --lib-dir DIR [--proto X.Y.Z]

The ordinary ``set``/``get`` steps build their data and hash it inside the step, so their
t0/t1 would time numpy and the hash with the transfer. The bench steps take the payload out
of the timed region: the buffer is made (and its pages touched) first, then only the
library call is timed, followed by a 1-byte GET_TENSOR on the same connection. The
connection is served in order, so that answer proves the server has consumed the whole
SET_TENSOR (proto 7 sends no answer of its own, and the call returns once the bytes are in
the socket buffer).

Extra steps (besides every step of ``harness.impls.ctypes_agent``):

  bench_set   tensor, size, repeat=1  -> {seconds: [..], rtt: [..], fnv}
  bench_get   tensor, size, repeat=1  -> {seconds: [..], fnv}
  bench_hash  tensor, size, repeat=1  -> {seconds: [..], rtt: [..], fnv}
              (a weights tensor > 10 MiB: the library hashes, sends SET_TENSOR_HASH and stops
              when the server says it has the data; time minus rtt = the library's fnv_hash)
"""

from __future__ import annotations

import sys
import time

import numpy as np

from ..impls import ctypes_agent as ca
from ..impls.ctypes_driver import CtypesClientDriver

_PATTERN_BYTES = 1 << 20


def payload(size: int, seed: int = 7) -> np.ndarray:
    """``size`` bytes of non-constant data, cheap to make (a random MiB repeated), pages touched."""
    block = np.random.default_rng(seed).integers(0, 256, min(size, _PATTERN_BYTES) or 1,
                                                 dtype=np.uint8)
    out = np.empty(size, dtype=np.uint8)
    for off in range(0, size, len(block)):
        n = min(len(block), size - off)
        out[off:off + n] = block[:n]
    return out


class BenchAgent(ca.Agent):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self._data: np.ndarray | None = None
        self._one = np.zeros(1, dtype=np.uint8)

    def _buffer_of(self, size: int) -> np.ndarray:
        # One payload reused by every step: a new GiB per step would page-fault in the timing.
        if self._data is None or self._data.nbytes < size:
            self._data = None
            self._data = payload(size)
        return self._data[:size]

    def _sync(self, t) -> float:
        t0 = time.perf_counter()
        self.lib.ggml_backend_tensor_get(t.ptr, self._one.ctypes.data, 0, 1)
        return time.perf_counter() - t0

    def op_bench_set(self, s):
        t = self.tensor(s["tensor"])
        _, offset, size = self.region(t, s)
        data = self._buffer_of(size)
        seconds, rtt = [], []
        for _ in range(int(s.get("repeat", 1))):
            t0 = time.perf_counter()
            self.lib.ggml_backend_tensor_set(t.ptr, data.ctypes.data, offset, size)
            r = self._sync(t)
            seconds.append(time.perf_counter() - t0)
            rtt.append(r)
        return {"seconds": seconds, "rtt": rtt, "fnv": f"{ca.fnv1a64(data):016x}"}

    def op_bench_get(self, s):
        t = self.tensor(s["tensor"])
        _, offset, size = self.region(t, s)
        out = self._buffer_of(size)  # overwritten by the download, checked by its hash
        out[:] = 0
        seconds = []
        for _ in range(int(s.get("repeat", 1))):
            t0 = time.perf_counter()
            self.lib.ggml_backend_tensor_get(t.ptr, out.ctypes.data, offset, size)
            seconds.append(time.perf_counter() - t0)
        fnv = f"{ca.fnv1a64(out):016x}"
        self._data = None  # the next upload must not send what it just downloaded by accident
        return {"seconds": seconds, "fnv": fnv}

    op_bench_hash = op_bench_set  # same timing; the buffer's usage makes the library hash


class BenchClientDriver(CtypesClientDriver):
    """CtypesClientDriver running this module's agent instead of the plain one."""

    name = "c-bench"
    agent_module = "harness.bench.agent"


def main(argv=None) -> int:
    ca.Agent = BenchAgent  # ctypes_agent.main builds its agent from this module global
    return ca.main(argv)


if __name__ == "__main__":
    sys.exit(main())
