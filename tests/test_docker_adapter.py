"""The Docker peer adapter: plain reporting where there is no engine; the container path
only runs where an engine and a server image exist."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from harness.impls.docker_adapter import DockerPeer, DockerUnavailable, _probe, docker_available

IMAGE_ENV = "GGML_RPC_HARNESS_TEST_DOCKER_IMAGE"


def test_availability_is_reported_with_a_reason():
    ok, reason = docker_available(timeout=5)
    assert isinstance(ok, bool) and reason
    if ok:
        assert reason.startswith("Docker engine ")
        return
    assert reason.startswith(("no Docker engine: ", "docker SDK not installed: "))
    with pytest.raises(DockerUnavailable) as ei:
        DockerPeer("any-image").start()
    assert str(ei.value).split(":")[0] == reason.split(":")[0]


def test_probe_tells_a_waiting_server_from_a_dropping_proxy():
    def listener(hold: bool):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(1)

        def serve():
            conn, _ = s.accept()
            if hold:
                conn.recv(1)  # waits for a HELLO that never comes, until the probe closes
            conn.close()
        threading.Thread(target=serve, daemon=True).start()
        return s

    waiting, dropping = listener(True), listener(False)
    try:
        assert _probe("127.0.0.1", waiting.getsockname()[1])
        assert not _probe("127.0.0.1", dropping.getsockname()[1])
    finally:
        waiting.close()
        dropping.close()
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    assert not _probe("127.0.0.1", port)


def test_server_container_roundtrip():
    ok, reason = docker_available(timeout=5)
    if not ok:
        pytest.skip(reason)
    image = os.environ.get(IMAGE_ENV)
    if not image:
        pytest.skip(f"set {IMAGE_ENV} to an image whose entrypoint is ggml-rpc-server")
    with DockerPeer(image) as peer:
        host, port = peer.endpoint.split(":")
        with socket.create_connection((host, int(port)), timeout=5) as s:
            # HELLO with empty caps; a real server answers 8 + 28 bytes.
            s.sendall(bytes([14]) + (24).to_bytes(8, "little") + bytes(24))
            s.settimeout(5)
            got = b""
            while len(got) < 36:
                chunk = s.recv(64)
                if not chunk:
                    break
                got += chunk
        assert int.from_bytes(got[:8], "little") == 28
    assert peer.exit_info is not None
