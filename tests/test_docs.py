"""The front door and the documentation site. README.md is a page a newcomer reads in a few
minutes (at most about 200 lines), shows the commands CI runs and links every docs page, each
of which exists; the site builds with `mkdocs build --strict` (a link to a missing page or
anchor, or a page outside the nav, fails it) and every internal link and anchor of the built
pages resolves: `make docs`, run here as CI runs it. Each check is shown to fail on a planted
fault."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from harness.strictness import TOOL_MISSING
from needs import module, skip

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 200
DOCS_EXTRA = "pip install -e '.[docs]' (make install includes it)"


def readme_problems(readme: str, ci_run: str, docs: Path) -> list[str]:
    problems = []
    lines = len(readme.splitlines())
    if lines > README_MAX_LINES:
        problems.append(f"README.md has {lines} lines, more than {README_MAX_LINES}")
    for command in ["make matrix", "make test", *re.findall(r"^make [\w-]+", ci_run, re.M)]:
        if not re.search(rf"^{re.escape(command)}\b", readme, re.M):
            problems.append(f"README.md does not show `{command}` as a command line")
    linked = set()
    for target in re.findall(r"\]\(([^)\s]+)\)", readme):
        path = urlsplit(target).path
        if urlsplit(target).scheme or not path:
            continue
        linked.add(Path(path).as_posix())
        if not (docs.parent / path).is_file():
            problems.append(f"README.md links {target}: no such file")
    for page in sorted(docs.glob("*.md")):
        if page.name != "index.md" and f"docs/{page.name}" not in linked:
            problems.append(f"README.md does not link docs/{page.name}")
    return problems


def _readme() -> tuple[str, str]:
    return (ROOT / "README.md").read_text(), (ROOT / ".ci" / "run").read_text()


def test_the_readme_is_a_short_front_door_to_every_docs_page():
    readme, ci_run = _readme()
    assert readme_problems(readme, ci_run, ROOT / "docs") == []
    assert "make lint-workflows" in ci_run  # what the check above reads from .ci/run


def test_a_long_readme_a_missing_command_or_a_dead_link_is_caught():
    readme, ci_run = _readme()
    docs = ROOT / "docs"
    long = readme + "more prose\n" * 1000
    assert any("more than 200" in p for p in readme_problems(long, ci_run, docs))
    without = "\n".join(ln for ln in readme.splitlines() if not ln.startswith("make test"))
    assert any("`make test`" in p for p in readme_problems(without, ci_run, docs))
    dead = readme.replace("(docs/matrix.md)", "(docs/no-such-page.md)")
    problems = readme_problems(dead, ci_run, docs)
    assert any("no-such-page.md: no such file" in p for p in problems)
    assert any("does not link docs/matrix.md" in p for p in problems)


def _needs_docs_tools() -> None:
    module("mkdocs", DOCS_EXTRA)
    module("material", DOCS_EXTRA)
    if shutil.which("make") is None:
        skip(TOOL_MISSING, "no make on PATH (Debian: apt-get install make)")


def _run(args: list[str], cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          check=False)


def test_make_docs_builds_the_site_strict_with_every_link_resolving(tmp_path):
    _needs_docs_tools()
    stamp = tmp_path / "installed"  # the venv this test runs in is installed already
    stamp.touch()
    os.utime(stamp, (time.time() + 60,) * 2)  # newer than pyproject.toml whatever its mtime
    out = tmp_path / "site"
    proc = _run(["make", "-s", "docs", f"BIN={Path(sys.executable).parent}", f"STAMP={stamp}",
                 f"DOCS_OUT={out}"], ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"{out}: " in proc.stdout and "0 broken internal link(s)" in proc.stdout
    for page in ("index", "matrix", "fuzzing", "PROTOCOL", "EXTENDING", "RDMA"):
        assert (out / f"{page}.html").is_file(), page


def _docs_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "docs", copy / "docs")
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    return copy


def test_a_dead_anchor_a_dead_page_and_a_dead_built_link_are_caught(tmp_path):
    _needs_docs_tools()
    copy = _docs_copy(tmp_path)
    build = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", "out"]
    page = copy / "docs" / "setup.md"
    text = page.read_text()
    page.write_text(text + "\nSee [the verdicts](matrix.md#no-such-heading).\n")
    proc = _run(build, copy)
    assert proc.returncode != 0 and "no-such-heading" in proc.stderr, proc.stderr[-2000:]
    page.write_text(text + "\nSee [a page](no-such-page.md).\n")
    proc = _run(build, copy)
    assert proc.returncode != 0 and "no-such-page.md" in proc.stderr, proc.stderr[-2000:]
    page.write_text(text)
    proc = _run(build, copy)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # the built pages' check: a page the others link is gone
    (copy / "out" / "matrix.html").unlink()
    proc = _run([sys.executable, "-m", "harness.site.links", "out", "--skip", "404.html"], copy)
    assert proc.returncode == 1 and "matrix.html (no such file)" in proc.stdout, proc.stdout[-2000:]


@pytest.mark.parametrize("args", [["missing-dir"], []])
def test_the_link_check_refuses_a_folder_without_pages(tmp_path, args):
    proc = _run([sys.executable, "-m", "harness.site.links", *args], tmp_path, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
