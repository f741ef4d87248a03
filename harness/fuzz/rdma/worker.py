"""The fuzzer as the RDMA peer of a real server, in a process of its own.

``python -m harness.fuzz.rdma.worker`` runs under :func:`~harness.transport.softverbs.softverbs_env`
(the soft ``libibverbs.so.1`` is loaded in that process only) and answers one JSON request per
stdin line with one JSON result line:

* ``{"op": "case", "case": RdmaCase JSON, "endpoint": "127.0.0.1:PORT", "timeout": S}``: the
  reference client's pyverbs transport connects, says HELLO and allocates the case's buffers
  framed as the 7.0.0 client does (every server reads that), relocates the request stream onto
  the live buffers and writes it as the SEND plan says, then reads every due answer (the spec's
  sizes) and compares the probe's data. Verdicts: ``ok``, ``wrong-data`` (an answer of the wrong
  size, or the probe's bytes differ), ``closed`` (the server ended the connection), ``hang`` (no
  answer, or a SEND never completed, within the timeout), ``rdma-error`` (an error completion
  here), ``closed-by-us`` (plans that leave early), ``no-rdma`` (the server stayed on TCP);
* ``{"op": "liveness", "endpoint": ..., "timeout": S}``: a fresh correct 7.0.0 client
  (HELLO, a buffer, 64 bytes up and back): ``ok`` or what went wrong.

:class:`FuzzPeer` is the parent's handle: every call has a deadline, a worker that does not
answer in time is killed and reported (:class:`WorkerDied`), and the process is always reaped.
"""

from __future__ import annotations

import faulthandler
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..errors import FuzzError

HOLD_SECONDS = 1.0  # how long a peer that stopped posting receives stays before it leaves


# ---------------------------------------------------------------- in the worker process

def _read_exact(ep, n: int) -> bytes:
    from ...transport.base import recv_exact_into
    buf = bytearray(n)
    got = recv_exact_into(ep, memoryview(buf)) if n else 0
    if got < n:
        from ...reference.client import ServerClosed
        raise ServerClosed(f"the server closed after {got} of {n} bytes")
    return bytes(buf)


def _connect(endpoint: str, timeout: float, **cfg):
    from ...proto.behaviour import APP, C_OLD, PARTIAL, RdmaGeneration
    from ...transport.rdma_core import RdmaConfig
    from ...transport.verbs import connect_verbs
    host, port = endpoint.rsplit(":", 1)
    fuzzing = RdmaGeneration("fuzz", send_slots=1, recv_policy=PARTIAL, send_framing=C_OLD,
                             read_calls=APP)
    config = RdmaConfig(fuzzing, timeout=timeout).with_(**cfg)
    return connect_verbs(host, int(port), config, timeout=timeout)


def run_rdma_case(req: dict) -> dict:
    from ...proto import get_dialect
    from ...transport.rdma_core import SendFramer
    from ..case import BASE, HANDLE, relocate
    from .plans import RdmaCase, expected_probe, has_probe, response_sizes
    from ...reference.client import RefClient

    case = RdmaCase.from_json(req["case"])
    timeout = float(req.get("timeout", 2.0))
    out: dict = {"sends": 0, "bytes": 0}

    def body(ep, stage):
        c = RefClient(ep, get_dialect(case.dialect))
        c.hello()
        if not c.rdma_active:
            return {"verdict": "no-rdma"}
        stage[0] = "setup"
        live: dict = {HANDLE: [], BASE: []}
        for size in case.buffers:
            ptr, _ = c.alloc_buffer(size)
            live[HANDLE].append(ptr)
            live[BASE].append(c.buffer_get_base(ptr))
        stream = b"".join(relocate(s.frame, s.relocs, live) if s.relocs else s.frame
                          for s in case.requests)
        stage[0] = "fuzzed writes"
        ep.framer = SendFramer(case.chunk)  # every write is one send_data call, cut by chunk
        sends0, pos = ep.stats.sends, 0
        try:
            for i, n in enumerate(case.writes):
                if case.close_after is not None and i >= case.close_after:
                    return {"verdict": "closed-by-us", "sent": pos}
                ep.sendall(stream[pos:pos + n])
                pos += n
            ep.flush()
        finally:
            out.update(sends=ep.stats.sends - sends0, bytes=pos)
        if case.starve:  # nothing read, no receive reposted; then gone
            time.sleep(HOLD_SECONDS)
            return {"verdict": "closed-by-us", "sent": pos}
        stage[0] = "response"
        payload = b""
        for size, cmd, want in response_sizes(case, live):
            stage[0] = f"answer to {cmd}"
            n = int.from_bytes(_read_exact(ep, 8), "little")
            if n != size:
                return {"verdict": "wrong-data", "at": cmd,
                        "why": f"{cmd} answered with a {n}-byte payload, the spec says {size}"}
            payload = _read_exact(ep, n)
            if want is not None and payload != want:
                return {"verdict": "wrong-data", "at": cmd,
                        "why": f"{cmd} answered {payload.hex()}, not {want.hex()}"}
        if has_probe(case) and payload != expected_probe(case):
            diff = next((i for i, (a, b) in enumerate(zip(payload, expected_probe(case)))
                         if a != b), min(len(payload), len(expected_probe(case))))
            return {"verdict": "wrong-data", "at": "GET_TENSOR",
                    "why": f"the probe read back differs from what it wrote at byte {diff}"}
        return {"verdict": "ok"}

    out.update(_guarded(lambda stage: body_with(
        _connect(req["endpoint"], timeout, chunk=case.chunk, send_slots=case.slots,
                 recv_depth=case.recv_depth), body, stage)))
    return out


