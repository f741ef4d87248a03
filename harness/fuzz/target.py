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
import hashlib
import os
import re
import resource
import shutil
import signal
import socket
import struct
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from .errors import FuzzError
from ..impls.driver import ExitInfo
from ..impls.loopback import ensure_loopback_shim, preload_env
from ..impls.registry import PeerError, get_peer, probe_hello
from ..impls.supervisor import ServerProcess, ServerStartError, start_peer_server, \
    start_reference_server
from ..proto import DEFAULT, Cmd, dialect_for_version, get_dialect
from ..reference.knobs import parse_knobs
from ..proto.dialects import ALIASES
from ..transport.tcp import recv_exact
from . import sanitizer
from .faultinfo import LINE_PREFIX, is_sanitized, with_shim

DEFAULT_AS_LIMIT = 3 << 30
DEFAULT_RSS_LIMIT = 1 << 30
REFERENCE_MEMORY = "256M"  # the reference server's buffer budget under fuzzing


class TargetError(FuzzError, RuntimeError):
    """The target cannot be resolved or started."""


# ---------------------------------------------------------------- signatures


@functools.cache
def _loopback_shim():
    """Built (or found in the cache) once per process: targets relaunch after every death."""
    return ensure_loopback_shim()

@dataclass(frozen=True)
class Signature:
    """What identifies a finding: two findings with equal signatures are the same bug."""

    kind: str  # crash | hang | memory | protocol | one of harness.fuzz.oracles.KINDS
    signal: str  # "SIGABRT", "SIGSEGV", "exit 1", or "" when the process lives on
    line: str  # first meaningful log line (crash) or what was observed, normalised
    command: str  # the command of the step that caused it

    @property
    def id(self) -> str:
        """Short stable name (folder names, report anchors)."""
        h = hashlib.sha1("\x1f".join((self.kind, self.signal, self.line,
                                      self.command)).encode()).hexdigest()[:8]
        return f"{self.kind}-{slug(self.command)}-{h}"

    def same_bug(self, other: "Signature | None", *, command: bool = True) -> bool:
        if other is None:
            return False
        same = (self.kind, self.signal, self.line) == (other.kind, other.signal, other.line)
        return same and (not command or self.command == other.command)

    def title(self) -> str:
        parts = [self.kind]
        if self.signal:
            parts.append(self.signal)
        parts.append(f"in {self.command}")
        return " ".join(parts) + (f": {self.line}" if self.line else "")

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Signature":
        return cls(d["kind"], d.get("signal", ""), d.get("line", ""), d.get("command", ""))


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_").lower()[:24] or "none"


# Log lines that say why a process died, most telling first.
_DEATH_PATTERNS = [re.compile(p) for p in (
    r"(?:\S+\.(?:c|cpp|h):\d+: )?GGML_ASSERT\(.*\) failed",
    r"GGML_ABORT.*|\S+\.(?:c|cpp|h):\d+: .*",
    r"terminate called .*",
    r"Assertion .* failed.*",
    r"AddressSanitizer: .*|UndefinedBehaviorSanitizer: .*|runtime error: .*",
    r"(Segmentation fault|Aborted|Bus error).*",
)]
_PY_EXC = re.compile(r"^(\w+(?:\.\w+)*(?:Error|Exception|Exit|Interrupt)\b.*)$")
_PY_FRAME = re.compile(r'^\s*File "([^"]+)", line \d+, in (\S+)')
_PATH = re.compile(r"(?:/[^\s:()'\"]+/)+([^\s/:()'\"]+)")
_HEX = re.compile(r"0x[0-9a-fA-F]+")
_BIG_NUMBER = re.compile(r"\b\d{5,}\b")


def normalise(line: str) -> str:
    """A log line without run-specific noise: paths cut to the file name, addresses and big
    numbers (sizes, pids) replaced, so the same bug gives the same line on every run."""
    line = _PATH.sub(r"\1", line.strip())
    line = _HEX.sub("0x?", line)
    line = _BIG_NUMBER.sub("N", line)
    return line[:300]


