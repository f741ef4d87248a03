"""Helpers for the real-peer client tests: locate a build, run its server, fake servers."""

from __future__ import annotations

import os
import shutil
import socket
import threading
from pathlib import Path

import pytest

from harness.impls.registry import PeerError, get_peer
from harness.impls.supervisor import ServerProcess
from harness.strictness import PEER_MISSING
from needs import skip

PEER_DIR_ENV = "GGML_RPC_HARNESS_TEST_PEER_DIR"  # override: any 7.0.0 bin dir
PEER = "p7"  # the registry's proto-7.0.0 pin, built by `harness peers build p7`

realpeer = pytest.mark.realpeer


def peer_dir() -> Path | None:
    """The bin dir of a real 7.0.0 build (server + libggml*.so), or None."""
    env = os.environ.get(PEER_DIR_ENV)
    if env:
        return Path(env) if (Path(env) / "libggml-rpc.so").exists() or \
            (Path(env) / "libggml-rpc.so.0").exists() else None
    try:
        peer = get_peer(PEER)
    except PeerError:
        return None
    return peer.bin_dir if peer.available else None


def require_peer_dir(*, server: bool = True, llama_simple: bool = False) -> Path:
    d = peer_dir()
    if d is None:
        skip(PEER_MISSING, f"no real llama.cpp 7.0.0 build: run `harness peers build {PEER}` "
                           f"(or set {PEER_DIR_ENV})")
    if server and not (d / "ggml-rpc-server").exists():
        skip(PEER_MISSING, f"{d} has no ggml-rpc-server")
    if llama_simple and not (d / "llama-simple").exists():
        skip(PEER_MISSING, f"{d} has no llama-simple: run `harness peers build {PEER} "
                           "--extra-target llama-simple`")
    return d


class RealServer:
    """ggml-rpc-server on a loopback port under the shared supervisor; always reaped."""

    def __init__(self, bin_dir: Path, log_path: Path, *, env: dict | None = None,
                 args: tuple[str, ...] = (), timeout: float = 15.0):
        stdbuf = shutil.which("stdbuf")
        argv = ([stdbuf, "-oL"] if stdbuf else []) + [
            str(bin_dir / "ggml-rpc-server"), "-H", "{host}", "-p", "{port}", "-t", "1", *args]
        self.proc = ServerProcess.start(argv, {**os.environ, **(env or {})},
                                        name=log_path.stem, workdir=log_path.parent,
                                        ready_timeout=timeout)
        self.port = self.proc.port
        self.endpoint = self.proc.endpoint

    def log(self) -> str:
        return self.proc.log_text()

    def stop(self) -> int | None:
        return self.proc.stop().returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


class FakeServer:
    """A listener that reads the 33-byte HELLO and answers it with ``reply`` (None: never).

    With ``reply`` None the connection is held open without an answer (a hung server).
    """

    HELLO_LEN = 1 + 8 + 24

    def __init__(self, reply: bytes | None, hold: float = 30.0):
        self.reply = reply
        self.hold = hold
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.sock.settimeout(1.0)
        self.endpoint = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.received = b""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @staticmethod
    def hello_reply(major: int, minor: int = 0, patch: int = 0) -> bytes:
        # The response frame: size (u64 = 28), then major, minor, patch, pad, 24 bytes of caps.
        return b"\x1c" + 7 * b"\0" + bytes([major, minor, patch, 0]) + 24 * b"\0"

    def _serve(self):
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(5.0)
                try:
                    while len(self.received) < self.HELLO_LEN:
                        chunk = conn.recv(self.HELLO_LEN - len(self.received))
                        if not chunk:
                            break
                        self.received += chunk
                    if self.reply is not None:
                        conn.sendall(self.reply)
                    self._stop.wait(self.hold)  # keep it open until the client gives up
                except OSError:
                    pass

    def close(self):
        self._stop.set()
        self.sock.close()
        self._thread.join(timeout=5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
