"""docs/EXTENDING.md's "add a dialect" checklist, worked through: a throw-away dialect that is
one row added to DIALECTS speaks, serves, is rejected by the version rule, and is accepted by
matrix.yaml, with no other file touched. (The other checklists' proofs:
test_scenarios.py::test_a_scenario_defined_here_registers_and_runs_in_a_cell,
test_strategies.py::test_a_registered_mutation_is_catalogued_drawn_and_covered,
test_peers_unit.py::test_adding_a_patched_pin_is_one_row_of_the_shipped_file.)"""

from __future__ import annotations

import dataclasses

import pytest

from harness.matrix.model import Matrix
from harness.reference.client import VersionRejected
from harness.reference.pair import ConnectionPair
from harness.proto import dialects
from harness.proto.behaviour import LOAD_OPT_PEERS_9, RDMA_V9
from harness.proto.ggml import GGML_7

# 9.0.0 with a minor bump: what a 9.1.0 release that only adds behaviour would be
D910 = dataclasses.replace(dialects.D900, name="9.1.0-example", version=(9, 1, 0),
                           evidence="tests/test_extending.py", peer=LOAD_OPT_PEERS_9, rdma=RDMA_V9,
                           numbering=GGML_7)


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(dialects.DIALECTS, D910.name, D910)
    return D910


def test_a_new_row_speaks_and_serves(registered):
    with ConnectionPair(registered.name) as pair:
        hello = pair.client.server_hello
        assert hello.version == (9, 1, 0)
        ptr, _ = pair.client.alloc_buffer(64)
        assert pair.client.buffer_get_base(ptr)
    assert pair.record.close_reason is None


def test_the_version_rule_applies_to_the_new_row(registered):
    # a 9.0.0 client refuses a 9.1.0 server (newer minor); a 9.1.0 client accepts 9.0.0
    with pytest.raises(VersionRejected):
        with ConnectionPair("9.0.0", registered.name):
            pass
    with ConnectionPair(registered.name, "9.0.0") as pair:
        assert pair.client.server_hello.version == (9, 0, 0)


def test_matrix_yaml_accepts_the_new_row(registered):
    m = Matrix.model_validate({
        "implementations": {"ref-91": {"kind": "ref", "proto": registered.name}},
        "designs": {"d": {"roles": {r: "ref-91" for r in
                                    ("old-client", "new-client", "old-server", "new-server")}}},
        "scenarios": ["handshake"], "expectations": [{"outcome": "works"}]})
    assert m.implementations["ref-91"].proto == registered.name


# ------------------------------------------------------------------ the worked trial, for real
# docs/EXTENDING.md followed literally in a copy of the tree: a dialect row (7.0.0 with one
# behaviour of 8.0.0 changed), a scenario file and a mutation, each written into exactly the
# files the guide names; then the suite's dialect, conformance, scenario and strategy tests and
# `harness list` / `harness dialects` run in a fresh process of that copy. A guide that names
# too few files, or code that still lists dialects, scenarios or mutations elsewhere, fails.

TRIAL_ROW = '''
# worked trial (tests/test_extending.py): 7.0.0 whose SET_TENSOR_HASH validates its tensor
D710 = Dialect("7.1.0", (7, 1, 0), _IDS_5, evidence="[INF] worked trial",
               peer=dataclasses.replace(OLD_PEERS, server_hash_checks_tensor=True),
               rdma=RDMA_PROTO7, numbering=GGML_7)
DIALECTS[D710.name] = D710
'''
TRIAL_SCENARIO = '''"""Worked trial (tests/test_extending.py): the server reports device memory."""

from harness.scenario import WORKS, Check, Ended, Observation, Scenario, run_steps, scenario


@scenario
class TrialMemory(Scenario):
    id = "trial-memory"
    title = "Trial: device memory"
    description = "Connect and ask for the device's free and total memory."
    evidence = ("GET_DEVICE_MEMORY",)

    def run(self, ctx):
        try:
            (mem,) = run_steps(ctx, [{"op": "device_memory"}])
        except Ended as e:
            return e.observation
        return Observation(WORKS, checks=[Check("memory reported", mem["total"] > 0, str(mem))])
'''
TRIAL_MUTATION = '''

@mutation("field", "trial_max_size_device", fields=("device",),
          applies=lambda d, cmd: cmd is Cmd.GET_MAX_SIZE)
def _(draw, site):
    device = draw(st.sampled_from((2, 0xBEEF)))
    return site.mutation("device", replace(site.request, device=device), value=device)
'''
GUIDE_FILES = {  # what docs/EXTENDING.md says each addition touches
    "dialect": ["harness/proto/dialects.py"],
    "scenario": ["scenarios/trial_memory.py", "harness/data/matrix.yaml"],
    "mutation": ["harness/fuzz/strategies/fields.py"],
}


