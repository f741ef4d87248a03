"""Fault-injecting delivery: a TCP proxy that re-segments, delays, truncates and rewrites.

It sits in front of a server (or of the recording proxy) and forwards each direction through
a ``Delivery`` plan:

* segmentation: ``fixed`` N-byte writes, ``random`` sizes from a seeded generator, or
  ``boundaries``: every frame cut at each header and field edge (and at every byte for
  frames up to ``byte_limit`` bytes), so a receiver meets every split a size class allows;
* a delay between writes;
* truncation: close the connection after a chosen number of bytes in that direction;
* field rewrites in flight, by name: ``hello_flags`` (HELLO response byte 3), ``cache_flag``
  (every SET_TENSOR), ``hello_major``, ``conn_caps`` (both HELLO directions).

Frames are found from their length prefixes only (request: cmd u8 + len u64, response:
len u64), so it works for any dialect. The recording proxy behind it still sees exactly what
each side sent; this proxy's log says what it changed.
"""

from __future__ import annotations

import random
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

from ..proto.wire import FrameHead, FrameWalker
from ..proto.constants import CONN_CAPS_SIZE, HELLO_ID
from ..proto.tensor import TENSOR_SIZE

SET_TENSOR_ID = 6  # the same in every dialect
REWRITABLE = ("hello_flags", "hello_major", "cache_flag", "conn_caps")


@dataclass
class Delivery:
    mode: str = "pass"  # pass | fixed | random | boundaries
    size: int = 1  # fixed: bytes per write; random: largest write
    seed: int = 0
    delay: float = 0.0  # seconds between writes
    truncate_at: int | None = None  # close after this many bytes of this direction
    rewrites: dict[str, int | bytes] = field(default_factory=dict)
    byte_limit: int = 64  # boundaries: frames up to this size are cut at every byte

    @classmethod
    def parse(cls, spec: str) -> "Delivery":
        """``chop`` (= ``boundaries``) / ``chop:N`` (N-byte writes) / ``random:SEED[:MAX]`` /
        ``boundaries`` / ``pass``, then ``,delay=MS``, ``,truncate=N``, ``,FIELD=VALUE``."""
        head, *opts = spec.split(",")
        kind, *args = head.split(":")
        d = cls()
        if kind == "chop" and not args:
            d.mode = "boundaries"
        elif kind in ("chop", "fixed"):
            d.mode, d.size = "fixed", int(args[0]) if args else 1
        elif kind == "random":
            d.mode, d.seed = "random", int(args[0]) if args else 0
            d.size = int(args[1]) if len(args) > 1 else 4096
        elif kind in ("boundaries", "pass"):
            d.mode = kind
        else:
            raise ValueError(f"unknown delivery {kind!r}: use chop[:N], random[:SEED[:MAX]], "
                             "boundaries or pass")
        for opt in opts:
            k, _, v = opt.partition("=")
            if k == "delay":
                d.delay = float(v) / 1000
            elif k == "truncate":
                d.truncate_at = int(v)
            elif k in REWRITABLE:
                d.rewrites[k] = bytes.fromhex(v) if k == "conn_caps" else int(v, 0)
            else:
                raise ValueError(f"unknown delivery option {k!r}")
        return d


def _boundaries(frame: FrameHead, limit: int) -> list[int]:
    """Cut points inside one frame: header and field edges, every byte for small frames."""
    start, header_end, end = frame.start, frame.payload, frame.end
    if end - start <= limit:
        return list(range(start + 1, end))
    cuts = {start + 1, header_end - 4, header_end}
    if frame.cmd is not None:  # requests: the rpc_tensor and the fields after it
        for off in (8, 12, 20, 52, 120, 220, TENSOR_SIZE, TENSOR_SIZE + 1, TENSOR_SIZE + 9):
            cuts.add(header_end + off)
    cuts.add(end - 1)
    return sorted(c for c in cuts if start < c < end)


