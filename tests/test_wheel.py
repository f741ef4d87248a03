"""The package is the tool: `python -m build` makes an sdist and a wheel that `twine check`
accepts, and the wheel installed (not editable) into a fresh venv outside the repository runs
every command a newcomer starts with, from a working directory outside the repository too:
the shipped matrix, allow-list and reference server are found inside the installed package.

One build and one venv per session (the install takes most of the time: the dependencies come
from pip's cache)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.data import default_matrix
from harness.impls.errors import VerificationError
from harness.impls.supervisor import free_port
from harness.impls.verify import probe_hello
from harness.matrix.cells import expand
from harness.matrix.model import load_matrix
from harness.proto.dialects import DIALECTS
from needs import module, peer

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _outside_env() -> dict[str, str]:
    """The environment without anything that would import the checkout instead of the wheel
    (the peer cache, HOME and GGML_RPC_HARNESS_CACHE, is kept: building is not the point)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST", "PYTHON", "VIRTUAL_ENV"))}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


class Installed:
    def __init__(self, venv: Path, dist: Path, work: Path):
        self.venv, self.dist, self.work = venv, dist, work

    @property
    def bin(self) -> Path:
        return self.venv / "bin"

    def harness(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.bin / "harness"), *args], cwd=self.work,
                              env=_outside_env(), capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)


