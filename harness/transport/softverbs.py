"""Build and use softverbs, the project's software RDMA device (``harness/native/softverbs``).

softverbs is a ``libibverbs.so.1`` of its own: loaded through ``LD_LIBRARY_PATH`` in place of
rdma-core's, it gives a process one RoCE-shaped device, ``softverbs0``, whose RC queue pairs
carry SEND/RECV to queue pairs of other processes on this machine. Real llama.cpp RDMA builds
and pyverbs then run their real verbs code without an HCA (docs/RDMA.md says where it differs
from one).

* :func:`build_softverbs` compiles it with the system C compiler against Debian's
  ``libibverbs-dev`` headers, cached in the user cache dir by source hash.
* :func:`softverbs_env` is the environment for a process under test (the library path, and
  the device's counters directory, log switch and addresses).
* :func:`read_qp_stats` reads the counters every queue pair keeps in that directory: the
  proof that a payload went over RDMA and not over the TCP socket.
* :func:`read_capture` reads what every queue pair received (``capture_dir``): the bytes that
  crossed the QPs, which no TCP proxy sees.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from platformdirs import user_cache_dir

from .base import TransportError

SOURCE_DIR = Path(__file__).resolve().parent.parent / "native" / "softverbs"
SOURCES = ("softverbs.c",)
VERSION_SCRIPT = "libibverbs.map"
LIB_NAME = "libibverbs.so.1"
DEVICE_NAME = "softverbs0"
HEADER = "infiniband/verbs.h"
CFLAGS = ("-O2", "-g", "-Wall", "-Wextra", "-Wno-unused-parameter", "-fPIC",
          "-fvisibility=hidden", "-pthread")

STATS_DIR_ENV = "SOFTVERBS_STATS_DIR"
LOG_ENV = "SOFTVERBS_LOG"
ADDRS_ENV = "SOFTVERBS_ADDRS"
MEMLOCK_ENV = "SOFTVERBS_MEMLOCK"
CAPTURE_ENV = "SOFTVERBS_CAPTURE_DIR"
INSTALL_HINT = "apt-get install libibverbs-dev (the verbs headers; .ci/system-deps does it)"


class SoftverbsUnavailable(TransportError):
    """softverbs cannot be built here; the message says why and what to install."""


class SoftverbsBuildError(SoftverbsUnavailable):
    """softverbs' compile failed (the compiler and headers are there): a build error, which
    no run may take for a missing device."""


def _compiler(cc: str | None) -> str:
    cc = cc or os.environ.get("CC") or "cc"
    path = shutil.which(cc)
    if not path:
        raise SoftverbsUnavailable(f"no C compiler ({cc!r} not on PATH): apt-get install gcc")
    return path


def _header_check(cc: str, timeout: float) -> None:
    r = subprocess.run([cc, "-E", "-x", "c", "-"], input=f"#include <{HEADER}>\n",
                       capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise SoftverbsUnavailable(f"<{HEADER}> not found: {INSTALL_HINT}\n{r.stderr.strip()}")


def build_softverbs(*, cc: str | None = None, out_dir: str | os.PathLike | None = None,
                    defines: tuple[str, ...] = (), timeout: float = 180.0) -> Path:
    """Compile softverbs; returns the directory holding ``libibverbs.so.1``.

    Cached per source, version script, compiler, flags and ``defines`` (e.g. the tests'
    planted faults, ``("SOFTVERBS_PLANT_NO_RNR",)``). Raises :class:`SoftverbsUnavailable` without a compiler or the verbs headers,
    and :class:`SoftverbsBuildError` with the compiler's output when the compile fails.
    """
    cc = _compiler(cc)
    h = hashlib.sha256()
    for name in (*SOURCES, VERSION_SCRIPT):
        h.update(name.encode() + b"\0" + (SOURCE_DIR / name).read_bytes())
    h.update(repr((cc, CFLAGS, defines)).encode())
    d = Path(out_dir) if out_dir else \
        Path(user_cache_dir("ggml-rpc-harness")) / "softverbs" / h.hexdigest()[:16]
    lib = d / LIB_NAME
    if lib.exists():
        return d
    _header_check(cc, timeout)
    d.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, suffix=".so.tmp")
    os.close(fd)
    cmd = [cc, *CFLAGS, *(f"-D{d}" for d in defines), "-shared", f"-Wl,-soname,{LIB_NAME}",
           f"-Wl,--version-script={SOURCE_DIR / VERSION_SCRIPT}", "-o", tmp,
           *(str(SOURCE_DIR / s) for s in SOURCES)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise SoftverbsBuildError(f"softverbs compile failed ({' '.join(cmd)}):\n"
                                      f"{r.stderr.strip()}")
        os.replace(tmp, lib)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return d


def softverbs_env(lib_dir: str | os.PathLike, *, stats_dir: str | os.PathLike | None = None,
                  log: bool = False, addrs: str | None = None, memlock: int | None = None,
                  capture_dir: str | os.PathLike | None = None,
                  base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a process that is to see the soft device instead of rdma-core's.

    ``LD_LIBRARY_PATH`` is searched before a binary's RUNPATH, so the real llama.cpp builds
    (RUNPATH ``$ORIGIN``) and pyverbs pick up this ``libibverbs.so.1``.
    """
    env = dict(os.environ if base is None else base)
    old = env.get("LD_LIBRARY_PATH")
    env["LD_LIBRARY_PATH"] = str(lib_dir) + (os.pathsep + old if old else "")
    for key, value in ((STATS_DIR_ENV, stats_dir), (ADDRS_ENV, addrs),
                       (MEMLOCK_ENV, memlock), (LOG_ENV, "1" if log else None),
                       (CAPTURE_ENV, capture_dir)):
        if value is None:
            env.pop(key, None)
        else:
            env[key] = str(value)
    return env


