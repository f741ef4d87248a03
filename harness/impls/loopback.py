"""Keep a real server's own listeners on loopback: the loopback_bind.c preload shim.

The real 8.0.0 server's rank-0 COMM_INIT listens on 0.0.0.0 (spec 15.15) and the harness may
only listen on 127.0.0.1. A private network namespace (``unshare -n``) would need root and put
the test process itself inside it; a preload shim rewrites just that bind, in just the real
server's process, works unprivileged and in CI, and is checked from outside (which library is
mapped, which addresses are in LISTEN).

* ``ensure_loopback_shim()``: the shim compiled with the system compiler, cached by source hash;
* ``start_loopback_peer_server(peer, ...)``: ``start_peer_server`` with the shim preloaded;
* ``require_loopback_only(server)``: raises unless the shim is mapped in the server process
  and every socket it listens on is a loopback address; call it before any COMM_INIT.
"""

from __future__ import annotations

import hashlib
import socket
from pathlib import Path

from .cache import cache_root
from .errors import ImplError, PeerUnavailable
from .preload_shim import compile_shared_object
from .supervisor import ServerProcess, _socket_inodes_of

SHIM_SOURCE = Path(__file__).with_name("loopback_bind.c")
SHIM_NAME = "libloopback_bind.so"
REWRITE_LOG = "[loopback_bind]"  # the shim's stderr line for each rewritten bind


class NotLoopbackOnly(ImplError):
    """A real server could listen beyond loopback: the harness refuses to go on."""


def ensure_loopback_shim(*, out_dir: Path | str | None = None, cc: str = "cc",
                         timeout: float = 60.0) -> Path:
    """Compile loopback_bind.c (no dependencies but libc); cached per source and compiler."""
    key = hashlib.sha256(SHIM_SOURCE.read_bytes() + cc.encode()).hexdigest()[:16]
    d = Path(out_dir) if out_dir else cache_root() / "shims" / f"loopback-{key}"
    out = d / SHIM_NAME
    if out.exists():
        return out
    return compile_shared_object(cc, ["-O2", "-shared", "-fPIC", "-Wall", "-Werror",
                                      str(SHIM_SOURCE), "-ldl"], out, timeout)


def preload_env(env: dict[str, str], shim: Path) -> dict[str, str]:
    """``env`` with the shim first in LD_PRELOAD (a sanitizer runtime, if any, stays)."""
    others = [p for p in env.get("LD_PRELOAD", "").split() if p and p != str(shim)]
    return dict(env, LD_PRELOAD=" ".join([str(shim), *others]))


def start_loopback_peer_server(peer, *, workdir: Path | str | None = None, threads: int = 1,
                               shim: Path | None = None, ready_timeout: float = 30.0
                               ) -> ServerProcess:
    """A real peer's server on 127.0.0.1 with loopback_bind preloaded."""
    if not peer.available:
        raise PeerUnavailable(f"peer {peer.name} is unavailable: {peer.reason}")
    shim = shim or ensure_loopback_shim()
    _, env = peer.server_cmd("127.0.0.1", 0, None, threads)
    return ServerProcess.start(lambda h, p: peer.server_cmd(h, p, None, threads)[0],
                               preload_env(env, shim), name=peer.name, host="127.0.0.1",
                               workdir=workdir, ready_timeout=ready_timeout)


def shim_mapped(pid: int) -> bool:
    """The loopback shim is loaded in process ``pid`` (its library is in /proc/PID/maps)."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False
    return any(line.rstrip().endswith("/" + SHIM_NAME) for line in maps.splitlines())


_TCP_LISTEN = "0A"


def _hex_addr(field: str) -> str:
    """An address of /proc/net/tcp{,6} (raw in-memory words, hex) as text."""
    raw = bytes.fromhex(field)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, words)


def listeners_of(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket process ``pid`` has in LISTEN, IPv4 and IPv6."""
    inodes = _socket_inodes_of(pid)
    if inodes is None:
        raise NotLoopbackOnly(f"cannot read the sockets of pid {pid}")
    inodes = {str(i) for i in inodes}
    out = []
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == _TCP_LISTEN and f[9] in inodes:
                addr, port = f[1].rsplit(":", 1)
                out.append((_hex_addr(addr), int(port, 16)))
    return out


def _is_loopback(addr: str) -> bool:
    return addr.startswith("127.") or addr == "::1" or addr.startswith("::ffff:127.")


def require_loopback_only(server: ServerProcess) -> list[tuple[str, int]]:
    """Raise NotLoopbackOnly unless ``server`` runs with the shim and listens on loopback
    only; returns its listeners."""
    if not shim_mapped(server.pid):
        raise NotLoopbackOnly(f"{server.name} (pid {server.pid}) runs without {SHIM_NAME}: its "
                              "COMM_INIT would listen on every interface; start it with "
                              "start_loopback_peer_server")
    listeners = listeners_of(server.pid)
    wide = [(a, p) for a, p in listeners if not _is_loopback(a)]
    if wide:
        raise NotLoopbackOnly(f"{server.name} listens beyond loopback: {wide}")
    return listeners
