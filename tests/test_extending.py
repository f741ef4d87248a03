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


def _design_naming(row) -> Matrix:
    return Matrix.model_validate({
        "implementations": {"ref-9": {"kind": "ref", "proto": "9.0.0"}},
        "designs": {"d": {"roles": {"old-client": "ref-9", "new-client": row.name,
                                    "old-server": "ref-9", "new-server": row.name}}},
        "scenarios": ["handshake"], "expectations": []})


def version_rule_misses(m: Matrix) -> list[str]:
    """Cells whose expectation is not the version rule's for their two dialects."""
    from harness.matrix.cells import expand, expectation_for
    from harness.proto.dialects import client_accepts, get_dialect
    out = []
    for cell in expand(m):
        c = get_dialect(m.implementations[cell.client].proto)
        s = get_dialect(m.implementations[cell.server].proto)
        e = expectation_for(m, cell)
        want = "works" if client_accepts(c.version, s.version) else "rejected-at-hello"
        if e.outcome != want or (want != "works" and f"mismatch: {s.version_str}" not in e.message):
            out.append(f"{cell.id}: expected {e.outcome}, the version rule says {want}")
    return out


def test_a_design_naming_the_row_gets_cells_with_the_version_rules_expectations(registered):
    m = _design_naming(registered)
    assert m.designs["d"].roles["new-server"] == "ref-9.1.0-example"
    assert m.implementations["ref-9.1.0-example"].proto == registered.name
    assert not version_rule_misses(m)


def test_the_old_catch_all_fails_the_version_rule_check(registered, monkeypatch):
    # planted: no rule matched used to mean "works" (same major assumed); a 9.0.0 client
    # refuses a 9.1.0 server
    from harness.matrix import cells
    from harness.matrix.model import Expectation
    monkeypatch.setattr(cells, "predict", lambda c, s: Expectation(outcome="works"))
    assert any("d:ref-9_ref-9.1.0-example:handshake" in miss
               for miss in version_rule_misses(_design_naming(registered)))


# ------------------------------------------------------------------ the worked trial, for real
# docs/EXTENDING.md followed literally in a clean export of the tree (tracked and untracked
# files): a dialect row (7.0.0 with one behaviour of 8.0.0 changed) with a design that names it,
# a scenario file and two mutations (a field one and a framing one), each written into exactly
# the files the guide names; then in fresh processes of that copy: `harness list` gives the
# row cells, `harness matrix` runs them and they pass, and the suite's dialect, conformance,
# scenario and strategy tests pass (with their own --basetemp). A guide that names too few
# files, or code that still lists dialects, scenarios or mutations elsewhere, fails.

TRIAL_ROW = '''
# worked trial (tests/test_extending.py): 7.0.0 whose SET_TENSOR_HASH validates its tensor
D710 = Dialect("7.1.0", (7, 1, 0), _IDS_5, evidence="[INF] worked trial",
               peer=dataclasses.replace(OLD_PEERS, server_hash_checks_tensor=True),
               rdma=RDMA_PROTO7, numbering=GGML_7)
DIALECTS[D710.name] = D710
'''
TRIAL_DESIGN = '''
  trial:  # worked trial (tests/test_extending.py): the 7.1.0 row, named by its version
    description: worked trial - old = the reference 7.0.0, new = the reference 7.1.0
    scenarios: [handshake, trial-memory]
    roles: {old-client: ref-7, new-client: "7.1.0", old-server: ref-7, new-server: "7.1.0"}'''
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
TRIAL_FRAMING = '''

@mutation("framing", "trial_len_one_over", fields=("len",), applies=_is_fixed,
          refused_at=("len",))
def _(draw, site):
    frame = site.frame()
    n = len(frame) - REQUEST_HEADER_SIZE + 1  # one byte more than the fixed size, none sent
    return site.mutation("len", request_frame(frame[0], frame[REQUEST_HEADER_SIZE:], n), value=n)
'''
GUIDE_FILES = {  # what docs/EXTENDING.md says each addition touches
    "dialect": ["harness/proto/dialects.py", "tests/test_dialect_table.py",
                "harness/data/matrix.yaml"],
    "scenario": ["scenarios/trial_memory.py", "harness/data/matrix.yaml"],
    "mutation": ["harness/strategies/fields.py", "harness/strategies/framing.py"],
}