def death_line(log_lines: list[str], *, raw: bool = False) -> str:
    """The most meaningful line of a dead server's log (normalised unless ``raw``), or ""."""
    norm = (lambda x: x.strip()) if raw else normalise
    # A Python traceback: the exception and the innermost frame of ours say it all.
    for i in range(len(log_lines) - 1, -1, -1):
        m = _PY_EXC.match(log_lines[i].strip())
        if m and any("Traceback" in x for x in log_lines[max(0, i - 200):i]):
            where = ""
            for j in range(i - 1, max(0, i - 200) - 1, -1):
                f = _PY_FRAME.match(log_lines[j])
                if f:
                    where = f" at {Path(f.group(1)).name}:{f.group(2)}"
                    break
            return norm(m.group(1)[:200] + where)
    report = sanitizer.parse(log_lines)  # ASan/UBSan builds: the report names the bug
    if report is not None and not report.is_abort and report.tool != "libFuzzer":
        return norm(report.summary or report.text.splitlines()[0]) if raw \
            else report.signature_line()
    for line in log_lines:
        if line.startswith(LINE_PREFIX):
            text = _PATH.sub(r"\1", line[len(LINE_PREFIX):].strip())[:300]
            return text if raw else _fault_site(text)
    for pat in _DEATH_PATTERNS:
        for line in log_lines:
            m = pat.search(line)
            if m:
                return norm(m.group(0)) if raw else _abort_site(norm(m.group(0)))
    return ""


_SITE_AT = (r"(?P<{0}mod>\S+)\+0x(?P<{0}off>[0-9a-f]+)"
            r"(?: \((?P<{0}sym>[^+)]+)\+0x[0-9a-f]+\))?")
_FAULT = re.compile(r"^(?P<head>.* in )" + _SITE_AT.format("") +
                    r"(?: from " + _SITE_AT.format("from_") + ")?$")
_ABORT_AT = re.compile(r"^(\S+\.(?:c|cc|cpp|h|hpp|cu|m|mm):\d+: )(.*)$")


def _fault_site(text: str) -> str:
    """The fault shim's line reduced to where it happened: the function when the module
    exports one there, else the 4 KiB page of the module (one function, nearly always), so
    two faults at neighbouring instructions of one function are one bug. A stack overflow
    keeps its class only."""
    m = _FAULT.match(text)
    if m is None:
        return text
    if " stack overflow in " in text:
        # Where the stack ran out depends on its random start (ASLR), not on the bug: the
        # class alone is the signature.
        return text.split(" in ", 1)[0]
    site = m.group("head") + _site(m, "")
    return site + (f" from {_site(m, 'from_')}" if m.group("from_mod") else "")


def _site(m: re.Match, prefix: str) -> str:
    mod, sym = m.group(f"{prefix}mod"), m.group(f"{prefix}sym")
    if sym:
        return f"{mod} ({sym})"
    return f"{mod} page 0x{int(m.group(f'{prefix}off'), 16) & ~0xFFF:x}"


def _abort_site(text: str) -> str:
    """An abort at ``file:line: message``: the location names the bug; a formatted message
    (``binary_op: unsupported types: dst: q4_0, ...``) keeps only its first part, so each
    type combination is not a bug of its own. GGML_ASSERT conditions are static: kept."""
    m = _ABORT_AT.match(text)
    if m is None or m.group(2).startswith("GGML_ASSERT"):
        return text
    first, sep, _ = m.group(2).partition(": ")
    return m.group(1) + first + (": ..." if sep else "")


# gcc gives ``__LINE__`` of a macro call that spans lines as its first line, clang as its last
# (a GGML_ABORT with its arguments on the next lines): the same abort is lines apart between
# a gcc-built release server and the clang-built in-process target or sanitizer server.
MACRO_CALL_LINES = 4
_SITE = re.compile(r"^(?P<file>\S+\.(?:c|cc|cpp|h|hpp|cu|m|mm)):(?P<line>\d+): (?P<msg>.*)$")


