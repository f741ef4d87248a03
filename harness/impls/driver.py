"""The contract between scenarios and any client under test (reference or real C library).

Scenarios speak ggml terms, not wire terms: buffers, tensors placed in them, ops, a graph to
compute. Each implementation turns a step into whatever its client does on the wire, so the
verdict can come from the bytes. A step is a plain dict, JSON-safe, so a client living in
another process (the ctypes agent over the real libggml-rpc) takes the same steps over a pipe.

Step vocabulary (``op`` key, then arguments):

  connect        endpoint, device=0                     -> {}
  device_count                                           -> {count}
  buffer_type    device=0                                -> {alignment, max_size}
  device_memory  device=0                                -> {free, total}
  alloc_buffer   name, size, usage=any|weights|compute   -> {base, size}
  tensor         name, buffer, offset, type=f32, ne=[..] -> {nbytes, data}
  view           name, src, ne, offset (bytes into src)  -> {nbytes, data}
  set            tensor, offset=0, size=None, fill       -> {fnv}
  get            tensor, offset=0, size=None             -> {fnv, size, head (hex, <= 64 B)}
  node           name, kind, inputs=[..], buffer, offset, params={}  -> {nbytes, data}
                 kinds: add mul scale(s) cpy mul_mat get_rows
  set_2d         tensor, size, n_copies, stride, offset=0, fill  -> {fnv}
                 n_copies rows of size bytes at offset + i*stride (SET_TENSOR_2D from 8.0.0;
                 one copy, or an older client: plain uploads row by row)
  get_2d         tensor, size, n_copies, stride, offset=0 -> {fnv, size, head}
  compute        outputs=[names], graph=None             -> {status, uid}
                 with graph NAME the graph is kept with a uid; computing NAME again lets
                 the client reuse it (GRAPH_RECOMPUTE)
  forget_graph   graph                                   -> {uid}
  copy           src, dst                                -> {ok}
  memset         tensor, offset, size, value             -> {}
  clear          buffer, value                           -> {}
  free_buffer    buffer                                  -> {}
  close                                                  -> {}

``fill`` names deterministic content so both sides can check it without shipping bytes:
{"pattern": "arange"|"random"|"const", "seed": int, "value": float, "dtype": "f32"|"f16"|"u8"}.

Results go back as events: {"i": step index, "op", "ok": bool, "result": {...}, "error": str,
"t0", "t1"} (monotonic seconds). A client process that dies is reported as an ``ExitInfo``.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..proto.fnv import fnv1a64
from .errors import ImplError

USAGES = {"any": 0, "weights": 1, "compute": 2}
NODE_KINDS = ("add", "mul", "scale", "cpy", "mul_mat", "get_rows")
DTYPES = {"f32": np.float32, "f16": np.float16, "u8": np.uint8, "i32": np.int32}


FILL_CHUNK = 1 << 20  # random draws per call (the stream goes on across calls: same values)


def make_fill(fill: dict, nbytes: int) -> np.ndarray:
    """Deterministic content of ``nbytes`` bytes described by ``fill`` (a u8 view of it).

    Written into the output a chunk at a time, with the same values as one call would give
    (the random stream continues across chunks; the patterns repeat): one call made an int64
    or float64 array eight times the size first, 6 s for a 64 MiB tensor on a loaded machine,
    paid by the client and again by the check of what came back."""
    pattern = fill.get("pattern", "arange")
    dtype = np.dtype(DTYPES[fill.get("dtype", "f32")])
    count = nbytes // dtype.itemsize
    out = np.zeros(nbytes, dtype=np.uint8)
    arr = out[:count * dtype.itemsize].view(dtype)
    if pattern == "arange":
        base = fill.get("value", 0.0)
        if dtype.kind == "f":
            # Small values wrapped at 1024 keep f16 exact and f32 sums exact.
            period = (np.arange(min(count, 1024), dtype=np.float64) + base).astype(dtype)
        else:
            period = np.arange(min(count, 256)).astype(dtype)
        _tile(arr, period)
    elif pattern == "random":
        rng = np.random.default_rng(fill.get("seed", 0))
        for i in range(0, count, FILL_CHUNK):
            n = min(FILL_CHUNK, count - i)
            arr[i:i + n] = rng.uniform(-1.0, 1.0, n) if dtype.kind == "f" else \
                rng.integers(0, 256, n)
    elif pattern == "const":
        arr[:] = fill.get("value", 0)
    else:
        raise ValueError(f"unknown fill pattern {pattern!r}")
    return out


def _tile(arr: np.ndarray, period: np.ndarray) -> None:
    """``arr`` filled with ``period`` repeated, in place by doubling copies (np.resize would
    build a second array of the tensor's size first)."""
    n = len(period)
    arr[:n] = period
    while n < len(arr):
        k = min(n, len(arr) - n)
        arr[n:n + k] = arr[:k]
        n += k


def fingerprint(data) -> dict:
    """What a ``get`` step reports about the bytes it read."""
    raw = data.tobytes() if isinstance(data, np.ndarray) else bytes(data)
    return {"fnv": f"{fnv1a64(raw):016x}", "size": len(raw), "head": raw[:64].hex()}


@dataclass
class ExitInfo:
    """How a client or server process ended."""

    returncode: int | None  # None while running
    signal: int | None = None
    aborted: bool = False  # SIGABRT / exit 134 with the library's abort text
    message: str = ""  # the library's last error line (e.g. "RPC server version mismatch: 9.0.0")
    log_tail: list[str] = field(default_factory=list)

    @property
    def crashed(self) -> bool:
        return self.signal is not None and not self.aborted


@dataclass
class StepResult:
    i: int
    op: str
    ok: bool
    result: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    t0: float = 0.0
    t1: float = 0.0


class ClientAborted(ImplError):
    """The client process ended (abort, crash or exit) before finishing its steps."""

    def __init__(self, exit_info: ExitInfo, step: dict | None = None):
        self.exit_info = exit_info
        self.step = step
        super().__init__(f"client ended during {step.get('op') if step else 'startup'}: "
                         f"rc={exit_info.returncode} signal={exit_info.signal} {exit_info.message}")


class StepFailed(ImplError):
    """A step was refused without the client dying (reference client, or a NULL return)."""

    def __init__(self, result: StepResult):
        self.result = result
        super().__init__(f"{result.op} failed: {result.error}")


class ClientDriver(abc.ABC):
    """One client session under test. ``run`` executes a step and returns its result."""

    name: str = "client"

    @abc.abstractmethod
    def run(self, step: dict) -> StepResult:
        """Execute one step. Raises ClientAborted if the client died, StepFailed if refused."""

    def close(self) -> ExitInfo | None:
        """End the session (and the process, if any) and report how it ended."""
        return None

    def log_tail(self, n: int = 20) -> list[str]:
        return []

    # Convenience wrappers, so scenarios read like ggml code.
    def do(self, op: str, **kw) -> dict:
        return self.run({"op": op, **kw}).result

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