def _export_tree(dest):
    """The working tree as git sees it: tracked files and the untracked ones it does not
    ignore (an uncommitted change is part of what the guide is tried on)."""
    import shutil
    import subprocess
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=root, capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = root / rel
        if src.is_file():  # a tracked file deleted in the working tree is not exported
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


def _insert(path, anchor: str, text: str, *, after: bool = False) -> None:
    body = path.read_text()
    assert anchor in body, (path, anchor)
    path.write_text(body.replace(anchor, anchor + text if after else text + anchor, 1))


def _changed(tree, before: dict) -> set[str]:
    return {str(p.relative_to(tree)) for p in tree.rglob("*") if p.is_file()
            and before.get(p.relative_to(tree)) != p.read_bytes()}


def test_the_changed_file_check_sees_an_untracked_file_and_a_stray_edit(tmp_path):
    # planted: an edit outside the guide's files, and a new file nobody named
    (tmp_path / "a.py").write_text("x = 1\n")
    before = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*")}
    (tmp_path / "a.py").write_text("x = 2\n")
    (tmp_path / "b.py").write_text("")
    assert _changed(tmp_path, before) == {"a.py", "b.py"}


# test_scenarios.py's tests that run cells of fixed reference implementations and scenarios
# named in the test (REF7, a 6.0.0/7.0.0 liar), none read from a registry the trial adds to:
# the copy's run of them would repeat the suite's own run (about 100 s of the trial's 290 s).
FIXED_CELL_TESTS = (
    "test_honest_reference_cells_pass_every_stricter_check",
    "test_client_that_sends_after_the_hello_it_rejects_fails_that_check",
    "test_two_clients_each_read_back_their_own_pattern",
    "test_every_data_check_fails_on_wrong_expected_bytes",
    "test_load_checks_every_byte_of_every_tensor",
    "test_a_client_that_hashes_unlike_its_label_is_misconfigured",
    "test_a_client_speaking_another_dialect_than_its_label_is_misconfigured",
    "test_pytest_plugin_fails_a_missing_peer_unless_allowed",
)


def _runs_a_design_of_its_own(name: str) -> bool:
    import inspect

    import test_scenarios
    source = inspect.getsource(getattr(test_scenarios, name))
    return "one_design(" in source and "SCENARIOS" not in source and "DIALECTS" not in source


def test_the_fixed_cell_tests_name_real_tests_of_fixed_cells():
    """Each deselected test exists (a renamed one raises here, not silently runs again) and
    builds its own design; planted: a test that reads the scenario registry is refused."""
    assert all(_runs_a_design_of_its_own(name) for name in FIXED_CELL_TESTS)
    assert not _runs_a_design_of_its_own("test_every_scenario_module_registers_itself")
    with pytest.raises(AttributeError):
        _runs_a_design_of_its_own("test_renamed_meanwhile")


