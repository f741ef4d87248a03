"""RealPeer: one real llama.cpp peer on this machine, where it lives and how to start its server."""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from . import sanitize as sanitizers
from .cache import failed_build_log
from .errors import PeerUnavailable
from .manifest import manifest_problem, read_manifest
from .pins import Pin, load_pins
from .supervisor import REAL_PROCESS_ENV
from .tools import missing_build_tools

# the harness package's parent, so a child `python -m harness...` imports this very checkout
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])


WHEEL_SERVER_SOURCE = Path(__file__).with_name("wheel_server.c")


@functools.cache
def wheel_launcher() -> Path | None:
    """wheel_server.c compiled with the system compiler (cached by source hash), or None
    without one: the Python module ``harness.impls.wheel_server`` then starts the server (31 ms
    of CPU a start against 5: a campaign restarts a server after every crash it finds)."""
    from .cache import cache_root
    from .preload_shim import compile_shared_object
    cc = os.environ.get("CC") or "cc"
    if shutil.which(cc) is None:
        return None
    key = hashlib.sha256(WHEEL_SERVER_SOURCE.read_bytes() + cc.encode()).hexdigest()[:16]
    out = cache_root() / "shims" / f"wheel-server-{key}" / "wheel_server"
    if out.exists():
        return out
    try:
        return compile_shared_object(cc, ["-O2", "-Wall", "-Werror", str(WHEEL_SERVER_SOURCE),
                                          "-ldl"], out, 60.0)
    except (RuntimeError, OSError, subprocess.SubprocessError):
        return None


@dataclass
class RealPeer:
    """A real peer: where it lives, what it must announce, and how to start its server."""

    name: str
    pin: str | None  # the pin's readable label; None for user builds
    package: str | None
    version: str | None
    proto: str | None  # expected protocol version (None: a user build not yet verified)
    kind: str  # "pin" | "wheel" | "user"
    bin_dir: Path | None
    available: bool
    reason: str = ""
    verified_proto: str | None = None
    server_binary: Path | None = None  # None for the wheel (served from its libraries)
    lib_dir: Path | None = None  # where libggml-rpc.so lives (the real client library)
    manifest: dict = field(default_factory=dict, repr=False)
    sanitize: tuple[str, ...] = ()  # -fsanitize= names the build has (reports parse as such)
    rdma: bool = False  # built with llama.cpp's RDMA transport
    dialect: str | None = None  # set when the version alone does not tell (7.0.0+flags)
    base: str | None = None  # the release pin a patched pin is built from
    patch_sha256: str = ""  # of the patch applied to its llama.cpp tree ("" = none)
    build_failed: bool = False  # unavailable because its last build failed (not just absent)

    def server_cmd(self, host: str, port: int, cache_dir: Path | str | None = None,
                   threads: int = 1, *, line_buffered: bool = True
                   ) -> tuple[list[str], dict[str, str]]:
        """argv and full environment that start this peer's server on host:port.
        ``line_buffered``: its stdout through ``stdbuf -oL``, so the banner shows in a
        redirected log at once (a launcher that does not read the banner saves that exec: a
        quarter of a restart's CPU, and a fuzz campaign restarts after every crash).

        With ``cache_dir`` the hash cache is on and lives in ``<cache_dir>/rpc`` for every
        kind (the binaries' ``-c`` uses ``$LLAMA_CACHE/rpc``). A sanitizer build gets the
        runtime options of ``harness.impls.sanitize``.
        """
        env = dict(os.environ, **REAL_PROCESS_ENV)
        env.update(sanitizers.runtime_env(self.sanitize, env))
        if self.kind == "wheel":
            if self.lib_dir is None:
                raise PeerUnavailable(f"peer {self.name} has no library dir: {self.reason}")
            cache = str(Path(cache_dir) / "rpc") if cache_dir is not None else None
            launcher = wheel_launcher()
            if launcher is not None:  # the same library calls, without a Python to start
                if cache is not None:
                    Path(cache).mkdir(parents=True, exist_ok=True)
                return [str(launcher), str(self.lib_dir), f"{host}:{port}", str(threads),
                        *([cache] if cache else [])], env
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (_PACKAGE_PARENT, os.environ.get("PYTHONPATH", "")) if p)
            argv = [sys.executable, "-m", "harness.impls.wheel_server", str(self.lib_dir),
                    f"{host}:{port}", "--threads", str(threads)]
            if cache is not None:
                argv += ["--cache-dir", cache]
            return argv, env
        if self.server_binary is None:
            raise PeerUnavailable(f"peer {self.name} has no server binary: {self.reason}")
        # stdout is block-buffered when redirected: the banner would only show at first accept.
        stdbuf = shutil.which("stdbuf") if line_buffered else None
        argv = ([stdbuf, "-oL"] if stdbuf else []) + [
            str(self.server_binary), "-H", host, "-p", str(port), "-t", str(threads)]
        if cache_dir is not None:
            argv.append("-c")
            env["LLAMA_CACHE"] = str(cache_dir)
        return argv, env

    @property
    def display_proto(self) -> str:
        return self.proto or self.verified_proto or "?"


