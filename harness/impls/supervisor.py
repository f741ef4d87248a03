"""Start, watch and stop ggml-rpc server processes (real llama.cpp peers or the reference peer).

Facts this module is built around (notes/real-peers.md §4):

* the server prints its banner *before* listen(), so readiness is the port in LISTEN state,
  read from /proc/net/tcp: a connect probe would be seen (and served) by the
  one-client-at-a-time server;
* a bind failure prints "Failed to create server socket" and exits 0, so the exit code alone
  does not tell;
* the banner goes to stdout on builds up to 7.0.0 and to stderr on the proto-8 library, so both
  streams are logged and read;
* every child runs in its own process group and is killed and reaped at stop(), when the object
  is collected, or at interpreter exit, whichever comes first.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import psutil

from .driver import ExitInfo
from .errors import ImplError, PeerUnavailable

BANNER_RE = re.compile(r"Starting RPC server v(\d+\.\d+\.\d+)")
BIND_FAILED_TEXT = "Failed to create server socket"
# what a lost port race looks like: the C server's message, or Python's (reference server)
_BIND_LOST = (BIND_FAILED_TEXT, "Address already in use")
_ABORT_RE = re.compile(r"GGML_ABORT|GGML_ASSERT|\babort", re.IGNORECASE)
_ERROR_RE = re.compile(r"error|fail|abort|assert|mismatch|unknown|expected|crash|invalid|"
                       r"cannot|can't|refus|denied|exception|traceback", re.IGNORECASE)
_TCP_LISTEN = "0A"
_POLL_INTERVAL = 0.02
# The environment of every real llama.cpp process the harness runs: ggml must not attach gdb
# before it aborts, and glibc must write its fatal messages ("double free or corruption",
# "malloc(): corrupted top size", "*** stack smashing detected ***") to stderr, where a death
# is read from (without the variable it writes them to the process's terminal when it has
# one: the servers run in a session of their own, but a client may share the user's).
REAL_PROCESS_ENV = {"GGML_NO_BACKTRACE": "1", "LIBC_FATAL_STDERR_": "1"}
# A real server listens 5-30 ms after exec and a campaign restarts one after each crash (p7
# aborts on every tensor outside its buffer: thousands of restarts per sweep), so the first
# 100 ms are polled every millisecond (a /proc read, no CPU to speak of), then every 20 ms.
_FAST_POLL, _FAST_POLL_FOR = 0.001, 0.1
_BIND_RETRIES = 3

ArgvSpec = Sequence[str] | Callable[[str, int], Sequence[str]]


class Terminated(KeyboardInterrupt):
    """SIGTERM, delivered as an interrupt: every path that unwinds on Ctrl-C unwinds on it too
    (hypothesis, which turns other exceptions into examples to shrink, lets it through)."""

    exit_code = 128 + signal.SIGTERM


def exit_on_sigterm() -> None:
    """Make SIGTERM (a cancelled CI job, ``kill``) raise :class:`Terminated` in the main
    thread, so the ``finally`` blocks that stop servers, containers and campaigns run.
    Python's default is to die at once, leaving every server it started running. A handler
    someone else installed is kept."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _exit_for_signal)


_terminated = threading.Event()


def terminated() -> bool:
    """Whether SIGTERM arrived (a command that reports an interrupt must not then exit 0)."""
    return _terminated.is_set()


def _exit_for_signal(signum, frame) -> None:
    _terminated.set()
    raise Terminated()


class ServerStartError(ImplError):
    """The server did not reach LISTEN: it exited, failed to bind, or timed out."""

    def __init__(self, message: str, exit_info: ExitInfo | None = None,
                 log_tail: list[str] | None = None):
        self.exit_info = exit_info
        self.log_tail = log_tail or []
        detail = "\n".join("    " + line for line in self.log_tail[-15:])
        super().__init__(message + (f"\n  log tail:\n{detail}" if detail else ""))


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (the caller retries if it is taken meanwhile)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


_EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
_FIXED_PORTS_FROM = 10000  # below: well-known and registered services a user may run


def _ephemeral_low(path: str = _EPHEMERAL_RANGE) -> int:
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default low bound


