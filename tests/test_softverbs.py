"""The soft verbs device (harness/native/softverbs): RC semantics checked in C through the
libibverbs API between two processes, each check shown to fail on a planted fault, and the
device seen by pyverbs and by a real llama.cpp RDMA build's probe."""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness.transport import softverbs
from harness.transport.softverbs import (
    QpStats,
    SoftverbsUnavailable,
    build_softverbs,
    rdma_carried_problems,
    softverbs_env,
)

from softverbs_support import build_semantics, run_semantics, softverbs_lib_dir

CASES = ["in_order", "length_error", "rnr_wait", "rnr_retry_exceeded", "no_such_qp", "inline",
         "protection_error", "completion_channel", "misuse", "flush", "not_ready_retried",
         "counted_before_seen"]


@pytest.fixture(scope="module")
def lib_dir():
    return softverbs_lib_dir()


@pytest.fixture(scope="module")
def semantics(lib_dir, tmp_path_factory):
    return build_semantics(lib_dir, tmp_path_factory.mktemp("semantics"))


def test_the_program_lists_every_case(semantics):
    listed = subprocess.run([str(semantics), "--list"], capture_output=True, text=True,
                            timeout=10).stdout.split()
    assert listed == CASES


@pytest.mark.parametrize("case", CASES)
def test_rc_semantics(semantics, lib_dir, case, tmp_path):
    r = run_semantics(semantics, lib_dir, case, tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == f"ok {case}", r.stdout + r.stderr


# Each planted fault must be caught by the case that checks that rule (by whichever of the
# two processes notices first).
@pytest.mark.parametrize("define, case, symptoms", [
    ("SOFTVERBS_PLANT_NO_RNR", "rnr_wait", ["send completed while no RECV was posted"]),
    ("SOFTVERBS_PLANT_NO_RNR", "rnr_retry_exceeded", ["expected RNR retry counter exceeded"]),
    ("SOFTVERBS_PLANT_TRUNCATE", "length_error", ["status success, expected local length error",
                                                  "status success, expected remote invalid"]),
    # the receiver's error completion before its NAK: the receiver exits on the completion,
    # the NAK never leaves, and the sender times out instead of seeing the remote error
    ("SOFTVERBS_PLANT_LATE_ANSWER", "protection_error", ["expected remote operation error"]),
    # counters written after the completions: whoever looks first sees the other's stale count
    ("SOFTVERBS_PLANT_LATE_COUNT", "counted_before_seen", ["receiver's recv_bytes 0",
                                                           "sender's send_bytes 0"]),
])
def test_rc_semantics_catch_a_planted_fault(semantics, define, case, symptoms, tmp_path):
    planted = softverbs_lib_dir((define,))
    r = run_semantics(semantics, planted, case, tmp_path)
    assert r.returncode != 0 and f"FAIL {case}" in r.stdout, r.stdout + r.stderr
    assert any(s in r.stdout for s in symptoms), r.stdout


def test_build_names_the_missing_headers(monkeypatch, tmp_path):
    monkeypatch.setattr(softverbs, "HEADER", "infiniband/no-such-header.h")
    with pytest.raises(SoftverbsUnavailable, match="libibverbs-dev"):
        build_softverbs(out_dir=tmp_path)


def test_build_names_a_missing_compiler(tmp_path):
    with pytest.raises(SoftverbsUnavailable, match="no C compiler"):
        build_softverbs(cc="no-such-cc", out_dir=tmp_path)


def test_env_puts_the_device_first_and_leaves_the_rest(lib_dir):
    env = softverbs_env(lib_dir, stats_dir="/s", log=True,
                        base={"LD_LIBRARY_PATH": "/x", "SOFTVERBS_ADDRS": "10.0.0.1"})
    assert env["LD_LIBRARY_PATH"] == f"{lib_dir}:/x"
    assert env["SOFTVERBS_STATS_DIR"] == "/s" and env["SOFTVERBS_LOG"] == "1"
    assert "SOFTVERBS_ADDRS" not in env  # not asked for: the default (127.0.0.1) applies


PYVERBS_PROBE = r"""
from harness.transport.verbs import find_device, verbs_available
print(verbs_available()[1]); d = find_device("127.0.0.1"); print(d.name, d.gid_index, d.roce_v2)
"""


def test_pyverbs_sees_the_soft_device(lib_dir):
    """pyverbs (Debian's, bind-now, linked against rdma-core) loads the soft libibverbs and
    finds the RoCE v2 GID of the loopback address, as harness.transport.verbs probes it."""
    r = subprocess.run([sys.executable, "-c", PYVERBS_PROBE], capture_output=True, text=True,
                       timeout=60, env=softverbs_env(lib_dir))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["RDMA devices: softverbs0", "softverbs0 3 True"]


def _qp(qpn, dest, sent, received, errors=0) -> QpStats:
    return QpStats(pid=1, qpn=qpn, dest_qpn=dest, state="RTS", sends=1, send_bytes=sent,
                   inline_sends=0, max_send=sent, recvs=1, recv_bytes=received,
                   rnr_naks_sent=0, rnr_naks_received=0, retries=0, errors=errors)


def test_rdma_carried_accepts_a_session_that_went_over_the_qps():
    assert rdma_carried_problems(_qp(5, 9, 100, 80), _qp(9, 5, 80, 100), 80,
                                 "RDMA activated: qpn=9->5 mtu=1024") == []


@pytest.mark.parametrize("client, server, log, problem", [
    (_qp(5, 9, 100, 80), _qp(9, 5, 80, 100), "transport: TCP", "never logged"),
    (_qp(5, 9, 100, 80), _qp(9, 5, 80, 100), "RDMA activated: qpn=9->6", "not QP 9 -> 5"),
    (_qp(5, 8, 100, 80), _qp(9, 5, 80, 100), None, "not connected"),
    (_qp(5, 9, 100, 80), _qp(9, 5, 80, 100, errors=1), None, "error completions"),
    (_qp(5, 9, 100, 80), _qp(9, 5, 80, 99), None, "bytes lost"),
    (_qp(5, 9, 100, 10), _qp(9, 5, 10, 100), None, "less than the payload"),
])
def test_rdma_carried_names_each_planted_fault(client, server, log, problem):
    problems = rdma_carried_problems(client, server, 80, log)
    assert len(problems) == 1 and problem in problems[0], problems
