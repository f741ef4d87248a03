"""Seed 000 in all four roles: the real C 7f build (p7f) and the reference 7.0.0+flags peer are
two independent implementations of the same description, so the no-bump design with real C
(no-bump-c) and the emulated one (no-bump: ref-7f in the new roles) must put the same
canonical bytes on the wire in every cell both run. Any difference is a bug in one of them.

Tolerated, each named in ``_TOLERATED`` and nothing else beyond pointer renaming:
* GET_DEVICE_MEMORY values: the real server reports this host's RAM, the reference a constant;
* llama.cpp's tensor names carry the endpoint it connected to (the cell's proxy port);
* the result of a MUL_MAT read back: ggml-cpu converts the f32 activations to f16 for its dot
  product, the reference multiplies in f32 (the compute scenario checks both within 1e-3).
"""

from __future__ import annotations

import copy
import re

import pytest

from harness.data import default_matrix
from harness.capture.canonical import first_divergence
from harness.capture.differ import load_cell_sessions
from harness.matrix.cells import expand
from harness.matrix.execute import run_cells
from harness.matrix.model import load_matrix
from harness.proto.ggml import OP

REAL, EMULATED = "no-bump-c", "no-bump"
_ENDPOINT_IN_NAME = re.compile(r"\[127\.0\.0\.1:\d+\]")


def _tolerated(session: list[dict]) -> list[dict]:
    """The canonical session with the tolerated values (module docstring) blanked."""
    out = copy.deepcopy(session)
    mul_mat = OP["MUL_MAT"]  # 7.0.0's numbering, which the 7f builds share
    for e in out:
        if e["cmd"] == "GET_DEVICE_MEMORY" and e.get("response"):
            e["response"] = {k: "host" for k in e["response"]}
        for msg in (e.get("request"), e.get("response")):
            for t in _tensors(msg):
                t["name"] = _ENDPOINT_IN_NAME.sub("[endpoint]", t["name"])
        tensor = (e.get("request") or {}).get("tensor")
        if e["cmd"] == "GET_TENSOR" and tensor and tensor["op"] == mul_mat and e.get("response"):
            e["response"]["data"] = {"len": e["response"]["data"]["len"]}
    return out


def _tensors(msg) -> list[dict]:
    if not isinstance(msg, dict):
        return []
    found = []
    for v in msg.values():
        if isinstance(v, dict) and "name" in v and "op" in v:
            found.append(v)
        elif isinstance(v, list):
            found += [t for t in v if isinstance(t, dict) and "name" in t and "op" in t]
    return found


def wire_differences(a: list[list[dict]], b: list[list[dict]]) -> list[str]:
    """Connection by connection, the first difference of two cells' canonical sessions."""
    if len(a) != len(b):
        return [f"{len(a)} connection(s) against {len(b)}"]
    found = []
    for i, (x, y) in enumerate(zip(a, b)):
        d = first_divergence(_tolerated(x), _tolerated(y))
        if d is not None:
            found.append(f"connection {i}: {d}")
    return found


def twins(rows: list[dict]) -> list[tuple[dict, dict]]:
    """Each cell of the real design with the emulated design's cell of the same pairing,
    scenario and cache; both must have run."""
    key = lambda r: (r["pair"], r["cache"], r["scenario"], r["transport"])  # noqa: E731
    emulated = {key(r): r for r in rows if r["design"] == EMULATED}
    return [(r, emulated[key(r)]) for r in rows
            if r["design"] == REAL and key(r) in emulated and r["verdict"] != "skip"
            and emulated[key(r)]["verdict"] != "skip"]


# ------------------------------------------------------------------------------ real peers
@pytest.mark.slow
@pytest.mark.realpeer
@pytest.mark.matrix
def test_reference_7f_and_c_7f_agree_on_the_wire_in_every_cell(tmp_path):
    m = load_matrix(default_matrix())
    # model-load and mixed-fleet need real programs in every role: no-bump has no twin cell
    # for most of them, and old/old is the same p7 build in both designs
    # (comm-allreduce is 8.0.0+ only: not applicable in these 7.0.0 designs)
    scenarios = [s for s in m.scenarios if s not in ("model-load", "mixed-fleet",
                                                      "comm-allreduce")]
    cells = expand(m, designs=[REAL, EMULATED], scenarios=scenarios)
    rows = run_cells(m, cells, tmp_path, run_id="twins", workers=2)
    assert [r["cell_id"] for r in rows if r["verdict"] != "pass"] == []
    pairs = twins(rows)
    # every cell of the real design has its emulated twin: 4 pairings x every scenario x cache
    assert len(pairs) == len([c for c in cells if c.design == REAL])
    found = {}
    for real, emulated in pairs:
        diff = wire_differences(load_cell_sessions(tmp_path / real["folder"]),
                                load_cell_sessions(tmp_path / emulated["folder"]))
        if diff:
            found[real["cell_id"]] = diff
    assert found == {}


# ------------------------------------------------------------------------------ the check itself
def _session(flags: int = 1, free: int = 1 << 33, name: str = "RPC0[127.0.0.1:4001]#x",
             op: int = 0, data: str = "aa") -> list[dict]:
    tensor = {"id": "T1", "op": op, "name": name}
    return [
        {"cmd": "HELLO", "request": {}, "response": {"major": 7, "flags": flags}},
        {"cmd": "GET_DEVICE_MEMORY", "request": {"device": 0},
         "response": {"free_mem": free, "total_mem": free}},
        {"cmd": "SET_TENSOR", "request": {"tensor": dict(tensor)}},
        {"cmd": "GET_TENSOR", "request": {"tensor": dict(tensor)},
         "response": {"data": {"len": 4, "fnv": data}}},
    ]


def test_tolerated_values_are_not_differences():
    mul_mat = OP["MUL_MAT"]
    assert wire_differences([_session(free=1, op=mul_mat)],
                            [_session(free=2, name="RPC0[127.0.0.1:4999]#x", op=mul_mat,
                                      data="bb")]) == []


@pytest.mark.parametrize("fault", [
    {"flags": 0},  # a server that drops the cache bit
    {"data": "bb"},  # different data read back from a tensor that is not a MUL_MAT result
    {"name": "RPC0[127.0.0.1:4001]#y"},  # a different tensor name beyond the endpoint
])
def test_a_planted_difference_is_found(fault):
    assert wire_differences([_session()], [_session(**fault)])


def test_connection_counts_must_match():
    assert wire_differences([_session()], [_session(), _session()])


def test_twins_pair_cells_of_the_same_pairing_scenario_and_cache():
    def row(design, pair, verdict="pass", cache=False):
        return {"design": design, "pair": pair, "cache": cache, "scenario": "alloc",
                "transport": "tcp", "verdict": verdict, "cell_id": f"{design}:{pair}"}
    rows = [row(REAL, "a"), row(EMULATED, "a"), row(REAL, "b"), row(EMULATED, "b", "skip"),
            row(REAL, "a", cache=True)]
    assert [(r["cell_id"], e["cell_id"]) for r, e in twins(rows)] == [
        (f"{REAL}:a", f"{EMULATED}:a")]
