"""A lockstep run pins a close to its step by waiting after each step that has no answer. The
wait ends early once the server is seen asleep (Target.is_idle): it closes before it sleeps,
so a close would be there by then. The close stays pinned to its step; without the probe each
unanswered step costs the whole wait."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from types import SimpleNamespace

from harness.fuzz.case import BASE, HANDLE, annotate, sentinel, step
from harness.fuzz.case_runner import CaseRunner
from harness.fuzz.execute import CLOSED, Executor
from harness.fuzz.target import Target
from harness.fuzz.target_spec import TargetSpec
from harness.proto import get_dialect, pack_request
from harness.proto import messages as m
from harness.proto.tensor import RpcTensor
from harness import strategies as rst

from test_realclient_support import realpeer, require_peer_dir

D7 = get_dialect("7.0.0")
UPLOADS = 12  # SET_TENSOR has no answer in 7.0.0: each is a lockstep wait


def _is_idle(pid: int):
    return Target.is_idle(SimpleNamespace(_local_pid=lambda: pid))


def test_a_sleeping_process_is_idle_and_a_spinning_one_is_not():
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        assert _is_idle(sleeper.pid) is True
        assert any(_is_idle(spinner.pid) is False for _ in range(20))
    finally:
        for p in (sleeper, spinner):
            p.kill()
            p.wait()
    assert _is_idle(sleeper.pid) is None  # gone: cannot tell


def _uploads_then_one_past_the_end() -> tuple:
    def upload(offset: int):
        t = RpcTensor(id=1, type=0, buffer=sentinel(HANDLE, 0), ne=(64, 1, 1, 1),
                      nb=(4, 256, 256, 256), data=sentinel(BASE, 0) + offset)
        return step(pack_request(D7, m.SetTensorRequest(t, 0, 0, bytes(256))), "SET_TENSOR")
    head = (step(rst.hello_request_frame(D7), "HELLO"),
            step(pack_request(D7, m.AllocBufferRequest(0, 4096)), "ALLOC_BUFFER",
                 learn=(HANDLE, 0)),
            step(pack_request(D7, m.BufferGetBaseRequest(sentinel(HANDLE, 0))),
                 "BUFFER_GET_BASE", learn=(BASE, 0)))
    # the last upload lies past the buffer's end: p7 aborts on it (a GGML_ASSERT), which
    # closes the connection
    return annotate(D7, head + tuple(upload(256 * i) for i in range(UPLOADS))
                    + (upload(4096 - 128),))


@realpeer
def test_the_close_is_pinned_and_the_waits_end_when_the_server_sleeps(tmp_path):
    require_peer_dir()
    case = _uploads_then_one_past_the_end()
    target = Target(TargetSpec.parse("p7", None), tmp_path / "w")
    target.start()
    try:
        runner = CaseRunner(target)
        runner.ensure_running()
        t0 = time.monotonic()
        out = runner.executor.run(case, lockstep=True)
        probed = time.monotonic() - t0
        assert out.status == CLOSED and out.at == len(case.steps) - 1, (out.status, out.at)
        # planted: no probe, every upload waits the whole 50 ms (on a new server: the abort
        # may land after the close, so ensure_running could still see the old one alive)
        runner.restart()
        runner.executor.idle_probe = None
        t0 = time.monotonic()
        out = runner.executor.run(case, lockstep=True)
        waited = time.monotonic() - t0
        assert out.status == CLOSED and out.at == len(case.steps) - 1
        assert waited >= UPLOADS * runner.executor.lockstep_wait
        assert probed < waited / 2, (probed, waited)
    finally:
        target.stop()


def test_a_probe_that_cannot_tell_waits_the_whole_wait(monkeypatch):
    """A docker target (no local pid) answers None: the executor waits as before."""
    import socket
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        ex = Executor("127.0.0.1", listener.getsockname()[1], idle_probe=lambda: None)
        a, _ = socket.socket(), None
        a.connect(listener.getsockname())
        t0 = time.monotonic()
        assert not ex._ended_within(a, 0.1)
        assert time.monotonic() - t0 >= 0.1
        a.close()
    finally:
        listener.close()


def _refused_clear() -> tuple:
    """HELLO, then a BUFFER_CLEAR of a buffer never allocated: the server must close."""
    case = annotate(D7, (step(rst.hello_request_frame(D7), "HELLO"),
                         step(pack_request(D7, m.BufferClearRequest(0xDEAD000, 0)),
                              "BUFFER_CLEAR")))
    return dataclasses.replace(case, protocol_error_at=1)


def _run_refused_clear(tmp_path, knobs: str, probe=None, deadline: float = 0.5):
    target = Target(TargetSpec.parse(f"ref:{knobs}", "7.0.0"), tmp_path / knobs.replace("=", "-"))
    target.start()
    try:
        runner = CaseRunner(target, deadline=deadline)
        runner.ensure_running()
        ex = runner.executor
        ex.idle_probe = probe or target.is_idle
        t0 = time.monotonic()
        for mode in (False, True):  # pipelined, then lockstep
            out = ex.run(_refused_clear(), lockstep=mode)
            if out.status != CLOSED:
                break
            runner.restart()
            ex = runner.executor
            ex.idle_probe = probe or target.is_idle
        return out, time.monotonic() - t0
    finally:
        target.stop()


def test_a_server_still_busy_at_the_close_deadline_is_given_time(tmp_path):
    """A server that takes longer than the deadline to get to its close (1.2 s of CPU before
    the refused request, against a 1 s deadline; a loaded machine zeroing an announced
    payload) is not a server that keeps the connection open: while it is seen working the
    wait goes on, up to a bound (4 s here: room for a third of a core)."""
    knobs = "spin_on=BUFFER_CLEAR,spin_seconds=1.2"
    out, _ = _run_refused_clear(tmp_path, knobs, deadline=1.0)
    assert out.status == CLOSED, (out.status, out.detail)
    # planted: a probe that always says asleep judges the same server at the deadline
    out, _ = _run_refused_clear(tmp_path, knobs, probe=lambda: True, deadline=1.0)
    assert out.status != CLOSED and "still open" in out.detail, (out.status, out.detail)


def test_a_server_asleep_with_the_connection_open_is_judged_at_the_deadline(tmp_path):
    out, took = _run_refused_clear(tmp_path, "stall_on=BUFFER_CLEAR")
    assert out.status != CLOSED and "still open" in out.detail, (out.status, out.detail)
    assert took < 0.5 + 1.0, took  # the deadline and a recheck or two, not the grace