class _Direction(threading.Thread):
    def __init__(self, name: str, src: socket.socket, dst: socket.socket, plan: Delivery,
                 requests: bool, log: list[str], idle: float):
        super().__init__(name=name, daemon=True)
        self.src, self.dst, self.plan, self.log = src, dst, plan, log
        self.requests = requests
        self.label = "c2s" if requests else "s2c"
        self.walker = FrameWalker(requests)
        self.frames: list[FrameHead] = []  # not yet fully sent
        self.rng = random.Random(plan.seed)
        self.sent = 0
        self.idle = idle

    def _rewrites_for(self, frame: FrameHead) -> list[tuple[int, bytes]]:
        payload, cmd, index = frame.payload, frame.cmd, frame.index
        r = self.plan.rewrites
        out = []
        if self.requests:
            if cmd == SET_TENSOR_ID and "cache_flag" in r:
                out.append((payload + TENSOR_SIZE, bytes([r["cache_flag"]])))
            if cmd == HELLO_ID and "conn_caps" in r:
                out.append((payload, bytes(r["conn_caps"])[:CONN_CAPS_SIZE]))
        elif index == 0:  # the HELLO response
            if "hello_major" in r:
                out.append((payload, bytes([r["hello_major"]])))
            if "hello_flags" in r:
                out.append((payload + 3, bytes([r["hello_flags"]])))
            if "conn_caps" in r:
                out.append((payload + 4, bytes(r["conn_caps"])[:CONN_CAPS_SIZE]))
        return out

    def _apply_rewrites(self, buf: bytearray, base: int) -> None:
        for frame in self.frames:
            for off, value in self._rewrites_for(frame):
                for k, v in enumerate(value):
                    i = off + k - base
                    if 0 <= i < len(buf) and buf[i] != v:
                        buf[i] = v
                        self.log.append(f"{self.label}: byte {off + k} rewritten to 0x{v:02x}")

    def _cuts(self, base: int, n: int) -> list[int]:
        mode = self.plan.mode
        if mode == "fixed":
            return list(range(self.plan.size, n, self.plan.size))
        if mode == "random":
            cuts, i = [], 0
            while True:
                i += self.rng.randint(1, self.plan.size)
                if i >= n:
                    return cuts
                cuts.append(i)
        if mode == "boundaries":
            cuts = set()
            for frame in self.frames:
                cuts.update(c - base for c in _boundaries(frame, self.plan.byte_limit))
            return sorted(c for c in cuts if 0 < c < n)
        return []

    def run(self) -> None:
        self.src.settimeout(self.idle)
        try:
            while True:
                data = self.src.recv(1 << 20)
                if not data:
                    break
                buf = bytearray(data)
                base = self.walker.pos
                self.frames += [p.frame for p in self.walker.feed(data) if p.header and p.frame]
                self._apply_rewrites(buf, base)
                edges = [0] + self._cuts(base, len(buf)) + [len(buf)]
                self.frames = [f for f in self.frames if f.end > base + len(buf)]
                for a, b in zip(edges, edges[1:]):
                    seg = bytes(buf[a:b])
                    limit = self.plan.truncate_at
                    if limit is not None and self.sent + len(seg) >= limit:
                        self.dst.sendall(seg[:limit - self.sent])
                        self.sent = limit
                        self.log.append(f"{self.label}: truncated after {limit} bytes")
                        self.dst.shutdown(socket.SHUT_RDWR)
                        self.src.shutdown(socket.SHUT_RDWR)
                        return
                    self.dst.sendall(seg)
                    self.sent += len(seg)
                    if self.plan.delay:
                        time.sleep(self.plan.delay)
            self.dst.shutdown(socket.SHUT_WR)  # pass the FIN on
        except OSError:
            # a reset (or any failure) on one side resets the other, as a real connection would
            for sock in (self.dst, self.src):
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    sock.shutdown(socket.SHUT_RDWR)  # wakes the other direction's blocked recv
                except OSError:
                    pass


class FaultProxy:
    """Listen on 127.0.0.1, forward each connection to ``upstream`` through the plans."""

    def __init__(self, upstream: tuple[str, int], *, c2s: Delivery | None = None,
                 s2c: Delivery | None = None, idle: float = 60.0):
        self.upstream = upstream
        self.c2s = c2s or Delivery()
        self.s2c = s2c or Delivery()
        self.idle = idle
        self.log: list[str] = []
        self._lsock = socket.socket()
        self._lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._lsock.bind(("127.0.0.1", 0))
        self._lsock.listen(16)
        self._lsock.settimeout(0.2)
        self.port = self._lsock.getsockname()[1]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._socks: list[socket.socket] = []

    def start(self) -> "FaultProxy":
        t = threading.Thread(target=self._accept, name=f"fault-proxy-{self.port}", daemon=True)
        t.start()
        self._threads.append(t)
        return self

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._lsock.accept()
            except (TimeoutError, OSError):
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError as e:
                self.log.append(f"upstream connect failed: {e}")
                client.close()
                continue
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._socks += [client, server]
            for name, src, dst, plan, req in (("c2s", client, server, self.c2s, True),
                                             ("s2c", server, client, self.s2c, False)):
                d = _Direction(f"fault-{name}-{self.port}", src, dst, plan, req, self.log,
                               self.idle)
                d.start()
                self._threads.append(d)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        for s in [self._lsock] + self._socks:
            try:
                # a close alone does not wake a recv blocked in another thread: the stop
                # waited out each direction's join (two joins of 5 s after every session)
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                s.close()
            except OSError:
                pass
        for t in self._threads:
            t.join(timeout)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