def _run(argv: list, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    done = subprocess.run([str(a) for a in argv], cwd=cwd, env=_outside_env(),
                          capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"{argv}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="session")
def installed(tmp_path_factory) -> Installed:
    module("build", "pip install -e '.[package]' (make install)")
    module("twine", "pip install -e '.[package]' (make install)")
    base = tmp_path_factory.mktemp("wheel")
    assert not base.resolve().is_relative_to(ROOT)
    dist, venv, work = base / "dist", base / "venv", base / "work"
    work.mkdir()
    # sdist first, then the wheel built from it: an sdist that misses a file fails here
    _run([sys.executable, "-m", "build", "--outdir", dist, ROOT], cwd=work, timeout=600)
    _run([sys.executable, "-m", "venv", venv], cwd=work, timeout=300)
    wheel = next(dist.glob("*.whl"))
    # --no-compile: pip byte-compiled every module of every dependency (pandas, scapy, ...),
    # 22 of the install's 35 CPU seconds; what the tests import compiles on first import
    # with its [build] extra, as README says: the tools a peer's build needs
    _run([venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-compile",
          f"{wheel}[build]"], cwd=work, timeout=900)
    return Installed(venv, dist, work)


def test_build_makes_an_sdist_and_a_wheel_that_twine_accepts(installed):
    files = sorted(p.name for p in installed.dist.iterdir())
    assert [f for f in files if f.endswith(".tar.gz")] and [f for f in files if f.endswith(".whl")]
    done = _run([sys.executable, "-m", "twine", "check", "--strict", *installed.dist.iterdir()],
                cwd=installed.work, timeout=120)
    assert done.stdout.count("PASSED") == 2, done.stdout


def test_the_venv_runs_the_installed_package_not_the_checkout(installed):
    code = "import harness, scenarios; print(harness.__file__); print(scenarios.__file__)"
    done = _run([installed.bin / "python", "-c", code],
                cwd=installed.work, timeout=60)
    for line in done.stdout.split():
        assert Path(line).resolve().is_relative_to(installed.venv.resolve()), done.stdout


def test_version_names_the_release_and_every_dialect(installed):
    done = installed.harness("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ggml-rpc-harness 0.1.0\n"), done.stdout
    for name in DIALECTS:
        assert name in done.stdout


def test_list_reads_the_shipped_matrix(installed):
    done = installed.harness("list", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    ids = [c["id"] for c in json.loads(done.stdout)]
    assert ids == [c.id for c in expand(load_matrix(default_matrix()))]


def test_planted_a_wheel_without_its_data_fails_as_the_checkout_only_tool_did(installed):
    """The checks above rest on the copy inside the installed package: without it (the matrix
    beside the package, as before) `harness list` stops as it did outside a checkout."""
    [shipped] = installed.venv.glob("lib/python*/site-packages/harness/data/matrix.yaml")
    hidden = shipped.with_name("matrix.yaml.hidden")
    shipped.rename(hidden)
    try:
        done = installed.harness("list")
        assert done.returncode == 2 and "matrix.yaml: no such file" in done.stdout, done.stdout
    finally:
        hidden.rename(shipped)
    assert installed.harness("list").returncode == 0


def test_init_writes_the_default_matrix_and_the_command_line_path_wins(installed):
    done = installed.harness("init", "mine")
    assert done.returncode == 0, done.stdout + done.stderr
    copy = installed.work / "mine" / "matrix.yaml"
    assert copy.read_bytes() == default_matrix().read_bytes()
    again = installed.harness("init", "mine")
    assert again.returncode == 1 and "exists" in again.stdout  # a user's edits are kept
    text = copy.read_text()
    copy.write_text(text.replace("scenarios: [handshake, device-info,", "scenarios: [handshake,"))
    mine = installed.harness("list", "--json", "--matrix", str(copy))
    assert mine.returncode == 0, mine.stdout + mine.stderr
    scenarios = {c["scenario"] for c in json.loads(mine.stdout)}
    assert "device-info" not in scenarios and "handshake" in scenarios


def test_a_missing_matrix_is_named_with_the_way_out(installed):
    done = installed.harness("list", "--matrix", "nowhere.yaml")
    assert done.returncode == 2
    assert "nowhere.yaml: no such file" in done.stdout and "harness init" in done.stdout


def _run_no_bump_handshake(installed: Installed, client_role: str) -> list[dict]:
    """`harness run CLIENT_ROLE new-server --design no-bump --scenario handshake`: its rows."""
    out = installed.work / f"reports-{client_role}"
    done = installed.harness("run", client_role, "new-server", "--design", "no-bump",
                             "--scenario", "handshake", "--out", str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [results] = out.glob("*/results.jsonl")
    return [json.loads(line) for line in results.read_text().splitlines()]


def test_run_a_reference_only_cell(installed):
    # no-bump's new client and new server are both the reference 7.0.0+flags peer
    rows = _run_no_bump_handshake(installed, "new-client")
    seen = {(r["client"], r["server"], r["verdict"]) for r in rows}
    assert seen == {("ref-7f", "ref-7f", "pass")}
    assert len(rows) == 2  # handshake with the server cache off and on


def test_fuzz_the_reference_target_for_a_few_seconds(installed):
    out = installed.work / "fuzz-ref"
    done = installed.harness("fuzz", "--target", "ref", "--duration", "4s", "--seed", "1",
                             "--out", str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["messages_sent"] > 0


def test_differential_uses_the_allow_list_shipped_in_the_package(installed):
    out = installed.work / "diff-ref"
    done = installed.harness("fuzz", "--differential", "ref-7.0.0", "ref-7.0.0", "--duration",
                             "5s", "--seed", "1", "--out", str(out), "--fail-on-findings")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    allow = Path(json.loads((out / "report.json").read_text())["config"]["allow"])
    assert allow.name == "allow-7.0.0.yaml", allow
    assert allow.resolve().is_relative_to(installed.venv.resolve() / "lib"), allow


def test_serve_answers_hello_and_stops(installed):
    port = free_port()
    proc = subprocess.Popen([str(installed.bin / "harness"), "serve", "--proto", "7.0.0",
                             "--port", str(port)], cwd=installed.work, env=_outside_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                version, _ = probe_hello("127.0.0.1", port, 7, timeout=5)
                break
            except (OSError, VerificationError):
                assert proc.poll() is None, proc.stdout.read()
                assert time.monotonic() < deadline, "harness serve never answered HELLO"
                time.sleep(0.2)
        assert version == (7, 0, 0)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) is not None
        assert "Starting RPC server v7.0.0" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)


@pytest.mark.realpeer
def test_a_real_peer_cell_runs_from_the_wheel(installed):
    """The issue's first criterion: no-bump's old client is the real 7.0.0 build (p7, from the
    shared peer cache) against the reference 7.0.0+flags server."""
    peer("p7")
    rows = _run_no_bump_handshake(installed, "old-client")
    assert rows and {(r["client"], r["verdict"]) for r in rows} == {("llama-7", "pass")}


def test_run_builds_the_peer_its_cells_lack(installed, tmp_path):
    """`harness run` builds what its cells need and is not built (here the real 8.0.0 build,
    bump's old client, into a peer cache that holds only the downloads, so the build is the
    registry recipe without the network). Planted: --no-build, the cell skips as a missing
    peer and the run fails naming it."""
    from harness.impls.cache import downloads_dir
    peer("p8")  # its download is in the shared cache
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "downloads").symlink_to(downloads_dir())

    def run(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(installed.bin / "harness"), "run", "old-client",
                               "new-server", "--design", "bump", "--scenario", "handshake",
                               "--out", str(tmp_path / "r"), *extra], cwd=installed.work,
                              env={**_outside_env(), "GGML_RPC_HARNESS_CACHE": str(cache)},
                              capture_output=True, text=True, timeout=600,
                              stdin=subprocess.DEVNULL)
    unbuilt = run("--no-build")
    assert unbuilt.returncode == 1 and "peer-missing" in unbuilt.stdout, unbuilt.stdout[-2000:]
    assert not (cache / "peers").exists() or not any((cache / "peers").iterdir())
    built = run()
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    assert "built in" in built.stdout and "verified 8.0.0" in built.stdout
    assert any(p.name.startswith("llama-cpp-py-sync==") for p in (cache / "peers").iterdir())
