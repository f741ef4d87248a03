"""ggml-rpc peers in Docker containers, supervised like local processes.

``DockerServer`` has ``ServerProcess``'s interface (port, pid, poll, stop, logs, banner, RSS),
so the matrix and the fuzzer treat a container like a local server. ``DockerClientDriver`` is
the real client library from an image, driven by the harness's ctypes agent inside the
container. Every container runs with host networking (the engine has no bridge: see
.ci/dockerd.sh), binds 127.0.0.1, runs under the engine's init (so SIGTERM reaches the
server and a signal death shows as 128+N), and is removed at stop, on a failed start, when
its object is collected, or at interpreter exit.

Where there is no engine, ``docker_available()`` says why with the SDK's own error, and
starting raises ``DockerUnavailable`` with the same text. Set GGML_RPC_HARNESS_REQUIRE_DOCKER=1
(CI does) to make that a failure of the cell rather than a skip.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import tempfile
import uuid
import weakref
from pathlib import Path

import psutil

from ..strictness import strict
from .driver import ExitInfo
from .ctypes_driver import CtypesClientDriver
from .supervisor import (BANNER_RE, REAL_PROCESS_ENV, ServerProcess, ServerStartError,
                         _socket_inodes_of, exit_info_from, listening_inodes, start_retrying)

LABEL = "ggml-rpc-harness"
# Which process started a container: a user finds a crashed session's leftovers by it, and a
# check that this process left nothing behind is not fooled by another one's containers.
OWNER_LABEL = f"{LABEL}.owner-pid"

REQUIRE_ENV = "GGML_RPC_HARNESS_REQUIRE_DOCKER"
# The SDK negotiates the engine's API version (Debian's engine 20.10 speaks 1.41; the CLI and
# SDK are newer). DOCKER_API_VERSION pins it where negotiation is not wanted.
API_VERSION_ENV = "DOCKER_API_VERSION"


def _owner_labels(role: str) -> dict[str, str]:
    return {LABEL: role, OWNER_LABEL: str(os.getpid())}


class DockerUnavailable(ServerStartError):
    """No usable Docker engine (or no SDK); the message says why."""


def docker_required() -> bool:
    """A missing engine fails rather than skips: asked for, or strict (CI)."""
    return os.environ.get(REQUIRE_ENV, "") not in ("", "0") or strict()


def engine_client(timeout: float = 10.0):
    """A docker SDK client for DOCKER_HOST (or the default socket), pinged."""
    try:
        import docker
    except ImportError as e:
        raise DockerUnavailable(f"docker SDK not installed: {e}") from None
    try:
        client = docker.from_env(timeout=timeout,
                                 version=os.environ.get(API_VERSION_ENV) or "auto")
        client.ping()
    except Exception as e:  # noqa: BLE001 - the SDK raises several kinds; all mean "no engine"
        raise DockerUnavailable(f"no Docker engine: {e}") from None
    return client


def docker_available(timeout: float = 5.0) -> tuple[bool, str]:
    """(True, engine version) or (False, why not), e.g. "no Docker engine: <SDK error>"."""
    try:
        client = engine_client(timeout)
    except DockerUnavailable as e:
        return False, str(e)
    try:
        version = client.version().get("Version", "?")
    except Exception as e:  # noqa: BLE001
        return False, f"no Docker engine: {e}"
    finally:
        client.close()
    return True, f"Docker engine {version}"


def _exit_code_as_returncode(code: int | None) -> int | None:
    """The engine's init exits 128+N when the server dies of signal N: report it as -N, the
    way Popen does for a local server."""
    if code is not None and 128 < code < 128 + 65:
        return -(code - 128)
    return code


def _remove(client, container_id: str) -> None:
    try:
        client.api.remove_container(container_id, force=True)
    except Exception:  # noqa: BLE001 - already gone, or the engine went away
        pass


def _substitute(argv, host: str, port: int) -> list[str]:
    return [str(a).replace("{host}", host).replace("{port}", str(port)) for a in argv]


class DockerServer:
    """One server container. Create with ``DockerServer.start(...)``; a context manager."""

    log_starts: dict[Path, int] = {}  # its logs are the engine's, not files of ours

    def __init__(self, client, container, *, name: str, host: str, port: int, workdir: Path,
                 owns_workdir: bool):
        self.client = client
        self.container = container
        self.name = name
        self.host = host
        self._port = port
        self.workdir = workdir
        self._owns_workdir = owns_workdir
        self._final_logs: tuple[list[str], list[str]] | None = None
        self._exit_info: ExitInfo | None = None
        self._init_pid: int | None = None
        self._finalizer = weakref.finalize(self, _remove, client, container.id)

    # ----------------------------------------------------------------- start
    @classmethod
    def start(cls, image: str, command=None, *, name: str = "docker", host: str = "127.0.0.1",
              port: int | None = None, workdir: Path | str | None = None,
              cache_dir: Path | str | None = None, env: dict[str, str] | None = None,
              ready_timeout: float = 30.0, engine_timeout: float = 10.0) -> "DockerServer":
        """Run ``image`` with ``command`` (``{host}``/``{port}`` substituted; default: the
        pin image's ggml-rpc-server) and wait until it listens on host:port. With
        ``cache_dir`` the dir is mounted at the same path, LLAMA_CACHE points at it and
        ``-c`` is appended, as for a local server. Raises ServerStartError with the
        container's log when it does not come up."""
        return start_retrying(
            lambda p, wd: cls._launch(image, command, name=name, host=host, port=p, workdir=wd,
                                      cache_dir=cache_dir, env=env,
                                      engine_timeout=engine_timeout),
            host=host, port=port, workdir=workdir, ready_timeout=ready_timeout,
            prefix="ggml-rpc-docker-")

    @classmethod
    def _launch(cls, image, command, *, name, host, port, workdir, cache_dir, env,
                engine_timeout):
        import docker.errors

        from .docker_image import image_server_argv

        argv = _substitute(command or image_server_argv(host="{host}", port="{port}"), host, port)
        environment = {**REAL_PROCESS_ENV, **(env or {})}
        volumes = {}
        if cache_dir is not None:
            cache_dir = str(Path(cache_dir).resolve())
            Path(cache_dir).mkdir(parents=True, exist_ok=True)
            volumes[cache_dir] = {"bind": cache_dir, "mode": "rw"}
            environment["LLAMA_CACHE"] = cache_dir
            argv.append("-c")
        cname = f"ggml-rpc-{name}-{port}-{uuid.uuid4().hex[:8]}".replace("/", "_")
        client = engine_client(engine_timeout)  # the server's own; closed at its stop
        try:
            # create + start, never containers.run: run() pulls from a registry when the
            # image is missing, and leaves the container behind when start fails
            container = client.containers.create(
                image, argv, name=cname, network_mode="host", init=True,
                environment=environment, volumes=volumes, labels=_owner_labels("server"))
        except docker.errors.ImageNotFound:
            client.close()
            raise ServerStartError(f"{name}: image {image} not in the engine (build it with "
                                   "`harness peers image PIN`)") from None
        except docker.errors.APIError as e:
            client.close()
            raise ServerStartError(f"{name}: engine refused to create the container: "
                                   f"{e.explanation or e}") from None
        server = cls(client, container, name=name, host=host, port=port, workdir=workdir,
                     owns_workdir=False)
        try:
            container.start()
        except docker.errors.APIError as e:
            info = server.stop()
            raise ServerStartError(f"{name}: container did not start: {e.explanation or e}",
                                   exit_info=info, log_tail=info.log_tail) from None
        return server

    # ServerProcess's readiness loop, as is: it only asks for _logs, poll, _is_listening,
    # name, host and _port, which a container answers the same way (so do the log views)
    _wait_ready = ServerProcess._wait_ready

    def _processes(self) -> list[psutil.Process]:
        """The container's processes as the host sees them: the init, then the server."""
        if self._init_pid is None:
            try:
                self.container.reload()
            except Exception:  # noqa: BLE001
                return []
            self._init_pid = self.container.attrs.get("State", {}).get("Pid") or None
            if self._init_pid is None:
                return []
        try:
            init = psutil.Process(self._init_pid)
            return [init, *init.children(recursive=True)]
        except psutil.Error:
            return []

    def _is_listening(self) -> bool:
        inodes = listening_inodes(self.host, self._port)
        if not inodes:
            return False
        # host networking: the socket is in our namespace; it must belong to the container
        return any(inodes & (_socket_inodes_of(p.pid) or set()) for p in self._processes())

    # ------------------------------------------------------------ inspection
    @property
    def port(self) -> int:
        return self._port

    @property
    def pid(self) -> int:
        """The server's host pid (the init's child), for prlimit and RSS."""
        procs = self._processes()
        return procs[-1].pid if procs else -1

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self._port}"

    @property
    def banner_version(self) -> str | None:
        out, err = self._logs()
        for line in out + err:
            m = BANNER_RE.search(line)
            if m:
                return m.group(1)
        return None

    def _logs(self) -> tuple[list[str], list[str]]:
        if self._final_logs is not None:
            return self._final_logs
        try:
            out = self.container.logs(stdout=True, stderr=False)
            err = self.container.logs(stdout=False, stderr=True)
        except Exception as e:  # noqa: BLE001 - the container is gone: say so in the log
            return [], [f"[harness] container logs unavailable: {e}"]
        return (out.decode("utf-8", "replace").splitlines(),
                err.decode("utf-8", "replace").splitlines())

    # as ServerProcess's, over the container's two streams
    log_tail = ServerProcess.log_tail
    log_text = ServerProcess.log_text

    def poll(self) -> ExitInfo | None:
        """None while running; how it ended otherwise."""
        if self._exit_info is not None:
            return self._exit_info
        procs = self._processes()
        if procs and procs[0].is_running() and procs[0].status() != psutil.STATUS_ZOMBIE:
            return None  # the fast path: no engine call while the init lives
        try:
            self.container.reload()
        except Exception:  # noqa: BLE001 - removed under us: it did end
            state = {"Status": "removed", "ExitCode": None}
        else:
            state = self.container.attrs.get("State", {})
        if state.get("Status") in ("created", "running", "restarting", "paused"):
            return None
        out, err = self._logs()
        self._exit_info = exit_info_from(_exit_code_as_returncode(state.get("ExitCode")), out,
                                         err)
        if state.get("OOMKilled"):
            self._exit_info.message = "killed by the engine: out of memory"
        return self._exit_info

    @property
    def running(self) -> bool:
        return self.poll() is None

    def rss_bytes(self) -> int | None:
        procs = self._processes()
        try:
            return procs[-1].memory_info().rss if procs else None
        except psutil.Error:
            return None

    # ------------------------------------------------------------------ stop
    def stop(self, timeout: float = 5.0) -> ExitInfo:
        """SIGTERM (forwarded by the init), SIGKILL after ``timeout``, then remove the
        container; returns how it ended with its log tail."""
        if self._final_logs is None:
            c = self.container
            try:
                if self.poll() is None:
                    c.kill(signal="SIGTERM")
                    try:
                        c.wait(timeout=timeout)
                    except Exception:  # noqa: BLE001 - requests' ReadTimeout: it lingers
                        c.kill(signal="SIGKILL")
                        c.wait(timeout=timeout)
            except Exception:  # noqa: BLE001 - exited meanwhile; removal below still runs
                pass
            info = self.poll()
            self._final_logs = self._logs()
            (self.workdir / f"{self.name}.stdout.log").write_text("\n".join(self._final_logs[0]))
            (self.workdir / f"{self.name}.stderr.log").write_text("\n".join(self._final_logs[1]))
            self._finalizer()  # removes the container
            self.client.close()
            if self._owns_workdir:
                shutil.rmtree(self.workdir, ignore_errors=True)
            self._exit_info = info or ExitInfo(returncode=None, message="container vanished")
        return self._exit_info

    def __enter__(self) -> "DockerServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<DockerServer {self.name} {self.container.short_id} {self.endpoint}>"