def peer_from_pin(pin: Pin, manifest: dict | None = None) -> RealPeer:
    """The peer a pin gives: available if its cache entry is complete and verified."""
    peer = _peer_of(pin, bin_dir=None, available=False)
    manifest = manifest if manifest is not None else read_manifest(pin.entry_dir)
    problem = manifest_problem(pin, manifest)
    if problem is None:
        peer.available = True
        peer.bin_dir = peer.lib_dir = pin.bin_dir
        peer.manifest = manifest
        peer.verified_proto = manifest.get("verified_proto")
        if pin.server_target:
            peer.server_binary = pin.bin_dir / manifest.get("server", pin.server_target)
        return peer
    peer.reason = f"{problem}: run `{build_command(pin)}`"
    failed = failed_build_log(pin.key)
    if failed is not None:
        peer.build_failed = True
        peer.reason = f"its last build failed (log: {failed}); {peer.reason}"
    missing = missing_build_tools(pin)
    if missing:
        peer.reason += f" (needs {', '.join(missing)})"
    return peer


def build_command(pin: Pin) -> str:
    """The `harness peers build` line that builds ``pin``."""
    if pin.is_source_build:
        return f"harness peers add --source-dir TREE --name {pin.name}"
    if pin.patch and not _shipped(pin):
        cmd = f"harness peers build --base {pin.base} --patch {pin.patch} --name {pin.name.split('+')[0]}"
    else:
        cmd = f"harness peers build {pin.name.split('+')[0]}"
    if pin.sanitize:
        cmd += " --sanitize " + ",".join(pin.sanitize)
    if pin.rdma:
        cmd += " --rdma"
    return cmd


def _shipped(pin: Pin) -> bool:
    return pin.name.split("+")[0] in load_pins()


def staged_peer(pin: Pin, bin_dir: Path, server: str | None) -> RealPeer:
    """A peer for a build not yet in the cache (verified before it is installed)."""
    return _peer_of(pin, bin_dir=bin_dir, available=True, lib_dir=bin_dir,
                    server_binary=bin_dir / server if server else None)


def _peer_of(pin: Pin, **where) -> RealPeer:
    return RealPeer(name=pin.name, pin=pin.label, package=pin.package, version=pin.version,
                    proto=pin.proto, kind=pin.peer_kind, sanitize=pin.sanitize, rdma=pin.rdma,
                    dialect=pin.dialect or None, base=pin.base or None,
                    patch_sha256=pin.patch_sha256, **where)


def client_library_env(lib_dir: Path | str) -> dict[str, str]:
    """What a process loading a build's libraries (the ctypes client) needs in its environment:
    nothing for a release; for a sanitizer build its runtimes preloaded (an uninstrumented
    Python must load them before anything else) and the sanitizers' runtime options."""
    manifest = read_manifest(Path(lib_dir).parent) or {}
    runtimes = manifest.get("sanitizer_runtimes") or []
    if not runtimes:
        return {}
    return {"LD_PRELOAD": " ".join(runtimes),
            **sanitizers.runtime_env(tuple(manifest.get("sanitize", ())))}


def peer_from_user_record(record: dict) -> RealPeer:
    server = Path(record["server"]) if record.get("server") else None
    lib_dir = Path(record["lib_dir"]) if record.get("lib_dir") else None
    peer = RealPeer(name=record["name"], pin=None, package=None, version=None,
                    proto=record.get("verified_proto"), kind="user",
                    bin_dir=server.parent if server else None, available=True,
                    verified_proto=record.get("verified_proto"), server_binary=server,
                    lib_dir=lib_dir, manifest=record)
    if server is None or not server.is_file():
        peer.available = False
        peer.reason = f"server binary missing: {server}"
    return peer