@pytest.mark.slow
def test_the_guide_followed_in_a_copy_of_the_tree_touches_only_the_files_it_names(tmp_path):
    import json
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
    _export_tree(tree)
    before = {p.relative_to(tree): p.read_bytes() for p in tree.rglob("*") if p.is_file()}
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update(PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1")

    def run(*argv, timeout=900):
        r = subprocess.run([sys.executable, *argv], cwd=tree, env=env, capture_output=True,
                           text=True, timeout=timeout)
        return r.returncode, r.stdout + r.stderr

    def pytest_in_tree(*args):  # temporary folders of its own, not the shared ones
        return run("-m", "pytest", "-q", "-p", "no:cacheprovider",
                   f"--basetemp={tmp_path / 'nested'}", *args)

    # a dialect: the row; the derived versions it changes, pasted from what the check prints;
    # a design naming the row by its version, which gives the row cells
    _insert(tree / "harness/proto/dialects.py",
            "# The dialects the reference peer is held to byte-exactness for",
            TRIAL_ROW.lstrip() + "\n")
    rc, out = pytest_in_tree("tests/test_dialect_table.py::"
                             "test_every_derivable_version_maps_to_its_pinned_row")
    assert rc == 1 and "7.1.1: 7.0.1 -> 7.1.0" in out, out[-3000:]
    from test_dialect_table import DERIVED, TABLE_BEGIN, TABLE_END, format_table
    printed = out.split(TABLE_BEGIN + "\n", 1)[1].split("\n" + TABLE_END, 1)[0]
    pins = tree / "tests/test_dialect_table.py"
    assert format_table(DERIVED) in pins.read_text()
    pins.write_text(pins.read_text().replace(format_table(DERIVED), printed, 1))
    matrix = tree / "harness/data/matrix.yaml"
    _insert(matrix, "\ndesigns:\n", TRIAL_DESIGN.lstrip("\n") + "\n", after=True)
    # a scenario
    (tree / "scenarios/trial_memory.py").write_text(TRIAL_SCENARIO)
    _insert(matrix, "\nscenarios: [handshake, ", "trial-memory, ", after=True)
    # two mutations: a field one and a framing one
    for name, text in (("fields.py", TRIAL_MUTATION), ("framing.py", TRIAL_FRAMING)):
        module = tree / "harness/strategies" / name
        module.write_text(module.read_text() + text)
    assert _changed(tree, before) == {f for fs in GUIDE_FILES.values() for f in fs}

    rc, out = run("-c", "import harness, scenarios; print(harness.__file__)")
    assert rc == 0 and str(tree) in out, out  # the copy is what runs
    rc, out = run("-m", "harness", "dialects", "--json")
    assert rc == 0 and '"7.1.0"' in out, out[-2000:]
    rc, out = run("-m", "harness", "list", "--json")
    assert rc == 0, out[-2000:]
    cells = [c for c in json.loads(out) if "ref-7.1.0" in (c["client"], c["server"])]
    # three pairs with the row, each with handshake (cache off and on) and the trial scenario
    assert len(cells) == 9 and {c["scenario"] for c in cells} == {"handshake", "trial-memory"}
    # the version rule: a 7.0.0 client refuses a 7.1.0 server (a newer minor), nothing else
    refused = {c["id"] for c in cells if c["expected"].startswith("rejected-at-hello")}
    assert refused == {c["id"] for c in cells if c["pair"] == "old-client/new-server"}, cells
    reports = tmp_path / "reports"  # the row's cells run, and pass
    rc, out = run("-m", "harness", "matrix", "--no-releases", "--design", "trial",
                  "--out", str(reports))
    verdicts = {r["cell_id"]: r["verdict"] for f in reports.glob("*/results.jsonl")
                for r in map(json.loads, f.read_text().splitlines())}
    assert rc == 0 and set(verdicts) >= {c["id"] for c in cells}, out[-3000:]
    assert set(verdicts.values()) == {"pass"}, verdicts
    rc, out = pytest_in_tree("-x", "-m", "not realpeer and not slow", "-rA",
                             "tests/test_dialect_table.py", "tests/test_proto_roundtrip.py",
                             "tests/test_conformance_features.py", "tests/test_scenarios.py",
                             "tests/test_strategies.py", "tests/test_error_roots.py",
                             *(f"--deselect=tests/test_scenarios.py::{t}"
                               for t in FIXED_CELL_TESTS))
    assert rc == 0, out[-4000:]
    # the row was held to the catalogue, and the framing check read the new mutation's entry
    assert "PASSED tests/test_conformance_features.py::test_every_row_meets_the_catalogue_on_its_" \
           "reference_server[7.1.0]" in out, out[-4000:]
    # and the trial's facts hold where the table, the registry and the catalogue say
    rc, out = run("-c", "\n".join((
        "from harness.conformance.check import cases_for",
        "from harness.strategies import MUTATIONS, mutation_catalogue",
        "import scenarios  # registers every scenario module",
        "from harness.scenario import SCENARIOS",
        "c = {x.id: x for x in cases_for('7.1.0')}",
        "assert c['set-tensor-hash-null'].expect_for('7.1.0') == 'closed', c",
        "assert 'trial-memory' in SCENARIOS",
        "whats = {e['what'] for e in mutation_catalogue('7.1.0')}",
        "assert {'trial_max_size_device', 'trial_len_one_over'} <= whats, whats",
        "assert MUTATIONS[('framing', 'trial_len_one_over')].never_runs",
        "print('trial ok')")))
    assert rc == 0 and "trial ok" in out, out[-2000:]