def _copy_tree(dest):
    import shutil
    import subprocess
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    files = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = root / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return root


def _files_named_by_the_guide() -> dict[str, str]:
    from pathlib import Path
    text = (Path(__file__).resolve().parent.parent / "docs" / "EXTENDING.md").read_text()
    sections = {"dialect": "## Add a dialect", "scenario": "## Add a scenario",
                "mutation": "## Add a fuzz mutation"}
    out = {}
    for key, head in sections.items():
        body = text.split(head, 1)[1].split("\n## ", 1)[0]
        out[key] = body
    return out


@pytest.mark.slow
def test_the_guide_followed_in_a_copy_of_the_tree_touches_only_the_files_it_names(tmp_path):
    import os
    import subprocess
    import sys
    guide = _files_named_by_the_guide()
    for key, files in GUIDE_FILES.items():  # the guide names what the trial touches
        for f in files:
            # the guide names the shipped matrix by its file name, which `harness init` copies
            named = "scenarios/<name>.py" if f.startswith("scenarios/trial") else \
                f.removeprefix("harness/data/")
            assert named in guide[key], (key, named)
    tree = tmp_path / "tree"
    _copy_tree(tree)
    before = {p.relative_to(tree): p.read_bytes() for p in tree.rglob("*") if p.is_file()}
    dialects = tree / "harness/proto/dialects.py"
    text = dialects.read_text()
    anchor = "# The dialects the reference peer is held to byte-exactness for"
    assert anchor in text
    dialects.write_text(text.replace(anchor, TRIAL_ROW.lstrip() + "\n" + anchor, 1))
    (tree / "scenarios/trial_memory.py").write_text(TRIAL_SCENARIO)
    matrix = tree / "harness/data/matrix.yaml"
    m = matrix.read_text()
    assert "\nscenarios: [handshake, " in m
    matrix.write_text(m.replace("\nscenarios: [handshake, ",
                                "\nscenarios: [trial-memory, handshake, ", 1))
    fields = tree / "harness/fuzz/strategies/fields.py"
    fields.write_text(fields.read_text() + TRIAL_MUTATION)
    changed = {p.relative_to(tree) for p in tree.rglob("*") if p.is_file()
               and before.get(p.relative_to(tree)) != p.read_bytes()}
    assert {str(p) for p in changed} == {f for fs in GUIDE_FILES.values() for f in fs}

    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update(PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1")

    def run(*argv, timeout=900):
        r = subprocess.run([sys.executable, *argv], cwd=tree, env=env, capture_output=True,
                           text=True, timeout=timeout)
        return r.returncode, r.stdout + r.stderr

    rc, out = run("-c", "import harness, scenarios; print(harness.__file__)")
    assert rc == 0 and str(tree) in out, out  # the copy is what runs
    rc, out = run("-m", "harness", "dialects", "--json")
    assert rc == 0 and '"7.1.0"' in out, out[-2000:]
    rc, out = run("-m", "harness", "list", "--json")
    assert rc == 0 and "trial-memory" in out, out[-2000:]
    rc, out = run("-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m",
                  "not realpeer and not slow",
                  "tests/test_dialect_table.py", "tests/test_proto_roundtrip.py",
                  "tests/test_conformance_8.py", "tests/test_scenarios.py",
                  "tests/test_strategies.py", "tests/test_error_roots.py")
    assert rc == 0, out[-4000:]
    # and the trial's facts hold where the table, the registry and the catalogue say
    rc, out = run("-c", "\n".join((
        "from harness.conformance.check import cases_for",
        "from harness.strategies import mutation_catalogue",
        "import scenarios  # registers every scenario module",
        "from harness.scenario import SCENARIOS",
        "c = {x.id: x for x in cases_for('7.1.0')}",
        "assert c['set-tensor-hash-null'].expect_for('7.1.0') == 'closed', c",
        "assert 'trial-memory' in SCENARIOS",
        "assert any(e['what'] == 'trial_max_size_device' for e in mutation_catalogue('7.1.0'))",
        "print('trial ok')")))
    assert rc == 0 and "trial ok" in out, out[-2000:]