def same_abort_site(a: str, b: str) -> bool:
    """Do two abort lines (``file:line: message``) name one abort, as two compilers place it?
    The same file and message, lines at most MACRO_CALL_LINES - 1 apart."""
    ma, mb = _SITE.match(a), _SITE.match(b)
    return bool(ma and mb and ma["file"] == mb["file"] and ma["msg"] == mb["msg"]
                and abs(int(ma["line"]) - int(mb["line"])) < MACRO_CALL_LINES)


def same_abort_moved(a: str, b: str) -> bool:
    """Do two abort lines name one abort in two builds of the code, wherever it sits? The same
    file and message at any line: between builds unrelated edits move an assert (a 7.0.0
    GGML_ASSERT was at ggml-rpc.cpp:1401 in b10985, :1413 in b11327, :1429 in b11413)."""
    ma, mb = _SITE.match(a), _SITE.match(b)
    return bool(ma and mb and ma["file"] == mb["file"] and ma["msg"] == mb["msg"])


_VM_HWM = re.compile(r"^VmHWM:\s+(\d+) kB", re.M)


def vm_hwm(pid: int) -> int | None:
    """The kernel's high-water mark of a process's RSS in bytes (None: not readable)."""
    try:
        m = _VM_HWM.search(Path(f"/proc/{pid}/status").read_text())
    except OSError:
        return None
    return int(m.group(1)) << 10 if m else None


def signal_text(info: ExitInfo) -> str:
    if info.signal:
        try:
            return signal.Signals(info.signal).name
        except ValueError:
            return f"signal {info.signal}"
    if info.returncode is not None and info.returncode > 128:
        try:
            return signal.Signals(info.returncode - 128).name
        except ValueError:
            pass
    return f"exit {info.returncode}"


# ---------------------------------------------------------------- specs

@dataclass(frozen=True)
class TargetSpec:
    """A parsed ``--target``: ``p7`` (registered peer), ``ref`` / ``ref-<dialect>``
    (reference server), ``ref[-<dialect>]:KNOB=V[,KNOB=V]`` (the reference server with
    misbehaviour knobs, e.g. ``ref:stall_on=BUFFER_CLEAR``: a server with a planted bug, to see
    the fuzzer find it), ``docker:IMAGE`` (a server image run under Docker; ``docker:p7``
    builds and runs that pin's image), or a path to a server binary or a llama.cpp build dir."""

    kind: str  # "peer" | "ref" | "binary" | "docker"
    name: str  # for reports and file names
    dialect: str | None  # None: ask the server (HELLO) after the first start
    peer: str | None = None
    binary: str | None = None
    knobs: tuple[str, ...] = ()  # reference server only: `harness serve --knob` values
    image: str | None = None  # docker: an image in the engine, or a pin name

    @classmethod
    def parse(cls, text: str, dialect: str | None = None) -> "TargetSpec":
        text = text.strip()
        if dialect is not None and _dialect_or_none(dialect) is None:
            raise TargetError(f"unknown dialect {dialect!r} (see `harness dialects`)")
        head, _, knob_text = text.partition(":")
        if head == "docker":
            if not knob_text:
                raise TargetError(f"{text}: name an image (docker:IMAGE) or a pin (docker:p7)")
            return cls("docker", "docker-" + slug(knob_text), _dialect_or_none(dialect),
                       image=knob_text)
        if head == "ref" or head.startswith("ref-"):
            name = _dialect_or_none(dialect or (head[4:] if head.startswith("ref-") else DEFAULT.name))
            if name is None:
                raise TargetError(f"{text}: unknown dialect (see `harness dialects`)")
            knobs = tuple(k.strip() for k in knob_text.split(",") if k.strip())
            try:
                parse_knobs(knobs)
            except ValueError as e:
                raise TargetError(f"{text}: {e}") from None
            return cls("ref", f"ref-{name}" + "".join(f"+{k}" for k in knobs), name,
                       knobs=knobs)
        path = Path(text).expanduser()
        # A bare word names a peer even where a folder of that name exists (a campaign's
        # out dir is often called after its target); paths are spelt with a slash.
        looks_like_path = os.sep in text or text.startswith(("~", "."))
        if path.exists() and (looks_like_path or not _is_peer_name(text)):
            binary = _find_server_binary(path)
            if binary is None:
                raise TargetError(f"{text}: no ggml-rpc-server / rpc-server in it")
            return cls("binary", binary.name, _dialect_or_none(dialect),
                       binary=str(binary.resolve()))
        try:
            peer = get_peer(text)
        except PeerError as e:
            raise TargetError(f"unknown target {text!r}: {e} (use a peer name from `harness "
                              "peers list`, ref[-DIALECT], or a server path)") from None
        # a pin's own dialect where the version alone does not tell (p7f: 7.0.0+flags)
        proto = dialect or peer.dialect or peer.proto or peer.verified_proto
        d = _dialect_or_none(proto)
        return cls("peer", peer.name, d)

    @property
    def is_reference(self) -> bool:
        return self.kind == "ref"


