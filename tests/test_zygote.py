"""Restarts by fork (harness/impls/zygote.c and zygote.py): a fuzz target's real server is
held at its zygote point and each restart forks a fresh server from it. Each test here is the
property a fork must share with a restart by exec, checked on the real peers."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from types import SimpleNamespace

import pytest

from harness.fuzz.case_runner import CaseRunner
from harness.fuzz.replay import load
from harness.fuzz.signature import death_line, reproduces
from harness.fuzz.target import Target
from harness.fuzz.target_spec import TargetSpec
from harness.data import shipped
from harness.releases.watch import reproducer_dirs
from harness.impls.supervisor import ServerProcess
from harness.impls.zygote import Zygote, ZygoteChild, ZygoteUnsupported
from needs import peer

pytestmark = pytest.mark.realpeer

PEERS = [("p7", "7.0.0"), ("p8", "8.0.0")]


def _gone(pid: int, within: float = 5.0) -> bool:
    end = time.monotonic() + within
    while os.path.exists(f"/proc/{pid}"):
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


@pytest.mark.parametrize("name,dialect", PEERS)
def test_a_restart_forks_a_fresh_server_from_one_zygote(name, dialect, tmp_path):
    peer(name)
    target = Target(TargetSpec.parse(name, dialect), tmp_path / "t", standby=True)
    target.start()
    zygote = target.zygote
    pids = [target.server.pid]
    try:
        assert isinstance(target.server, ZygoteChild) and zygote is not None
        for _ in range(20):
            os.kill(target.server.pid, signal.SIGABRT)  # a crash
            info = target.wait_exit(5.0)
            assert info is not None and info.signal == signal.SIGABRT  # the status, relayed
            target.restart()
            pids.append(target.server.pid)
            assert target.zygote is zygote and target.answers_hello(timeout=5.0)
        assert zygote.forks == 21 and len(set(pids)) == 21
        # the zygote never serves: its HELLO comes from the child
        assert target.server.pid != zygote.pid
    finally:
        target.stop()
    for pid in pids + [zygote.pid]:
        assert _gone(pid), pid


@pytest.mark.parametrize("name,dialect", PEERS)
def test_a_dead_childs_port_refuses_connections(name, dialect, tmp_path):
    """What the campaign reads a death from: a connection refused, not one queued in a
    backlog nobody accepts (it would be, if the zygote held the listening socket)."""
    peer(name)
    target = Target(TargetSpec.parse(name, dialect), tmp_path / "t", standby=True)
    target.start()
    try:
        os.kill(target.server.pid, signal.SIGKILL)
        assert target.wait_exit(5.0) is not None
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", target.port), timeout=2.0).close()
    finally:
        target.stop()


@pytest.mark.parametrize("name,dialect", PEERS)
def test_every_shipped_crash_reproduces_in_turn_on_one_zygote(name, dialect, tmp_path):
    """The findings the project ships (found with restarts by exec, and replayed that way by
    `harness fuzz replay`) reproduce on forked servers, one after another from the same
    zygote: the same death line, read from the log of the child that died and of no other
    (a child's log is what was written after its fork)."""
    peer(name)
    folders = sorted(d for d in reproducer_dirs(shipped("reproducers"))
                     if d.name.startswith(f"{name}-crash-"))
    assert folders, "no shipped reproducers for " + name
    target = Target(TargetSpec.parse(name, dialect), tmp_path / "t", standby=True)
    target.start()
    try:
        for folder in folders:
            case, expected, _ = load(folder / "repro.rpct")
            assert not [line for line in target.log_lines() if death_line([line])], \
                "a fresh child's log carries an earlier child's death"
            verdict, _ = CaseRunner(target).check(case, lockstep=True, restart=False)
            assert verdict is not None and reproduces(expected, verdict.signature), \
                (folder.name, verdict)
            assert isinstance(target.server, ZygoteChild)
            target.restart()
        assert target.zygote.forks == len(folders) + 1
    finally:
        target.stop()


def test_the_zygote_and_its_children_die_with_the_harness(tmp_path):
    """A harness killed outright (no finally runs) leaves no server behind: the zygote
    exits when its control socket closes, a child when its zygote dies."""
    peer("p7")
    script = textwrap.dedent(f"""
        import os, sys, time
        from pathlib import Path
        from harness.fuzz.target import Target
        from harness.fuzz.target_spec import TargetSpec
        t = Target(TargetSpec.parse("p7", "7.0.0"), Path({str(tmp_path)!r}) / "t", standby=True)
        t.start()
        print(t.zygote.pid, t.server.pid, flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        zygote_pid, child_pid = map(int, proc.stdout.readline().split())
        assert os.path.exists(f"/proc/{child_pid}")
    finally:
        proc.kill()
        proc.wait()
    assert _gone(zygote_pid) and _gone(child_pid)


def test_a_server_that_binds_around_the_shim_is_restarted_by_exec(tmp_path):
    """The zygote point is the shim's bind(): a server that never calls it (here, one whose
    LD_PRELOAD is cleared on the way) is refused as a zygote, and a target falls back to
    restarts by exec instead of waiting for a zygote that will not come."""
    p7 = peer("p7")
    argv, env = p7.server_cmd("{host}", 0, None, 1, line_buffered=False)
    # (not env(1): it reads the binary's path, which has a '=' in the peers' cache, as an
    # assignment)
    argv = ["sh", "-c", 'unset LD_PRELOAD; exec "$@"', "sh",
            *(a if a != "0" else "{port}" for a in argv)]
    with pytest.raises(ZygoteUnsupported):
        Zygote.start(argv, env, name="p7", workdir=tmp_path / "z", ready_timeout=15)

    target = Target(TargetSpec.parse("p7", "7.0.0"), tmp_path / "t", standby=True)

    def unsupported(*a, **k):
        raise ZygoteUnsupported("planted")
    target._launch_zygote = unsupported
    target.start()
    try:
        assert isinstance(target.server, ServerProcess) and not target.forking
        assert target.answers_hello(timeout=5.0)
    finally:
        target.stop()


def test_sanitizer_builds_and_cached_targets_restart_by_exec(tmp_path):
    """Children of a zygote share what it set up: not ASan's RSS-limit thread (a fork has
    only the forking thread), nor a hash cache's files. Those targets keep exec."""
    peer("p7")
    cached = Target(TargetSpec.parse("p7", "7.0.0"), tmp_path / "c", standby=True, cache=True)
    assert not cached.forking
    peer("p7+asan+ubsan")
    target = Target(TargetSpec.parse("p7+asan+ubsan", "7.0.0"), tmp_path / "t", standby=True)
    target.start()
    try:
        assert isinstance(target.server, ServerProcess) and target.zygote is None
    finally:
        target.stop()


def test_a_reused_pid_is_a_new_child_not_the_dead_one():
    """Kernels wrap pids (pid_max 32,768 here; a p7 campaign forks about 60 children a
    second): a new child with a dead child's pid must not inherit its exit status or its
    listen() record. The messages as the zygote and the children send them, in the order the
    zygote's loop guarantees (the dead child's X before the fork that reuses its pid), with
    the new child's L before or after the zygote's P."""
    for listen_first in (False, True):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            z = Zygote.__new__(Zygote)
            Zygote.__init__(z, process=SimpleNamespace(name="z", host="127.0.0.1", port=1),
                            control=ours)
            for msg in (b"P 4242", b"L 4242 0 0", b"X 4242 0"):  # a child that exited 0
                theirs.send(msg)
            z._pump(0.0)
            assert z._exits[4242] == 0
            new = [b"L 4242 0 0", b"P 4242"] if listen_first else [b"P 4242"]
            for msg in new:
                theirs.send(msg)
            z._pump(0.0)
            assert 4242 not in z._exits, "the new child looks dead with the old one's exit"
            assert (4242 in z._listened) == listen_first, z._listened
        finally:
            ours.close()
            theirs.close()
