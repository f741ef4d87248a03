"""Docker peers: reporting where there is no engine, and live containers where there is one.

The live tests need a Docker engine (DOCKER_HOST, e.g. from `eval "$(.ci/dockerd.sh start)"`)
and a built p7. Without an engine they skip with the SDK's reason; where
GGML_RPC_HARNESS_REQUIRE_DOCKER=1 (CI) they fail instead.
"""

from __future__ import annotations

import os
import socket
import struct
import tarfile
import io
import time

import psutil
import pytest
import yaml

from harness.impls.adapters import Adapter
from harness.impls.docker_adapter import (REQUIRE_ENV, DockerClientDriver, DockerServer,
                                          DockerUnavailable, docker_available, docker_required,
                                          engine_client)
from harness.impls.supervisor import ServerStartError
from harness.strictness import PEER_MISSING, STRICT_ENV, TOOL_MISSING
from needs import peer, skip

NO_ENGINE = "unix:///nonexistent/docker.sock"


# ------------------------------------------------------------------ without an engine
def test_no_engine_is_reported_with_the_sdks_reason(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", NO_ENGINE)
    ok, reason = docker_available(timeout=2)
    assert not ok and reason.startswith("no Docker engine: ")
    with pytest.raises(DockerUnavailable, match="no Docker engine"):
        DockerServer.start("any-image", ready_timeout=1)


def test_without_an_engine_cells_skip_unless_docker_is_required(monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_HOST", NO_ENGINE)
    for name in (REQUIRE_ENV, "CI", STRICT_ENV):  # neither asked for nor strict
        monkeypatch.delenv(name, raising=False)
    adapter = Adapter(name="d", kind="docker", dialect="7.0.0", image="some/image")
    assert adapter.unavailable().startswith("no Docker engine")
    # required (CI): not a skip; starting fails the cell with the same reason
    monkeypatch.setenv(REQUIRE_ENV, "1")
    adapter = Adapter(name="d", kind="docker", dialect="7.0.0", image="some/image")
    assert docker_required() and adapter.unavailable() is None
    with pytest.raises(ServerStartError, match="no Docker engine"):
        adapter.start_server(tmp_path / "srv", None)


# ------------------------------------------------------------------------- live
def _engine_or_skip():
    ok, reason = docker_available(timeout=5)
    if not ok:
        if docker_required():
            pytest.fail(f"{REQUIRE_ENV} is set (or CI is strict) but: {reason}")
        skip(TOOL_MISSING, reason)


def _p7_image(**kw) -> str:
    from harness.impls.docker_image import build_pin_image
    peer("p7")
    return build_pin_image("p7", **kw).tag


def _hello(port: int) -> tuple[int, int, int]:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(bytes([14]) + (24).to_bytes(8, "little") + bytes(24))
        s.settimeout(5)
        got = b""
        while len(got) < 36:
            chunk = s.recv(64)
            if not chunk:
                break
            got += chunk
    assert int.from_bytes(got[:8], "little") == 28, got
    return struct.unpack_from("<BBB", got, 8)


def _our_containers() -> list:
    """The containers this test process started: other xdist workers' are running too."""
    from harness.impls.docker_adapter import OWNER_LABEL
    client = engine_client()
    try:
        return client.containers.list(all=True,
                                      filters={"label": f"{OWNER_LABEL}={os.getpid()}"})
    finally:
        client.close()


@pytest.mark.realpeer
def test_pin_image_has_the_bin_dir_and_every_linked_library():
    from harness.impls.docker_image import rootfs_tar
    from harness.impls.registry import get_peer
    peer = get_peer("p7")
    if not peer.available:
        skip(PEER_MISSING, "p7 is not built: harness peers build p7")
    names = set(tarfile.open(fileobj=io.BytesIO(rootfs_tar(peer.bin_dir))).getnames())
    assert {"app/ggml-rpc-server", "app/libggml-rpc.so", "usr/bin/stdbuf"} <= names
    assert any(n.endswith("ld-linux-x86-64.so.2") for n in names)
    assert any(n.endswith("/libc.so.6") for n in names)
    # the planted fault used below really leaves the library out
    dropped = set(tarfile.open(fileobj=io.BytesIO(
        rootfs_tar(peer.bin_dir, drop=("libggml-base.so.0",)))).getnames())
    assert "app/libggml-base.so.0" not in dropped


@pytest.mark.realpeer
def test_server_container_is_supervised_like_a_process(tmp_path):
    _engine_or_skip()
    image = _p7_image()
    server = DockerServer.start(image, name="p7-docker", workdir=tmp_path)
    try:
        assert server.banner_version == "7.0.0"
        assert _hello(server.port) == (7, 0, 0)
        assert server.poll() is None and server.running
        assert psutil.Process(server.pid).name() == "ggml-rpc-server"
        assert server.rss_bytes() > 0
        # the owner label is on it, so the check after stop below can see a leftover
        assert server.container.id in [c.id for c in _our_containers()]
    finally:
        info = server.stop()
    assert info.signal == 15  # SIGTERM reached the server through the engine's init
    assert "Accepted client connection" in server.log_text()
    assert (tmp_path / "p7-docker.stdout.log").is_file()
    assert not [c for c in _our_containers() if c.id == server.container.id]


@pytest.mark.realpeer
def test_a_crashing_server_container_reports_its_signal(tmp_path):
    _engine_or_skip()
    image = _p7_image()
    with DockerServer.start(image, name="p7-kill", workdir=tmp_path) as server:
        psutil.Process(server.pid).kill()
        deadline = time.monotonic() + 10
        while server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        info = server.poll()
        assert info is not None and info.signal == 9 and info.crashed


@pytest.mark.realpeer
def test_client_library_in_a_container_talks_to_a_server_container(tmp_path):
    _engine_or_skip()
    image = _p7_image()
    with DockerServer.start(image, name="p7-srv", workdir=tmp_path) as server:
        client = DockerClientDriver(image, proto="7.0.0", step_timeout=30)
        try:
            assert client.start()["lib_dir"] == "/app"
            client.do("connect", endpoint=server.endpoint)
            assert client.do("device_count")["count"] == 1
            assert client.container_name in [c.name for c in _our_containers()]
        finally:
            info = client.close()
        assert info is not None and info.returncode == 0
    assert not [c for c in _our_containers() if c.name == client.container_name]


@pytest.mark.realpeer
def test_a_hung_client_container_is_removed(tmp_path):
    _engine_or_skip()
    image = _p7_image()
    # a listener that accepts and never answers: the library waits for its HELLO reply
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)
    client = DockerClientDriver(image, proto="7.0.0", step_timeout=3)
    try:
        from harness.impls.ctypes_driver import ClientHung
        with pytest.raises(ClientHung):
            client.do("connect", endpoint=f"127.0.0.1:{silent.getsockname()[1]}")
    finally:
        client.close()
        silent.close()
    assert not [c for c in _our_containers() if c.name == client.container_name]


@pytest.mark.realpeer
@pytest.mark.slow
def test_a_cell_with_a_broken_image_fails_with_the_containers_log(tmp_path):
    """The planted fault: an image without libggml-base. The cell must fail (not skip, not
    pass) and its reason must carry what the container printed."""
    _engine_or_skip()
    from harness.matrix.cells import expand
    from harness.matrix.model import load_matrix
    from harness.matrix.execute import run_cells

    broken = _p7_image(drop=("libggml-base.so.0",), tag="ggml-rpc-harness/test:broken",
                       force=True)
    data = {
        "version": 1,
        "defaults": {"deadline": 60, "idle_timeout": 20, "workers": 1},
        "implementations": {"ref-7": {"kind": "ref", "proto": "7.0.0"},
                            "broken": {"kind": "docker", "proto": "7.0.0", "image": broken}},
        "designs": {"d": {"roles": {"old-client": "ref-7", "new-client": "ref-7",
                                    "old-server": "broken", "new-server": "ref-7"}}},
        "scenarios": ["handshake"],
        "expectations": [{"outcome": "works"}],
    }
    path = tmp_path / "matrix.yaml"
    path.write_text(yaml.safe_dump(data))
    m = load_matrix(path)
    cells = [c for c in expand(m) if c.server == "broken"]
    rows = run_cells(m, cells, tmp_path / "out", run_id="t", workers=1)
    assert rows and all(r["verdict"] == "error" for r in rows), rows
    for r in rows:
        assert "server did not start" in r["reason"]
        assert "libggml-base.so.0: cannot open shared object file" in r["reason"]
    assert not _our_containers()


@pytest.mark.realpeer
def test_fuzz_target_docker_pin_starts_a_container(tmp_path):
    _engine_or_skip()
    _p7_image()
    from harness.fuzz.target import Target
    from harness.fuzz.target_spec import TargetSpec
    spec = TargetSpec.parse("docker:p7")
    assert spec.kind == "docker" and spec.image == "p7"
    target = Target(spec, tmp_path)
    target.start()
    try:
        assert target.dialect == "7.0.0"  # from the container's banner
        assert target.answers_hello()
        assert target.server.container.id in [c.id for c in _our_containers()]
    finally:
        target.stop()
    assert not _our_containers()


@pytest.mark.slow
def test_dockerd_script_starts_a_private_engine_and_stops_it_by_pid(tmp_path):
    """.ci/dockerd.sh, as CI and a developer use it: its own socket and dirs, stopped by pid."""
    import os
    import shutil
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / ".ci" / "dockerd.sh"
    if shutil.which("dockerd") is None or os.geteuid() != 0:
        if docker_required():
            pytest.fail(f"{REQUIRE_ENV} is set (or CI is strict) but dockerd is missing or we "
                        "are not root")
        skip(TOOL_MISSING, "needs dockerd (Debian's docker.io) and root")
    env = dict(os.environ, TMPDIR=str(tmp_path))
    out = subprocess.run(["bash", str(script), "start"], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    exports = dict(line.removeprefix("export ").split("=", 1) for line in out.stdout.splitlines())
    engine_dir = Path(exports["GGML_RPC_DOCKERD_DIR"])
    pid = int((engine_dir / "pid").read_text())
    try:
        import docker
        client = docker.from_env(environment={"DOCKER_HOST": exports["DOCKER_HOST"]}, timeout=10)
        info = client.info()
        client.close()
        assert info["DockerRootDir"] == str(engine_dir / "data")
    finally:
        stop = subprocess.run(["bash", str(script), "stop", str(engine_dir)], capture_output=True,
                              text=True, timeout=120)
    assert stop.returncode == 0, stop.stderr
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert not engine_dir.exists()
