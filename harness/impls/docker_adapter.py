"""A ggml-rpc server in a Docker container, through the ``docker`` SDK.

Needs a running Docker engine. Where there is none, ``docker_available()`` says so with the
SDK's own error, and ``DockerPeer.start()`` raises ``DockerUnavailable`` with the same text:
callers skip with that reason, never silently.

The container's server listens on ``container_port`` inside; the host side is published on
loopback only (``host``:``host_port``, a free port by default). Readiness cannot be seen
from the port alone (Docker's proxy accepts before the server listens), so ``start`` waits
for the banner in the logs and then for a probe connection the proxy does not drop at once.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field

from .driver import ExitInfo

DEFAULT_CONTAINER_PORT = 50052
LABEL = "ggml-rpc-harness"
BANNER = "Starting RPC server"


class DockerUnavailable(RuntimeError):
    """No usable Docker engine (or no SDK); the message says why."""


def _client(timeout: float):
    try:
        import docker
    except ImportError as e:
        raise DockerUnavailable(f"docker SDK not installed: {e}") from None
    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
    except Exception as e:  # noqa: BLE001 - the SDK raises several kinds; all mean "no engine"
        raise DockerUnavailable(f"no Docker engine: {e}") from None
    return client


def docker_available(timeout: float = 5.0) -> tuple[bool, str]:
    """(True, engine version) or (False, why not), e.g. "no Docker engine: <SDK error>"."""
    try:
        client = _client(timeout)
    except DockerUnavailable as e:
        return False, str(e)
    try:
        version = client.version().get("Version", "?")
    except Exception as e:  # noqa: BLE001
        return False, f"no Docker engine: {e}"
    finally:
        client.close()
    return True, f"Docker engine {version}"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _probe(host: str, port: int, hold: float = 0.3) -> bool:
    """True if a connection is accepted and kept open: the server waits for its HELLO."""
    try:
        with socket.create_connection((host, port), timeout=1.0) as s:
            s.settimeout(hold)
            try:
                return s.recv(1) != b""  # data would be odd, EOF means nobody behind the proxy
            except socket.timeout:
                return True
    except OSError:
        return False


@dataclass
class DockerPeer:
    """One server container. ``command`` is passed to the image's entrypoint (the server)."""

    image: str
    command: list[str] | None = None
    container_port: int = DEFAULT_CONTAINER_PORT
    host: str = "127.0.0.1"
    host_port: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    name: str | None = None
    start_timeout: float = 60.0
    engine_timeout: float = 10.0
    container: object | None = field(default=None, init=False, repr=False)
    exit_info: ExitInfo | None = field(default=None, init=False)

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.host_port}"

    def start(self) -> str:
        """Run the container and wait until the server is ready; returns host:port."""
        client = _client(self.engine_timeout)
        if self.host_port is None:
            self.host_port = free_port(self.host)
        command = self.command if self.command is not None else [
            "-H", "0.0.0.0", "-p", str(self.container_port)]  # 0.0.0.0 inside; loopback outside
        self.container = client.containers.run(
            self.image, command, detach=True, environment=dict(self.env), name=self.name,
            ports={f"{self.container_port}/tcp": (self.host, self.host_port)},
            labels={LABEL: "server"})
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            self.container.reload()
            if self.container.status in ("exited", "dead"):
                info = self.stop()
                raise RuntimeError(f"container exited during start-up (rc={info.returncode}): "
                                   f"{info.message}")
            if BANNER in self.logs_text() and _probe(self.host, self.host_port):
                return self.endpoint
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"{self.image}: server not ready within {self.start_timeout:g} s")

    def logs_text(self) -> str:
        if self.container is None:
            return ""
        return self.container.logs(stdout=True, stderr=True).decode("utf-8", "replace")

    def stop(self, timeout: float = 5.0) -> ExitInfo:
        """Stop and remove the container; returns how it ended with its last log lines."""
        if self.container is None:
            return self.exit_info or ExitInfo(returncode=None)
        c = self.container
        try:
            c.stop(timeout=int(timeout))
            rc = c.wait(timeout=timeout + 5).get("StatusCode")
        except Exception as e:  # noqa: BLE001 - still remove it below
            rc, err = None, str(e)
        else:
            err = ""
        lines = self.logs_text().splitlines()
        try:
            c.remove(force=True)
        except Exception:  # noqa: BLE001 - already gone
            pass
        self.container = None
        self.exit_info = ExitInfo(returncode=rc, message=err or (lines[-1] if lines else ""),
                                  log_tail=lines[-40:])
        return self.exit_info

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
