"""Build variants of the real 7.0.0 release: a patched pin, a sanitizer build, an RDMA build.

The sanitizer and RDMA builds are made by `make peers` (`harness peers build p7 --sanitize
address,undefined`, `harness peers build p7 --rdma`); their tests skip, saying how to build
them, where they are not built. The patch tests need the release's sdist, which building p7
keeps in the download cache.
"""

from __future__ import annotations

import difflib
import os
import struct
import tarfile
import time
from pathlib import Path

import pytest

from harness.impls import build as peer_build, sanitize
from harness.impls.cache import cache_root
from harness.impls.errors import PatchRejected
from harness.impls.fetch import _cached_download
from harness.impls.ref_driver import RefClientDriver
from harness.impls.registry import get_peer, get_pin, load_pins, probe_hello
from harness.impls.source import apply_patch, has_rdma_transport
from harness.impls.supervisor import start_peer_server
from harness.strictness import PEER_MISSING
from needs import skip
from peer_sessions import BASIC_SESSION

pytestmark = pytest.mark.realpeer

RPC_CPP = "ggml/src/ggml-rpc/ggml-rpc.cpp"
LOG_LINE = 'printf("  local cache    : %s\\n", cache_dir ? cache_dir : "n/a");'
PATCHED_LOG_LINE = 'printf("  local cache    : %s (patched)\\n", cache_dir ? cache_dir : "n/a");'

def _built(name: str):
    peer = get_peer(name)
    if not peer.available:
        skip(PEER_MISSING, f"{name} is not built here: {peer.reason}")
    return peer


def _session(peer, tmp_path: Path, tag: str) -> tuple[list, str]:
    """Run BASIC_SESSION with the reference client; (digests of the reads, server log)."""
    with start_peer_server(peer, workdir=tmp_path / tag) as server:
        version, _ = probe_hello(server.host, server.port, 7)
        assert version == (7, 0, 0)
        with RefClientDriver("7.0.0") as driver:
            driver.run({"op": "connect", "endpoint": server.endpoint})
            results = [driver.run(step).result for step in BASIC_SESSION]
            driver.run({"op": "close"})
        assert server.poll() is None, server.log_tail(30)
        log = server.log_text()
    assert "Sanitizer" not in log, log
    return [(r.get("fnv"), r.get("size")) for r in results if "fnv" in r], log


def _release_session(tmp_path: Path) -> tuple[list, str]:
    """The release's answers to the same session, which every variant is held to: without
    the release built this is a [peer-missing] skip (a failure under CI), never a pass that
    compared nothing."""
    return _session(_built("p7"), tmp_path, "release")


def test_a_variant_test_without_its_release_does_not_pass(monkeypatch, tmp_path):
    """Planted: p7 not built. The comparison skips with its code (the tests before left it
    out and passed)."""
    class Unbuilt:
        available, reason = False, "planted: not built"
    monkeypatch.setitem(globals(), "get_peer", lambda name: Unbuilt())
    with pytest.raises(pytest.skip.Exception, match=r"^\[peer-missing\] p7 is not built"):
        _release_session(tmp_path)


def _p7_sdist() -> Path:
    archive = _cached_download(get_pin("p7"))
    if archive is None:
        skip(PEER_MISSING, "the p7 sdist is not in the download cache (run `harness peers build p7`)")
    return archive


def _log_line_patch(tmp_path: Path, source: Path, old: str, new: str) -> Path:
    """A -p1 diff turning ``old`` into ``new`` in the release's ggml-rpc.cpp, where ``old``
    stands in place of the release's cache log line (the tree may already carry the patch)."""
    text = (source / RPC_CPP).read_text().replace(PATCHED_LOG_LINE, LOG_LINE)
    assert LOG_LINE in text
    before = text.replace(LOG_LINE, old)
    diff = "".join(difflib.unified_diff(before.splitlines(True),
                                        before.replace(old, new).splitlines(True),
                                        f"a/{RPC_CPP}", f"b/{RPC_CPP}"))
    path = tmp_path / "log-line.patch"
    path.write_text(diff)
    return path


@pytest.fixture(scope="module")
def p7_tree(tmp_path_factory):
    """The release's ggml-rpc sources (all a patch of that code needs, a fraction of the tree)."""
    pin = get_pin("p7")
    dest = tmp_path_factory.mktemp("p7-src")
    with tarfile.open(_p7_sdist()) as tar:
        wanted = [m for m in tar if f"/{pin.source_subdir}/ggml/src/ggml-rpc/" in m.name]
        tar.extractall(dest, members=wanted, filter="data")
    return next(dest.iterdir()) / pin.source_subdir


