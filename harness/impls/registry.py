"""Which real llama.cpp peers exist on this machine, and how to start and verify them.

Three sources: the pins in ``pins.toml`` (built into the cache by ``build.build_pin``), the
prebuilt proto-8 wheel (a pin of kind "wheel", served through ``wheel_server``), and the
user's own llama.cpp build dirs registered with ``add_user_build`` (kept in
``<cache root>/user-peers.json``).

Cache layout (root: $GGML_RPC_HARNESS_CACHE, else the platform user cache dir)::

    peers/<package>==<version>/bin/            server + libggml*.so (+ extra targets)
    peers/<package>==<version>/manifest.json   what was built, how long it took, what it announced
    downloads/                                 kept sdists/wheels, so a rebuild skips pip
    user-peers.json
"""

from __future__ import annotations

import functools
import importlib.resources
import json
import os
import re
import shutil
import socket
import struct
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import platformdirs

from ..transport.tcp import recv_exact

CACHE_ENV = "GGML_RPC_HARNESS_CACHE"
MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 1
SERVER_NAMES = ("ggml-rpc-server", "rpc-server")
RPC_LIB = "libggml-rpc.so"
HELLO_CMD = 14
CONN_CAPS_SIZE = 24
_HELLO_TIMEOUT = 5.0
_VERSION_RE = re.compile(r"^\d+\.\d+\.\d+$")


class PeerError(RuntimeError):
    """Base class of the registry's errors."""


class PeerNotFound(PeerError, KeyError):
    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class PeerUnavailable(PeerError):
    """The peer exists but cannot be started here (not built, tools missing, ...)."""


class VerificationError(PeerError):
    """The server did not come up or did not answer HELLO."""


class MislabelledPeer(VerificationError):
    """The server announced another protocol version than its pin promises."""


# --------------------------------------------------------------------------- cache paths
def cache_root() -> Path:
    """Root of everything the harness caches; $GGML_RPC_HARNESS_CACHE overrides it."""
    override = os.environ.get(CACHE_ENV)
    return Path(override) if override else Path(platformdirs.user_cache_dir("ggml-rpc-harness"))


def peers_dir() -> Path:
    return cache_root() / "peers"


def downloads_dir() -> Path:
    return cache_root() / "downloads"


def user_peers_file() -> Path:
    return cache_root() / "user-peers.json"