def run_liveness(req: dict) -> dict:
    from ...proto import RpcTensor, get_dialect, ggml
    from .plans import DIALECT
    from ...reference.client import RefClient

    def body(ep, stage):
        c = RefClient(ep, get_dialect(DIALECT))
        c.hello()
        if not c.rdma_active:
            return {"verdict": "no-rdma"}
        stage[0] = "session"
        ptr, _ = c.alloc_buffer(4096)
        t = RpcTensor.make(id=0x10, type=ggml.TYPE_I8, ne=(64,), buffer=ptr,
                           data=c.buffer_get_base(ptr))
        data = bytes(range(64))
        c.set_tensor(t, data)
        ok = bytes(c.get_tensor(t, 0, 64)) == data
        return {"verdict": "ok" if ok else "wrong-data"}

    timeout = float(req.get("timeout", 2.0))
    return _guarded(lambda stage: body_with(_connect(req["endpoint"], timeout), body, stage))


def body_with(ep, body, stage):
    try:
        return body(ep, stage)
    finally:
        ep.close()


def _guarded(fn) -> dict:
    """``fn(stage)`` with the transport's failures as verdicts (``stage[0]`` says where)."""
    from ...reference.client import ServerClosed
    from ...transport.rdma_core import RdmaError, RdmaHang
    stage = ["connect"]
    try:
        return fn(stage)
    except ServerClosed as e:
        return {"verdict": "closed", "stage": stage[0], "why": str(e)[:200]}
    except (RdmaHang, TimeoutError) as e:
        return {"verdict": "hang", "stage": stage[0], "why": str(e)[:200]}
    except RdmaError as e:
        return {"verdict": "rdma-error", "stage": stage[0], "why": str(e)[:200]}
    except OSError as e:
        return {"verdict": "closed", "stage": stage[0], "why": f"{type(e).__name__}: {e}"[:200]}


OPS = {"case": run_rdma_case, "liveness": run_liveness}


def main() -> None:
    # a crash in the soft device, or a wait that never ends, leaves its Python stack in the
    # log the parent quotes (SIGUSR1 is the parent asking where a silent worker is stuck)
    faulthandler.enable()
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    for line in sys.stdin:
        req = json.loads(line)
        print(json.dumps(OPS[req["op"]](req)), flush=True)


# ---------------------------------------------------------------- the parent's handle

class WorkerDied(FuzzError, RuntimeError):
    """The fuzz worker gave no answer in time or exited; the message has its stderr tail."""


def _log_excerpt(text: str, limit: int = 6000) -> str:
    """The end of the worker's log; from the header of its last stack dump when it has one,
    since faulthandler prints the innermost frame first and the worker's own code last (a
    worker stuck deep in an import has a long dump: its middle is left out, not its ends)."""
    at = text.rfind("(most recent call first)")
    if at < 0:
        return text[-3000:]
    dump = text[text.rfind("\n", 0, at) + 1:]
    if len(dump) > limit:
        dump = f"{dump[:limit // 3]}\n  ...\n{dump[-(2 * limit) // 3:]}"
    return dump


class FuzzPeer:
    """The worker process on the soft device (``lib_dir``), counters in ``stats_dir``."""

    def __init__(self, lib_dir: Path, stats_dir: Path, log_path: Path):
        from ...transport.softverbs import softverbs_env
        stats_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_path
        env = softverbs_env(lib_dir, stats_dir=stats_dir)
        # the package as this process sees it (a checkout run without installing it too)
        root = str(Path(__file__).resolve().parents[3])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "harness.fuzz.rdma.worker"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._log, text=True, env=env)

    def call(self, request: dict, deadline: float) -> dict:
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except OSError:
            pass  # it died: the read below says so
        ready = select.select([self.proc.stdout], [], [], deadline)[0]
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            if ready:  # end of file: it is exiting, and is reaped a moment later (on a busy
                try:   # machine, after poll() below would have said it still runs)
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
            silent = self.proc.poll() is None
            if silent:
                self._where_stuck()
            self.close()
            tail = _log_excerpt(self.log_path.read_text(errors="replace"))
            what = f"gave no answer within {deadline:g} s" if silent else \
                f"exited ({self.proc.returncode}) without an answer"
            raise WorkerDied(f"the RDMA fuzz worker {what}; its log ends:\n{tail}")
        return json.loads(line)

    def _where_stuck(self) -> None:
        """Ask the worker for its stack (faulthandler on SIGUSR1) before it is stopped."""
        size = self.log_path.stat().st_size
        try:
            os.kill(self.proc.pid, signal.SIGUSR1)
        except OSError:
            return
        # the dump has come when the log grew and then stayed the same for 0.2 s
        end, last, still_since = time.monotonic() + 3.0, size, None
        while time.monotonic() < end:
            time.sleep(0.05)
            now = self.log_path.stat().st_size
            if now != last:
                last, still_since = now, time.monotonic()
            elif still_since is not None and time.monotonic() - still_since >= 0.2:
                return

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
        self.proc.wait(timeout=10)
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass
        self._log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


if __name__ == "__main__":
    main()
