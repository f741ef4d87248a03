"""Fuzz targets: what to launch, how to restart it, and how to tell that it broke.

A target is any server the harness can launch -- a registered real peer (``p7``, a user build
added with ``harness peers add``), a server binary or build dir given by path, or the
reference server (``ref`` / ``ref-<dialect>``) -- each in its own work dir, on its own port.

Breakage, in the order it is checked:

* **death** -- the process exited; the signature is the signal (or exit code), the first
  meaningful line of its log (a ``GGML_ASSERT``, ``terminate called ...``, a Python
  exception, or for a silent segfault the fault shim's class and faulting module+offset,
  see :mod:`.faultinfo`) and the command that was running;
* **hang** -- a due answer did not come within the deadline and the process still runs;
* **memory** -- resident memory above the bound (sampled after cases);
* **protocol** -- the connection broke the spec (see :mod:`harness.fuzz.execute`).

Every launched process runs under ``RLIMIT_AS`` (``as_limit``) so that a fuzzed length prefix
or buffer size cannot take the machine's memory with it; an allocation beyond the limit fails
inside the target, which is then free to refuse it.
"""

from __future__ import annotations

import functools
import os
import resource
import shutil
import socket
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import psutil

from .errors import TargetError
from .signature import Signature, death_line, signal_text, vm_hwm, without_paths
from .target_spec import TargetSpec, dialect_or_none, server_binary
from ..impls.driver import ExitInfo
from ..impls.loopback import ensure_loopback_shim, preload_env
from ..impls.registry import PeerError, get_peer, probe_hello
from ..impls.supervisor import REAL_PROCESS_ENV, ArgvSpec, ServerProcess, ServerStartError, \
    start_peer_server, start_reference_server
from ..impls.zygote import Zygote, ZygoteChild, ZygoteUnsupported
from ..proto import DEFAULT, EMPTY_HELLO, Cmd, dialect_for_version, get_dialect
from ..reference.knobs import parse_knobs
from ..proto.wire import U64
from ..transport.tcp import recv_exact
from . import sanitizer
from .faultinfo import is_sanitized, with_shim

DEFAULT_AS_LIMIT = 3 << 30
DEFAULT_RSS_LIMIT = 1 << 30
# A server still working on the CPU when a new connection's HELLO is due (zeroing the
# gigabytes a length prefix announced, then freeing them) is waited for this long at most
# before it counts as no longer serving: late is not the same finding as stopped.
BUSY_GRACE = 30.0
BUSY_SHARE = 0.1  # "working": at least this share of a core while the HELLO went unanswered
# The CPU share is judged over windows at least this long: the kernel counts CPU time in 10 ms
# ticks and a loaded machine can leave a working server off the CPU for a 50 ms deadline
# (a clean-clone CI run read p7 zeroing 1.75 GiB as 'stopped' that way).
BUSY_WINDOW = 0.5
REFERENCE_MEMORY = "256M"  # the reference server's buffer budget under fuzzing
SPARES = 3  # standby processes of a target that has died once (see Target.standby)


@functools.cache
def _loopback_shim():
    """Built (or found in the cache) once per process: targets relaunch after every death."""
    return ensure_loopback_shim()

# ---------------------------------------------------------------- targets

def _reported_command(report, dialect: str | None) -> str | None:
    """The command a sanitizer report's stack says the server was serving (its
    ``rpc_server::<method>`` frame), when the dialect has a command of that name."""
    method = report.server_method() if report is not None else None
    if method is None:
        return None
    cmd = Cmd.__members__.get(method.upper())
    return cmd.value if cmd is not None and get_dialect(dialect or DEFAULT.name).has(cmd) \
        else None