def free_fixed_port(host: str = "127.0.0.1", attempts: int = 200) -> int:
    """A port for a peer to bind later by number (a COMM_INIT's rank-0 listen): free now and
    below the ephemeral range, so no connection's source port or port-0 bind can take it in
    the meantime, and a connect to it cannot pick it as its own source port (self-connect).
    A free_port() port was taken that way in a CI matrix: 'failed to listen on comm port'."""
    import random
    low = _ephemeral_low()
    if low <= _FIXED_PORTS_FROM + 1:
        return free_port(host)
    for _ in range(attempts):
        port = random.randrange(_FIXED_PORTS_FROM, low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise OSError(f"no free port in {_FIXED_PORTS_FROM}..{low - 1} after {attempts} tries")


def _proc_net_addr(host: str, port: int) -> str:
    # /proc/net/tcp prints the IPv4 address as the raw in-memory u32, i.e. byte-reversed hex.
    packed = socket.inet_aton(host)
    return f"{packed[::-1].hex().upper()}:{port:04X}"


_NETLINK_SOCK_DIAG, _SOCK_DIAG_BY_FAMILY = 4, 20
_NLM_F_REQUEST, _NLM_F_DUMP, _NLMSG_ERROR, _NLMSG_DONE = 1, 0x300, 2, 3
_TCP_LISTEN_STATE = 10


def _sock_diag_listeners() -> list[tuple[str, int, int]] | None:
    """(address, port, inode) of every IPv4 TCP socket in LISTEN, asked of the kernel over
    NETLINK_SOCK_DIAG. Unlike /proc/net/tcp this never lists TIME_WAIT sockets, of which a
    fuzzing run leaves thousands (reading them all made each readiness poll take 15 ms)."""
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG)
    except (OSError, AttributeError):
        return None
    out = []
    with sock:
        sock.settimeout(2.0)
        req = struct.pack("=BBBxI", socket.AF_INET, socket.IPPROTO_TCP, 0,
                          1 << _TCP_LISTEN_STATE) + bytes(48)  # inet_diag_req_v2, any sockid
        sock.send(struct.pack("=IHHII", 16 + len(req), _SOCK_DIAG_BY_FAMILY,
                              _NLM_F_REQUEST | _NLM_F_DUMP, 1, 0) + req)
        while True:
            try:
                data = sock.recv(1 << 16)
            except OSError:
                return None
            off = 0
            while off + 16 <= len(data):
                length, kind = struct.unpack_from("=IH", data, off)
                if kind == _NLMSG_DONE:
                    return out
                if kind == _NLMSG_ERROR or length < 16:
                    return None
                body = off + 16  # inet_diag_msg: family, state, timer, retrans, sockid, ...
                (sport,) = struct.unpack_from(">H", data, body + 4)
                addr = socket.inet_ntoa(data[body + 8:body + 12])
                (inode,) = struct.unpack_from("=I", data, body + 68)
                out.append((addr, sport, inode))
                off += (length + 3) & ~3


def listening_inodes(host: str, port: int) -> set[int] | None:
    """Socket inodes in LISTEN on host:port (0.0.0.0 listeners count); None if the kernel
    cannot tell (no sock_diag and no /proc)."""
    listeners = _sock_diag_listeners()
    if listeners is not None:
        return {inode for addr, p, inode in listeners
                if p == port and addr in (host, "0.0.0.0")}
    try:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return None
    wanted = {_proc_net_addr(host, port), _proc_net_addr("0.0.0.0", port)}
    inodes = set()
    for line in lines:
        fields = line.split()
        if len(fields) > 9 and fields[1] in wanted and fields[3] == _TCP_LISTEN:
            inodes.add(int(fields[9]))
    return inodes