# ------------------------------------------------------------------------------- clients
def _agent_mounts() -> list[str]:
    """Read-only mounts that give the container the harness's agent: the interpreter, the
    venv (numpy) and the package; the client library stays the image's."""
    import numpy

    from .ctypes_driver import _package_root
    wanted = (sys.base_prefix, sys.prefix, str(Path(numpy.__file__).parents[1]), _package_root())
    # both spellings: the venv's python is a link into the base interpreter's prefix
    dirs = {f(p) for p in wanted for f in (os.path.abspath, os.path.realpath)}
    # nested dirs are covered by their parent's mount
    keep = [d for d in sorted(dirs) if not any(d != o and d.startswith(o + "/") for o in dirs)]
    return [f"{d}:{d}:ro" for d in keep]


class DockerClientDriver(CtypesClientDriver):
    """The real client library from ``image`` (a pin image: libraries in /app), in its own
    container, on host networking. The container's name is ours, so a hung or killed
    session's container is removed by name whatever the CLI did."""

    name = "docker-client"

    def __init__(self, image: str, *, proto: str | None = None, step_timeout: float = 60.0,
                 name: str | None = None, docker_cli: str | None = None):
        self.image = image
        self.container_name = f"ggml-rpc-client-{uuid.uuid4().hex[:12]}"
        cli = docker_cli or shutil.which("docker")
        if cli is None:
            raise DockerUnavailable("no docker CLI on PATH (Debian's docker.io provides it)")
        self._wrapper_dir = Path(tempfile.mkdtemp(prefix="ggml-rpc-docker-client-"))
        wrapper = self._wrapper_dir / "python"
        # numba's compiled FNV kernel is cached beside its source, which is mounted
        # read-only: without a writable cache each agent would compile it again (seconds)
        from .registry import cache_root
        jit_cache = cache_root() / "numba-docker"
        jit_cache.mkdir(parents=True, exist_ok=True)
        run = [cli, "run", "--rm", "-i", "--init", "--network", "host", "--name",
               self.container_name,
               *(a for k, v in _owner_labels("client").items() for a in ("--label", f"{k}={v}")),
               *(a for env in (*REAL_PROCESS_ENV, "PYTHONUNBUFFERED", "PYTHONPATH")
                 for a in ("-e", env)),
               "-e", f"NUMBA_CACHE_DIR={jit_cache}", "-v", f"{jit_cache}:{jit_cache}",
               *(a for m in _agent_mounts() for a in ("-v", m)),
               image, sys.executable]
        # CtypesClientDriver runs `<python> -u -m agent ...`: this python runs it in the image
        wrapper.write_text("#!/bin/sh\nexec " + " ".join(shlex.quote(a) for a in run) + ' "$@"\n')
        wrapper.chmod(0o755)
        super().__init__("/app", proto=proto, step_timeout=step_timeout, python=str(wrapper),
                         name=name)
        self._engine = engine_client()
        self._remove_finalizer = weakref.finalize(self, _remove_client, self._engine,
                                                  self.container_name, self._wrapper_dir)

    def _kill(self) -> None:
        super()._kill()  # the CLI; the container must go too
        _remove(self._engine, self.container_name)

    def close(self) -> ExitInfo | None:
        try:
            return super().close()
        finally:
            self._remove_finalizer()


def _remove_client(engine, container_name: str, wrapper_dir: Path) -> None:
    _remove(engine, container_name)
    engine.close()
    shutil.rmtree(wrapper_dir, ignore_errors=True)


__all__ = ["DockerServer", "DockerClientDriver", "DockerUnavailable", "docker_available",
           "docker_required", "engine_client"]
