"""End-to-end model client: llama-simple with a tiny generated model, locally and over RPC.

The same greedy generation run twice, once on the local CPU and once with every layer
offloaded to RPC servers, must print the same bytes. llama-simple has no ``--rpc`` flag, so
the RPC run preloads a small shim that registers ``$GGML_RPC_SERVERS`` as devices before
main(), as ``--rpc`` does in the tools that have it.

* ``tiny_model()`` (:mod:`.tiny_gguf`): a tiny random llama GGUF, generated on first use.
* ``ensure_shim(bin_dir)`` (:mod:`.preload_shim`): the shim compiled against one build's own
  libraries, cached.
* ``compare_local_rpc(bin_dir, servers)``: both runs and the verdict.

LD_PRELOAD and GGML_RPC_SERVERS are set only in the environment of the llama-simple process
itself: on a wrapper (timeout, env, a shell) the shim's constructor would connect too.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from .ctypes_driver import classify_exit
from .driver import ExitInfo
from .preload_shim import ensure_shim
from .supervisor import REAL_PROCESS_ENV
from .tiny_gguf import TinyModelSpec, tiny_model

DEFAULT_PROMPT = "Hello world"
DEFAULT_N_PREDICT = 24
DEFAULT_TIMEOUT = 300.0
_HIDDEN_ENV = ("LD_PRELOAD", "GGML_RPC_SERVERS")
# Seed 000's profiler (patches/seed000-server-flags.patch); builds without it ignore it.
LOADPROF_ENV = {"GGML_RPC_LOADPROF": "1"}


@dataclass
class ModelRun:
    """One llama-simple run."""

    stdout: bytes
    exit: ExitInfo
    seconds: float
    cmd: list[str]
    env: dict[str, str] = field(default_factory=dict)  # what was added to the environment
    decoded_tokens: int | None = None  # from "decoded N tokens in ..." on stderr
    log: list[str] = field(default_factory=list)  # all of stderr

    @property
    def text(self) -> str:
        return self.stdout.decode("utf-8", "replace")

    @property
    def ok(self) -> bool:
        return self.exit.returncode == 0


@dataclass
class ModelCheck:
    """Local run vs RPC run of the same generation."""

    local: ModelRun
    rpc: ModelRun
    model: Path
    shim: Path
    servers: list[str]

    @property
    def equal(self) -> bool:
        """Both runs finished and printed the same bytes."""
        return self.local.ok and self.rpc.ok and self.local.stdout == self.rpc.stdout

    @property
    def local_text(self) -> str:
        return self.local.text

    @property
    def rpc_text(self) -> str:
        return self.rpc.text

    def summary(self) -> dict:
        return {"equal": self.equal, "servers": self.servers, "model": str(self.model),
                "local": {"rc": self.local.exit.returncode, "seconds": round(self.local.seconds, 3),
                          "text": self.local.text, "tokens": self.local.decoded_tokens},
                "rpc": {"rc": self.rpc.exit.returncode, "signal": self.rpc.exit.signal,
                        "aborted": self.rpc.exit.aborted, "message": self.rpc.exit.message,
                        "seconds": round(self.rpc.seconds, 3), "text": self.rpc.text,
                        "tokens": self.rpc.decoded_tokens}}


_DECODED = re.compile(rb"decoded (\d+) tokens in")


def run_llama_simple(bin_dir: str | os.PathLike, model: str | os.PathLike, *,
                     prompt: str = DEFAULT_PROMPT, n_predict: int = DEFAULT_N_PREDICT,
                     servers: list[str] | None = None, shim: str | os.PathLike | None = None,
                     env: dict[str, str] | None = None, timeout: float = DEFAULT_TIMEOUT
                     ) -> ModelRun:
    """Run llama-simple once; with ``servers`` (host:port list) offload through the shim."""
    exe = Path(bin_dir) / "llama-simple"
    if not exe.exists():
        raise FileNotFoundError(f"{exe} not found (build the llama-simple target)")
    cmd = [str(exe), "-m", str(model), "-n", str(n_predict), prompt]
    added = {**REAL_PROCESS_ENV, **(env or {})}
    if servers:
        if shim is None:
            raise ValueError("an RPC run needs the shim (ensure_shim)")
        added["LD_PRELOAD"] = str(shim)
        added["GGML_RPC_SERVERS"] = ",".join(servers)
    full = {k: v for k, v in os.environ.items() if k not in _HIDDEN_ENV}
    full.update(added)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=full, start_new_session=True)
    hung = False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        hung = True
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    seconds = time.monotonic() - t0
    log = err.decode("utf-8", "replace").splitlines()
    info = classify_exit(proc.returncode, log)
    if hung:
        info.returncode, info.signal, info.aborted = None, None, False
        info.message = f"hang: llama-simple did not finish within {timeout:g} s"
    m = _DECODED.search(err)
    return ModelRun(stdout=out, exit=info, seconds=seconds, cmd=cmd, env=added,
                    decoded_tokens=int(m.group(1)) if m else None, log=log)


def compare_local_rpc(bin_dir: str | os.PathLike, servers: list[str] | str, *,
                      model: str | os.PathLike | None = None,
                      spec: TinyModelSpec = TinyModelSpec(), prompt: str = DEFAULT_PROMPT,
                      n_predict: int = DEFAULT_N_PREDICT, shim: str | os.PathLike | None = None,
                      env: dict[str, str] | None = None, timeout: float = DEFAULT_TIMEOUT
                      ) -> ModelCheck:
    """The headline end-to-end check: same text locally and with all layers on ``servers``."""
    if isinstance(servers, str):
        servers = [s for s in servers.split(",") if s]
    model = Path(model) if model else tiny_model(spec)
    shim = Path(shim) if shim else ensure_shim(bin_dir)
    kw = dict(prompt=prompt, n_predict=n_predict, env=env, timeout=timeout)
    local = run_llama_simple(bin_dir, model, **kw)
    rpc = run_llama_simple(bin_dir, model, servers=servers, shim=shim, **kw)
    return ModelCheck(local=local, rpc=rpc, model=model, shim=shim, servers=list(servers))