def _socket_inodes_of(pid: int) -> set[int] | None:
    try:
        entries = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    inodes = set()
    for entry in entries:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{entry}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def _kill_group(popen: subprocess.Popen, timeout: float = 5.0) -> None:
    """SIGTERM the child's process group, SIGKILL it if it lingers, and always reap."""
    if popen.returncode is None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(popen.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                popen.wait(timeout=timeout)
                break
            except subprocess.TimeoutExpired:
                continue
        if popen.returncode is None:
            popen.wait()
    else:
        # The leader is gone; make sure nothing it forked outlives it.
        try:
            os.killpg(popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


_LOG_TAIL_BYTES = 256 * 1024  # GGML_RPC_DEBUG logs grow by a line per command
_LOG_HEAD_BYTES = 16 * 1024  # the banner is in the first few lines


def _read_lines(path: Path, limit: int = _LOG_TAIL_BYTES, *, head: bool = False) -> list[str]:
    """Lines of the first or last ``limit`` bytes of a log (a partial edge line is dropped)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            if head or size <= limit:
                f.seek(0)
                data = f.read(limit)
                cut = head and size > limit
            else:
                f.seek(size - limit)
                data = f.read()
                data = data[data.find(b"\n") + 1:]
                cut = False
    except OSError:
        return []
    lines = data.decode(errors="replace").splitlines()
    return lines[:-1] if cut else lines


def exit_info_from(returncode: int | None, stdout: list[str], stderr: list[str],
                   tail: int = 20) -> ExitInfo:
    """Classify how a server or client process ended from its return code and logs."""
    sig = -returncode if returncode is not None and returncode < 0 else None
    text_lines = stdout + stderr
    aborted = (sig == signal.SIGABRT or returncode == 128 + signal.SIGABRT
               or any(_ABORT_RE.search(line) for line in text_lines))
    message = ""
    for line in reversed(stderr + stdout):
        if line.strip() and _ERROR_RE.search(line):
            message = line.strip()
            break
    else:
        for line in reversed(stderr):
            if line.strip():
                message = line.strip()
                break
    return ExitInfo(returncode=returncode, signal=sig, aborted=aborted, message=message,
                    log_tail=_merge_tail(stdout, stderr, tail))


def _abandon(popen: subprocess.Popen, workdirs: list[Path]) -> None:
    """A server dropped without stop(): kill it, and remove the workdir that was made for it."""
    _kill_group(popen)
    for workdir in workdirs:
        shutil.rmtree(workdir, ignore_errors=True)


def _merge_tail(stdout: list[str], stderr: list[str], n: int) -> list[str]:
    # Errors are on stderr, so its lines go last and survive the cut.
    merged = [f"[stdout] {line}" for line in stdout[-n:]] + [f"[stderr] {line}" for line in stderr[-n:]]
    return merged[-n:] if n > 0 else []


def start_retrying(launch: Callable[[int, Path], "ServerProcess"], *, host: str,
                   port: int | None, workdir: Path | str | None, ready_timeout: float,
                   prefix: str = "ggml-rpc-server-"):
    """``launch(port, workdir)`` and wait until it listens; with ``port=None`` a free port is
    picked, and picked again if the server loses the race for it. A workdir made here
    (``workdir=None``) belongs to the server, which removes it at stop. Any server with
    ServerProcess's ``_wait_ready``/``stop``/``_owns_workdir`` can be started this way."""
    owns_workdir = workdir is None
    workdir = Path(tempfile.mkdtemp(prefix=prefix) if workdir is None else workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    attempts = _BIND_RETRIES if port is None else 1
    for attempt in range(attempts):
        chosen = free_port(host) if port is None else port
        # The workdir is handed over only on success: a failed attempt's stop() must not
        # delete the dir the next attempt logs into.
        try:
            server = launch(chosen, workdir)
        except BaseException:
            if owns_workdir:
                shutil.rmtree(workdir, ignore_errors=True)
            raise
        try:
            server._wait_ready(ready_timeout)
            server._owns_workdir = owns_workdir
            return server
        except ServerStartError as e:
            server.stop()
            bind_lost = any(t in e.args[0] or any(t in line for line in e.log_tail)
                            for t in _BIND_LOST)
            if bind_lost and attempt + 1 < attempts:
                continue
            if owns_workdir:
                shutil.rmtree(workdir, ignore_errors=True)
            raise
    raise AssertionError("unreachable")


class ServerProcess:
    """One running server. Create with ``ServerProcess.start(...)``; use as a context manager."""

    def __init__(self, popen: subprocess.Popen, *, name: str, host: str, port: int,
                 workdir: Path, owns_workdir: bool):
        self.popen = popen
        self.name = name
        self.host = host
        self._port = port
        self.workdir = workdir
        self.stdout_path = workdir / f"{name}.stdout.log"
        self.stderr_path = workdir / f"{name}.stderr.log"
        # Where this process's own lines begin in its logs (a forked server shares a file)
        self.log_starts = {self.stdout_path: 0, self.stderr_path: 0}
        # What the finaliser removes if the server is dropped unstopped: a workdir made for it.
        self._abandoned_dirs: list[Path] = []
        self._owns_workdir = owns_workdir
        self._banner_version: str | None = None
        self._final_logs: tuple[list[str], list[str]] | None = None
        self._exit_info: ExitInfo | None = None
        self.argv: list[str] = list(popen.args) if isinstance(popen.args, list) else []
        self._finalizer = weakref.finalize(self, _abandon, popen, self._abandoned_dirs)

    @property
    def _owns_workdir(self) -> bool:
        return bool(self._abandoned_dirs)

    @_owns_workdir.setter
    def _owns_workdir(self, owns: bool) -> None:
        self._abandoned_dirs[:] = [self.workdir] if owns else []

    # ----------------------------------------------------------------- start
    @classmethod
    def start(cls, argv: ArgvSpec, env: Mapping[str, str] | None = None, *, name: str,
              host: str = "127.0.0.1", port: int | None = None, workdir: Path | str | None = None,
              ready_timeout: float = 30.0) -> "ServerProcess":
        """Launch and wait until host:port is in LISTEN.

        ``argv`` is a list (``{host}`` and ``{port}`` in its items are substituted) or a
        callable ``(host, port) -> argv``. ``env`` is the child's whole environment (default:
        ours). With ``port=None`` a free port is picked, and picked again if the server loses
        the race for it. Raises ServerStartError, with the log tail, when the server does not
        come up.
        """
        return start_retrying(
            lambda p, wd: cls._launch(argv, env, name=name, host=host, port=p, workdir=wd,
                                      owns_workdir=False),
            host=host, port=port, workdir=workdir, ready_timeout=ready_timeout)

    @classmethod
    def _launch(cls, argv: ArgvSpec, env, *, name, host, port, workdir, owns_workdir,
                pass_fds: Sequence[int] = ()):
        if callable(argv):
            args = [str(a) for a in argv(host, port)]
        else:
            args = [str(a).replace("{host}", host).replace("{port}", str(port)) for a in argv]
        stdout_path = workdir / f"{name}.stdout.log"
        stderr_path = workdir / f"{name}.stderr.log"
        # Line-buffered on our side too; the child's own buffering is set by stdbuf/setvbuf.
        with open(stdout_path, "w", buffering=1) as out, open(stderr_path, "w", buffering=1) as err:
            popen = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                     env=dict(env) if env is not None else None,
                                     start_new_session=True, pass_fds=tuple(pass_fds))
        return cls(popen, name=name, host=host, port=port, workdir=workdir,
                   owns_workdir=owns_workdir)

    def _wait_ready(self, timeout: float) -> None:
        started = time.monotonic()
        deadline = started + timeout
        while True:
            out, err = self._logs()
            if any(BIND_FAILED_TEXT in line for line in out + err):
                raise ServerStartError(f"{self.name}: could not bind {self.host}:{self._port}",
                                       log_tail=_merge_tail(out, err, 30))
            info = self.poll()
            if info is not None:
                raise ServerStartError(
                    f"{self.name}: exited before listening (rc={info.returncode}, "
                    f"signal={info.signal}) {info.message}", exit_info=info,
                    log_tail=info.log_tail)
            if self._is_listening():
                return
            if time.monotonic() > deadline:
                raise ServerStartError(
                    f"{self.name}: not listening on {self.host}:{self._port} after {timeout:g} s",
                    log_tail=_merge_tail(out, err, 30))
            fast = time.monotonic() - started < _FAST_POLL_FOR
            time.sleep(_FAST_POLL if fast else _POLL_INTERVAL)

    def _is_listening(self) -> bool:
        inodes = listening_inodes(self.host, self._port)
        if inodes is None:  # no /proc: fall back to a probe (the server logs one extra client)
            try:
                with socket.create_connection((self.host, self._port), timeout=0.2):
                    return True
            except OSError:
                return False
        if not inodes:
            return False
        # Only our child's socket counts, not whoever else might have grabbed the port.
        ours = _socket_inodes_of(self.popen.pid)
        return ours is None or bool(inodes & ours)

    # ------------------------------------------------------------ inspection
    @property
    def port(self) -> int:
        return self._port

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self._port}"

    @property
    def banner_version(self) -> str | None:
        """X.Y.Z from "Starting RPC server vX.Y.Z" on either stream, once it has been printed."""
        if self._banner_version is None:
            if self._final_logs is not None:
                out, err = self._final_logs
            else:
                out = _read_lines(self.stdout_path, _LOG_HEAD_BYTES, head=True)
                err = _read_lines(self.stderr_path, _LOG_HEAD_BYTES, head=True)
            for line in out + err:
                m = BANNER_RE.search(line)
                if m:
                    self._banner_version = m.group(1)
                    break
        return self._banner_version

    def _logs(self) -> tuple[list[str], list[str]]:
        if self._final_logs is not None:
            return self._final_logs
        return _read_lines(self.stdout_path), _read_lines(self.stderr_path)

    def log_tail(self, n: int = 20) -> list[str]:
        out, err = self._logs()
        return _merge_tail(out, err, n)

    def log_text(self) -> str:
        """Both logs (their last 256 KiB each), stdout first."""
        out, err = self._logs()
        return "\n".join(out + err)

    def poll(self) -> ExitInfo | None:
        """None while running; how it ended otherwise."""
        if self._exit_info is not None:
            return self._exit_info
        rc = self.popen.poll()
        if rc is None:
            return None
        out, err = self._logs()
        self._exit_info = exit_info_from(rc, out, err)
        return self._exit_info

    @property
    def running(self) -> bool:
        return self.popen.poll() is None

    def rss_bytes(self) -> int | None:
        try:
            return psutil.Process(self.popen.pid).memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return None

    # ------------------------------------------------------------------ stop
    def stop(self, timeout: float = 5.0) -> ExitInfo:
        """SIGTERM the process group, SIGKILL after ``timeout``, reap; report how it ended."""
        self._finalizer.detach()
        _kill_group(self.popen, timeout)
        info = self.poll()
        if self._final_logs is None:
            _ = self.banner_version  # read from the log heads while the files still exist
            self._final_logs = _read_lines(self.stdout_path), _read_lines(self.stderr_path)
            if self._owns_workdir:
                shutil.rmtree(self.workdir, ignore_errors=True)
        assert info is not None
        return info

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.popen.returncode is None else f"rc={self.popen.returncode}"
        return f"<ServerProcess {self.name} pid={self.pid} {self.endpoint} {state}>"


def start_peer_server(peer, *, cache_dir: Path | str | None = None, workdir: Path | str | None = None,
                      threads: int = 1, host: str = "127.0.0.1", port: int | None = None,
                      ready_timeout: float = 30.0, env: Mapping[str, str] | None = None
                      ) -> ServerProcess:
    """Start a real peer's server (see realpeer.RealPeer.server_cmd); ``env`` adds variables."""
    if not peer.available:
        raise PeerUnavailable(f"peer {peer.name} is unavailable: {peer.reason}")
    env = {**peer.server_cmd(host, 0, cache_dir, threads)[1], **(env or {})}
    return ServerProcess.start(lambda h, p: peer.server_cmd(h, p, cache_dir, threads)[0], env,
                               name=peer.name, host=host, port=port, workdir=workdir,
                               ready_timeout=ready_timeout)


def start_reference_server(dialect: str, *, cache_dir: Path | str | None = None,
                           workdir: Path | str | None = None, extra_args: Sequence[str] = (),
                           host: str = "127.0.0.1", port: int | None = None,
                           ready_timeout: float = 30.0) -> ServerProcess:
    """Start the harness's own reference server (``python -m harness serve``) for ``dialect``."""

    def argv(h: str, p: int) -> list[str]:
        return ([sys.executable, "-m", "harness", "serve", "--proto", dialect, "--host", h,
                 "--port", str(p)] + (["--cache-dir", str(cache_dir)] if cache_dir else [])
                + list(extra_args))

    env = dict(os.environ, PYTHONUNBUFFERED="1")
    safe_name = "reference-" + re.sub(r"[^A-Za-z0-9_.+-]", "_", dialect)
    return ServerProcess.start(argv, env, name=safe_name, host=host, port=port, workdir=workdir,
                               ready_timeout=ready_timeout)