@dataclass(frozen=True)
class QpStats:
    """One queue pair's counters (``qp-<pid>-<qpn>.json``), as the device last wrote them."""
    pid: int
    qpn: int
    dest_qpn: int
    state: str
    sends: int
    send_bytes: int
    inline_sends: int
    max_send: int
    recvs: int
    recv_bytes: int
    rnr_naks_sent: int
    rnr_naks_received: int
    retries: int
    errors: int
    max_send_queue: int = 0  # most SENDs posted and not yet completed: 1 is stop-and-wait
    max_recv_queue: int = 0  # most RECVs posted at once: the receive ring's depth


def read_qp_stats(stats_dir: str | os.PathLike) -> list[QpStats]:
    """Every queue pair's counters in ``stats_dir``, by pid then QPN."""
    out = []
    for p in sorted(Path(stats_dir).glob("qp-*.json")):
        text = p.read_text()
        if text.strip():
            out.append(QpStats(**json.loads(text)))
    return sorted(out, key=lambda s: (s.pid, s.qpn))


_CAPTURE_REC = struct.Struct("<dI")  # softverbs.c sv_capture(): time, length, then the data


@dataclass(frozen=True)
class QpCapture:
    """What one queue pair received, one (wall-clock time, bytes) per SEND, in order."""
    pid: int
    qpn: int
    sends: list[tuple[float, bytes]]

    @property
    def data(self) -> bytes:
        return b"".join(d for _, d in self.sends)


def read_capture(capture_dir: str | os.PathLike) -> dict[int, QpCapture]:
    """Every queue pair's received SENDs in ``capture_dir``, by QPN (unique on the machine
    while the QPs exist). A record cut short by a process killed mid-write is dropped."""
    out = {}
    for p in sorted(Path(capture_dir).glob("rx-*-*.bin")):
        pid, qpn = (int(x) for x in p.stem.split("-")[1:3])
        raw, pos, sends = p.read_bytes(), 0, []
        while pos + _CAPTURE_REC.size <= len(raw):
            t, n = _CAPTURE_REC.unpack_from(raw, pos)
            pos += _CAPTURE_REC.size
            if pos + n > len(raw):
                break
            sends.append((t, raw[pos:pos + n]))
            pos += n
        out[qpn] = QpCapture(pid, qpn, sends)
    return out


ACTIVATED_RE = re.compile(r"RDMA activated: qpn=(\d+)->(\d+)")  # ggml-rpc's own log line


def rdma_carried_problems(client: QpStats, server: QpStats, payload: int,
                          server_log: str | None = None) -> list[str]:
    """Why a session did not go over RDMA on these two QPs (empty: it did).

    Both QPs connected to each other, at least ``payload`` bytes each way with every byte
    sent by one received by the other, no error completion; with a real server's log, its
    ``RDMA activated: qpn=<server>-><client>`` line names these QPs.
    """
    problems = []
    if server_log is not None:
        m = ACTIVATED_RE.search(server_log)
        if not m:
            problems.append("the server never logged 'RDMA activated'")
        elif (int(m.group(1)), int(m.group(2))) != (server.qpn, client.qpn):
            problems.append(f"the server activated {m.group(0)!r}, not QP {server.qpn} -> "
                            f"{client.qpn}")
    if client.dest_qpn != server.qpn or server.dest_qpn != client.qpn:
        problems.append(f"QPs not connected to each other: client {client.qpn}->"
                        f"{client.dest_qpn}, server {server.qpn}->{server.dest_qpn}")
    if client.errors or server.errors:
        problems.append(f"error completions: client {client.errors}, server {server.errors}")
    if client.send_bytes != server.recv_bytes or server.send_bytes != client.recv_bytes:
        problems.append(f"bytes lost: client sent {client.send_bytes} / server received "
                        f"{server.recv_bytes}, server sent {server.send_bytes} / client "
                        f"received {client.recv_bytes}")
    if min(client.send_bytes, server.send_bytes) < payload:
        problems.append(f"less than the payload ({payload} bytes) went over RDMA: client sent "
                        f"{client.send_bytes}, server sent {server.send_bytes}")
    return problems


__all__ = [
    "ACTIVATED_RE",
    "DEVICE_NAME",
    "LIB_NAME",
    "QpCapture",
    "QpStats",
    "SoftverbsBuildError",
    "SoftverbsUnavailable",
    "build_softverbs",
    "rdma_carried_problems",
    "read_capture",
    "read_qp_stats",
    "softverbs_env",
]
