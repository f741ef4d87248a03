"""Restarts by fork: a real server held at its zygote point (the zygote.c preload shim).

A fuzz campaign restarts the server after every crash, and p7 aborts on every tensor outside
its buffer: a sweep restarts it ten thousand times. A restart by exec pays the process start,
the dynamic loader and the backends' initialisation each time; a restart by fork pays a fork.
The server runs as usual up to its first bind() of a TCP socket, where the shim turns it into
a zygote; :meth:`Zygote.spawn` forks a child that goes on from there (binds, listens, serves)
and returns a :class:`ZygoteChild`, which stands where a :class:`ServerProcess` does.

What a child shares with a process started afresh: everything the server set up before
binding, which is all a restart would redo. What it does not: a fresh address-space layout
(every child has the zygote's), and its own log files (children write to the zygote's, and a
child's log is the part written after it was forked: only one child lives at a time).
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import time
from collections.abc import Mapping
from pathlib import Path

import psutil

from .cache import cache_root
from .driver import ExitInfo
from .errors import ImplError
from .loopback import preload_env
from .preload_shim import compile_shared_object
from .supervisor import (BIND_FAILED_TEXT, ArgvSpec, ServerProcess, ServerStartError, _merge_tail,
                         exit_info_from, free_port)

SHIM_SOURCE = Path(__file__).with_name("zygote.c")
SHIM_NAME = "libzygote.so"
CONTROL_FD_ENV = "HARNESS_ZYGOTE_FD"
_LOG_SEGMENT_BYTES = 256 * 1024
_POLL = 0.0005  # readiness is a message: waiting for it is a select, this only bounds a slice


class ZygoteUnsupported(ImplError):
    """The server never reached the zygote point (its bind() is not the shim's: a static
    binary, a setuid one, a container): restart it by exec."""


def ensure_zygote_shim(*, cc: str = "cc", timeout: float = 60.0) -> Path:
    """zygote.c compiled (libc and libdl only), cached per source and compiler."""
    key = hashlib.sha256(SHIM_SOURCE.read_bytes() + cc.encode()).hexdigest()[:16]
    out = cache_root() / "shims" / f"zygote-{key}" / SHIM_NAME
    if out.exists():
        return out
    return compile_shared_object(cc, ["-O2", "-shared", "-fPIC", "-Wall", "-Werror",
                                      str(SHIM_SOURCE), "-ldl"], out, timeout)


def _status_to_returncode(status: int) -> int:
    """A wait status as subprocess spells it: -signal, or the exit code."""
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else status


class Zygote:
    """One server process held at its zygote point. Create with :meth:`start`."""

    def __init__(self, process: ServerProcess, control: socket.socket):
        self.process = process
        self.control = control
        self.name = process.name
        self.host = process.host
        self.port = process.port
        self.forks = 0
        self._exits: dict[int, int] = {}  # pid -> wait status
        self._listened: dict[int, tuple[int, int]] = {}  # pid -> (rc, errno) of listen()
        self._forked: list[int] = []
        self._ready = False
        self._live: ZygoteChild | None = None

    @classmethod
    def start(cls, argv: ArgvSpec, env: Mapping[str, str], *, name: str,
              host: str = "127.0.0.1", workdir: Path, ready_timeout: float = 30.0,
              shim: Path | None = None) -> "Zygote":
        """Launch ``argv`` (as :meth:`ServerProcess.start` takes it; a free port is picked) with the
        shim first in LD_PRELOAD and wait for the zygote point. Raises ZygoteUnsupported when
        the server listens without reaching it, ServerStartError when it dies or times out."""
        shim = shim or ensure_zygote_shim()
        Path(workdir).mkdir(parents=True, exist_ok=True)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            env = preload_env({**env, CONTROL_FD_ENV: str(theirs.fileno())}, shim)
            process = ServerProcess._launch(argv, env, name=name, host=host,
                                            port=free_port(host), workdir=Path(workdir),
                                            owns_workdir=False, pass_fds=(theirs.fileno(),))
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        zygote = cls(process, ours)
        try:
            zygote._wait_ready(ready_timeout)
        except BaseException:
            zygote.stop()
            raise
        return zygote

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self._ready:
            self._pump(0.01)
            if self._ready:
                return
            info = self.process.poll()
            if info is not None:
                raise ServerStartError(f"{self.name}: exited before its zygote point "
                                       f"(rc={info.returncode}, signal={info.signal}) "
                                       f"{info.message}", exit_info=info, log_tail=info.log_tail)
            if self.process._is_listening():
                raise ZygoteUnsupported(f"{self.name}: listens without the zygote shim's bind")
            if time.monotonic() > deadline:
                raise ServerStartError(f"{self.name}: no zygote point after {timeout:g} s",
                                       log_tail=self.process.log_tail(30))

    def _pump(self, timeout: float = 0.0) -> None:
        """Read the control messages that have come (waiting up to ``timeout`` for one)."""
        self.control.settimeout(timeout if timeout > 0 else 0.0)
        while True:
            try:
                msg = self.control.recv(64)
            except (BlockingIOError, TimeoutError, InterruptedError):
                return
            except OSError:
                return
            if not msg:
                return  # the zygote is gone; its process's poll says how
            fields = msg.decode("ascii", "replace").split()
            kind, nums = fields[0], [int(f) for f in fields[1:] if f.lstrip("-").isdigit()]
            if kind == "R":
                self._ready = True
            elif kind == "P" and nums:
                # A pid comes back once the kernel wraps (pid_max is 32,768 on many machines;
                # a campaign forks 60 children a second): an earlier child's exit is not this
                # one's. Its "X" came before this fork, which reused the reaped pid.
                self._exits.pop(nums[0], None)
                self._forked.append(nums[0])
            elif kind == "X" and len(nums) >= 2:
                # Its listen() record goes with it: the next child of that pid says its own
                # "L", perhaps before the zygote's "P" for it arrives.
                self._listened.pop(nums[0], None)
                self._exits[nums[0]] = nums[1]
            elif kind == "L" and len(nums) >= 3:
                self._listened[nums[0]] = (nums[1], nums[2])
            self.control.settimeout(0.0)

    def spawn(self, timeout: float = 30.0) -> "ZygoteChild":
        """Fork a child and wait until it listens. The previous child must be stopped (one
        child at a time: a child's log is what was written after its fork)."""
        if self._live is not None and self._live.poll() is None:
            raise ImplError(f"{self.name}: a child still runs ({self._live.pid})")
        if not self.alive:
            raise ServerStartError(f"{self.name}: the zygote is gone",
                                   log_tail=self.process.log_tail(30))
        starts = {p: _size(p) for p in (self.process.stdout_path, self.process.stderr_path)}
        known = len(self._forked)
        try:
            self.control.sendall(b"f")
        except OSError as e:
            raise ServerStartError(f"{self.name}: the zygote does not answer: {e}") from None
        deadline = time.monotonic() + timeout
        while len(self._forked) == known:
            self._pump(0.05)
            if time.monotonic() > deadline or not self.alive:
                raise ServerStartError(f"{self.name}: the zygote forked no child",
                                       log_tail=self.process.log_tail(30))
        child = ZygoteChild(self, self._forked[known], starts)
        self.forks += 1
        self._live = child
        while True:
            listened = self._listened.get(child.pid)
            if listened is not None:
                rc, err = listened
                if rc == 0:
                    return child
                child.stop()
                raise ServerStartError(f"{self.name}: listen failed ({os.strerror(err)})",
                                       log_tail=child.log_tail(30))
            info = child.poll()
            if info is not None:
                bind_lost = any(BIND_FAILED_TEXT in line for line in info.log_tail)
                raise ServerStartError(
                    f"{self.name}: " + (f"could not bind {self.host}:{self.port}" if bind_lost
                                        else f"child exited before listening (rc="
                                             f"{info.returncode}) {info.message}"),
                    exit_info=info, log_tail=info.log_tail)
            if time.monotonic() > deadline:
                child.stop()
                raise ServerStartError(f"{self.name}: child not listening after {timeout:g} s",
                                       log_tail=child.log_tail(30))
            self._pump(0.05)

    def stop(self, timeout: float = 5.0) -> ExitInfo:
        """Stop the live child and the zygote (which takes any other child with it)."""
        if self._live is not None:
            self._live.stop(timeout)
        try:
            self.control.close()  # the zygote kills its children and exits on this alone
        except OSError:
            pass
        return self.process.stop(timeout)

    def __repr__(self) -> str:
        return f"<Zygote {self.name} pid={self.pid} {self.host}:{self.port} forks={self.forks}>"


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _read_segment(path: Path, start: int, limit: int = _LOG_SEGMENT_BYTES) -> list[str]:
    """Lines written to ``path`` after ``start`` (the last ``limit`` bytes of them)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            begin = max(start, size - limit)
            f.seek(begin)
            data = f.read()
    except OSError:
        return []
    if begin > start:
        data = data[data.find(b"\n") + 1:]
    return data.decode(errors="replace").splitlines()


class ZygoteChild:
    """One server forked from a zygote: a :class:`ServerProcess` to its users (pid, port,
    poll, stop, logs), its exit status reported by the zygote that reaps it."""

    def __init__(self, zygote: Zygote, pid: int, log_starts: dict[Path, int]):
        self.zygote = zygote
        self._pid = pid
        self.name = zygote.name
        self.host = zygote.host
        self.workdir = zygote.process.workdir
        self.stdout_path = zygote.process.stdout_path
        self.stderr_path = zygote.process.stderr_path
        self.argv = zygote.process.argv
        self.log_starts = dict(log_starts)
        self._exit_info: ExitInfo | None = None
        self._final_logs: tuple[list[str], list[str]] | None = None

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def port(self) -> int:
        return self.zygote.port

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def banner_version(self) -> str | None:
        return self.zygote.process.banner_version

    def _logs(self) -> tuple[list[str], list[str]]:
        if self._final_logs is not None:
            return self._final_logs
        return (_read_segment(self.stdout_path, self.log_starts[self.stdout_path]),
                _read_segment(self.stderr_path, self.log_starts[self.stderr_path]))

    def log_tail(self, n: int = 20) -> list[str]:
        out, err = self._logs()
        return _merge_tail(out, err, n)

    def log_text(self) -> str:
        out, err = self._logs()
        return "\n".join(out + err)

    def poll(self) -> ExitInfo | None:
        if self._exit_info is not None:
            return self._exit_info
        self.zygote._pump(0.0)
        status = self.zygote._exits.get(self._pid)
        if status is not None:
            rc = _status_to_returncode(status)
        elif not self.zygote.alive and not os.path.exists(f"/proc/{self._pid}"):
            rc = -signal.SIGKILL  # the zygote died, and the child with it (PDEATHSIG)
        else:
            return None
        out, err = self._logs()
        self._exit_info = exit_info_from(rc, out, err)
        return self._exit_info

    def wait(self, timeout: float) -> ExitInfo | None:
        """How the child ended, waiting up to ``timeout`` s for the zygote's report of it
        (a death is a message, not a state to poll for)."""
        deadline = time.monotonic() + timeout
        while (info := self.poll()) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if not self.zygote.alive:
                time.sleep(min(left, 0.005))
            self.zygote._pump(min(left, 0.05))
        return info

    @property
    def running(self) -> bool:
        return self.poll() is None

    def rss_bytes(self) -> int | None:
        try:
            return psutil.Process(self._pid).memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return None

    def stop(self, timeout: float = 5.0) -> ExitInfo:
        """SIGKILL the child (nothing of a server's is saved at exit) and wait for the zygote
        to report it reaped."""
        deadline = time.monotonic() + timeout
        if self.poll() is None:
            try:
                os.kill(self._pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            while self.poll() is None and time.monotonic() < deadline:
                self.zygote._pump(0.05)
        info = self.poll()
        if info is None:  # the zygote did not report it: it is gone or wedged; stop it all
            self.zygote.process.stop(timeout)
            info = self.poll() or exit_info_from(-signal.SIGKILL, *self._logs())
            self._exit_info = info
        if self._final_logs is None:
            self._final_logs = self._logs()
        if self.zygote._live is self:
            self.zygote._live = None
        return info

    def __enter__(self) -> "ZygoteChild":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<ZygoteChild {self.name} pid={self._pid} {self.endpoint}>"
