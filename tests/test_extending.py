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