def test_a_tiny_patch_applies_to_the_real_7_tree(tmp_path, p7_tree):
    patch = _log_line_patch(tmp_path, p7_tree, LOG_LINE, PATCHED_LOG_LINE)
    report = apply_patch(p7_tree, patch)
    assert any(RPC_CPP in line for line in report)
    assert PATCHED_LOG_LINE in (p7_tree / RPC_CPP).read_text()
    # applied once: applying it again is refused ("previously applied"), the tree is kept
    with pytest.raises(PatchRejected):
        apply_patch(p7_tree, patch)
    assert (p7_tree / RPC_CPP).read_text().count(PATCHED_LOG_LINE) == 1


def test_a_patch_for_another_tree_names_the_rejected_hunk(tmp_path, p7_tree):
    other = LOG_LINE.replace("local cache", "local  cache")  # a line this release does not have
    patch = _log_line_patch(tmp_path, p7_tree, other, other + " /* x */")
    before = (p7_tree / RPC_CPP).read_text()
    with pytest.raises(PatchRejected) as err:
        apply_patch(p7_tree, patch)
    assert f"hunk #1 of {RPC_CPP}" in str(err.value) and "local  cache" in str(err.value)
    assert (p7_tree / RPC_CPP).read_text() == before


def test_which_releases_have_the_rdma_transport(tmp_path):
    """The fact `--rdma` relies on, read from each release's own sources."""
    have = {}
    for pin in load_pins().values():
        archive = _cached_download(pin) if pin.kind == "sdist" else None
        if archive is None:
            continue
        member = f"{pin.source_subdir}/ggml/src/ggml-rpc/CMakeLists.txt"
        with tarfile.open(archive) as tar:
            wanted = [m for m in tar.getmembers() if m.name.split("/", 1)[-1] == member]
            tar.extractall(tmp_path / pin.name, members=wanted, filter="data")
        top = next((tmp_path / pin.name).iterdir()) if wanted else tmp_path
        have[pin.name] = has_rdma_transport(top / pin.source_subdir)
    if "p7" not in have:
        skip(PEER_MISSING, "no sdists in the download cache (run `harness peers build --all`)")
    # 3.6.1 (0.3.20) predates the transport; 4.0.2 (0.3.34) already has it
    assert have == {name: name != "p3" for name in have}


@pytest.mark.slow
def test_a_patched_p7_builds_verifies_and_runs_the_patched_code(tmp_path, p7_tree, monkeypatch):
    archive = _p7_sdist()
    # the compiler cache of the real peers: the patched tree compiles only what the patch
    # changed (make peers built p7 through it), the rest of the build is p7's
    monkeypatch.setenv("CCACHE_DIR", os.environ.get("CCACHE_DIR") or str(cache_root() / "ccache"))
    monkeypatch.setenv("GGML_RPC_HARNESS_CACHE", str(tmp_path / "cache"))
    patch = _log_line_patch(tmp_path, p7_tree, LOG_LINE, PATCHED_LOG_LINE)
    pin = get_pin("p7").patched("p7logline", patch)
    result = peer_build.build_pin(pin, archive=archive, jobs=2)
    assert result.manifest["verified_proto"] == "7.0.0"
    assert result.manifest["patch"]["sha256"] == pin.patch_sha256
    assert pin.entry_dir.name.startswith("llama-cpp-python==0.3.36+patch-")
    peer = get_peer("p7logline")
    assert peer.available and peer.base == "p7"
    with start_peer_server(peer, workdir=tmp_path / "run", cache_dir=tmp_path / "c") as server:
        assert server.banner_version == "7.0.0"
        assert "(patched)" in server.log_text()


def test_sanitizer_p7_answers_a_session_like_the_release(tmp_path):
    asan = _built("p7+asan+ubsan")
    assert asan.sanitize == ("address", "undefined")
    assert asan.manifest["sanitize"] == ["address", "undefined"]
    clang = sanitize.clang_toolchain()  # clang-16 when installed (its runtime by path), else gcc
    runtime = f"{clang.runtime_dir}/libclang_rt.asan-" if clang else "libasan.so"
    assert any(r.startswith(runtime) for r in asan.manifest["sanitizer_runtimes"])
    with start_peer_server(asan, workdir=tmp_path / "env") as server:
        environ = Path(f"/proc/{server.pid}/environ").read_bytes().split(b"\0")
        assert any(e.startswith(b"ASAN_OPTIONS=") and b"abort_on_error=1" in e for e in environ)
        assert any(e.startswith(b"UBSAN_OPTIONS=") and b"halt_on_error=1" in e for e in environ)
    sanitized, _ = _session(asan, tmp_path, "asan")
    assert sanitized == _release_session(tmp_path)[0]