# ---------------------------------------------------------------------------------- pins
@dataclass(frozen=True)
class Pin:
    """One pinned PyPI release that provides a real peer (a row of pins.toml)."""

    name: str
    label: str
    package: str
    version: str
    proto: str
    kind: str  # "sdist" | "wheel"
    source_subdir: str
    server_target: str  # "" for library-only pins
    no_binary: bool = False
    commit_file: str = ""

    @property
    def key(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def entry_dir(self) -> Path:
        return peers_dir() / self.key

    @property
    def bin_dir(self) -> Path:
        return self.entry_dir / "bin"

    @property
    def peer_kind(self) -> str:
        return "wheel" if self.kind == "wheel" else "pin"


_PIN_KINDS = ("sdist", "wheel")


def parse_pins(text: str) -> dict[str, Pin]:
    """Pins from TOML text, keyed by short name; raises ValueError on a malformed table."""
    data = tomllib.loads(text)
    pins: dict[str, Pin] = {}
    known = set(Pin.__dataclass_fields__)
    for row in data.get("pin", []):
        unknown = set(row) - known
        if unknown:
            raise ValueError(f"pin {row.get('name')!r}: unknown keys {sorted(unknown)}")
        try:
            pin = Pin(**row)
        except TypeError as e:
            raise ValueError(f"pin {row.get('name')!r}: {e}") from None
        if pin.kind not in _PIN_KINDS:
            raise ValueError(f"pin {pin.name}: kind must be one of {_PIN_KINDS}, not {pin.kind!r}")
        if not _VERSION_RE.match(pin.proto):
            raise ValueError(f"pin {pin.name}: proto {pin.proto!r} is not X.Y.Z")
        if pin.kind == "sdist" and not pin.server_target:
            raise ValueError(f"pin {pin.name}: an sdist pin needs a server_target")
        if pin.name in pins:
            raise ValueError(f"pin {pin.name} defined twice")
        pins[pin.name] = pin
    return pins


@functools.cache
def load_pins() -> dict[str, Pin]:
    """The pins shipped with the harness (harness/impls/pins.toml), in file order."""
    text = importlib.resources.files(__package__).joinpath("pins.toml").read_text()
    return parse_pins(text)


def get_pin(name_or_alias: str) -> Pin:
    """A pin by short name, label, package==version or proto version; ``llama.cpp==X`` names
    the llama.cpp build of any of those (``llama.cpp==p7``, ``llama.cpp==0.3.36``,
    ``llama.cpp==7.0.0``)."""
    pins = load_pins()
    if name_or_alias.startswith("llama.cpp=="):
        inner = name_or_alias.split("==", 1)[1]
        for pin in pins.values():
            if inner in (pin.name, pin.version, pin.proto, pin.label, pin.key):
                return pin
    for pin in pins.values():
        if name_or_alias in (pin.name, pin.label, pin.key):
            return pin
    for pin in pins.values():
        if name_or_alias == pin.proto:
            return pin
    raise PeerNotFound(f"no pin named {name_or_alias!r} (known: {', '.join(pins)})")


def read_manifest(entry_dir: Path) -> dict | None:
    try:
        return json.loads((Path(entry_dir) / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return None


def manifest_problem(pin: Pin, manifest: dict | None, targets: tuple[str, ...] = ()) -> str | None:
    """Why a cache entry cannot be used as is (None when it can)."""
    if manifest is None:
        return "not built"
    if manifest.get("format") != MANIFEST_FORMAT or manifest.get("pin", {}).get("name") != pin.name:
        return "cache entry from another harness version"
    if manifest.get("verified_proto") != pin.proto:
        return f"cache entry verified as {manifest.get('verified_proto')}, pin says {pin.proto}"
    missing = [f for f in manifest.get("files", []) if not os.path.lexists(pin.bin_dir / f)]
    if missing or not manifest.get("files"):
        return f"cache entry incomplete (missing {', '.join(missing[:3]) or 'file list'})"
    lacking = [t for t in targets if t not in manifest.get("targets", [])]
    if lacking:
        return f"cache entry lacks targets {', '.join(lacking)}"
    return None


# --------------------------------------------------------------------------------- peers
@dataclass
class Peer:
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

    def server_cmd(self, host: str, port: int, cache_dir: Path | str | None = None,
                   threads: int = 1) -> tuple[list[str], dict[str, str]]:
        """argv and full environment that start this peer's server on host:port.

        With ``cache_dir`` the hash cache is on and lives in ``<cache_dir>/rpc`` for every
        kind (the binaries' ``-c`` uses ``$LLAMA_CACHE/rpc``).
        """
        env = dict(os.environ, GGML_NO_BACKTRACE="1")
        if self.kind == "wheel":
            if self.lib_dir is None:
                raise PeerUnavailable(f"peer {self.name} has no library dir: {self.reason}")
            package_parent = str(Path(__file__).resolve().parents[2])
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (package_parent, os.environ.get("PYTHONPATH", "")) if p)
            argv = [sys.executable, "-m", "harness.impls.wheel_server", str(self.lib_dir),
                    f"{host}:{port}", "--threads", str(threads)]
            if cache_dir is not None:
                argv += ["--cache-dir", str(Path(cache_dir) / "rpc")]
            return argv, env
        if self.server_binary is None:
            raise PeerUnavailable(f"peer {self.name} has no server binary: {self.reason}")
        # stdout is block-buffered when redirected: the banner would only show at first accept.
        stdbuf = shutil.which("stdbuf")
        argv = ([stdbuf, "-oL"] if stdbuf else []) + [
            str(self.server_binary), "-H", host, "-p", str(port), "-t", str(threads)]
        if cache_dir is not None:
            argv.append("-c")
            env["LLAMA_CACHE"] = str(cache_dir)
        return argv, env

    @property
    def display_proto(self) -> str:
        return self.proto or self.verified_proto or "?"


def _peer_from_pin(pin: Pin) -> Peer:
    peer = Peer(name=pin.name, pin=pin.label, package=pin.package, version=pin.version,
                proto=pin.proto, kind=pin.peer_kind, bin_dir=None, available=False)
    manifest = read_manifest(pin.entry_dir)
    problem = manifest_problem(pin, manifest)
    if problem is None:
        peer.available = True
        peer.bin_dir = peer.lib_dir = pin.bin_dir
        peer.manifest = manifest
        peer.verified_proto = manifest.get("verified_proto")
        if pin.server_target:
            peer.server_binary = pin.bin_dir / manifest.get("server", pin.server_target)
        return peer
    hint = f"run `harness peers build {pin.name}`"
    from .build import missing_build_tools  # late: build imports this module

    missing = missing_build_tools(pin)
    peer.reason = f"{problem}: {hint}" + (f" (needs {', '.join(missing)})" if missing else "")
    return peer


def _load_user_records() -> list[dict]:
    try:
        data = json.loads(user_peers_file().read_text())
    except (OSError, ValueError):
        return []
    return [r for r in data.get("peers", []) if isinstance(r, dict) and r.get("name")]


def _save_user_records(records: list[dict]) -> None:
    path = user_peers_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".user-peers-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump({"format": MANIFEST_FORMAT, "peers": records}, f, indent=2)
    os.replace(tmp, path)


def _peer_from_user_record(record: dict) -> Peer:
    server = Path(record["server"]) if record.get("server") else None
    lib_dir = Path(record["lib_dir"]) if record.get("lib_dir") else None
    peer = Peer(name=record["name"], pin=None, package=None, version=None,
                proto=record.get("verified_proto"), kind="user",
                bin_dir=server.parent if server else None, available=True,
                verified_proto=record.get("verified_proto"), server_binary=server,
                lib_dir=lib_dir, manifest=record)
    if server is None or not server.is_file():
        peer.available = False
        peer.reason = f"server binary missing: {server}"
    return peer


def list_peers(*, verify: bool = False) -> list[Peer]:
    """Every pin (built or not, in pins.toml order), then the user's registered builds.

    With ``verify`` every available peer is started and must announce its expected proto in
    its banner and in HELLO; a peer that does not is marked unavailable with the reason.
    """
    peers = [_peer_from_pin(pin) for pin in load_pins().values()]
    peers += [_peer_from_user_record(r) for r in _load_user_records()]
    if verify:
        for peer in peers:
            if not peer.available:
                continue
            try:
                peer.verified_proto = verify_peer(peer).version
            except VerificationError as e:
                peer.available = False
                peer.reason = str(e)
    return peers


def get_peer(name_or_alias: str) -> Peer:
    """A peer by name, pin label, package==version, or proto version (pins first)."""
    peers = list_peers()
    for peer in peers:
        if name_or_alias in (peer.name, peer.pin, f"{peer.package}=={peer.version}"):
            return peer
    for peer in peers:
        if name_or_alias == peer.proto:
            return peer
    raise PeerNotFound(f"no peer named {name_or_alias!r} "
                       f"(known: {', '.join(p.name for p in peers)})")


# ---------------------------------------------------------------------------- verification
@dataclass
class Verification:
    """What a server announced: its banner version and its HELLO reply."""

    banner: str | None
    hello: str | None
    flags: int | None = None
    seconds: float = 0.0

    @property
    def version(self) -> str | None:
        return self.hello or self.banner


def hello_request(major: int) -> bytes:
    """HELLO as a proto-``major`` client sends it: empty before 4.0, 24 caps bytes from 4.0."""
    if major < 4:
        return bytes([HELLO_CMD]) + struct.pack("<Q", 0)
    return bytes([HELLO_CMD]) + struct.pack("<Q", CONN_CAPS_SIZE) + bytes(CONN_CAPS_SIZE)


def probe_hello(host: str, port: int, major: int,
                timeout: float = _HELLO_TIMEOUT) -> tuple[tuple[int, int, int], int | None]:
    """Send HELLO in the proto-``major`` layout; returns ((major, minor, patch), flags or None).

    Raises VerificationError when the reply does not have the layout that major implies.
    """
    expected_len = 3 if major < 4 else 4 + CONN_CAPS_SIZE
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(hello_request(major))
            length, = struct.unpack("<Q", recv_exact(sock, 8))
            if length != expected_len:
                raise VerificationError(f"HELLO reply is {length} bytes, a proto-{major} server "
                                        f"sends {expected_len}")
            payload = recv_exact(sock, length)
    except (OSError, ConnectionError) as e:
        raise VerificationError(f"no HELLO reply from {host}:{port} ({e})") from None
    version = (payload[0], payload[1], payload[2])
    return version, (payload[3] if length > 3 else None)


def _version_str(v: tuple[int, int, int]) -> str:
    return ".".join(map(str, v))


def verify_peer(peer: Peer, *, expected: str | None = None, timeout: float = 30.0) -> Verification:
    """Start ``peer``'s server on a free local port, read its banner, HELLO it, stop it.

    ``expected`` defaults to the peer's pinned proto. Raises MislabelledPeer if the banner or
    HELLO disagree with it (or with each other), VerificationError if it does not answer.
    """
    from .supervisor import ServerStartError, start_peer_server

    expected = expected or peer.proto
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"verify-{peer.name}-") as workdir:
        try:
            server = start_peer_server(peer, workdir=workdir, ready_timeout=timeout)
        except ServerStartError as e:
            raise VerificationError(f"{peer.name}: server did not start: {e}") from None
        with server:
            banner = server.banner_version
            major = int((expected or banner or "4").split(".")[0])
            try:
                version, flags = probe_hello(server.host, server.port, major)
            except VerificationError as first:
                if expected is not None or major < 4:
                    raise VerificationError(f"{peer.name}: {first}; log: "
                                            + " | ".join(server.log_tail(6))) from None
                # Unknown build without a banner: it may be a 3.x server (empty HELLO).
                version, flags = probe_hello(server.host, server.port, 3)
            hello = _version_str(version)
    result = Verification(banner=banner, hello=hello, flags=flags,
                          seconds=time.monotonic() - started)
    if banner is not None and banner != hello:
        raise MislabelledPeer(f"mislabelled peer {peer.name}: banner says {banner}, "
                              f"HELLO says {hello}")
    if expected is not None and hello != expected:
        raise MislabelledPeer(f"mislabelled peer {peer.name}: expected proto {expected}, "
                              f"banner {banner or 'missing'}, HELLO {hello}")
    return result


# ---------------------------------------------------------------------------- user builds
def header_proto(source_dir: Path) -> str | None:
    """RPC_PROTO_{MAJOR,MINOR,PATCH}_VERSION from ggml/include/ggml-rpc.h under source_dir."""
    header = Path(source_dir) / "ggml" / "include" / "ggml-rpc.h"
    try:
        text = header.read_text(errors="replace")
    except OSError:
        return None
    parts = []
    for which in ("MAJOR", "MINOR", "PATCH"):
        m = re.search(rf"#define\s+RPC_PROTO_{which}_VERSION\s+(\d+)", text)
        if not m:
            return None
        parts.append(m.group(1))
    return ".".join(parts)


def _find_server(build_dir: Path) -> Path | None:
    for directory in (build_dir / "bin", build_dir):
        for name in SERVER_NAMES:
            candidate = directory / name
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return candidate
    return None


def _find_rpc_lib_dir(build_dir: Path, server: Path) -> Path | None:
    for directory in (server.parent, build_dir / "bin", build_dir):
        if any((directory / n).exists() for n in (RPC_LIB, RPC_LIB + ".0")):
            return directory
    found = next(iter(sorted(build_dir.rglob(RPC_LIB))), None)
    return found.parent if found else None


def _source_dir_of(build_dir: Path) -> Path | None:
    try:
        cache = (build_dir / "CMakeCache.txt").read_text(errors="replace")
    except OSError:
        return None
    m = re.search(r"^CMAKE_HOME_DIRECTORY:INTERNAL=(.*)$", cache, re.MULTILINE)
    return Path(m.group(1).strip()) if m else None


def add_user_build(build_dir: Path | str, name: str | None = None) -> Peer:
    """Register a llama.cpp build dir as a peer, after verifying what its server announces.

    The dir must hold ``bin/ggml-rpc-server`` (or ``rpc-server``); ``libggml-rpc.so`` is
    recorded when present (it is the real client library). Re-adding the same dir replaces
    its record. Raises PeerError when nothing usable is found or the server misbehaves.
    """
    build_dir = Path(build_dir).expanduser().resolve()
    server = _find_server(build_dir)
    if server is None:
        raise PeerError(f"no {' or '.join(SERVER_NAMES)} under {build_dir}/bin or {build_dir} "
                        "(build it with: cmake --build <dir> --target ggml-rpc-server)")
    lib_dir = _find_rpc_lib_dir(build_dir, server)
    source_dir = _source_dir_of(build_dir)
    from_header = header_proto(source_dir) if source_dir else None

    probe = Peer(name=name or "user", pin=None, package=None, version=None, proto=None,
                 kind="user", bin_dir=server.parent, available=True, server_binary=server,
                 lib_dir=lib_dir)
    result = verify_peer(probe, expected=from_header)
    if result.banner is None:
        raise MislabelledPeer(f"{server} printed no 'Starting RPC server vX.Y.Z' banner")

    records = [r for r in _load_user_records() if Path(r.get("build_dir", "")) != build_dir]
    taken = {r["name"] for r in records} | set(load_pins()) | {p.label for p in load_pins().values()}
    if name is None:
        name = base = f"user-{result.version}"
        suffix = 2
        while name in taken:
            name, suffix = f"{base}-{suffix}", suffix + 1
    elif name in taken:
        raise PeerError(f"peer name {name!r} is already used")
    record = {
        "name": name,
        "build_dir": str(build_dir),
        "server": str(server),
        "lib_dir": str(lib_dir) if lib_dir else None,
        "source_dir": str(source_dir) if source_dir else None,
        "header_proto": from_header,
        "banner": result.banner,
        "verified_proto": result.version,
        "added_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    _save_user_records(records + [record])
    return _peer_from_user_record(record)


def remove_user_build(name: str) -> bool:
    """Forget a registered user build; True if it was there."""
    records = _load_user_records()
    kept = [r for r in records if r["name"] != name]
    if len(kept) == len(records):
        return False
    _save_user_records(kept)
    return True


def peer_summary(peer: Peer) -> dict:
    """A JSON-safe description of a peer (``harness peers list --json``)."""
    return {
        "name": peer.name,
        "pin": peer.pin,
        "package": peer.package,
        "version": peer.version,
        "kind": peer.kind,
        "proto": peer.proto,
        "available": peer.available,
        "verified_proto": peer.verified_proto,
        "bin_dir": str(peer.bin_dir) if peer.bin_dir else None,
        "server": str(peer.server_binary) if peer.server_binary else None,
        "lib_dir": str(peer.lib_dir) if peer.lib_dir else None,
        "reason": peer.reason,
        "commit": peer.manifest.get("commit"),
        "targets": peer.manifest.get("targets"),
        "build_seconds": peer.manifest.get("build_seconds"),
    }
