"""One interface over every kind of implementation the matrix can put in a role.

An adapter knows whether its implementation is available here (and why not), how to start
its server under supervision, and how to open a client session. The matrix treats the
reference peer, real llama.cpp pins, user builds and docker images alike through it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..peer.knobs import Misbehaviour
from .driver import ClientDriver
from .supervisor import ServerProcess, start_peer_server, start_reference_server


@dataclass
class Adapter:
    name: str  # the implementation's name in matrix.yaml
    kind: str  # ref | pin | user | docker
    dialect: str
    pin: str | None = None
    image: str | None = None
    command: list[str] | None = None
    container_port: int | None = None
    server_args: tuple[str, ...] = ()

    # ------------------------------------------------------------ availability
    def unavailable(self) -> str | None:
        """None when it can run here, else the reason (shown as the cell's skip reason)."""
        if self.kind == "ref":
            return None
        if self.kind == "docker":
            from .docker_adapter import docker_available
            ok, reason = docker_available()
            return None if ok else reason
        from .registry import PeerError, get_peer
        try:
            peer = get_peer(self.pin)
        except PeerError as e:
            return str(e)
        if not peer.available:
            return f"{self.pin}: {peer.reason}"
        return None

    def peer(self):
        from .registry import get_peer
        return get_peer(self.pin)

    # ------------------------------------------------------------ server
    def start_server(self, workdir: Path, cache_dir: Path | None) -> ServerProcess:
        workdir.mkdir(parents=True, exist_ok=True)
        if self.kind == "ref":
            # the real servers keep entries in <LLAMA_CACHE>/rpc; mirror that layout
            return start_reference_server(self.dialect, workdir=workdir,
                                          cache_dir=cache_dir / "rpc" if cache_dir else None,
                                          extra_args=["--idle-timeout", "60", *self.server_args])
        if self.kind == "docker":
            raise NotImplementedError("docker servers run through DockerPeer where an engine exists")
        return start_peer_server(self.peer(), cache_dir=cache_dir, workdir=workdir)

    # ------------------------------------------------------------ clients
    def new_client(self, *, step_timeout: float = 60.0, knobs: Misbehaviour | None = None,
                   transport_factory=None) -> ClientDriver:
        if self.kind == "ref":
            from .ref_client import RefClientDriver
            return RefClientDriver(self.dialect, knobs=knobs, timeout=step_timeout,
                                   transport_factory=transport_factory)
        if self.kind == "docker":
            raise NotImplementedError("docker images play servers only")
        from .real_client import CtypesClientDriver
        peer = self.peer()
        return CtypesClientDriver(peer.lib_dir, proto=peer.proto, step_timeout=step_timeout,
                                  name=self.name)

    @property
    def bin_dir(self) -> Path | None:
        return None if self.kind in ("ref", "docker") else self.peer().bin_dir


def adapter_for(name: str, impl) -> Adapter:
    """Build an adapter from a matrix.yaml implementation entry (harness.matrix.model)."""
    return Adapter(name=name, kind=impl.kind, dialect=impl.proto, pin=impl.pin, image=impl.image,
                   command=impl.command, container_port=impl.port,
                   server_args=tuple(impl.server_args))


def adapter_for_peer(pin: str) -> Adapter:
    """An adapter for a registry peer by name (the releases matrix uses every built pin)."""
    from .registry import get_peer
    peer = get_peer(pin)
    dialect = peer.proto or peer.verified_proto or "7.0.0"
    from ..proto.dialects import dialect_for_version
    d = dialect_for_version(tuple(int(x) for x in dialect.split(".")))
    return Adapter(name=pin, kind=peer.kind if peer.kind != "wheel" else "pin",
                   dialect=d.name if d else dialect, pin=pin)
