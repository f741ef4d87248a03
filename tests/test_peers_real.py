"""Real llama.cpp servers built by `harness peers build`: they announce what their pin says, and
the supervisor sees their real failure modes (bind failure with exit 0, SIGKILL, stop/reap).

Each test skips, saying why, when its peer is not built on this machine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from harness.impls.registry import get_peer, list_peers, load_pins, probe_hello
from harness.impls.supervisor import ServerStartError, start_peer_server, start_reference_server
from harness.strictness import PEER_MISSING
from needs import skip

pytestmark = pytest.mark.realpeer

PIN_NAMES = list(load_pins())


def _built(name: str):
    peer = get_peer(name)
    if not peer.available:
        skip(PEER_MISSING, f"peer {name} not built here: {peer.reason}")
    return peer


def _any_binary_peer():
    for peer in list_peers():
        if peer.available and peer.server_binary is not None:
            return peer
    skip(PEER_MISSING, "no real peer with a server binary is built (run `harness peers build p7`)")


@pytest.mark.parametrize("name", PIN_NAMES)
def test_server_answers_hello_with_its_banner_version(name, tmp_path):
    peer = _built(name)
    with start_peer_server(peer, workdir=tmp_path) as server:
        assert server.banner_version == peer.proto
        version, flags = probe_hello(server.host, server.port, int(peer.proto.split(".")[0]))
        assert ".".join(map(str, version)) == peer.proto
        assert flags in (None, 0)  # no server flags byte before 9.0.0
        assert server.poll() is None  # HELLO and a clean close leave it serving
        version_again, _ = probe_hello(server.host, server.port, version[0])
        assert version_again == version
    assert (tmp_path / f"{name}.stdout.log").exists() and (tmp_path / f"{name}.stderr.log").exists()


@pytest.mark.parametrize("name", PIN_NAMES)
def test_server_starts_with_a_cache_dir(name, tmp_path):
    peer = _built(name)
    cache = tmp_path / "llama-cache"
    with start_peer_server(peer, workdir=tmp_path, cache_dir=cache, threads=2) as server:
        assert server.banner_version == peer.proto
        assert str(cache / "rpc") in server.log_text()  # "local cache : <dir>" in the banner


@pytest.mark.parametrize("name", ["p3", "p7", "p8"])
def test_bind_failure_is_detected(name, tmp_path):
    peer = _built(name)
    with start_peer_server(peer, workdir=tmp_path / "a") as first:
        t0 = time.monotonic()
        with pytest.raises(ServerStartError, match="could not bind") as err:
            start_peer_server(peer, workdir=tmp_path / "b", port=first.port)
        assert time.monotonic() - t0 < 10
        assert any("Failed to create server socket" in line for line in err.value.log_tail)
        assert first.poll() is None


def test_sigkill_is_reported_as_signal(tmp_path):
    peer = _any_binary_peer()
    with start_peer_server(peer, workdir=tmp_path) as server:
        os.kill(server.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        info = server.poll()
    assert info is not None and info.signal == signal.SIGKILL and not info.aborted


@pytest.mark.parametrize("name", ["p7", "p8"])
def test_stop_terminates_and_reaps(name, tmp_path):
    peer = _built(name)
    server = start_peer_server(peer, workdir=tmp_path)
    pid = server.pid
    info = server.stop(timeout=5)
    assert info.signal in (signal.SIGTERM, signal.SIGKILL)
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def _reference_serve_available() -> str | None:
    try:
        proc = subprocess.run([sys.executable, "-m", "harness", "serve", "--help"],
                              capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return "`python -m harness serve --help` timed out"
    return None if proc.returncode == 0 else "`harness serve` is not available yet"


def test_reference_server_starts(tmp_path):
    reason = _reference_serve_available()
    assert reason is None, reason  # the project's own server: never a skip
    with start_reference_server("7.0.0", workdir=tmp_path) as server:
        assert server.banner_version == "7.0.0"
        version, _ = probe_hello(server.host, server.port, 7)
        assert version == (7, 0, 0)
