""".ci/system-deps on hosts unlike this one (a CI runner with docker-ce and Chrome already
installed), and a cancelled job: SIGTERM to the harness stops the servers it started."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from harness.strictness import NOT_ROOT, coded

SCRIPT = Path(__file__).resolve().parents[1] / ".ci" / "system-deps"


def _host(tmp_path: Path, programs: list[str]) -> dict[str, str]:
    """A PATH where dpkg knows no package, apt-get records its arguments, and ``programs``
    exist (as another package's files would)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "apt.log"
    scripts = {"dpkg-query": "exit 1", "apt-get": f'echo "$@" >> {log}',
               **{p: "exit 0" for p in programs}}
    for name, body in scripts.items():
        f = bin_dir / name
        f.write_text(f"#!/bin/sh\n{body}\n")
        f.chmod(0o755)
    for tool in ("grep", "id", "env", "sh"):  # what the script runs, and nothing this host has
        (bin_dir / tool).symlink_to(shutil.which(tool))
    return {"PATH": str(bin_dir), "HOME": str(tmp_path)}


@pytest.mark.skipif(os.geteuid() != 0, reason=coded(NOT_ROOT, "the install path runs as root"))
def test_programs_another_package_provides_are_not_reinstalled(tmp_path):
    env = _host(tmp_path, ["dockerd", "google-chrome"])
    run = subprocess.run([shutil.which("bash"), str(SCRIPT)], env=env, capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    install = (tmp_path / "apt.log").read_text().splitlines()[-1].split()
    assert install[:2] == ["install", "-y"]
    assert "docker.io" not in install and "chromium" not in install
    assert {"libibverbs-dev", "clang-16", "patch"} <= set(install)
    # Planted: without those programs both packages are wanted again.
    bare = tmp_path / "bare"
    bare.mkdir()
    subprocess.run([shutil.which("bash"), str(SCRIPT)], env=_host(bare, []), check=True, timeout=60)
    wanted = (bare / "apt.log").read_text().splitlines()[-1].split()
    assert "docker.io" in wanted and "chromium" in wanted


def _children_after_sigterm(tmp_path: Path, entry: str, workers: int = 1) -> list[int]:
    """Start a campaign against the reference server, SIGTERM the harness once its server
    listens, and return the server processes still alive afterwards (the caller ends them;
    on a failure here they are killed)."""
    import signal
    import sys
    import time

    import psutil
    args = ["fuzz", "--target", "ref-7.0.0", "--duration", "120s", "--out", str(tmp_path / "r"),
            "--workers", str(workers)]
    run = subprocess.Popen([sys.executable, "-c", f"import sys, harness.cli as c; "
                            f"sys.argv = ['harness', *{args!r}]; c.{entry}()"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    servers: list[psutil.Process] = []
    judged = False
    try:
        proc = psutil.Process(run.pid)
        deadline = time.monotonic() + 60
        while len(servers) < workers and time.monotonic() < deadline:
            servers = [c for c in proc.children(recursive=True)
                       if "serve" in " ".join(c.cmdline())]
            time.sleep(0.2)
        assert servers, "the campaign never started its server"
        time.sleep(1.0)
        run.send_signal(signal.SIGTERM)
        rc = run.wait(timeout=60)
        _, alive = psutil.wait_procs(servers, timeout=15)
        assert rc != 0, "a terminated harness exited 0"
        judged = True
        return [p.pid for p in alive]
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        if not judged:  # a failing run's servers must not outlive the test
            for p in servers:
                try:
                    p.kill()
                except psutil.Error:
                    pass


def test_a_terminated_harness_stops_the_servers_it_started(tmp_path):
    # one worker: the campaign runs in the harness's own process (with --workers N the
    # parent forwards SIGTERM and kills what its workers started; not yet held to this test)
    assert _children_after_sigterm(tmp_path, "main") == []


def test_without_the_handler_a_terminated_harness_leaves_its_server(tmp_path):
    """Planted: the command line without main()'s handler (Python's default) leaves the
    server running."""
    import signal
    alive = _children_after_sigterm(tmp_path, "app")
    assert alive
    for pid in alive:
        os.kill(pid, signal.SIGKILL)


# ------------------------------------------------------------------ strict CI tooling
ROOT = SCRIPT.parents[1]


def _non_root(tmp_path: Path) -> dict[str, str]:
    """A host where we are not root and have no sudo."""
    env = _host(tmp_path, [])
    fake_id = Path(env["PATH"]) / "id"
    fake_id.unlink()
    fake_id.write_text("#!/bin/sh\necho 1000\n")
    fake_id.chmod(0o755)
    return env


def test_system_deps_fails_under_ci_when_it_cannot_install(tmp_path):
    env = _non_root(tmp_path)
    relaxed = subprocess.run([shutil.which("bash"), str(SCRIPT)], env=env, capture_output=True,
                             text=True, timeout=60)
    assert relaxed.returncode == 0 and "missing" in relaxed.stderr  # outside CI: a note
    strict = subprocess.run([shutil.which("bash"), str(SCRIPT)], env={**env, "CI": "true"},
                            capture_output=True, text=True, timeout=60)
    assert strict.returncode == 1 and "CI is strict" in strict.stderr, strict.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason=coded(NOT_ROOT, "the install path runs as root"))
def test_system_deps_fails_under_ci_when_apt_installs_nothing(tmp_path):
    # the fake apt-get of _host records and installs nothing: the packages stay missing
    env = {**_host(tmp_path, []), "GGML_RPC_HARNESS_STRICT": "1"}
    run = subprocess.run([shutil.which("bash"), str(SCRIPT)], env=env, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 1 and "still missing after apt-get install" in run.stderr


def _make(tmp_path: Path, target: str, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([shutil.which("make"), "-C", str(ROOT), target, *args],
                          env=env, capture_output=True, text=True, timeout=600)


def test_lint_workflows_fails_under_ci_without_node(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("make", "sh"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path)}
    relaxed = _make(tmp_path, "lint-workflows", env)
    assert relaxed.returncode == 0 and "not linted" in relaxed.stdout
    strict = _make(tmp_path, "lint-workflows", {**env, "CI": "true"})
    assert strict.returncode != 0 and "CI is strict" in strict.stderr


def test_a_test_run_that_selects_nothing_fails(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "GGML_RPC_HARNESS_STRICT")}
    run = _make(tmp_path, "test-fast", env, "PYTEST_ARGS=-k no_test_is_called_like_this")
    assert run.returncode != 0, run.stdout[-2000:]  # pytest's exit 5 is no longer turned into 0
