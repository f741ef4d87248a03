""".ci/system-deps on hosts unlike this one: a CI runner with docker-ce and Chrome already
installed, and a user without root."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

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


@pytest.mark.skipif(os.geteuid() != 0, reason="the install path runs as root")
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
