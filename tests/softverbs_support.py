"""Shared pieces of the soft-verbs tests: the device build, the RDMA build of a real peer, the
check that a payload went over RDMA, and the pyverbs client session run in a subprocess (the
fuzzer as an RDMA peer is product code: :mod:`harness.fuzz.rdma.worker`).

The RDMA build goes through :func:`rdma_peer_dir` only, so it can switch to the product's
``harness peers build p7 --rdma`` entry when that lands.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.data import data_root
from harness.transport.softverbs import (
    QpStats,
    SoftverbsUnavailable,
    build_softverbs,
    rdma_carried_problems,
    read_qp_stats,
    softverbs_env,
)

TESTS_DIR = Path(__file__).resolve().parent
SEMANTICS_SOURCE = TESTS_DIR / "softverbs" / "semantics.c"
RDMA_PIN = "p7"


def softverbs_lib_dir(defines: tuple[str, ...] = ()) -> Path:
    """The device build; its absence is a failure (the project's setup installs the headers)."""
    try:
        return build_softverbs(defines=defines)
    except SoftverbsUnavailable as e:
        pytest.fail(f"softverbs cannot be built: {e}")


def build_semantics(lib_dir: Path, out_dir: Path) -> Path:
    """Compile the C semantics test against the soft device (and only it, through RUNPATH)."""
    exe = out_dir / "semantics"
    cc = shutil.which(os.environ.get("CC", "cc"))
    r = subprocess.run([cc, "-O1", "-g", "-Wall", "-Wno-unused-parameter", "-o", str(exe),
                        str(SEMANTICS_SOURCE), str(lib_dir / "libibverbs.so.1"),
                        f"-Wl,-rpath,{lib_dir}"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return exe


def run_semantics(exe: Path, lib_dir: Path, case: str, stats_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(exe), case], capture_output=True, text=True, timeout=90,
                          env=softverbs_env(lib_dir, stats_dir=stats_dir))


# ---------------------------------------------------------------- the RDMA build of a real peer

def rdma_entry_name(pin_name: str, patch: Path | None) -> str:
    """The product's name of an RDMA build: ``p7+rdma``, or ``p7f+rdma`` for the pin that is
    p7 plus ``patch`` (the shipped pins.toml row when its patch is that file)."""
    return _rdma_pin(pin_name, patch).name


def _rdma_pin(pin_name: str, patch: Path | None):
    from harness.impls.build import patched_pin
    from harness.impls.registry import resolve_pin
    if patch is None:
        return resolve_pin(pin_name).variant(rdma=True)
    digest = hashlib.sha256(Path(patch).read_bytes()).hexdigest()[:8]
    return patched_pin(pin_name, patch, f"{pin_name}-{digest}").variant(rdma=True)


def rdma_peer_dir(pin_name: str = RDMA_PIN, patch: Path | None = None) -> Path:
    """Bin dir of ``pin_name`` (plus ``patch``, a unified diff of its llama.cpp tree) built
    with -DGGML_RPC_RDMA=ON (server + libggml-rpc.so): the product's own variant build,
    ``harness peers build [--base PIN --patch FILE] --rdma``, in the peers cache."""
    from harness.impls.build import build_pin
    from harness.impls.errors import ImplError
    pin = _rdma_pin(pin_name, patch)
    try:
        return Path(build_pin(pin, jobs=2).bin_dir)
    except ImplError as e:
        pytest.fail(f"the RDMA build {pin.name} failed: {e}")


SEED000_PATCH = data_root() / "patches" / "seed000-server-flags.patch"  # shipped in the package


@pytest.fixture(scope="module")
def lib_dir() -> Path:
    """The soft device (import this fixture into a test module to use it)."""
    return softverbs_lib_dir()


@pytest.fixture(scope="module")
def builds() -> dict[str, Path]:
    """Bin dirs of seed 000's two generations, both with -DGGML_RPC_RDMA=ON: old = p7,
    new = p7 + harness/data/patches/seed000-server-flags.patch."""
    return {"old": rdma_peer_dir("p7"), "new": rdma_peer_dir("p7", SEED000_PATCH)}


# ---------------------------------------------------------------- did RDMA carry it?

def qp_of(stats_dir: Path) -> QpStats:
    qps = read_qp_stats(stats_dir)
    assert len(qps) == 1, f"expected one queue pair in {stats_dir}, found {qps}"
    return qps[0]


def assert_rdma_carried(client_stats: Path, server_stats: Path, payload: int,
                        server_log: str | None) -> tuple[QpStats, QpStats]:
    """The one client QP and the one server QP carried the session (see
    :func:`harness.transport.softverbs.rdma_carried_problems`)."""
    cq, sq = qp_of(client_stats), qp_of(server_stats)
    problems = rdma_carried_problems(cq, sq, payload, server_log)
    assert not problems, f"{problems}\nclient {cq}\nserver {sq}"
    return cq, sq


# ---------------------------------------------------------------- pyverbs client in a subprocess

PYVERBS_SESSION = r"""
import io, json, os, sys
from harness.reference.client import RefClient
from harness.reference.server import ReferenceServer
from harness.reference.server_core import ServerConfig
from harness.proto import RpcTensor, get_dialect, ggml
from harness.transport import rdma_core
from harness.transport.verbs import connect_verbs, verbs_listener

def session(host, port, cfg, size):
    ep = connect_verbs(host, port, cfg, timeout=20)
    c = RefClient(ep, "7.0.0")
    c.hello()
    out = {"rdma_active": c.rdma_active, "device": ep.wire.dev.name,
           "qpn": ep.wire.local_qpn, "peer_qpn": ep.wire.peer_qpn}
    ptr, _ = c.alloc_buffer(size)
    t = RpcTensor.make(id=0x1000, type=ggml.TYPE_I8, ne=(size,), buffer=ptr,
                       data=c.buffer_get_base(ptr))
    data = os.urandom(size)
    c.set_tensor(t, data)
    out["round_trip_ok"] = bytes(c.get_tensor(t, 0, size)) == data
    out.update(overruns=ep.stats.overruns, largest_send=ep.stats.largest_send,
               max_in_flight=ep.wire.stats.max_in_flight)
    c.close()
    return out

mode, size = sys.argv[1], int(sys.argv[2])
if mode == "serve":  # "serve SERVER_CFG": print the port, serve until stdin closes
    srv = ReferenceServer(ServerConfig(dialect=get_dialect("7.0.0")), idle_timeout=60,
                          out=io.StringIO(), err=io.StringIO())
    with verbs_listener(srv.serve_transport, getattr(rdma_core, sys.argv[3]), timeout=60) as lst:
        print(json.dumps({"port": lst.port}), flush=True)
        sys.stdin.read()
    out = {"connections": [{"rdma_active": c.rdma_active, "close_reason": c.close_reason}
                           for c in srv.connections],
           "notes": list(lst.notes), "devices": [ep.wire.dev.name for ep in lst.endpoints]}
elif mode == "client":  # against a server given as HOST PORT [CLIENT_CFG]
    cfg = getattr(rdma_core, sys.argv[5]) if len(sys.argv) > 5 else \
        rdma_core.config_for_dialect("7.0.0")
    out = session(sys.argv[3], int(sys.argv[4]), cfg, size)
else:  # "pair CLIENT_CFG SERVER_CFG": a reference server on verbs too, in this process
    ccfg, scfg = getattr(rdma_core, sys.argv[3]), getattr(rdma_core, sys.argv[4])
    srv = ReferenceServer(ServerConfig(dialect=get_dialect("7.0.0")), idle_timeout=20,
                          out=io.StringIO(), err=io.StringIO())
    with verbs_listener(srv.serve_transport, scfg, timeout=20) as lst:
        out = session("127.0.0.1", lst.port, ccfg, size)
    rec = srv.connections[0]
    out.update(server_rdma_active=rec.rdma_active, server_close_reason=rec.close_reason,
               notes=list(lst.notes), server_max_landed=lst.endpoints[0].wire.stats.max_landed)
print(json.dumps(out))
"""


def _pyverbs_cmd(lib_dir: Path, stats_dir: Path, mode: str, size: int, rest) -> tuple[list, dict]:
    env = softverbs_env(lib_dir, stats_dir=stats_dir)
    root = str(TESTS_DIR.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return [sys.executable, "-c", PYVERBS_SESSION, mode, str(size), *rest], env


def pyverbs_session(lib_dir: Path, stats_dir: Path, size: int, *args: str) -> dict:
    """The reference client over harness.transport.verbs (pyverbs) on the soft device, in a
    process of its own so the soft libibverbs is loaded there only. ``args``: ``client HOST
    PORT [CLIENT_CFG]`` (a server elsewhere; default the 7.0.0 generation) or ``pair
    CLIENT_CFG SERVER_CFG`` (a reference server on verbs too, in the same process); configs
    are rdma_core preset names."""
    mode, *rest = args
    cmd, env = _pyverbs_cmd(lib_dir, stats_dir, mode, size, rest)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    if "pyverbs not importable" in r.stderr:
        pytest.fail("pyverbs is not installed: apt-get install python3-pyverbs "
                    f"(.ci/system-deps does it)\n{r.stderr[-1000:]}")
    assert r.returncode == 0, f"pyverbs session failed:\n{r.stdout}\n{r.stderr[-3000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


class PyverbsServer:
    """The reference server behind harness.transport.verbs on the soft device, in its own
    process; ``result()`` stops it and returns what its connections did."""

    def __init__(self, lib_dir: Path, stats_dir: Path, config: str = "OLD"):
        cmd, env = _pyverbs_cmd(lib_dir, stats_dir, "serve", 0, [config])
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env)
        ready = select.select([self.proc.stdout], [], [], 60)[0]
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.proc.kill()
            _, err = self.proc.communicate(timeout=10)
            raise AssertionError(f"pyverbs server did not start:\n{err[-3000:]}")
        self.endpoint = f"127.0.0.1:{json.loads(line)['port']}"

    def result(self) -> dict:
        try:
            out, err = self.proc.communicate("", timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate(timeout=10)
        assert self.proc.returncode == 0, f"pyverbs server failed:\n{err[-3000:]}"
        return json.loads(out.strip().splitlines()[-1])

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate(timeout=10)
