"""The ClusterFuzzLite configuration (.clusterfuzzlite/, .github/workflows/cflite_*.yml): its
files as ClusterFuzzLite documents them, and the local check (build.sh under the builder's
environment, the fuzzer it produced run for 60 s on its seed corpus zip)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from needs import tool

ROOT = Path(__file__).resolve().parents[1]
CFL = ROOT / ".clusterfuzzlite"


def _workflow(name: str) -> dict:
    return yaml.safe_load((ROOT / ".github" / "workflows" / name).read_text())


def test_the_files_clusterfuzzlite_reads_are_there():
    project = yaml.safe_load((CFL / "project.yaml").read_text())
    assert project["language"] == "c++" and set(project["sanitizers"]) >= {"address"}
    docker = (CFL / "Dockerfile").read_text()
    assert docker.startswith("#") and "FROM gcr.io/oss-fuzz-base/base-builder" in docker
    assert "COPY .clusterfuzzlite/build.sh $SRC/" in docker
    build = (CFL / "build.sh").read_text()
    # the project's OSS-Fuzz-style script builds it; the harness fetches sources and seeds
    assert "harness/fuzz/libfuzzer/build.sh" in build and "fuzz-prep" in build
    assert os.access(CFL / "build.sh", os.X_OK) and os.access(CFL / "check-local", os.X_OK)


def test_the_workflows_are_the_documented_modes():
    modes = {}
    for name in ("cflite_pr.yml", "cflite_batch.yml", "cflite_cron.yml"):
        for job in _workflow(name)["jobs"].values():
            uses = [s.get("uses", "") for s in job["steps"]]
            assert any(u.startswith("google/clusterfuzzlite/actions/build_fuzzers@") for u in uses)
            run = next(s for s in job["steps"] if s.get("uses", "").startswith(
                "google/clusterfuzzlite/actions/run_fuzzers@"))
            modes.setdefault(name, set()).add(run["with"]["mode"])
    assert modes == {"cflite_pr.yml": {"code-change"}, "cflite_batch.yml": {"batch"},
                     "cflite_cron.yml": {"prune", "coverage"}}


@pytest.mark.slow
@pytest.mark.realpeer
def test_the_local_check_builds_the_target_and_fuzzes_it_for_the_time_asked(tmp_path):
    tool(shutil.which("clang-16"), "clang-16: the ClusterFuzzLite check builds with it")
    out = tmp_path / "out"
    # 20 s, not the check's default minute: what is checked is that the fuzzer keeps running
    # for the time asked (fork mode survives the pin's crashes), and a minute of one core's
    # fuzzing is 40 s of the suite's CPU for nothing more
    proc = subprocess.run([str(CFL / "check-local"), str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=1800,
                          env={**os.environ, "HARNESS": str(ROOT / ".venv" / "bin" / "harness"),
                               "FUZZ_SECONDS": "20"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (out / "ggml_rpc_server_fuzzer_seed_corpus.zip").stat().st_size > 0
    ran = re.search(r"fuzzer ran (\d+) s of 20 ", proc.stdout)
    assert ran and int(ran.group(1)) >= 20 and "stopped early" not in proc.stderr, proc.stdout
