"""``harness bench``: every performance figure next to its anchor, measured in one process tree
(:mod:`.measure`) and written as bench.json / bench.md (:mod:`.render`). This module is the
figure itself.

Figures (ids in bench.json):

* ``upload-c-ref-<size>`` / ``upload-ref-c-<size>``: SET_TENSOR throughput of the real C client
  into the reference server, and of the reference client into the real C server, each against
  the real C client into the real C server. ``download-*`` likewise for GET_TENSOR.
* ``upload-ref-ref-<size>``: reference client into reference server against raw loopback.
* ``loopback-<size>``: raw loopback itself (sendall into recv_into, two processes) against the
  all-C pair: how far the protocol implementation is from the wire.
* ``fnv``: FNV-1a-64 of the harness against the real C client's own fnv_hash.
* ``fuzz-conn`` / ``fuzz-1`` / ``fuzz-workers``: messages/s the fuzzer sends to a live real
  server: its send path on one connection, and whole campaigns with 1 and N workers, against
  the raw pipelined request rate of that server on one connection.
* ``matrix``: wall time of ``harness matrix`` against the serial sum of its cells.
* ``rss-ref-server``: peak RSS of the reference server during one upload of the largest size.

Transfers are timed at the client: the library (or RefClient) call only, the payload made and
touched beforehand, followed by a 1-byte GET_TENSOR on the same connection so the time ends
when the server has consumed everything. Buffers are COMPUTE, so no client hashes. Every pair
is measured in the same rounds (round 0 is a warm-up that touches the server's pages; it is
recorded as ``cold``), and the figure is the median of the rest.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

MiB = 1 << 20
GiB = 1 << 30
FORMAT = "ggml-rpc-bench/1"


@dataclass
class BenchFigure:
    id: str
    title: str
    unit: str
    value: float | None
    anchor: float | None
    anchor_title: str
    target: str  # human-readable, e.g. ">= 1.0x anchor"
    met: bool | None
    higher_is_better: bool = True
    paired: bool = False  # values[i] and anchor_values[i] were measured in the same round
    values: list = field(default_factory=list)
    anchor_values: list = field(default_factory=list)
    notes: str = ""
    extra: dict = field(default_factory=dict)
    # why the run that measures this figure failed (None: it did not): such a figure is no
    # measurement, and `harness bench` exits non-zero
    failed: str | None = None

    @property
    def ratio(self) -> float | None:
        """value / anchor; for paired figures the median of the per-round ratios, which
        cancels the load the machine's other users put on both sides of a round alike."""
        if self.value is None or not self.anchor:
            return None
        pairs = [(v, a) for v, a in zip(self.values, self.anchor_values) if v and a]
        if self.paired and pairs and len(self.values) == len(self.anchor_values):
            return statistics.median(v / a for v, a in pairs)
        return self.value / self.anchor

    def to_json(self) -> dict:
        d = asdict(self)
        d["ratio"] = None if self.ratio is None else round(self.ratio, 4)
        for k in ("value", "anchor"):
            if d[k] is not None:
                d[k] = round(d[k], 4)
        return d
