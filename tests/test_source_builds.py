"""`harness peers add --source-dir`: a llama.cpp tree on disk as a peer, keyed by its content
(the parts that need no compiler; tests/test_pr_action.py builds a real tree)."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from harness.impls import build as build_module
from harness.impls import registry, source
from harness.impls.build import build_pin, build_source, source_pin
from harness.impls.errors import BuildError
from harness.impls.pins import SOURCE_PACKAGE

HEADER = ("#define RPC_PROTO_MAJOR_VERSION 7\n#define RPC_PROTO_MINOR_VERSION 0\n"
          "#define RPC_PROTO_PATCH_VERSION 0\n")


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(registry.CACHE_ENV, str(tmp_path / "cache"))


@pytest.fixture()
def tree(tmp_path):
    """The files of a llama.cpp tree the harness reads before building: the RPC header (the
    proto), the server's CMakeLists.txt (its target), and a source file."""
    root = tmp_path / "llama.cpp"
    (root / "ggml" / "include").mkdir(parents=True)
    (root / "ggml" / "include" / "ggml-rpc.h").write_text(HEADER)
    (root / "tools" / "rpc").mkdir(parents=True)
    (root / "tools" / "rpc" / "CMakeLists.txt").write_text("set(TARGET ggml-rpc-server)\n")
    (root / "ggml" / "src").mkdir()
    (root / "ggml" / "src" / "ggml-rpc.cpp").write_text("// the server\n")
    return root


def test_the_fingerprint_is_the_content_not_the_place(tree, tmp_path):
    copy = tmp_path / "elsewhere" / "llama.cpp"
    shutil.copytree(tree, copy)
    assert source.tree_fingerprint(copy) == source.tree_fingerprint(tree)
    (copy / "ggml" / "src" / "ggml-rpc.cpp").write_text("// the server, changed\n")
    assert source.tree_fingerprint(copy) != source.tree_fingerprint(tree)


def test_the_fingerprint_leaves_out_git_and_build_dirs_inside_the_tree(tree):
    before = source.tree_fingerprint(tree)
    (tree / ".git").mkdir()
    (tree / ".git" / "HEAD").write_text("ref: refs/heads/pr\n")
    (tree / "build").mkdir()
    (tree / "build" / "CMakeCache.txt").write_text("CMAKE_HOME_DIRECTORY:INTERNAL=..\n")
    (tree / "build" / "libggml-rpc.so").write_bytes(b"\x7fELF")
    assert source.tree_fingerprint(tree) == before
    (tree / "notes").mkdir()  # a plain dir is part of the tree
    (tree / "notes" / "x.txt").write_text("x")
    assert source.tree_fingerprint(tree) != before


def test_planted_a_fingerprint_of_names_only_misses_an_edit(tree, monkeypatch):
    """The key must change with the bytes: a name-only key would reuse a stale build."""
    before = source_pin(tree, "mine").key
    (tree / "ggml" / "src" / "ggml-rpc.cpp").write_text("// edited\n")
    assert source_pin(tree, "mine").key != before
    monkeypatch.setattr(build_module, "tree_fingerprint",
                        lambda root: "names-only-" + ",".join(sorted(
                            p.name for p in root.rglob("*"))))
    edited = source_pin(tree, "mine").key
    (tree / "ggml" / "src" / "ggml-rpc.cpp").write_text("// edited again\n")
    assert source_pin(tree, "mine").key == edited


def test_a_source_pin_reads_proto_and_target_from_the_tree(tree, cache):
    pin = source_pin(tree)
    assert (pin.name, pin.proto, pin.server_target, pin.package) == \
        ("source-7.0.0", "7.0.0", "ggml-rpc-server", SOURCE_PACKAGE)
    assert pin.is_source_build and pin.key == f"{SOURCE_PACKAGE}=={pin.version}"
    assert len(pin.version) == build_module.SOURCE_KEY_HEX and str(tree) in pin.note


@pytest.mark.parametrize("name, message", [("p7", "a pin or user build"),
                                           ("llama.cpp-0.3.36", "a pin or user build"),
                                           ("mine+asan", "separates variant tags")])
def test_a_source_pin_refuses_names_that_are_taken(tree, cache, name, message):
    with pytest.raises(BuildError, match=message):
        source_pin(tree, name)


def test_a_tree_without_rpc_is_refused_by_name(tmp_path, tree, cache):
    (tree / "ggml" / "include" / "ggml-rpc.h").unlink()
    with pytest.raises(BuildError, match="RPC_PROTO"):
        source_pin(tree)
    with pytest.raises(BuildError, match="not a directory"):
        source_pin(tmp_path / "nothing")


def test_a_source_pin_is_never_fetched_from_a_registry(tree, cache):
    pin = source_pin(tree, "mine")
    with pytest.raises(BuildError, match="--source-dir TREE --name mine"):
        build_pin(pin)


def test_an_unchanged_tree_is_its_cache_entry(tree, cache, monkeypatch):
    """What a later `harness pr` on the same checkout does: no configure, no compile."""
    pin = source_pin(tree, "mine")
    pin.bin_dir.mkdir(parents=True)
    (pin.bin_dir / "ggml-rpc-server").write_text("")
    manifest = {"format": registry.MANIFEST_FORMAT, "pin": dataclasses.asdict(pin),
                "verified_proto": "7.0.0", "files": ["ggml-rpc-server"],
                "targets": ["ggml-rpc-server"], "server": "ggml-rpc-server",
                "cmake_flags": build_module.cmake_flags(pin)}
    (pin.entry_dir / "manifest.json").write_text(json.dumps(manifest))

    def no_build(*args, **kwargs):
        raise AssertionError("an unchanged tree was built again")
    monkeypatch.setattr(build_module, "_build_in", no_build)
    out = build_source(tree, name="mine")
    assert out.cached and out.pin.key == pin.key
    peer = registry.get_peer("mine")
    assert peer.available and peer.proto == "7.0.0"
    (tree / "ggml" / "src" / "ggml-rpc.cpp").write_text("// the pull request's change\n")
    with pytest.raises(AssertionError, match="built again"):
        build_source(tree, name="mine")  # a changed tree is another entry: it is built


def test_peers_add_takes_a_build_dir_or_a_source_dir(tree, cache):
    from typer.testing import CliRunner

    from harness.impls.cli import peers_app
    runner = CliRunner()
    assert runner.invoke(peers_app, ["add"]).exit_code == 2
    both = runner.invoke(peers_app, ["add", "--build-dir", str(tree), "--source-dir", str(tree)])
    assert both.exit_code == 2
    taken = runner.invoke(peers_app, ["add", "--source-dir", str(tree), "--name", "p7"])
    assert taken.exit_code == 1 and "a pin or user build has that name" in taken.output
