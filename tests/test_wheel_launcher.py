"""The wheel's server (the llama-cpp-py-sync libraries, no server executable) starts from a
compiled launcher, harness/impls/wheel_server.c: a campaign restarts a server after every
crash it finds, and a start through Python cost six times the CPU. Without a compiler the
Python module serves instead."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.impls import built_peer
from harness.impls.registry import get_peer
from harness.impls.supervisor import start_peer_server
from harness.impls.verify import probe_hello


def _p8():
    peer = get_peer("p8")
    if not peer.available:
        from needs import skip
        skip("peer-missing", f"p8 is not built: {peer.reason} (make peers)")
    return peer


@pytest.mark.realpeer
@pytest.mark.parametrize("launcher", ["compiled", "python"])
def test_the_wheel_server_answers_as_8_from_either_launcher(launcher, tmp_path, monkeypatch):
    peer = _p8()
    if launcher == "python":  # planted: no compiler on the machine
        monkeypatch.setattr(built_peer, "wheel_launcher", lambda: None)
    else:
        assert built_peer.wheel_launcher() is not None, "cc could not build wheel_server.c"
    server = start_peer_server(peer, workdir=tmp_path, host="127.0.0.1", ready_timeout=30)
    try:
        exe = Path(os.readlink(f"/proc/{server.pid}/exe"))
        if launcher == "compiled":
            assert exe == built_peer.wheel_launcher().resolve()
        else:
            assert exe.name.startswith("python")
        version, _ = probe_hello("127.0.0.1", server.port, 7)
        assert version == (8, 0, 0)
    finally:
        server.stop()


def test_a_launcher_that_does_not_compile_falls_back(monkeypatch, tmp_path):
    """A source the compiler refuses gives None (the Python module), never a half file."""
    bad = tmp_path / "bad.c"
    bad.write_text("int main( {")
    monkeypatch.setattr(built_peer, "WHEEL_SERVER_SOURCE", bad)
    monkeypatch.setenv("GGML_RPC_HARNESS_CACHE", str(tmp_path / "cache"))
    built_peer.wheel_launcher.cache_clear()
    try:
        assert built_peer.wheel_launcher() is None
        assert not any((tmp_path / "cache").rglob("wheel_server"))
    finally:
        built_peer.wheel_launcher.cache_clear()


def test_a_launch_that_does_not_read_the_banner_skips_stdbuf():
    """A fuzz target restarts its server after every crash: once its dialect is known it
    does not read the banner, and starts the binary without the stdbuf wrapper."""
    import shutil
    peer = get_peer("p7")
    if not peer.available:
        from needs import skip
        skip("peer-missing", f"p7 is not built: {peer.reason} (make peers)")
    plain, _ = peer.server_cmd("127.0.0.1", 1, line_buffered=False)
    assert plain[0] == str(peer.server_binary)
    default, _ = peer.server_cmd("127.0.0.1", 1)
    if shutil.which("stdbuf"):
        assert default[:2] == [shutil.which("stdbuf"), "-oL"]
