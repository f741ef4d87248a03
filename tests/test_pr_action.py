"""The GitHub Action (action.yml) run locally: its `harness pr` step, taken from the file and
run with bash as a composite step runs, with $GITHUB_STEP_SUMMARY and $GITHUB_OUTPUT pointing
at files. Two trees as a pull request brings them: the released 7.0.0 tree (p7's sdist) and
the same tree with the project's seed-000 patch (HELLO byte 3 = server flags, no version
bump). Their builds are the cached peers p7 and p7f (the action's `peer` input); the last
test builds the seed-000 tree itself, as the action does by default, with the registry
builds' recipe (once per peer cache: the entry is keyed by the tree's content)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.impls.fetch import download, unpack_sdist
from harness.impls.progress import as_progress
from harness.impls.registry import get_peer, get_pin, read_manifest
from harness.impls.source import apply_patch
from needs import built, peer

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.realpeer, pytest.mark.slow]
CHECK = "check"  # the id of the action's `harness pr` step
QUICK = {"against": "p7", "scenarios": "handshake", "duration": "5s", "base-ref": "",
         "extra-targets": ""}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """A workflow's workspace with the release tree and the seed-000 tree in it."""
    root = tmp_path_factory.mktemp("workspace")
    p7 = get_pin("p7")
    stage = tmp_path_factory.mktemp("unpack")
    archive, _ = built("p7's sdist", lambda: download(p7, stage, as_progress(None), keep=True))
    tree, _ = unpack_sdist(p7, archive, stage / "src")
    shutil.move(tree, root / "release")
    shutil.copytree(root / "release", root / "seed-000", symlinks=True)
    apply_patch(root / "seed-000", get_pin("p7f").patch_path)
    return root


def _step() -> tuple[dict, dict]:
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    [step] = [s for s in action["runs"]["steps"] if s.get("id") == CHECK]
    return action, step


def run_action(workspace: Path, tmp: Path, **inputs: str):
    """The check step as the runner runs it: inputs (the action's defaults, then ``inputs``)
    substituted into its env, bash -eo pipefail, the workspace as working directory."""
    action, step = _step()
    values = {k: str(v.get("default", "")) for k, v in action["inputs"].items()}
    values.update({k.replace("_", "-"): v for k, v in inputs.items()})
    runner_temp = tmp / "runner-temp"
    runner_temp.mkdir()

    def expand(text: str) -> str:
        text = re.sub(r"\$\{\{\s*inputs\.([\w-]+)\s*\}\}", lambda m: values[m.group(1)], text)
        text = re.sub(r"\$\{\{\s*runner\.temp\s*\}\}", str(runner_temp), text)
        assert "${{" not in text, f"the step uses an expression this test does not know: {text}"
        return text

    summary, outputs = tmp / "step-summary.md", tmp / "github-output"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update({k: expand(str(v)) for k, v in step.get("env", {}).items()})
    env.update(GITHUB_STEP_SUMMARY=str(summary), GITHUB_OUTPUT=str(outputs),
               GITHUB_ACTIONS="true", GITHUB_WORKSPACE=str(workspace), RUNNER_TEMP=str(runner_temp),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    assert step["shell"] == "bash" and "harness pr " in step["run"]
    done = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c",
                           expand(step["run"])], cwd=workspace, env=env, capture_output=True,
                          text=True, timeout=1800, stdin=subprocess.DEVNULL)
    return done, summary.read_text() if summary.exists() else "", \
        outputs.read_text() if outputs.exists() else "", Path(env["OUT"])


def _version_line(tree: Path) -> int:
    lines = (tree / "ggml/include/ggml-rpc.h").read_text().splitlines()
    return next(i for i, t in enumerate(lines, 1) if "define RPC_PROTO_MAJOR_VERSION" in t)


