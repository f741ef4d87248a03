"""Physical limits on this machine: raw loopback TCP and a server's raw command rate.

``RawSink`` is a child process that accepts one connection and, per round, receives an 8-byte
length and then that many bytes with ``recv_into`` straight into a preallocated buffer of the
full size (as a server receives a tensor), then answers one byte. The sender times
``sendall`` of a preallocated buffer up to that answer. Two processes, like a client and a
server, so the figure is comparable to the peer pairs measured the same way.

usage (the child): python -m harness.bench.loopback SIZE
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from ..proto.wire import RESPONSE_HEADER_SIZE, U64
from ..proto import DEFAULT, codec, get_dialect
from ..proto import messages as m
from ..transport.base import recv_exact_into
from ..transport.tcp import tune_socket as _tune  # as TcpTransport: only Python work differs



def _recv_exact(sock: socket.socket, view: memoryview) -> bool:
    return recv_exact_into(sock, view) == len(view)  # a socket has the recv_into it needs


def sink_main(size: int) -> int:
    buf = np.ones(size, dtype=np.uint8)  # allocated and touched before any timing
    view = memoryview(buf)
    hdr = bytearray(8)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as ls:
        ls.bind(("127.0.0.1", 0))
        ls.listen(1)
        print(ls.getsockname()[1], flush=True)
        ls.settimeout(60)
        conn, _ = ls.accept()
    with conn:
        conn.settimeout(120)
        _tune(conn)
        while _recv_exact(conn, memoryview(hdr)):
            (n,) = U64.unpack(hdr)
            if n == 0 or n > size or not _recv_exact(conn, view[:n]):
                break
            conn.sendall(b"\x01")
    return 0


class RawSink:
    """The sink child process and the sending end, in this process."""

    def __init__(self, size: int, timeout: float = 30.0):
        self.size = size
        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            p for p in (root, os.environ.get("PYTHONPATH")) if p))
        self.proc = subprocess.Popen([sys.executable, "-m", "harness.bench.loopback", str(size)],
                                     stdout=subprocess.PIPE, env=env, start_new_session=True)
        try:
            line = self.proc.stdout.readline()
            port = int(line)
            self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        except Exception:
            self.close()
            raise
        self.sock.settimeout(120)
        _tune(self.sock)
        self.data = np.ones(size, dtype=np.uint8)

    def send(self, n: int | None = None) -> float:
        """Seconds to move n bytes (default: all) into the sink's buffer, answer included."""
        n = self.size if n is None else n
        view = memoryview(self.data)[:n]
        ack = bytearray(1)
        t0 = time.perf_counter()
        self.sock.sendall(U64.pack(n))
        self.sock.sendall(view)
        if not _recv_exact(self.sock, memoryview(ack)):
            raise ConnectionError("raw sink closed")
        return time.perf_counter() - t0

    def close(self) -> None:
        sock = getattr(self, "sock", None)
        if sock is not None:
            try:
                sock.sendall(U64.pack(0))
            except OSError:
                pass
            sock.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def raw_request_rate(host: str, port: int, dialect: str = DEFAULT.name, *, seconds: float = 2.0,
                     batch: int = 256) -> float:
    """Requests per second one connection gets answered by a live server, pipelined.

    HELLO, then batches of GET_ALIGNMENT (the smallest command with an answer) written in one
    send and read back whole: the server's own per-command cost plus loopback, no generation,
    no checking. The ceiling for any client sending one connection's worth of messages.
    """
    d = get_dialect(dialect)
    hello = m.HelloRequest(bytes(24)) if d.hello_caps else m.HelloRequest()
    req = m.GetAlignmentRequest(0)
    frame = codec.pack_request(d, req)
    rsp_size = RESPONSE_HEADER_SIZE + codec.response_payload_size(d, req)
    hello_rsp = RESPONSE_HEADER_SIZE + codec.response_payload_size(d, hello)
    with socket.create_connection((host, port), timeout=10) as s:
        _tune(s)
        s.sendall(codec.pack_request(d, hello))
        _recv_exact(s, memoryview(bytearray(hello_rsp)))
        out = frame * batch
        back = memoryview(bytearray(rsp_size * batch))
        n = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            s.sendall(out)
            if not _recv_exact(s, back):
                raise ConnectionError("server closed during the request-rate probe")
            n += batch
        return n / (time.perf_counter() - t0)


if __name__ == "__main__":
    sys.exit(sink_main(int(sys.argv[1])))
