"""Which real peers exist on this machine: every pin (built or not), every built variant, and
the user's registered build dirs. ``get_peer`` finds one by name.

This is the module the rest of the harness imports peers from; it re-exports the names that
used to live here before the package was split (one job per module):

    cache.py        cache paths; atomic entries           pins.py      pins.toml, variants
    manifest.py     manifest.json and entry validity      verify.py    HELLO probe, verify_peer
    realpeer.py     RealPeer (start command, env)         user_builds  `harness peers add`
    source.py       llama.cpp tree: proto, RDMA, patch    fetch.py     pip download, unpack
    build.py        building pins into the cache          progress.py  build progress UI
    supervisor.py   server processes                      errors.py    ImplError and below
"""

from __future__ import annotations

from .cache import CACHE_ENV, cache_root, downloads_dir, peers_dir, remove_entry, user_peers_file
from .errors import (ImplError, MislabelledPeer, PeerError, PeerNotFound, PeerUnavailable,
                     VerificationError)
from .manifest import MANIFEST_FORMAT, MANIFEST_NAME, built_entries, manifest_problem, \
    read_manifest
from .pins import SANITIZER_TAGS, Pin, get_pin, load_pins, parse_pins
from .built_peer import RealPeer, peer_from_pin
from .source import header_proto
from .user_builds import SERVER_NAMES, add_user_build, remove_user_build, user_peers
from .verify import Verification, hello_request, probe_hello, verify_peer

Peer = RealPeer  # the name before the split; "peer" alone means a real peer

__all__ = [
    "CACHE_ENV", "MANIFEST_FORMAT", "MANIFEST_NAME", "SERVER_NAMES", "ImplError",
    "MislabelledPeer", "Peer", "PeerError", "PeerNotFound", "PeerUnavailable", "Pin", "RealPeer",
    "Verification", "VerificationError", "add_user_build", "cache_root", "downloads_dir",
    "get_peer", "get_pin", "header_proto", "hello_request", "list_peers", "load_pins",
    "local_pins", "manifest_problem", "parse_pins", "peer_summary", "peers_dir", "probe_hello",
    "read_manifest", "remove_peer", "remove_user_build", "resolve_pin", "user_peers_file",
    "verify_peer",
]


def local_pins() -> dict[str, Pin]:
    """Built pins that pins.toml does not define (variants, patched pins built from the CLI)."""
    shipped = {p.key for p in load_pins().values()}
    return {pin.name: pin for pin, _ in built_entries() if pin.key not in shipped}


def resolve_pin(name: str | Pin) -> Pin:
    """A shipped pin, a variant name (``p7+asan``), or a patched pin built from the CLI."""
    return name if isinstance(name, Pin) else get_pin(name, local=local_pins())


def list_peers(*, verify: bool = False) -> list[RealPeer]:
    """Every pin (built or not, in pins.toml order), then every other built entry (variants,
    patched pins from the CLI), then the user's registered builds.

    With ``verify`` every available peer is started and must announce its expected proto in
    its banner and in HELLO; a peer that does not is marked unavailable with the reason.
    """
    shipped = list(load_pins().values())
    shipped_keys = {p.key for p in shipped}
    peers = [peer_from_pin(pin) for pin in shipped]
    peers += [peer_from_pin(pin, manifest)
              for pin, manifest in sorted(built_entries(), key=lambda e: e[0].name)
              if pin.key not in shipped_keys]
    peers += user_peers()
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


def get_peer(name_or_alias: str) -> RealPeer:
    """A peer by name, pin label, package==version, or proto version (pins first); a variant
    that is not built yet (``p7+asan+ubsan``) comes back unavailable, saying how to build it."""
    peers = list_peers()
    for peer in peers:
        if name_or_alias in (peer.name, peer.pin, f"{peer.package}=={peer.version}"):
            return peer
    for peer in peers:
        if name_or_alias == peer.proto:
            return peer
    try:
        return peer_from_pin(resolve_pin(name_or_alias))
    except PeerNotFound:
        raise PeerNotFound(f"no peer named {name_or_alias!r} "
                           f"(known: {', '.join(p.name for p in peers)})") from None


def remove_peer(name: str) -> str | None:
    """Forget a user build or delete a pin's or variant's cache entry; what was removed, or
    None when there was nothing by that name."""
    if remove_user_build(name):
        return f"user build {name}"
    try:
        pin = resolve_pin(name)
    except PeerError:
        return None
    return f"cache entry {pin.key}" if remove_entry(pin.key) else None


def peer_summary(peer: RealPeer) -> dict:
    """A JSON-safe description of a peer (``harness peers list --json``)."""
    return {
        "name": peer.name,
        "pin": peer.pin,
        "package": peer.package,
        "version": peer.version,
        "kind": peer.kind,
        "proto": peer.proto,
        "dialect": peer.dialect,
        "available": peer.available,
        "verified_proto": peer.verified_proto,
        "bin_dir": str(peer.bin_dir) if peer.bin_dir else None,
        "server": str(peer.server_binary) if peer.server_binary else None,
        "lib_dir": str(peer.lib_dir) if peer.lib_dir else None,
        "reason": peer.reason,
        "commit": peer.manifest.get("commit"),
        "targets": peer.manifest.get("targets"),
        "build_seconds": peer.manifest.get("build_seconds"),
        "base": peer.base,
        "patch_sha256": peer.patch_sha256 or None,
        "sanitize": list(peer.sanitize),
        "rdma": peer.rdma,
        "variant": variant_text(peer),
    }


def variant_text(peer: RealPeer) -> str:
    """One word per way the build differs from its release: ``patch asan ubsan rdma``."""
    words = ["patch"] if peer.patch_sha256 else []
    words += [SANITIZER_TAGS[s] for s in peer.sanitize]
    if peer.rdma:
        words.append("rdma")
    return " ".join(words)