def test_the_action_passes_the_released_tree(workspace, tmp_path):
    peer("p7")
    done, summary, outputs, out = run_action(workspace, tmp_path, llama_cpp_dir="release",
                                             peer="p7", **QUICK)
    print(summary)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "exit-code=0" in outputs.splitlines()
    assert summary.startswith("## ✔ ggml-rpc harness: p7\n")
    assert "**compatible: it announces 7.0.0 and behaves as ref-7.0.0" in summary
    assert "Unexpected" not in summary
    assert "| handshake | on | ✔ works | ✔ works | ✔ works |" in summary
    assert "| p7 (7.0.0) | ✔ works (works) |" in summary
    assert "::notice file=release/ggml/include/ggml-rpc.h,line=" in done.stdout
    assert "::error" not in done.stdout
    report = json.loads((out / "pr.json").read_text())
    assert report["exit_code"] == 0 and (out / "site" / "index.html").is_file()


def test_the_action_fails_the_seed000_tree_as_a_wire_change_without_a_bump(workspace, tmp_path):
    peer("p7f")
    done, summary, outputs, out = run_action(workspace, tmp_path, llama_cpp_dir="seed-000",
                                             peer="p7f", **QUICK)
    print(summary)  # the job summary the seed-000 patch gets as a pull request
    assert done.returncode == 1, done.stdout[-4000:] + done.stderr[-4000:]
    assert "exit-code=1" in outputs.splitlines()
    assert summary.startswith("## ✘ ggml-rpc harness: p7f\n")
    assert "**breaks compatibility without a version bump: it announces 7.0.0" in summary
    assert "### Unexpected verdicts" in summary
    assert summary.count("sent flags 0x01 in HELLO byte 3") == 2
    # the grid: the build's server with a cache announces flags the 7.0.0 label forbids
    assert "| handshake | off | ✔ works | ✔ works | ✔ works |" in summary
    assert "| handshake | on | ⚠ error | ✔ works | ⚠ error |" in summary
    # the released 7.0.0 build still talks to it: only the reference shows the change
    assert "| p7 (7.0.0) | ✔ works (works) | ✔ works (works) |" in summary
    where = f"file=seed-000/ggml/include/ggml-rpc.h,line={_version_line(workspace / 'seed-000')}"
    errors = [line for line in done.stdout.splitlines() if line.startswith("::error ")]
    assert all(where in line for line in errors), done.stdout
    # the two cells, then any divergence the short differential met (the patch's own
    # SET_TENSOR bounds assert is one, when a session reaches it), then the headline
    assert ["HELLO byte 3" in line for line in errors[:2]] == [True, True], done.stdout
    assert "without a version bump" in errors[-1]
    assert len(errors) == 3 + summary.count("`divergence-")
    # the summary names the report's folders as the artifact unpacks them, no runner paths
    assert str(out) not in summary and "`site/`" in summary
    assert json.loads((out / "pr.json").read_text())["exit_code"] == 1


def test_the_action_builds_the_seed000_tree_with_the_registry_recipe(workspace, tmp_path):
    """The action's default: no `peer`, the tree is built (or found by its content key)."""
    p7f = peer("p7f")
    done, summary, outputs, out = run_action(workspace, tmp_path, llama_cpp_dir="seed-000",
                                             name="pr-seed000", **QUICK)
    assert done.returncode == 1, done.stdout[-4000:] + done.stderr[-4000:]
    assert "exit-code=1" in outputs.splitlines()
    assert "breaks compatibility without a version bump" in summary
    assert "`pr-seed000`, " in summary and "from `seed-000`" in summary
    mine = read_manifest(get_peer("pr-seed000").bin_dir.parent)
    theirs = read_manifest(p7f.bin_dir.parent)
    # one recipe: the same cmake options, and the same RPC sources as the pin's patched tree
    assert mine["cmake_flags"] == theirs["cmake_flags"]
    assert mine["rpc_digest"] == theirs["rpc_digest"]
    assert mine["targets"] == ["ggml-rpc-server"] and mine["verified_proto"] == "7.0.0"
    assert Path(mine["source_tree"]).name == "seed-000"  # the tree it was first built from
