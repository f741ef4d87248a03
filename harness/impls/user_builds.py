"""The user's own llama.cpp build dirs, registered with ``harness peers add`` and kept in
``<cache root>/user-peers.json``."""

from __future__ import annotations

import json
import os
import re
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from .cache import user_peers_file
from .errors import MislabelledPeer, PeerError
from .manifest import MANIFEST_FORMAT
from .pins import load_pins
from .built_peer import RealPeer, peer_from_user_record
from .source import header_proto
from .verify import verify_peer

SERVER_NAMES = ("ggml-rpc-server", "rpc-server")
RPC_LIB = "libggml-rpc.so"


def load_user_records() -> list[dict]:
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


def user_peers() -> list[RealPeer]:
    return [peer_from_user_record(r) for r in load_user_records()]


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


def add_user_build(build_dir: Path | str, name: str | None = None) -> RealPeer:
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

    probe = RealPeer(name=name or "user", pin=None, package=None, version=None, proto=None,
                     kind="user", bin_dir=server.parent, available=True, server_binary=server,
                     lib_dir=lib_dir)
    result = verify_peer(probe, expected=from_header)
    if result.banner is None:
        raise MislabelledPeer(f"{server} printed no 'Starting RPC server vX.Y.Z' banner")

    records = [r for r in load_user_records() if Path(r.get("build_dir", "")) != build_dir]
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
    return peer_from_user_record(record)


def remove_user_build(name: str) -> bool:
    """Forget a registered user build; True if it was there."""
    records = load_user_records()
    kept = [r for r in records if r["name"] != name]
    if len(kept) == len(records):
        return False
    _save_user_records(kept)
    return True
