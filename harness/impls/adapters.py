"""One interface over every kind of implementation the matrix can put in a role.

An adapter knows whether its implementation is available here (and why not), how to start
its server under supervision, and how to open a client session. The matrix treats the
reference peer, real llama.cpp pins, user builds and docker images alike through it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..reference.knobs import Misbehaviour
from ..proto.dialects import DEFAULT, get_dialect
from .driver import ClientDriver
from .supervisor import ServerProcess, ServerStartError, start_peer_server, \
    start_reference_server


@dataclass
class Adapter:
    name: str  # the implementation's name in matrix.yaml
    kind: str  # ref | pin | user | docker
    dialect: str
    pin: str | None = None
    image: str | None = None  # kind docker: the image, or with ``pin`` its repository
    command: list[str] | None = None  # kind docker: the server's argv ({host}, {port})
    server_args: tuple[str, ...] = ()
    _image_tag: str | None = field(default=None, init=False, repr=False)
    _image_problem: RuntimeError | None = field(default=None, init=False, repr=False)

    # ------------------------------------------------------------ availability
    def unavailable(self) -> str | None:
        """None when it can run here, else the reason (shown as the cell's skip reason)."""
        if self.kind == "ref":
            return None
        if self.kind == "docker":
            return self._docker_unavailable()
        return self._pin_unavailable()

    def _registry_peer(self):
        """The registry's peer for this adapter's pin, or None (a reference, no such pin)."""
        if self.kind == "ref" or not self.pin:
            return None
        from .registry import PeerError, get_peer
        try:
            return get_peer(self.pin)
        except PeerError:
            return None

    def buildable(self) -> bool:
        """Can `harness peers build` make it (a pin the registry resolves)?"""
        peer = self._registry_peer()
        return peer is not None and peer.kind != "user"

    def build_failed(self) -> bool:
        """Is it unavailable because its build failed (a failure), not merely unbuilt?"""
        peer = self._registry_peer()
        return peer is not None and peer.build_failed

    def _pin_unavailable(self) -> str | None:
        from .registry import PeerError, get_peer
        try:
            peer = get_peer(self.pin)
        except PeerError as e:
            return str(e)
        return f"{self.pin}: {peer.reason}" if not peer.available else None

    def _docker_unavailable(self) -> str | None:
        """Why this image cannot run here. Where Docker is required (CI), None: the start
        then fails with the same reason, so a missing engine fails the cell."""
        from .docker_adapter import docker_required
        if self.pin:  # the image is made from a built pin: without it the peer is missing
            missing = self._pin_unavailable()
            if missing:
                return missing
        try:
            self.docker_image()
        except RuntimeError as e:  # no engine, pin not built, import refused, no such image
            return None if docker_required() else str(e)
        return None

    def docker_image(self) -> str:
        """The image to run: with ``pin``, that pin's image (built on first use, see
        ``harness peers image``), else ``image`` as it is in the engine."""
        if self._image_problem is not None:  # said once per run, not tried again per cell
            raise self._image_problem
        if self._image_tag is None:
            from .docker_adapter import engine_client
            from .docker_image import ImageError, build_pin_image, image_exists
            client = engine_client()
            try:
                if self.pin:
                    self._image_tag = build_pin_image(self.pin, repository=self.image,
                                                      client=client).tag
                elif image_exists(client, self.image):
                    self._image_tag = self.image
                else:
                    raise ImageError(f"image {self.image} not in the engine (no registry is "
                                     "used: build it, e.g. `harness peers image PIN`)")
            except ImageError as e:
                self._image_problem = e
                raise
            finally:
                client.close()
        return self._image_tag

    def peer(self):
        from .registry import get_peer
        return get_peer(self.pin)

    # ------------------------------------------------------------ server
    def start_server(self, workdir: Path, cache_dir: Path | None,
                     env: dict[str, str] | None = None) -> ServerProcess:
        """``env``: variables for a real peer's server (e.g. GGML_RPC_LOADPROF=1)."""
        workdir.mkdir(parents=True, exist_ok=True)
        if self.kind == "ref":
            # the real servers keep entries in <LLAMA_CACHE>/rpc; mirror that layout
            return start_reference_server(self.dialect, workdir=workdir,
                                          cache_dir=cache_dir / "rpc" if cache_dir else None,
                                          extra_args=["--idle-timeout", "60", *self.server_args])
        if self.kind == "docker":
            from .docker_adapter import DockerServer
            from .docker_image import ImageError
            try:
                image = self.docker_image()
            except ImageError as e:
                raise ServerStartError(f"{self.name}: {e}") from None
            return DockerServer.start(image, self.command, name=self.name, workdir=workdir,
                                      cache_dir=cache_dir)
        return start_peer_server(self.peer(), cache_dir=cache_dir, workdir=workdir, env=env)

    # ------------------------------------------------------------ clients
    def new_client(self, *, step_timeout: float = 60.0, knobs: Misbehaviour | None = None,
                   transport_factory=None) -> ClientDriver:
        if self.kind == "ref":
            from .ref_driver import RefClientDriver
            return RefClientDriver(self.dialect, knobs=knobs, timeout=step_timeout,
                                   transport_factory=transport_factory)
        if self.kind == "docker":
            from .docker_adapter import DockerClientDriver
            return DockerClientDriver(self.docker_image(), proto=get_dialect(self.dialect).version_str,
                                      step_timeout=step_timeout, name=self.name)
        from .ctypes_driver import CtypesClientDriver
        peer = self.peer()
        return CtypesClientDriver(peer.lib_dir, proto=peer.proto, step_timeout=step_timeout,
                                  name=self.name)

    @property
    def bin_dir(self) -> Path | None:
        return None if self.kind in ("ref", "docker") else self.peer().bin_dir


def adapter_for(name: str, impl) -> Adapter:
    """Build an adapter from a matrix.yaml implementation entry (harness.matrix.model)."""
    return Adapter(name=name, kind=impl.kind, dialect=impl.proto, pin=impl.pin, image=impl.image,
                   command=impl.command, server_args=tuple(impl.server_args))


def adapter_for_peer(pin: str) -> Adapter:
    """An adapter for a registry peer by name (the releases matrix uses every built pin)."""
    from .registry import get_peer
    peer = get_peer(pin)
    dialect = peer.proto or peer.verified_proto or DEFAULT.name
    from ..proto.dialects import dialect_for_version
    d = dialect_for_version(tuple(int(x) for x in dialect.split(".")))
    return Adapter(name=pin, kind=peer.kind if peer.kind != "wheel" else "pin",
                   dialect=d.name if d else dialect, pin=pin)
