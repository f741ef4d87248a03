"""The reference peer on ``rdma-soft``: pyverbs (``harness.transport.verbs``) on softverbs.

The soft device is a ``libibverbs.so.1`` that only a process started with it in
``LD_LIBRARY_PATH`` sees, so the reference peer of an rdma-soft cell runs in a process of its
own, like the real ones, with the generation of its dialect (``config_for_dialect``) on real
queue pairs:

* server: ``python -m harness.matrix.soft_ref --serve --proto DIALECT --port P`` is the
  ReferenceServer behind a verbs listener, under the cell's ServerProcess supervision; for
  each connection that switched it logs ``RDMA activated: qpn=<own>-><peer>`` as ggml-rpc does
  (when the connection ends), which the cell's activation check reads.
* client: :class:`SoftRefClientDriver` runs this module as the ctypes agent's stand-in (same
  step protocol, same deadlines and reaping): a RefClientDriver whose transport is
  ``connect_verbs``. A session the reference client ends (a rejected HELLO, a closed server)
  ends the process with the abort status and message a real client would leave.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from ..impls.ctypes_driver import CtypesClientDriver

AGENT = "harness.matrix.soft_ref"
ABORT_STATUS = 128 + signal.SIGABRT  # what classify_exit reads as the library's abort


class SoftRefClientDriver(CtypesClientDriver):
    """The reference client of ``dialect`` over pyverbs on the soft device, in an agent process."""

    agent_module = AGENT

    def __init__(self, dialect: str, *, env: dict[str, str], step_timeout: float,
                 name: str | None = None):
        # the agent reads the dialect from --proto; --lib-dir names no build (the harness's)
        super().__init__(Path(__file__).parent, proto=dialect, env=env,
                         step_timeout=step_timeout, name=name)


def server_argv(dialect: str, cache_dir: Path | None, idle: float):
    """argv for ServerProcess.start: ``(host, port) -> argv``."""
    def argv(host: str, port: int) -> list[str]:
        return [sys.executable, "-u", "-m", AGENT, "--serve", "--proto", dialect, "--host", host,
                "--port", str(port), "--idle", str(idle)] + \
            (["--cache-dir", str(cache_dir)] if cache_dir else [])
    return argv


def _serve(a) -> int:
    from ..proto import get_dialect
    from ..reference.server import ReferenceServer
    from ..reference.server_core import ServerConfig
    from ..transport.rdma_core import config_for_dialect
    from ..transport.verbs import verbs_listener

    srv = ReferenceServer(ServerConfig(dialect=get_dialect(a.proto),
                                       cache_dir=Path(a.cache_dir) if a.cache_dir else None),
                          idle_timeout=a.idle, out=io.StringIO(), err=sys.stderr)

    def serve(ep, peer: str = "?") -> None:
        try:
            srv.serve_transport(ep, peer)
        finally:
            if ep.active:
                print(f"RDMA activated: qpn={ep.wire.local_qpn}->{ep.wire.peer_qpn}",
                      file=sys.stderr, flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with verbs_listener(serve, config_for_dialect(a.proto), host=a.host, port=a.port,
                        timeout=a.idle, dialect=a.proto) as lst:
        print(f"reference server {a.proto} on pyverbs, {a.host}:{lst.port}", file=sys.stderr,
              flush=True)
        stop.wait()
        for note in lst.notes:
            print(f"listener: {note}", file=sys.stderr, flush=True)
    return 0


def _agent(a) -> int:
    from ..impls.driver import ClientAborted, StepFailed
    from ..impls.ref_driver import RefClientDriver
    from ..transport.rdma_core import config_for_dialect

    events = os.fdopen(os.dup(1), "w", buffering=1)  # stdout is the event stream only
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def emit(ev: dict) -> None:
        events.write(json.dumps(ev) + "\n")
        events.flush()

    t0 = time.monotonic()
    try:
        from ..transport.verbs import connect_verbs
        cfg = config_for_dialect(a.proto)
        drv = RefClientDriver(a.proto, timeout=a.idle, transport_factory=lambda h, p: connect_verbs(
            h, p, cfg, timeout=a.idle))
    except Exception as e:  # noqa: BLE001 - reported, then a clean non-zero exit
        emit({"i": -1, "op": "ready", "ok": False, "result": {},
              "error": f"{type(e).__name__}: {e}"})
        return 2
    emit({"i": -1, "op": "ready", "ok": True, "error": "", "t0": t0, "t1": time.monotonic(),
          "result": {"pid": os.getpid(), "proto": a.proto, "transport": "pyverbs"}})
    for line in iter(sys.stdin.readline, ""):
        if not line.strip():
            continue
        step = json.loads(line)
        ev = {"i": step.pop("i", 0), "op": str(step.get("op")), "ok": False, "result": {},
              "error": "", "t0": time.monotonic()}
        try:
            ev["result"], ev["ok"] = drv.run(step).result, True
        except StepFailed as e:
            ev["error"] = e.result.error
        except ClientAborted as e:  # the session is over, as the C client's abort ends it
            for text in e.exit_info.log_tail or [e.exit_info.message]:
                print(text, file=sys.stderr, flush=True)
            os._exit(ABORT_STATUS)
        ev["t1"] = time.monotonic()
        emit(ev)
        if ev["op"] == "close" and ev["ok"]:
            break
    drv.close()
    sys.stderr.flush()
    os._exit(0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog=f"python -m {AGENT}")
    ap.add_argument("--serve", action="store_true", help="the server; else the client agent")
    ap.add_argument("--proto", required=True, help="the reference peer's dialect")
    ap.add_argument("--lib-dir", help="(the ctypes agent's argument; unused)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--cache-dir")
    ap.add_argument("--idle", type=float, default=60.0, help="every wait's deadline, seconds")
    a = ap.parse_args(argv)
    return _serve(a) if a.serve else _agent(a)


if __name__ == "__main__":
    sys.exit(main())
