"""Local Docker images of built pins, made without any registry.

An image is a root filesystem of the pin's ``bin/`` (at ``/app``) plus every shared library
``ldd`` lists for its programs and libraries, at the paths ``ldd`` names (glibc's loader
included), imported with the engine's import call (``docker import``). Its tag is keyed by
the pin's cache key and a digest of its manifest, so a rebuilt cache entry gets a new image
and an unchanged one is reused.

The same image also runs the real client library: the harness's ctypes agent is Python, so
the libraries the interpreter, its extension modules and numpy link against are added too
(the interpreter itself and the harness are mounted read-only at run time, see
``docker_adapter.DockerClientDriver``). The library under test always comes from the image.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import subprocess
import os
import sys
import tarfile
import threading
from dataclasses import dataclass
from pathlib import Path

from .registry import PeerError, get_pin, manifest_problem, read_manifest

IMAGE_FORMAT = 3  # bump when the image's layout changes: every tag changes with it
DEFAULT_REPOSITORY = "ggml-rpc-harness/reference"
APP_DIR = "/app"
LABEL_PIN = "ggml-rpc-harness.pin"
_LDD_LINE = re.compile(r"(?:=>\s*)?(/\S+)\s+\(0x[0-9a-f]+\)")
_build_lock = threading.Lock()  # cells of one run ask for the same image at once


class ImageError(PeerError):
    """The image cannot be built (pin not built, ldd failed, engine refused the import)."""


@dataclass(frozen=True)
class PinImage:
    pin: str
    tag: str  # repository:tag
    built: bool  # False: it already existed


def _is_elf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def ldd_libraries(paths: list[Path], *, strict: bool = True) -> list[str]:
    """Absolute paths of every library the dynamic loader would map for ``paths`` (sorted).
    ``strict``: a library ldd cannot find is an error (else it is left out: optional
    modules, e.g. numba's TBB pool, may lack theirs on the host as well)."""
    found: set[str] = set()
    for path in paths:
        try:
            out = subprocess.run(["ldd", str(path)], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise ImageError(f"ldd {path}: {e}") from None
        if out.returncode != 0 and "not a dynamic executable" not in out.stdout + out.stderr:
            raise ImageError(f"ldd {path}: {out.stderr.strip() or out.stdout.strip()}")
        for line in out.stdout.splitlines():
            if "not found" in line and strict:
                raise ImageError(f"ldd {path}: {line.strip()}")
            m = _LDD_LINE.search(line)
            if m:
                found.add(os.path.normpath(m.group(1)))
    return sorted(found)


def _python_runtime_files() -> tuple[list[Path], list[str]]:
    """ELF files of the interpreter the agent runs on (its extension modules and every
    compiled module of its site-packages: numpy, numba's llvmlite, ...), and the dirs
    mounted for it, whose own libraries need not be copied."""
    import _ctypes  # an extension module: its dir is lib-dynload, wherever the build put it

    import numpy

    site = Path(numpy.__file__).parents[1]
    mounts = sorted({sys.base_prefix, sys.prefix, str(site)})
    files = [Path(sys.executable).resolve()]
    files += sorted(Path(_ctypes.__file__).parent.glob("*.so"))
    files += sorted(p for p in site.rglob("*.so*") if p.is_file() and not p.is_symlink()
                    and _is_elf(p))
    return files, mounts


STDBUF = "/usr/bin/stdbuf"


def stdbuf_files() -> dict[str, str]:
    """coreutils' stdbuf (at STDBUF in the image) and its preload library, image path ->
    host path: a redirected stdout is block-buffered, and the server's banner would only
    show at its first accept (local servers run under stdbuf too)."""
    stdbuf = shutil.which("stdbuf")
    if stdbuf is None:
        return {}
    for lib in ("/usr/libexec/coreutils/libstdbuf.so", "/usr/lib/coreutils/libstdbuf.so"):
        if os.path.exists(lib):
            return {STDBUF: stdbuf, lib: lib}
    return {}


def image_server_argv(server_target: str = "ggml-rpc-server", host: str = "127.0.0.1",
                port: str = "50052") -> tuple[str, ...]:
    """How a pin image runs its server (line-buffered stdout, one thread, like a local one)."""
    return (STDBUF, "-oL", f"{APP_DIR}/{server_target or 'ggml-rpc-server'}", "-H", host,
            "-p", port, "-t", "1")


def image_tag(pin_name: str, repository: str = DEFAULT_REPOSITORY) -> str:
    """The tag of a built pin's image: ``REPO:<pin>-<cache key>-<digest of its manifest>``."""
    pin = get_pin(pin_name)
    manifest_path = pin.entry_dir / "manifest.json"
    try:
        manifest = manifest_path.read_bytes()
    except OSError:
        raise ImageError(f"{pin.name} is not built: run `harness peers build {pin.name}`") from None
    digest = hashlib.sha256(b"%d\0%s\0%s" % (IMAGE_FORMAT, sys.version.encode(), manifest))
    key = re.sub(r"[^A-Za-z0-9_.-]+", "-", pin.key)
    return f"{repository}:{pin.name}-{key}-{digest.hexdigest()[:10]}"


def rootfs_tar(bin_dir: Path, *, with_python: bool = True,
               drop: tuple[str, ...] = ()) -> bytes:
    """The image's root filesystem as an uncompressed tar. ``drop`` leaves out libraries
    whose file name matches (a planted fault for tests: an image that cannot start)."""
    elves = [p for p in sorted(bin_dir.iterdir()) if p.is_file() and not p.is_symlink()
             and _is_elf(p)]
    if not elves:
        raise ImageError(f"{bin_dir}: no programs or libraries in it")
    extras = stdbuf_files()
    libs = [lib for lib in ldd_libraries(elves + [Path(p) for p in extras.values()])
            if not lib.startswith(str(bin_dir) + "/")]
    if with_python:
        py_files, mounts = _python_runtime_files()
        libs += [lib for lib in ldd_libraries(py_files, strict=False)
                 if not any(lib.startswith(m.rstrip("/") + "/") for m in mounts)]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in ("app", "tmp"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755
            tar.addfile(info)
        for p in sorted(bin_dir.iterdir()):
            if p.name not in drop:
                tar.add(p, arcname=f"app/{p.name}", recursive=False)  # symlinks stay links
        files = {**{lib: lib for lib in libs}, **extras}
        for path, source in sorted(files.items()):
            if Path(path).name not in drop:
                # the file ldd names, dereferenced: /lib may be a link to /usr/lib on the host
                tar.add(str(Path(source).resolve()), arcname=path.lstrip("/"), recursive=False)
    return buf.getvalue()


def build_pin_image(pin_name: str, *, repository: str = DEFAULT_REPOSITORY, client=None,
                    force: bool = False, drop: tuple[str, ...] = (),
                    tag: str | None = None) -> PinImage:
    """Build (or find) the image of a built pin. Raises ImageError with the reason."""
    from .docker_adapter import engine_client

    pin = get_pin(pin_name)
    problem = manifest_problem(pin, read_manifest(pin.entry_dir))
    if problem:
        raise ImageError(f"{pin.name}: {problem}: run `harness peers build {pin.name}`")
    tag = tag or image_tag(pin.name, repository)
    own_client = client is None
    client = client or engine_client()
    try:
        with _build_lock:
            if not force and image_exists(client, tag):
                return PinImage(pin.name, tag, built=False)
            data = rootfs_tar(pin.bin_dir, drop=drop)
            repo, _, version = tag.rpartition(":")
            try:
                client.api.import_image_from_data(
                    data, repository=repo, tag=version,
                    changes=[f"WORKDIR {APP_DIR}", f"ENV LD_LIBRARY_PATH={APP_DIR}",
                             f"LABEL {LABEL_PIN}={pin.name}",
                             "CMD " + json.dumps(list(image_server_argv(pin.server_target)))])
            except Exception as e:  # noqa: BLE001 - the SDK's APIError and transport errors
                raise ImageError(f"import of {tag} failed: {e}") from None
            if not image_exists(client, tag):
                raise ImageError(f"import of {tag} reported success but no such image exists")
            return PinImage(pin.name, tag, built=True)
    finally:
        if own_client:
            client.close()


def image_exists(client, tag: str) -> bool:
    import docker.errors

    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False
