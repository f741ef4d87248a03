"""Partial-receive fuzzing against the real RDMA servers, over the soft verbs device.

The fuzzer is the RDMA peer (the reference client's pyverbs transport, HELLO and setup as
usual) and then writes a request stream as SENDs of sizes that do not match the server's
reads: whole frames, bytes, ragged sizes, a small frame split at every boundary, a SEND
larger than the server's 256 KiB receive slot, and a TCP close with SENDs in flight. Each
case gets a verdict (ok, wrong-data, closed, hang, rdma-error; death when the server process
ended; stuck when it no longer serves a correct client afterwards). The emulation's sans-IO
model (:func:`harness.transport.rdma_emu.simulate_transfer`) predicts for every case whether
the receiver of each generation can take the stream: the real server must give a correct
response exactly when it predicts an intact transfer. The 7.0.0 server's whole-completion
receive is expected to fail on most cases (the findings); the seed-000 patch must take all of
them, and neither may die or get stuck.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from harness.proto import RpcTensor, get_dialect, ggml
from harness.proto import messages as m
from harness.proto.codec import pack_request
from harness.proto.constants import RDMA_CHUNK
from harness.transport.rdma_emu import (C_NEW, C_OLD, OLD, PARTIAL, WHOLE_COMPLETION,
                                        simulate_transfer)
from harness.transport.softverbs import read_qp_stats, softverbs_env

from softverbs_support import FuzzPeer, builds, lib_dir, pyverbs_session  # noqa: F401 (fixtures)
from test_realclient_support import RealServer, realpeer

pytestmark = [realpeer, pytest.mark.slow]

D = get_dialect("7.0.0")
HANG_AFTER = 2.0  # seconds without the response: a hang (the server's own reads never time out)
RECEIVER = {"old": dict(recv_policy=WHOLE_COMPLETION, read_calls=C_OLD),
            "new": dict(recv_policy=PARTIAL, read_calls=C_NEW),
            # GGML_RPC_LOAD_OPT=0 reads like 7.0.0 but keeps the seed's partial receive
            "new-load-opt-0": dict(recv_policy=PARTIAL, read_calls=C_OLD)}
TARGETS = {"old": ("old", {}), "new": ("new", {}),
           "new-load-opt-0": ("new", {"GGML_RPC_LOAD_OPT": "0"})}


def stream_of(frames: str, size: int) -> bytes:
    """The request bytes the fuzz worker writes (same layout; pointers differ, lengths not)."""
    t = RpcTensor.make(id=0x1000, type=ggml.TYPE_I8, ne=(max(size, 1),), buffer=1, data=1)
    if frames == "get-base":
        return pack_request(D, m.BufferGetBaseRequest(1))
    return pack_request(D, m.SetTensorRequest(t, 0, 0, bytes(size))) + \
        pack_request(D, m.GetTensorRequest(t, 0, size))


def case(name: str, frames: str, size: int, writes, *, chunk: int = RDMA_CHUNK, slots: int = 1,
         close_early: bool = False, hold: float = 0.0) -> dict:
    n = len(stream_of(frames, size))
    if callable(writes):
        writes = writes(n)
    return {"name": name, "frames": frames, "size": size, "writes": list(writes), "chunk": chunk,
            "slots": slots, "close_early": close_early, "hold": hold, "timeout": HANG_AFTER}


def cycled(sizes):
    def cut(n):
        out, i = [], 0
        while sum(out) < n:
            out.append(min(sizes[i % len(sizes)], n - sum(out)))
            i += 1
        return out
    return cut


SET_GET_64 = len(pack_request(D, m.SetTensorRequest(
    RpcTensor.make(id=1, type=ggml.TYPE_I8, ne=(64,)), 0, 0, bytes(64))))
GET_BASE = len(stream_of("get-base", 0))
CASES = [
    case("aligned-reads", "set-get", 64,
         lambda n: [1, 8, SET_GET_64 - 9, 1, 8, n - SET_GET_64 - 9]),
    case("whole-frames", "set-get", 64, lambda n: [SET_GET_64, n - SET_GET_64]),
    case("one-send", "set-get", 3000, lambda n: [n]),
    case("bytewise", "set-get", 64, lambda n: [1] * n),
    case("ragged", "set-get", 3000, cycled([7, 13, 1, 300, 2])),
    case("ragged-large", "set-get", (1 << 20) + 3, cycled([100_000, RDMA_CHUNK, 5, 77_777])),
    *[case(f"split-at-{k}", "get-base", 0, [k, GET_BASE - k]) for k in range(1, GET_BASE)],
]
OVERSIZE = case("send-larger-than-a-slot", "set-get", 300_000, lambda n: [n],
                chunk=2 * RDMA_CHUNK)
CLOSE = case("tcp-close-with-sends-in-flight", "set-get", 4 << 20,
             lambda n: [1, 8, 2 << 20], slots=8, close_early=True)
SET_8M = len(pack_request(D, m.SetTensorRequest(
    RpcTensor.make(id=1, type=ggml.TYPE_I8, ne=(8 << 20,)), 0, 0, bytes(8 << 20))))
# the 8 MiB GET_TENSOR response fills the fuzzer's 6 MiB of receives, which it never reposts
STOP_RECEIVING = case("stops-posting-receives", "set-get", 8 << 20,
                      lambda n: [1, 8, SET_8M - 9, 1, 8, n - SET_8M - 9], hold=1.0)
LIVENESS = case("liveness", "get-base", 0, [1, 8, GET_BASE - 9])


def predicted_intact(c: dict, generation: str) -> bool:
    """The emulation's model of this server generation's receive path on this case."""
    res = simulate_transfer(stream_of(c["frames"], c["size"]), write_sizes=c["writes"],
                            chunk=c["chunk"], **RECEIVER[generation])
    return res.intact


class Target:
    """A real RDMA server under fuzzing; restarted when a case killed or wedged it."""

    def __init__(self, bin_dir: Path, lib_dir: Path, tmp: Path, env: dict):
        self.bin_dir, self.lib_dir, self.tmp, self.env = bin_dir, lib_dir, tmp, env
        self.starts = 0
        self.srv = None
        self.start()

    def start(self) -> None:
        self.starts += 1
        d = self.tmp / f"server-{self.starts}"
        d.mkdir(parents=True)
        self.qps = d / "qps"
        env = softverbs_env(self.lib_dir, stats_dir=d / "qps")
        (d / "qps").mkdir()
        self.srv = RealServer(self.bin_dir, d / "server.log",
                              env={k: env[k] for k in ("LD_LIBRARY_PATH", "SOFTVERBS_STATS_DIR")}
                              | self.env)

    def stop(self) -> None:
        self.srv.stop()

    def run(self, peer: FuzzPeer, c: dict) -> dict:
        """The case's verdict; then death / stuck from the server's state afterwards."""
        before = {(q.pid, q.qpn) for q in read_qp_stats(self.qps)}
        out = dict(peer.run(dict(c, endpoint=self.srv.endpoint), deadline=60))
        time.sleep(0.1)  # a crash lands just after the bad completion
        # the server's QP of this case, as the device last saw it
        out["server_qp"] = [{k: getattr(q, k) for k in ("state", "errors", "rnr_naks_received")}
                            for q in read_qp_stats(self.qps) if (q.pid, q.qpn) not in before]
        exit_info = self.srv.proc.poll()
        if exit_info is not None:
            out.update(verdict="death", exit=str(exit_info))
            self.start()
            return out
        alive = peer.run(dict(LIVENESS, endpoint=self.srv.endpoint), deadline=60)
        if alive["verdict"] != "ok":
            out.update(after="stuck", liveness=alive)
            self.stop()
            self.start()
        return out




@pytest.fixture(scope="module")
def campaign(builds, lib_dir, tmp_path_factory):
    """Every case against both servers: {generation: {case name: verdict dict}}."""
    tmp = tmp_path_factory.mktemp("rdma-fuzz")
    report = {}
    with FuzzPeer(lib_dir, tmp / "fuzzer-qps") as peer:
        for gen, (build, env) in TARGETS.items():
            target = Target(builds[build], lib_dir, tmp / gen, env)
            try:
                report[gen] = {c["name"]: target.run(peer, c) for c in [*CASES, OVERSIZE, CLOSE, STOP_RECEIVING]}
            finally:
                target.stop()
    (tmp / "report.json").write_text(json.dumps(report, indent=1))
    print(json.dumps({g: {n: r["verdict"] + ("/" + r["after"] if "after" in r else "")
                          for n, r in v.items()} for g, v in report.items()}, indent=1))
    return report


@pytest.mark.parametrize("generation", list(TARGETS))
def test_real_receive_path_matches_the_emulation_case_by_case(campaign, generation):
    disagree = {c["name"]: (campaign[generation][c["name"]], predicted_intact(c, generation))
                for c in CASES
                if (campaign[generation][c["name"]]["verdict"] == "ok")
                != predicted_intact(c, generation)}
    assert not disagree, f"real {generation} server vs the emulation: {disagree}"


def test_the_controls_work_on_both_and_the_old_server_has_findings(campaign):
    for gen in ("old", "new"):
        assert campaign[gen]["aligned-reads"]["verdict"] == "ok", campaign[gen]
        assert campaign[gen]["bytewise"]["verdict"] == "ok", campaign[gen]
    failing = [n for n, r in campaign["old"].items() if r["verdict"] != "ok"]
    assert "whole-frames" in failing and "split-at-1" in failing, campaign["old"]


def test_the_patched_server_takes_every_cut_and_survives_everything(campaign):
    new = campaign["new"]
    assert {n: r for n, r in new.items() if n in {c["name"] for c in CASES}
            and r["verdict"] != "ok"} == {}
    assert all("after" not in r and r["verdict"] != "death" for r in new.values()), new
    # a SEND larger than the receive slot is a length error: the connection ends, cleanly
    assert new[OVERSIZE["name"]]["verdict"] in ("closed", "rdma-error"), new[OVERSIZE["name"]]
    assert new[CLOSE["name"]]["verdict"] == "closed-by-us"
    assert new[STOP_RECEIVING["name"]]["verdict"] == "closed-by-us"


def test_no_server_dies_or_wedges_on_the_flow_control_cases(campaign):
    """A SEND beyond the receive slot, a TCP close mid-frame with SENDs in flight, a peer
    that stops posting receives under a response: every server ends that connection and
    serves the next client."""
    for gen, cases in campaign.items():
        for c in (OVERSIZE, CLOSE, STOP_RECEIVING):
            r = cases[c["name"]]
            assert r["verdict"] != "death" and "after" not in r, (gen, r)
        # the device saw what each case is about: a length error; the server's SENDs told
        # "receiver not ready" by the peer that stopped posting
        assert [q["errors"] for q in cases[OVERSIZE["name"]]["server_qp"]] == [1], cases
        assert [q["rnr_naks_received"] > 0
                for q in cases[STOP_RECEIVING["name"]]["server_qp"]] == [True], cases


def test_the_emulation_check_would_catch_a_whole_completion_patch():
    """Planted fault for the comparison: had the patch kept 7.0.0's whole-completion receive,
    the model would predict failures on the cases the patched server passes."""
    assert not all(predicted_intact(c, "old") for c in CASES)


def test_load_opt_0_keeps_the_partial_receive(campaign):
    """What the emulation's docs got wrong: GGML_RPC_LOAD_OPT=0 is not the OLD generation
    on the receive side. The real server with it takes every cut 7.0.0 fails on, which the
    OLD preset (whole-completion) would predict to fail."""
    real = campaign["new-load-opt-0"]
    assert all(real[c["name"]]["verdict"] == "ok" for c in CASES), real
    assert not all(simulate_transfer(stream_of(c["frames"], c["size"]), write_sizes=c["writes"],
                                     chunk=c["chunk"], recv_policy=OLD.recv_policy,
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