class Target:
    """One live target process, restarted on demand. Not thread-safe; one per worker."""

    def __init__(self, spec: TargetSpec, workdir: Path, *, as_limit: int = DEFAULT_AS_LIMIT,
                 rss_limit: int = DEFAULT_RSS_LIMIT, host: str = "127.0.0.1",
                 ready_timeout: float = 30.0, fault_shim: bool = True, standby: bool = False,
                 cache: bool = False, env: dict[str, str] | None = None, fork: bool = True):
        self.spec = spec
        self.env = dict(env or {})  # added to a real server's environment (e.g. softverbs)
        self.cache = cache  # run with the hash cache on (-c), in <launch dir>/cache
        self.workdir = Path(workdir)
        self.as_limit = as_limit
        self.rss_limit = rss_limit
        self.host = host
        self.ready_timeout = ready_timeout
        self.fault_shim = fault_shim  # name fatal signals of C servers (see faultinfo)
        self.server: ServerProcess | None = None
        self.dialect = spec.dialect
        self.starts = 0
        self.rss_peak = 0
        self.rss_first: int | None = None  # first sample of the current process
        self.rss_last: int | None = None
        # Standby: after the first death SPARES more processes are started in the
        # background, so a restart is a swap instead of a launch (5-30 ms for p7, mostly
        # waiting: a pool of them keeps up with a crash every few milliseconds, as the sweep's
        # placement classes give p7, which aborts on every tensor outside its buffer). Off for
        # targets that never die: no idle twins for nothing.
        self.standby = standby
        self._spares: deque[Future] = deque()
        self._pool: ThreadPoolExecutor | None = None
        self._launches = 0
        self._log_offsets: dict[str, int] = {}
        # Restarts by fork (see harness.impls.zygote) for the real servers a campaign
        # restarts: a p7 restart by exec costs about 5 ms of CPU, by fork 0.3 ms. Not with
        # the hash cache (children would share its files), not for sanitizer builds (ASan's
        # RSS-limit thread does not survive a fork), not for containers or the reference.
        self.forking = fork and standby and not cache and spec.kind in ("peer", "binary")
        self.zygote: Zygote | None = None

    # -- lifecycle
    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.forking and self.sanitized:
            self.forking = False
        if self.forking:
            self.server = self._fork_child()
        else:
            server = self._take_spare()
            self.server = server if server is not None else \
                self._launch_checked(self._next_dir())
        self._log_offsets = {str(path): at for path, at in self.server.log_starts.items()}
        self.starts += 1
        self.rss_first = self.rss_last = None
        if self.dialect is None:
            self.dialect = self._probe_dialect()
        if self.spec.kind == "docker" and get_dialect(self.dialect).has(Cmd.COMM_INIT):
            # a host-network container cannot take the loopback bind shim; a fuzzed COMM_INIT
            # would make the server listen on every interface
            self.stop()
            raise TargetError(f"{self.spec.name}: a {self.dialect} server in a container cannot "
                              "be fuzzed (COMM_INIT would listen beyond loopback); fuzz the pin")
        if self.standby and self.starts > 1 and not self.forking:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(SPARES, thread_name_prefix="target-standby")
            while len(self._spares) < SPARES:
                self._spares.append(self._pool.submit(self._launch_checked, self._next_dir()))

    def _next_dir(self) -> Path:
        if not self.standby:
            return self.workdir
        # Slots for the live process, the spares, and the dead one (its log was read).
        self._launches += 1
        return self.workdir / f"slot{self._launches % (SPARES + 2)}"

    def _launch_checked(self, workdir: Path) -> ServerProcess:
        try:
            server = self._launch(workdir)
        except (ServerStartError, PeerError, OSError) as e:
            raise TargetError(f"cannot start {self.spec.name}: {e}") from None
        self._bound_address_space(server.pid)
        return server

    def _bound_address_space(self, pid: int) -> None:
        if self.as_limit and not self.sanitized:
            try:
                resource.prlimit(pid, resource.RLIMIT_AS, (self.as_limit, self.as_limit))
            except (OSError, ValueError):
                pass  # e.g. a wrapper already exited; the bound is a safety net, not a test

    def _fork_child(self) -> ZygoteChild | ServerProcess:
        """A fresh server forked from the zygote, which is launched first if need be (and
        again, on a new port, if a child could not bind its port or the zygote died)."""
        failure: Exception | None = None
        for _ in range(2):
            if self.zygote is None or not self.zygote.alive:
                if self.zygote is not None:
                    self.zygote.stop()
                try:
                    self.zygote = self._launch_zygote()
                except ZygoteUnsupported:
                    self.forking = False  # restart by exec, as any other server
                    return self._launch_checked(self._next_dir())
            try:
                return self.zygote.spawn(self.ready_timeout)
            except ServerStartError as e:
                failure = e
                self.zygote.stop()
                self.zygote = None
        raise TargetError(f"cannot start {self.spec.name}: {failure}")

    def _launch_zygote(self) -> Zygote:
        argv, env, name = self._real_command()
        try:
            zygote = Zygote.start(argv, env, name=name, host=self.host, workdir=self.workdir,
                                  ready_timeout=self.ready_timeout)
        except (ServerStartError, PeerError, OSError) as e:
            raise TargetError(f"cannot start {self.spec.name}: {e}") from None
        self._bound_address_space(zygote.pid)  # children inherit the limit
        return zygote

    @functools.cached_property
    def sanitized(self) -> bool:
        """Is the server a sanitizer build? ASan reserves terabytes of shadow address space
        at start, so RLIMIT_AS would make its every later allocation fail (ggml_init's
        ``mem_buffer != NULL`` assert on the first request): its bound is the allocator's."""
        if self.spec.kind == "peer":
            return bool(get_peer(self.spec.peer or self.spec.name).sanitize)
        return self.spec.kind == "binary" and is_sanitized(self.spec.binary)

    def _sanitizer_bounds(self, env: dict[str, str]) -> dict[str, str]:
        """``env`` with the bounds of a sanitizer build in ASan's own terms: the address-space
        bound as ``max_allocation_size_mb`` (with ``allocator_may_return_null`` an allocation
        above it fails like one beyond RLIMIT_AS does in a release build), and the RSS bound as
        ``hard_rss_limit_mb`` (as the in-process target has it, so its memory findings replay
        here). A bound the user set already wins."""
        if not self.sanitized:
            return env
        options = env.get("ASAN_OPTIONS", "")
        bounds = []
        if self.as_limit and "max_allocation_size_mb=" not in options:
            bounds.append(f"max_allocation_size_mb={max(self.as_limit >> 20, 64)}")
        if self.rss_limit and "hard_rss_limit_mb=" not in options:
            bounds.append(f"hard_rss_limit_mb={max(self.rss_limit >> 20, 64)}")
        if not bounds:
            return env
        return {**env, "ASAN_OPTIONS": ":".join(filter(None, [options, *bounds]))}

    def _take_spare(self) -> ServerProcess | None:
        """The standby process if it came up and still runs; else None (launch afresh, which
        reports a start failure properly)."""
        if not self._spares:
            return None
        fut = self._spares.popleft()
        try:
            server = fut.result(timeout=self.ready_timeout + 5)
        except Exception:  # noqa: BLE001 - the synchronous launch will say what is wrong
            return None
        if server.poll() is not None:
            server.stop()
            return None
        return server

    def cache_dir(self) -> Path | None:
        """The live process's cache directory tree (None: the cache is off)."""
        if not self.cache or self.server is None:
            return None
        return Path(self.server.workdir) / "cache"

    def _launch(self, workdir: Path) -> ServerProcess:
        workdir.mkdir(parents=True, exist_ok=True)
        spec = self.spec
        cache_dir = workdir / "cache" if self.cache else None
        if cache_dir is not None:
            shutil.rmtree(cache_dir, ignore_errors=True)  # a slot's previous process's files
            cache_dir.mkdir(parents=True)
        if spec.kind == "ref":
            # serial: one connection at a time like the real server, so a finding is
            # attributed to exactly one connection and an uncaught exception is fatal (seen).
            # The freeze_mid_frame knob plants its bug in a server that claims concurrency.
            serial = [] if parse_knobs(spec.knobs).freeze_mid_frame else ["--serial"]
            return start_reference_server(spec.dialect, workdir=workdir, host=self.host,
                                          cache_dir=cache_dir,
                                          extra_args=serial + ["--memory", REFERENCE_MEMORY]
                                          + [a for k in spec.knobs for a in ("--knob", k)],
                                          ready_timeout=self.ready_timeout)
        if spec.kind == "peer" and not self.fault_shim:
            return start_peer_server(get_peer(spec.peer or spec.name), workdir=workdir,
                                     host=self.host, cache_dir=cache_dir,
                                     ready_timeout=self.ready_timeout,
                                     env={"LD_PRELOAD": str(_loopback_shim())})
        if spec.kind == "docker":
            from ..impls.docker_adapter import DockerServer
            from ..impls.docker_image import build_pin_image
            from ..impls.registry import get_pin
            image = spec.image
            try:
                get_pin(image)
            except PeerError:
                pass  # an image name
            else:
                image = build_pin_image(image).tag  # docker:p7

            return DockerServer.start(image, name=spec.name, host=self.host, workdir=workdir,
                                      ready_timeout=self.ready_timeout)
        argv, env, name = self._real_command(cache_dir)
        return ServerProcess.start(argv, env, name=name, host=self.host, workdir=workdir,
                                   ready_timeout=self.ready_timeout)

    def _real_command(self, cache_dir: Path | None = None
                      ) -> tuple[ArgvSpec, dict[str, str], str]:
        """argv, environment and name of a real server (a peer, or a binary given by path),
        with the fault shim, the sanitizer bounds and the loopback bind shim: a fuzzed
        COMM_INIT (8.0.0+) makes a real server listen on 0.0.0.0, which must stay 127.0.0.1
        (spec 15.15)."""
        spec = self.spec
        loopback = _loopback_shim()
        if spec.kind == "peer":
            peer = get_peer(spec.peer or spec.name)
            if not peer.available:
                raise PeerError(f"peer {peer.name} is unavailable: {peer.reason}")
            # the fault shim's handler is process-wide and every thread gets an alternate
            # stack, so 8.0.0's per-client threads are covered too; once the dialect is known
            # the banner is not read, so stdout need not be line-buffered
            buffered = self.dialect is None
            argv, env = peer.server_cmd(self.host, 0, cache_dir, 1, line_buffered=buffered)
            env = self._sanitizer_bounds(env | self.env)
            env = preload_env(with_shim(env, server_binary(argv)), loopback)
            return (lambda h, p: peer.server_cmd(h, p, cache_dir, 1, line_buffered=buffered)[0],
                    env, peer.name)
        stdbuf = shutil.which("stdbuf")
        argv = ([stdbuf, "-oL"] if stdbuf else []) + [spec.binary, "-H", "{host}", "-p",
                                                       "{port}", "-t", "1"]
        env = dict(os.environ, **REAL_PROCESS_ENV)
        if cache_dir is not None:
            argv.append("-c")
            env["LLAMA_CACHE"] = str(cache_dir)
        env = with_shim(env, spec.binary) if self.fault_shim else env
        return argv, preload_env(self._sanitizer_bounds(env), loopback), Path(spec.binary).name

    def _probe_dialect(self) -> str:
        """The dialect of a server given by path: its banner, else its HELLO answer."""
        banner = self.server.banner_version
        d = dialect_or_none(banner) if banner else None
        if d:
            return d
        for layout in (DEFAULT, EMPTY_HELLO):  # the 24-byte HELLO of >= 4.0, then the empty one
            try:
                version, flags = probe_hello(self.host, self.port, layout.version[0])
            except PeerError:
                continue
            found = dialect_for_version(version, server_flags_seen=bool(flags))
            if found is not None:
                return found.name
        raise TargetError(f"{self.spec.name}: could not learn its protocol version; "
                          "pass --dialect")

    def stop(self) -> ExitInfo | None:
        """Stop the live process, the standby ones and the zygote."""
        info = self._stop_live()
        if self.zygote is not None:
            self.zygote.stop()
            self.zygote = None
        while self._spares:
            spare = self._take_spare()
            if spare is not None:
                spare.stop()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        return info

    def _stop_live(self) -> ExitInfo | None:
        if self.server is None:
            return None
        info = self.server.stop()
        self.server = None
        return info

    def restart(self) -> None:
        self._stop_live()
        self.start()

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.port

    # -- health
    def exit_info(self) -> ExitInfo | None:
        """How the process ended, or None while it runs (never blocks)."""
        return self.server.poll() if self.server is not None else None

    def wait_exit(self, timeout: float) -> ExitInfo | None:
        """Wait up to ``timeout`` s for the process to end (it may be dying right now)."""
        if isinstance(self.server, ZygoteChild):
            return self.server.wait(timeout)
        end = time.monotonic() + timeout
        while True:
            info = self.exit_info()
            if info is not None or time.monotonic() >= end:
                return info
            time.sleep(0.005)

    def new_log_lines(self, limit: int = 64 << 10) -> list[str]:
        """Log lines the live process wrote since the last call (at most ``limit`` bytes per
        log): what the server said about the last case, for the evolving corpus."""
        server = self.server
        if server is None:
            return []
        lines: list[str] = []
        for path in (server.stdout_path, server.stderr_path):
            start = self._log_offsets.get(str(path), 0)
            try:
                size = os.stat(path).st_size
                if size <= start:
                    continue
                with open(path, "rb") as f:
                    f.seek(start)
                    chunk = f.read(min(size - start, limit))
            except OSError:
                continue
            # Keep an unfinished last line for the next call.
            end = chunk.rfind(b"\n") + 1
            self._log_offsets[str(path)] = start + (end if end else len(chunk))
            lines += chunk[:end or len(chunk)].decode("utf-8", "replace").splitlines()
        return lines

    def log_lines(self) -> list[str]:
        if self.server is None:
            return []
        return self.server.log_text().splitlines()

    def rss(self) -> int | None:
        v = self.server.rss_bytes() if self.server is not None else None
        if v:
            self.rss_peak = max(self.rss_peak, v)
            if self.rss_first is None:
                self.rss_first = v
            self.rss_last = v
        return v

    # The kernel's high-water mark of the server's RSS, restarted with each case: memory a
    # request takes and gives back before any sample (a declared payload size allocated and
    # zeroed, freed when the client hangs up mid-frame) still counts for that case.
    def _local_pid(self) -> int | None:
        return self.server.pid if self.server is not None and self.spec.kind != "docker" \
            else None

    def is_idle(self) -> bool | None:
        """Is every thread of the local server asleep (none running, none in the kernel on
        its behalf)? None when that cannot be read (not local, gone). A server that has
        read a request and finished with it, or closed the connection over it, is asleep in
        its next read or accept; one still working on it is not."""
        pid = self._local_pid()
        if pid is None:
            return None
        try:
            tids = os.listdir(f"/proc/{pid}/task")
            for tid in tids:
                with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                    # state is the field after the parenthesised name (which may hold spaces)
                    if f.read().rsplit(b")", 1)[1][1:2] != b"S":
                        return False
        except (OSError, IndexError):
            return None
        return bool(tids)

    def reset_peak_rss(self) -> None:
        pid = self._local_pid()
        try:
            if pid is not None:
                Path(f"/proc/{pid}/clear_refs").write_text("5")  # peak RSS := current RSS
        except OSError:
            pass  # not Linux, or not ours: the samples alone

    def peak_rss(self) -> int | None:
        pid = self._local_pid()
        return vm_hwm(pid) if pid is not None else None

    def over_memory(self) -> int | None:
        """The RSS (its peak since the case began, when the kernel keeps one) if it is above
        the bound, else None."""
        v = max(filter(None, (self.rss(), self.peak_rss())), default=None)
        return v if v is not None and self.rss_limit and v > self.rss_limit else None

    def answers_hello(self, timeout: float = 2.0) -> bool:
        """A throwaway connection that only says HELLO: answered within ``timeout``?"""
        return self.serves_new_connection(timeout, grace=0.0)[0]

    def cpu_seconds(self) -> float | None:
        """User + system CPU time of the server process (None: not local, or gone)."""
        pid = self._local_pid()
        try:
            t = psutil.Process(pid).cpu_times() if pid is not None else None
        except psutil.Error:
            return None
        return t.user + t.system if t is not None else None

    def serves_new_connection(self, timeout: float,
                              grace: float = BUSY_GRACE) -> tuple[bool, float]:
        """(served, seconds): did a new connection's HELLO get its answer, and after how
        long? Within ``timeout``, or later while the server kept working on the CPU (at least
        BUSY_SHARE of a core in each BUSY_WINDOW it went unanswered), up to ``grace`` in all.
        One connection throughout: a C server that answers a probe already closed dies of
        SIGPIPE (the real 7.0.0 server does), so a late answer is waited for, not given up."""
        from ..strategies import hello_request_frame
        frame = hello_request_frame(self.dialect or DEFAULT.name)
        t0 = time.monotonic()
        try:
            with socket.create_connection((self.host, self.port), timeout=timeout) as s:
                s.sendall(frame)
                cpu, start = self.cpu_seconds(), time.monotonic()
                while True:
                    try:
                        if not s.recv(1, socket.MSG_PEEK):
                            return False, time.monotonic() - t0  # closed on us
                        break
                    except TimeoutError:
                        now, used = time.monotonic(), self.cpu_seconds()
                        if cpu is None or used is None or self.exit_info() is not None or \
                                now - t0 >= grace:
                            return False, now - t0
                        if now - start >= BUSY_WINDOW:
                            if used - cpu < BUSY_SHARE * (now - start):
                                return False, now - t0
                            cpu, start = used, now
                        s.settimeout(min(timeout, max(grace - (now - t0), 0.1)))
                s.settimeout(timeout)
                (n,) = U64.unpack(recv_exact(s, U64.size))
                served = n < (1 << 16) and len(recv_exact(s, n)) == n
                return served, time.monotonic() - t0
        except OSError:
            return False, time.monotonic() - t0

    def death_verdict(self, info: ExitInfo, command: str) -> tuple[Signature, str]:
        """The signature of a death, and a human detail (the raw log line, exit status)."""
        lines = self.log_lines()
        report = sanitizer.parse(lines)
        kind = report.kind if report is not None and not report.is_abort else "crash"
        command = _reported_command(report, self.dialect) or command
        sig = Signature(kind, signal_text(info), death_line(lines), command)
        raw = without_paths(death_line(lines, raw=True))
        if raw.startswith(sig.signal):  # the fault shim's line names the signal itself
            return sig, raw
        return sig, f"{sig.signal}" + (f": {raw}" if raw else " (nothing in the log)")