def _add_graph(peer, tmp_path: Path, tag: str, env: dict[str, str] | None = None):
    """HELLO, one buffer, a + b as a one-node graph: (the sum read back or None, the server's
    exit status or None when alive, its log)."""
    from harness.proto import ggml
    from harness.proto.tensor import RpcTensor
    from harness.proto.errors import ProtocolError
    from harness.reference.client import RefClient
    from harness.reference.errors import ReferencePeerError
    with start_peer_server(peer, workdir=tmp_path / tag, env=env) as server:
        got = None
        try:
            c = RefClient.connect(server.host, server.port, peer.dialect or peer.proto,
                                  timeout=60)
            ptr, _ = c.alloc_buffer(1024)
            base = c.buffer_get_base(ptr)
            a = RpcTensor.make(id=0x10, ne=(4,), buffer=ptr, data=base, name="a")
            b = a.with_(id=0x20, data=base + 64)
            out = a.with_(id=0x30, data=base + 128, op=ggml.OP["ADD"], flags=ggml.FLAG_COMPUTE,
                          src=(0x10, 0x20) + (0,) * 8)
            c.set_tensor(a, struct.pack("<4f", 1, 2, 3, 4))
            c.set_tensor(b, struct.pack("<4f", 10, 20, 30, 40))
            c.graph_compute([0x30], [a, b, out])
            got = struct.unpack("<4f", bytes(c.get_tensor(out, 0, 16)))
            c.close()
        except (OSError, ReferencePeerError, ProtocolError):
            deadline = time.monotonic() + 15  # the sanitizer's report, then its abort
            while server.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
        return got, server.poll(), server.log_text()


def test_sanitizer_p5_gets_past_a_graph_with_the_reviewed_suppression(tmp_path):
    """Before 7.0.0 ggml sized a graph from a null base, which UBSan reports on the first
    GRAPH_COMPUTE of every session. harness/impls/ubsan.supp suppresses exactly that report:
    the clang-built p5+asan+ubsan computes the graph as the release does and keeps serving;
    with the server's UBSAN_OPTIONS lacking the file (the planted fault) it dies there."""
    asan = _built("p5+asan+ubsan")
    got, status, log = _add_graph(asan, tmp_path, "suppressed")
    assert got == (11, 22, 33, 44) and status is None, log[-3000:]
    assert "runtime error" not in log
    bare = sanitize.runtime_env(("undefined",), env={})["UBSAN_OPTIONS"]
    bare = ":".join(o for o in bare.split(":") if not o.startswith("suppressions="))
    got, status, log = _add_graph(asan, tmp_path, "bare", env={"UBSAN_OPTIONS": bare})
    assert got is None and status is not None, log[-3000:]
    assert "applying non-zero offset" in log and "incr_ptr_aligned" in log, log[-3000:]


def test_sanitizer_p7_client_library_runs_a_session_like_the_release(tmp_path):
    """The instrumented client library loads into an uninstrumented Python only with its
    runtime preloaded (the manifest's sanitizer_runtimes): read back what it wrote to the
    release server, as the release library does."""
    from harness.impls.ctypes_driver import CtypesClientDriver
    asan, release = _built("p7+asan+ubsan"), _built("p7")

    def session(lib_dir: Path, tag: str) -> list:
        with start_peer_server(release, workdir=tmp_path / tag) as server, \
                CtypesClientDriver(lib_dir, proto="7.0.0") as driver:
            driver.run({"op": "connect", "endpoint": server.endpoint})
            results = [driver.run(step).result for step in BASIC_SESSION]
            driver.run({"op": "close"})
            assert server.poll() is None, server.log_tail(30)
        return [(r.get("fnv"), r.get("size")) for r in results if "fnv" in r]

    sanitized = session(asan.lib_dir, "asan-client")
    assert sanitized and sanitized == session(release.lib_dir, "release-client")


def test_rdma_p7_links_libibverbs_and_serves_over_tcp_without_a_device(tmp_path):
    rdma = _built("p7+rdma")
    assert rdma.rdma and rdma.manifest["rdma"] is True
    lib = next(iter(sorted(rdma.lib_dir.glob("libggml-rpc.so*"))))
    needed = peer_build.needed_libraries(lib.resolve())
    assert any(n.startswith("libibverbs.so") for n in needed), needed
    over_tcp, log = _session(rdma, tmp_path, "rdma")  # no verbs device here: TCP fallback
    assert "transport      : TCP (RDMA auto-negotiate enabled)" in log
    digests, release_log = _release_session(tmp_path)
    assert over_tcp == digests and "RDMA" not in release_log
