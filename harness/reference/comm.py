"""The reference server's server-to-server link (COMM_INIT / COMM_ALLREDUCE, spec 12.2), as the
real 8.0.0 build (p8) does it on the wire:

* rank 0 listens on the port of its COMM_INIT (the client picks it) and accepts one peer;
  rank 1 connects to ``host:port``, up to 100 tries 50 ms apart;
* rank 1 sends its 24-byte conn caps first, rank 0 answers with its own (all zero: TCP);
* an ALLREDUCE exchanges the tensor's bytes unframed, rank 0 sending first; an f32 tensor of
  at least 32768 elements goes as bf16 (round to nearest even) and each side adds the peer's
  bf16 values to its own f32 ones, so the two ranks' results differ in the low bits.

Unlike the real server, which blocks in accept() and recv() without end, every wait here has a
deadline, and the reference listens on and connects to loopback only (network rule).
"""

from __future__ import annotations

import ipaddress
import socket
import time

import numpy as np

from ..proto.tensor import RpcTensor, nbytes
from .errors import ReferencePeerError

CAPS_SIZE = 24
BF16_MIN_ELEMENTS = 32768
GGML_TYPE_F32, GGML_TYPE_F16 = 0, 1
_ADD_DTYPES = {GGML_TYPE_F32: np.float32, GGML_TYPE_F16: np.float16}


class LinkError(ReferencePeerError):
    """The peer link failed (peer gone, deadline passed); the client connection closes."""


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def fp32_to_bf16(values: np.ndarray) -> np.ndarray:
    """ggml's fp32 -> bf16: round to nearest even, NaNs kept quiet."""
    u = values.view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, (u >> 16) | 64, rounded).astype(np.uint16)


def bf16_to_fp32(values: np.ndarray) -> np.ndarray:
    return (values.astype(np.uint32) << 16).view(np.float32)


class PeerLink:
    """One established rank-0/rank-1 socket with a deadline on every wait."""

    def __init__(self, sock: socket.socket, rank: int, timeout: float):
        self.sock, self.rank, self.timeout = sock, rank, timeout
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(timeout)

    @classmethod
    def listen(cls, port: int, timeout: float) -> "PeerLink":
        """Rank 0: accept one peer on 127.0.0.1:port, then the caps swap."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as ls:
            ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            ls.bind(("127.0.0.1", port))
            ls.listen(1)
            ls.settimeout(timeout)
            sock, _ = ls.accept()
        link = cls(sock, 0, timeout)
        link._swap_caps()
        return link

    @classmethod
    def connect(cls, host: str, port: int, timeout: float, tries: int = 100,
                interval: float = 0.05) -> "PeerLink":
        """Rank 1: connect to host:port (``tries`` attempts ``interval`` apart), caps swap."""
        last: OSError | None = None
        for attempt in range(tries):
            try:
                sock = socket.create_connection((host, port), timeout=timeout)
                break
            except OSError as e:
                last = e
                if attempt + 1 < tries:
                    time.sleep(interval)
        else:
            raise LinkError(f"failed to connect to peer {host}:{port}: {last}")
        link = cls(sock, 1, timeout)
        link._swap_caps()
        return link

    def _swap_caps(self) -> None:
        mine = bytes(CAPS_SIZE)  # TCP only: no RDMA offer
        if self.rank == 1:
            self.sock.sendall(mine)
            self._recv(CAPS_SIZE)
        else:
            self._recv(CAPS_SIZE)
            self.sock.sendall(mine)

    def _recv(self, n: int) -> bytes:
        out = bytearray(n)
        view, got = memoryview(out), 0
        deadline = time.monotonic() + self.timeout
        while got < n:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                k = self.sock.recv_into(view[got:])
            except TimeoutError:
                raise LinkError(f"peer sent {got} of {n} bytes within {self.timeout} s") from None
            except OSError as e:
                raise LinkError(f"recv failed ({e})") from None
            if k == 0:
                raise LinkError(f"recv failed (bytes_recv={got}, size_to_recv={n})")
            got += k
        return bytes(out)

    def exchange(self, data: bytes) -> bytes:
        """Send ours and receive the peer's, rank 0 first (the same length both ways)."""
        try:
            if self.rank == 0:
                self.sock.sendall(data)
                return self._recv(len(data))
            theirs = self._recv(len(data))
            self.sock.sendall(data)
            return theirs
        except (TimeoutError, OSError) as e:
            raise LinkError(f"send failed ({e})") from None

    def allreduce(self, rec: RpcTensor, mem: memoryview) -> None:
        """Replace ``mem`` (the tensor's bytes) with the sum of both ranks' tensors."""
        dtype = _ADD_DTYPES.get(rec.type)
        if dtype is None:
            raise LinkError(f"tensor type {rec.type} is not summed by the reference")
        count = nbytes(rec) // np.dtype(dtype).itemsize
        own = np.frombuffer(mem, dtype=dtype, count=count)
        if rec.type == GGML_TYPE_F32 and count >= BF16_MIN_ELEMENTS:
            peer = np.frombuffer(self.exchange(fp32_to_bf16(own).tobytes()), dtype=np.uint16)
            total = own + bf16_to_fp32(peer)
        else:
            total = own + np.frombuffer(self.exchange(own.tobytes()), dtype=dtype)
        mem[:total.nbytes] = total.astype(dtype).tobytes()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