def _is_peer_name(text: str) -> bool:
    try:
        get_peer(text)
        return True
    except PeerError:
        return False


def _dialect_or_none(name: str | None) -> str | None:
    if not name:
        return None
    try:
        return get_dialect(ALIASES.get(name, name)).name
    except ValueError:
        parts = tuple(int(x) for x in name.split(".")) if re.match(r"^\d+\.\d+\.\d+$", name) \
            else None
        d = dialect_for_version(parts) if parts else None
        return d.name if d else None


def _server_binary(argv: list[str]) -> str:
    """The server executable of a launch command (past wrappers such as stdbuf)."""
    return next((a for a in argv if "rpc-server" in Path(a).name), argv[0])


def _find_server_binary(path: Path) -> Path | None:
    if path.is_file():
        return path
    for sub in ("", "bin", "build/bin"):
        for name in ("ggml-rpc-server", "rpc-server"):
            cand = path / sub / name
            if cand.is_file():
                return cand
    return None


# ---------------------------------------------------------------- targets

class Target:
    """One live target process, restarted on demand. Not thread-safe; one per worker."""

    def __init__(self, spec: TargetSpec, workdir: Path, *, as_limit: int = DEFAULT_AS_LIMIT,
                 rss_limit: int = DEFAULT_RSS_LIMIT, host: str = "127.0.0.1",
                 ready_timeout: float = 30.0, fault_shim: bool = True, standby: bool = False,
                 cache: bool = False, env: dict[str, str] | None = None):
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
        # Standby: after the first death a second process is started in the background, so a
        # restart is a swap instead of a launch (24 ms for p7, which a campaign pays on most
        # crashing cases). Off for targets that never die: no idle twin for nothing.
        self.standby = standby
        self._spare: Future | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._launches = 0
        self._log_offsets: dict[str, int] = {}

    # -- lifecycle
    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        server = self._take_spare()
        self.server = server if server is not None else self._launch_checked(self._next_dir())
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
        if self.standby and self.starts > 1 and self._spare is None:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="target-standby")
            self._spare = self._pool.submit(self._launch_checked, self._next_dir())

    def _next_dir(self) -> Path:
        if not self.standby:
            return self.workdir
        # Three slots: the live process's, the spare's, and the dead one's (its log was read).
        self._launches += 1
        return self.workdir / f"slot{self._launches % 3}"

    def _launch_checked(self, workdir: Path) -> ServerProcess:
        try:
            server = self._launch(workdir)
        except (ServerStartError, PeerError, OSError) as e:
            raise TargetError(f"cannot start {self.spec.name}: {e}") from None
        if self.as_limit and not self.sanitized:
            try:
                resource.prlimit(server.pid, resource.RLIMIT_AS, (self.as_limit, self.as_limit))
            except (OSError, ValueError):
                pass  # e.g. a wrapper already exited; the bound is a safety net, not a test
        return server

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
        fut, self._spare = self._spare, None
        if fut is None:
            return None
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
        # Real servers run with the loopback bind shim: a fuzzed COMM_INIT (8.0.0+) makes a
        # real server listen on 0.0.0.0, which must stay 127.0.0.1 (spec 15.15).
        loopback = _loopback_shim()
        if spec.kind == "peer":
            peer = get_peer(spec.peer or spec.name)
            # the wheel's server is a Python process loading the real libraries: the shim
            # names its faults as it does a C server's (its handler is process-wide and every
            # thread gets an alternate stack, so 8.0.0's per-client threads are covered)
            if not self.fault_shim:
                return start_peer_server(peer, workdir=workdir, host=self.host,
                                         cache_dir=cache_dir, ready_timeout=self.ready_timeout,
                                         env={"LD_PRELOAD": str(loopback)})
            if not peer.available:
                raise PeerError(f"peer {peer.name} is unavailable: {peer.reason}")
            # start_peer_server, plus the fault shim in the environment.
            argv, env = peer.server_cmd(self.host, 0, cache_dir, 1)
            env = self._sanitizer_bounds(env | self.env)
            env = preload_env(with_shim(env, _server_binary(argv)), loopback)
            return ServerProcess.start(lambda h, p: peer.server_cmd(h, p, cache_dir, 1)[0], env,
                                       name=peer.name, host=self.host, workdir=workdir,
                                       ready_timeout=self.ready_timeout)
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
        stdbuf = shutil.which("stdbuf")
        argv = ([stdbuf, "-oL"] if stdbuf else []) + [spec.binary, "-H", "{host}", "-p",
                                                       "{port}", "-t", "1"]
        env = dict(os.environ, GGML_NO_BACKTRACE="1")
        if cache_dir is not None:
            argv.append("-c")
            env["LLAMA_CACHE"] = str(cache_dir)
        env = with_shim(env, spec.binary) if self.fault_shim else env
        return ServerProcess.start(argv, preload_env(self._sanitizer_bounds(env), loopback),
                                   name=Path(spec.binary).name, host=self.host,
                                   workdir=workdir, ready_timeout=self.ready_timeout)

    def _probe_dialect(self) -> str:
        """The dialect of a server given by path: its banner, else its HELLO answer."""
        banner = self.server.banner_version
        d = _dialect_or_none(banner) if banner else None
        if d:
            return d
        for major in (7, 3):  # the 24-byte HELLO of >= 4.0, then the empty one of 3.x
            try:
                version, flags = probe_hello(self.host, self.port, major)
            except PeerError:
                continue
            found = dialect_for_version(version, server_flags_seen=bool(flags))
            if found is not None:
                return found.name
        raise TargetError(f"{self.spec.name}: could not learn its protocol version; "
                          "pass --dialect")

    def stop(self) -> ExitInfo | None:
        """Stop the live process and the standby one."""
        info = self._stop_live()
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
        self._log_offsets = {}  # the next process writes its logs afresh
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
        """A throwaway connection that only says HELLO: is the server serving?"""
        from .strategies import hello_request_frame
        frame = hello_request_frame(self.dialect or DEFAULT.name)
        try:
            with socket.create_connection((self.host, self.port), timeout=timeout) as s:
                s.sendall(frame)
                head = recv_exact(s, 8)
                (n,) = struct.unpack("<Q", head)
                return n < (1 << 16) and len(recv_exact(s, n)) == n
        except OSError:
            return False

    def death_verdict(self, info: ExitInfo, command: str) -> tuple[Signature, str]:
        """The signature of a death, and a human detail (the raw log line, exit status)."""
        lines = self.log_lines()
        report = sanitizer.parse(lines)
        kind = report.kind if report is not None and not report.is_abort else "crash"
        sig = Signature(kind, signal_text(info), death_line(lines), command)
        raw = _PATH.sub(r"\1", death_line(lines, raw=True))  # no machine paths in reports
        if raw.startswith(sig.signal):  # the fault shim's line names the signal itself
            return sig, raw
        return sig, f"{sig.signal}" + (f": {raw}" if raw else " (nothing in the log)")
