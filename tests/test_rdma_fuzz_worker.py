"""The RDMA fuzz worker's handle: a worker that stops answering is stopped and reported with
where it was stuck (its Python stack), one that exits with how it ended (its traceback).

The CI run of stop 27 lost a p7f campaign to a worker that gave no answer, and the report
said no more than that; these are the checks that the next one says where.
"""

from __future__ import annotations

import socket

import pytest

from harness.fuzz.rdma.worker import FuzzPeer, WorkerDied

from softverbs_support import lib_dir  # noqa: F401 (fixture: the soft device)


@pytest.fixture
def silent_server():
    """A TCP server that takes the connection and never answers (HELLO waits forever)."""
    srv = socket.create_server(("127.0.0.1", 0))
    srv.listen(4)
    yield f"127.0.0.1:{srv.getsockname()[1]}"
    srv.close()


def _stuck(lib_dir, tmp_path, endpoint) -> str:
    with FuzzPeer(lib_dir, tmp_path / "stats", tmp_path / "worker.log") as peer:
        with pytest.raises(WorkerDied) as e:
            peer.call({"op": "liveness", "endpoint": endpoint, "timeout": 60}, deadline=1.5)
        assert not peer.alive()  # stopped and reaped, not left waiting
    return str(e.value)


def test_a_silent_worker_is_stopped_and_says_where_it_waited(lib_dir, tmp_path, silent_server):
    msg = _stuck(lib_dir, tmp_path, silent_server)
    assert "gave no answer within 1.5 s" in msg, msg
    assert "most recent call first" in msg and "run_liveness" in msg, msg


def test_planted_without_the_stack_request_the_message_has_no_stack(
        lib_dir, tmp_path, silent_server, monkeypatch):
    monkeypatch.setattr(FuzzPeer, "_where_stuck", lambda self: None)
    msg = _stuck(lib_dir, tmp_path, silent_server)
    assert "gave no answer" in msg and "run_liveness" not in msg, msg


def test_a_worker_that_exits_says_how(lib_dir, tmp_path):
    with FuzzPeer(lib_dir, tmp_path / "stats", tmp_path / "worker.log") as peer:
        with pytest.raises(WorkerDied) as e:
            peer.call({"op": "no-such-op"}, deadline=30)
    msg = str(e.value)
    assert "exited (1) without an answer" in msg and "KeyError: 'no-such-op'" in msg, msg


def test_a_deep_stack_keeps_both_ends_in_the_message():
    """Stop 38's cold CI run: the worker was still importing pyverbs when the deadline came, and
    a dump of 300 import frames pushed its header out of the last 3,000 characters."""
    from harness.fuzz.rdma.worker import _log_excerpt
    frames = '  File "<frozen importlib._bootstrap>", line 1147 in _find_and_load_unlocked\n' * 300
    log = ("earlier output\nCurrent thread 0x00007f (most recent call first):\n" + frames
           + '  File "worker.py", line 146 in run_liveness\n')
    msg = _log_excerpt(log)
    assert msg.startswith("Current thread") and "run_liveness" in msg and len(msg) < 6100
    assert "most recent call first" not in log[-3000:]  # what the message showed before
    # a traceback (a worker that exited) is shown by its end, as before
    assert _log_excerpt("x" * 5000 + "KeyError: 'op'") == ("x" * 5000 + "KeyError: 'op'")[-3000:]
