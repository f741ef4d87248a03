"""Partial-receive fuzzing against the real RDMA servers, over the soft verbs device.

The fixed cases of the product's RDMA fuzzer (:mod:`harness.fuzz.rdma`): the fuzzer is the
RDMA peer (the reference client's pyverbs transport, HELLO and setup as usual) and writes a
request stream as SENDs of sizes that do not match the server's reads: 7.0.0's read
boundaries, whole frames, bytes, ragged sizes, a small frame split at every boundary, a SEND
larger than the server's 256 KiB receive slot, a TCP close with SENDs in flight and a peer that
stops posting receives. :class:`~harness.fuzz.rdma.campaign.RdmaSession` runs each (verdicts
ok, wrong-data, closed, hang, rdma-error; death when the server process ended; liveness when it
no longer serves a correct client afterwards). The emulation's sans-IO model
(:func:`harness.transport.rdma_core.simulate_transfer`) predicts for every case whether the
receiver of each generation can take the stream: the real server must give a correct
response exactly when it predicts an intact transfer. The 7.0.0 server's whole-completion
receive is expected to fail on most cases (the findings); the seed-000 patch must take all of
them, and neither may die or get stuck.
"""

from __future__ import annotations

import json

import pytest

from harness.fuzz.case import HANDLE, sentinel, step
from harness.fuzz.rdma.campaign import RdmaSession, resolve_target
from harness.fuzz.rdma.plans import BUFFER_SIZES, RdmaCase, probe_steps, read_calls
from harness.proto import get_dialect
from harness.proto import messages as m
from harness.proto.codec import pack_request
from harness.proto.constants import RDMA_CHUNK
from harness.proto.behaviour import C_NEW, C_OLD, PARTIAL, WHOLE_COMPLETION
from harness.transport.rdma_core import OLD, simulate_transfer
from harness.transport.softverbs import softverbs_env

from softverbs_support import builds, lib_dir, pyverbs_session  # noqa: F401 (fixtures)
from test_realclient_support import RealServer, realpeer

pytestmark = [realpeer, pytest.mark.slow]

D = get_dialect("7.0.0")
HANG_AFTER = 2.0  # seconds without the response: a hang (the server's own reads never time out)
RECEIVER = {"old": dict(recv_policy=WHOLE_COMPLETION, read_calls=C_OLD),
            "new": dict(recv_policy=PARTIAL, read_calls=C_NEW),
            # GGML_RPC_LOAD_OPT=0 reads like 7.0.0 but keeps the seed's partial receive
            "new-load-opt-0": dict(recv_policy=PARTIAL, read_calls=C_OLD)}
TARGETS = {"old": ("p7", {}), "new": ("p7f", {}),
           "new-load-opt-0": ("p7f", {"GGML_RPC_LOAD_OPT": "0"})}
GET_BASE = (step(pack_request(D, m.BufferGetBaseRequest(sentinel(HANDLE, 1))),
                 "BUFFER_GET_BASE"),)
BIG_BUFFERS = (BUFFER_SIZES[0], 9 << 20)


def case(name: str, size: int | None, writes, **fields) -> RdmaCase:
    """``size`` bytes up and back through the probe (None: one BUFFER_GET_BASE)."""
    reqs = GET_BASE if size is None else tuple(probe_steps(size, 0))
    n = sum(len(s.frame) for s in reqs)
    if callable(writes):
        writes = writes(n)
    buffers = BIG_BUFFERS if size is not None and size > BUFFER_SIZES[1] else BUFFER_SIZES
    return RdmaCase(requests=reqs, writes=tuple(writes), plan={"what": name}, buffers=buffers,
                    **fields)


def cycled(sizes):
    def cut(n):
        out, i = [], 0
        while sum(out) < n:
            out.append(min(sizes[i % len(sizes)], n - sum(out)))
            i += 1
        return out
    return cut


def on_reads(size):
    """SENDs on 7.0.0's read boundaries (cmd, len, payload) of the probe of ``size``."""
    return lambda n: read_calls(b"".join(s.frame for s in probe_steps(size, 0)))


SET_64 = len(probe_steps(64, 0)[0].frame)
GET_BASE_LEN = len(GET_BASE[0].frame)
CASES = [
    case("aligned-reads", 64, on_reads(64)),
    case("whole-frames", 64, lambda n: [SET_64, n - SET_64]),
    case("one-send", 3000, lambda n: [n]),
    case("bytewise", 64, lambda n: [1] * n),
    case("ragged", 3000, cycled([7, 13, 1, 300, 2])),
    case("ragged-large", (1 << 20) + 3, cycled([100_000, RDMA_CHUNK, 5, 77_777])),
    *[case(f"split-at-{k}", None, [k, GET_BASE_LEN - k]) for k in range(1, GET_BASE_LEN)],
]
OVERSIZE = case("send-larger-than-a-slot", 300_000, lambda n: [n], chunk=2 * RDMA_CHUNK)
CLOSE = case("tcp-close-with-sends-in-flight", 4 << 20,
             lambda n: [1, 8, 2 << 20, n - (2 << 20) - 9], slots=8, close_after=3)
# the 8 MiB GET_TENSOR response fills the fuzzer's 6 MiB of receives, which it never reposts
STOP_RECEIVING = case("stops-posting-receives", 8 << 20, on_reads(8 << 20), starve=True)
FLOW_CONTROL = (OVERSIZE, CLOSE, STOP_RECEIVING)


def predicted_intact(c: RdmaCase, generation: str) -> bool:
    """The emulation's model of this server generation's receive path on this case."""
    res = simulate_transfer(c.stream, write_sizes=list(c.writes), chunk=c.chunk,
                            **RECEIVER[generation])
    return res.intact


