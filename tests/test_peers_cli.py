"""`harness peers ...` commands against an empty temporary cache (no builds)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.impls import registry

runner = CliRunner()


@pytest.fixture(autouse=True)
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(registry.CACHE_ENV, str(tmp_path / "cache"))


def test_list_json_has_every_pin_unbuilt():
    result = runner.invoke(app, ["peers", "list", "--json"])
    assert result.exit_code == 0, result.output
    rows = [r for r in json.loads(result.output) if not r["base"]]  # the releases
    assert [r["name"] for r in rows] == ["p3", "p4", "p5", "p6", "p7", "p8"]
    assert [r["proto"] for r in rows] == ["3.6.1", "4.0.2", "5.0.0", "6.0.0", "7.0.0", "8.0.0"]
    assert not any(r["available"] for r in rows)
    assert all("harness peers build" in r["reason"] for r in rows)


def test_list_table():
    result = runner.invoke(app, ["peers", "list"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "llama.cpp-0.3.36" in result.output and "not built" in result.output


def test_build_needs_names_or_all():
    assert runner.invoke(app, ["peers", "build"]).exit_code != 0
    assert runner.invoke(app, ["peers", "build", "p7", "--all"]).exit_code != 0


def test_build_unknown_pin_is_an_error():
    result = runner.invoke(app, ["peers", "build", "p99"])
    assert result.exit_code != 0
    assert "p99" in result.output


def test_add_without_a_server_fails_cleanly(tmp_path):
    (tmp_path / "b" / "bin").mkdir(parents=True)
    result = runner.invoke(app, ["peers", "add", "--build-dir", str(tmp_path / "b")],
                           env={"COLUMNS": "200"})
    assert result.exit_code == 1
    # the message names the path twice: under xdist (a longer tmp path) it wraps at 200
    assert "no ggml-rpc-server or rpc-server" in " ".join(result.output.split())


def test_remove_unknown_user_peer():
    result = runner.invoke(app, ["peers", "remove", "nobody"])
    assert result.exit_code == 1


def test_patched_pin_needs_base_patch_and_name(tmp_path):
    patch = tmp_path / "x.patch"
    patch.write_text("")
    for args in (["--base", "p7"], ["--base", "p7", "--patch", str(patch)],
                 ["--patch", str(patch), "--name", "x"], ["p7", "--base", "p7", "--patch",
                                                           str(patch), "--name", "x"]):
        result = runner.invoke(app, ["peers", "build", *args])
        assert result.exit_code != 0, args


def test_patched_pin_with_a_missing_patch_file_is_an_error(tmp_path):
    result = runner.invoke(app, ["peers", "build", "--base", "p7", "--patch",
                                 str(tmp_path / "nope.patch"), "--name", "mine"],
                           env={"COLUMNS": "200"})
    assert result.exit_code != 0 and "not found" in result.output
    assert not (tmp_path / "cache" / "peers").exists() or not any(
        (tmp_path / "cache" / "peers").glob("*+patch-*"))


def test_patched_pin_cannot_take_a_shipped_name(tmp_path):
    patch = tmp_path / "x.patch"
    patch.write_text("--- a/f\n+++ b/f\n@@ -1 +1 @@\n-taken\n+name\n")
    result = runner.invoke(app, ["peers", "build", "--base", "p7", "--patch", str(patch),
                                 "--name", "p6"], env={"COLUMNS": "200"})
    assert result.exit_code != 0 and "already defines p6" in result.output


def test_unknown_sanitizer_is_an_error():
    result = runner.invoke(app, ["peers", "build", "p7", "--sanitize", "memory"],
                           env={"COLUMNS": "200"})
    assert result.exit_code != 0 and "unknown sanitizer" in result.output


def test_remove_a_built_variant(tmp_path):
    pin = registry.get_pin("p7+rdma")
    pin.bin_dir.mkdir(parents=True)
    (pin.entry_dir / "manifest.json").write_text("{}")
    result = runner.invoke(app, ["peers", "remove", "p7+rdma"], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and pin.key in result.output
    assert not pin.entry_dir.exists()


def test_a_cli_patch_equal_to_a_shipped_patched_pin_is_that_pin(tmp_path, monkeypatch):
    from harness.impls import build, pins

    patch = tmp_path / "same.patch"
    patch.write_text("--- a/f\n+++ b/f\n@@ -1 +1 @@\n-same\n+content\n")
    shipped = {**pins.load_pins()}
    shipped["p7x"] = shipped["p7"].patched("p7x", patch)
    monkeypatch.setattr(build, "load_pins", lambda: shipped)
    assert build.patched_pin("p7", patch, "mine") is shipped["p7x"]
    other = tmp_path / "other.patch"
    other.write_text("--- a/f\n+++ b/f\n@@ -1 +1 @@\n-same\n+other\n")
    assert build.patched_pin("p7", other, "mine").name == "mine"