@pytest.fixture(scope="module")
def campaign(builds, tmp_path_factory):
    """Every case against the three servers: {generation: {case name: observation}}."""
    tmp = tmp_path_factory.mktemp("rdma-fuzz")
    report = {}
    for gen, (target, env) in TARGETS.items():
        session = RdmaSession(resolve_target(target), tmp / gen, deadline=HANG_AFTER,
                              server_env=env)
        session.start()
        try:
            report[gen] = {c.plan["what"]: session.observe(c) for c in [*CASES, *FLOW_CONTROL]}
        finally:
            session.close()
    print(json.dumps({g: {n: o.result["verdict"] + (f"/{o.kind}" if o.kind else "")
                          for n, o in v.items()} for g, v in report.items()}, indent=1))
    return report


@pytest.mark.parametrize("generation", list(TARGETS))
def test_real_receive_path_matches_the_emulation_case_by_case(campaign, generation):
    disagree = {c.plan["what"]: (campaign[generation][c.plan["what"]].result,
                                 predicted_intact(c, generation))
                for c in CASES
                if (campaign[generation][c.plan["what"]].result["verdict"] == "ok")
                != predicted_intact(c, generation)}
    assert not disagree, f"real {generation} server vs the emulation: {disagree}"


def test_the_controls_work_on_both_and_the_old_server_has_findings(campaign):
    for gen in ("old", "new"):
        assert campaign[gen]["aligned-reads"].result["verdict"] == "ok", campaign[gen]
        assert campaign[gen]["bytewise"].result["verdict"] == "ok", campaign[gen]
    failing = [n for n, o in campaign["old"].items() if o.kind is not None]
    assert "whole-frames" in failing and "split-at-1" in failing, campaign["old"]
    assert {campaign["old"][n].kind for n in ("one-send", "ragged")} == {"death"}
    assert campaign["old"]["ragged"].signature.signal == "SIGSEGV"


def test_the_patched_server_takes_every_cut_and_survives_everything(campaign):
    new = campaign["new"]
    assert {n: o.result for n, o in new.items() if o.result["verdict"] != "ok"
            and n in {c.plan["what"] for c in CASES}} == {}
    assert all(o.kind is None for o in new.values()), {n: o.kind for n, o in new.items()}
    # a SEND larger than the receive slot is a length error: the connection ends, cleanly
    assert new[OVERSIZE.plan["what"]].result["verdict"] in ("closed", "rdma-error")
    assert new[CLOSE.plan["what"]].result["verdict"] == "closed-by-us"
    assert new[STOP_RECEIVING.plan["what"]].result["verdict"] == "closed-by-us"


def test_no_server_dies_or_wedges_on_the_flow_control_cases(campaign):
    """A SEND beyond the receive slot, a TCP close mid-frame with SENDs in flight, a peer
    that stops posting receives under a response: every server ends that connection and
    serves the next client (the liveness client ran after each: kind None)."""
    for gen, cases in campaign.items():
        for c in FLOW_CONTROL:
            o = cases[c.plan["what"]]
            assert o.kind is None and o.result.get("liveness") == "ok", (gen, o)
        # the device saw what each case is about: a length error; the server's SENDs told
        # "receiver not ready" by the peer that stopped posting
        assert sum(q["errors"] for q in cases[OVERSIZE.plan["what"]].server_qp) == 1, cases
        assert any(q["rnr_naks_received"] > 0
                   for q in cases[STOP_RECEIVING.plan["what"]].server_qp), cases


def test_the_emulation_check_would_catch_a_whole_completion_patch():
    """Planted fault for the comparison: had the patch kept 7.0.0's whole-completion receive,
    the model would predict failures on the cases the patched server passes."""
    assert not all(predicted_intact(c, "old") for c in CASES)


def test_load_opt_0_keeps_the_partial_receive(campaign):
    """What the emulation's docs got wrong: GGML_RPC_LOAD_OPT=0 is not the OLD generation
    on the receive side. The real server with it takes every cut 7.0.0 fails on, which the
    OLD preset (whole-completion) would predict to fail."""
    real = campaign["new-load-opt-0"]
    assert all(real[c.plan["what"]].result["verdict"] == "ok" for c in CASES), real
    assert not all(simulate_transfer(c.stream, write_sizes=list(c.writes), chunk=c.chunk,
                                     recv_policy=OLD.recv_policy,
                                     read_calls=OLD.read_calls).intact for c in CASES)


@pytest.mark.parametrize("config", ["OLD", "SEED000"])
def test_pyverbs_reference_client_against_the_patched_rdma_server(builds, lib_dir, tmp_path,
                                                                  config):
    """The reference client over pyverbs, stop-and-wait (7.0.0) or pipelined with the split
    SET_TENSOR (seed 000), uploads 20 MiB to the real patched server and reads it back."""
    stats = tmp_path / "server-qps"
    stats.mkdir()
    env = softverbs_env(lib_dir, stats_dir=stats)
    with RealServer(builds["new"], tmp_path / "server.log",
                    env={k: env[k] for k in ("LD_LIBRARY_PATH", "SOFTVERBS_STATS_DIR")}) as srv:
        out = pyverbs_session(lib_dir, tmp_path / "client-qps", 20 << 20, "client",
                              *srv.endpoint.rsplit(":", 1), config)
        log = srv.log()
    assert out["rdma_active"] and out["round_trip_ok"] and out["overruns"] == 0, out
    assert "RDMA activated" in log
    if config == "OLD":
        assert out["max_in_flight"] == 1, out
    else:
        assert 1 < out["max_in_flight"] <= 8, out

