"""End-to-end model client: llama-simple with a tiny generated model, locally and over RPC.

The same greedy generation run twice, once on the local CPU and once with every layer
offloaded to RPC servers, must print the same bytes. llama-simple has no ``--rpc`` flag, so
the RPC run preloads a small shim (``rpc_preload.c``) that registers ``$GGML_RPC_SERVERS``
as devices before main(), as ``--rpc`` does in the tools that have it.

* ``tiny_model()``: a tiny random llama GGUF, generated on first use into the cache.
* ``ensure_shim(bin_dir)``: the shim compiled against one build's own libraries, cached.
* ``compare_local_rpc(bin_dir, servers)``: both runs and the verdict.

LD_PRELOAD and GGML_RPC_SERVERS are set only in the environment of the llama-simple process
itself: on a wrapper (timeout, env, a shell) the shim's constructor would connect too.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .cache import cache_root
from .driver import ExitInfo
from .ctypes_driver import classify_exit
from .supervisor import REAL_PROCESS_ENV

SHIM_SOURCE = Path(__file__).with_name("rpc_preload.c")
SHIM_NAME = "librpc_preload.so"
DEFAULT_PROMPT = "Hello world"
DEFAULT_N_PREDICT = 24
DEFAULT_TIMEOUT = 300.0
SHIM_EXIT_REFUSED = 3  # rpc_preload.c's exit code when ggml_backend_rpc_add_server returns NULL
_HIDDEN_ENV = ("LD_PRELOAD", "GGML_RPC_SERVERS")
# Seed 000's profiler (patches/seed000-server-flags.patch); builds without it ignore it.
LOADPROF_ENV = {"GGML_RPC_LOADPROF": "1"}


# -- tiny model -----------------------------------------------------------------------------

@dataclass(frozen=True)
class TinyModelSpec:
    layers: int = 2
    embd: int = 64
    ff: int = 128
    heads: int = 4
    kv_heads: int = 2
    ctx: int = 256
    seed: int = 0
    f16: bool = False
    minimal: bool = False

    @property
    def file_name(self) -> str:
        return (f"tiny-llama-l{self.layers}-e{self.embd}-f{self.ff}-h{self.heads}-kv{self.kv_heads}"
                f"-c{self.ctx}-s{self.seed}-{'f16' if self.f16 else 'f32'}"
                f"{'-min' if self.minimal else ''}.gguf")


# The model-load experiment's model: its three feed-forward matrices per layer are 256 x 11264
# f32 = 11 MiB each, above the 10 MiB hash threshold, so a caching server's path is taken
# (SET_TENSOR_HASH, cold miss, warm hit); 100 MiB in all, loaded in about a second here. Three
# layers, so a split across two servers gives each of them feed-forward weights.
LOAD_MODEL_SPEC = TinyModelSpec(layers=3, embd=256, ff=11264)


def _vocab(gguf):
    # SPM ("llama") vocab: <unk>, <s>, </s>, the 256 byte-fallback tokens, then a few words.
    tokens, scores, types = ["<unk>", "<s>", "</s>"], [0.0, 0.0, 0.0], [
        gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        scores.append(0.0)
        types.append(gguf.TokenType.BYTE)  # without the type, bytes print as "<0x5E>"
    words = ["\u2581", "\u2581the", "\u2581a", "\u2581cat", "\u2581dog", "\u2581sat", "\u2581on",
             "\u2581mat", "\u2581hello", "\u2581world", "\u2581Hello", "\u2581World"]
    words += list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?")
    for i, w in enumerate(words):
        tokens.append(w)
        scores.append(-float(i + 1))
        types.append(gguf.TokenType.NORMAL)
    return tokens, scores, types


def write_tiny_gguf(path: str | os.PathLike, spec: TinyModelSpec = TinyModelSpec()) -> dict:
    """Write a tiny random llama-architecture GGUF that llama.cpp loads (needs ``gguf``).

    ``minimal`` writes only what llama.cpp requires (real-peers notes 3a); otherwise the
    usual optional keys too. Returns a summary of what was written.
    """
    import gguf
    import numpy as np

    rng = np.random.default_rng(spec.seed)
    tokens, scores, types = _vocab(gguf)
    n_vocab = len(tokens)
    head_dim = spec.embd // spec.heads
    kv_heads = spec.heads if spec.minimal else spec.kv_heads
    n_embd_kv = head_dim * kv_heads

    w = gguf.GGUFWriter(str(path), "llama")  # writes general.architecture = "llama"
    w.add_name("tiny-random-llama")
    w.add_context_length(spec.ctx)  # required
    w.add_embedding_length(spec.embd)  # required
    w.add_block_count(spec.layers)  # required
    w.add_feed_forward_length(spec.ff)  # defaults to 0 otherwise
    w.add_head_count(spec.heads)  # defaults to 0 otherwise
    w.add_layer_norm_rms_eps(1e-5)  # required for llama
    w.add_tokenizer_model("llama")  # SPM: bos=1, eos=2, unk=0 by default
    w.add_token_list(tokens)
    if not spec.minimal:
        w.add_head_count_kv(kv_heads)
        w.add_rope_dimension_count(head_dim)
        w.add_vocab_size(n_vocab)
        w.add_file_type(1 if spec.f16 else 0)
        w.add_tokenizer_pre("default")
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
        w.add_add_bos_token(True)
        w.add_add_eos_token(False)

    wdt = np.float16 if spec.f16 else np.float32

    def mat(rows, cols, scale=0.2):  # numpy (rows, cols) is ggml ne = [cols, rows]
        return (rng.standard_normal((rows, cols)) * scale).astype(wdt)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w.add_tensor("token_embd.weight", mat(n_vocab, spec.embd, 1.0))
    for i in range(spec.layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", norm(spec.embd))
        w.add_tensor(p + "attn_q.weight", mat(spec.embd, spec.embd))
        w.add_tensor(p + "attn_k.weight", mat(n_embd_kv, spec.embd))
        w.add_tensor(p + "attn_v.weight", mat(n_embd_kv, spec.embd))
        w.add_tensor(p + "attn_output.weight", mat(spec.embd, spec.embd))
        w.add_tensor(p + "ffn_norm.weight", norm(spec.embd))
        w.add_tensor(p + "ffn_gate.weight", mat(spec.ff, spec.embd))
        w.add_tensor(p + "ffn_up.weight", mat(spec.ff, spec.embd))
        w.add_tensor(p + "ffn_down.weight", mat(spec.embd, spec.ff))
    w.add_tensor("output_norm.weight", norm(spec.embd))
    if not spec.minimal:
        w.add_tensor("output.weight", mat(n_vocab, spec.embd, 1.0))  # else tied to token_embd

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {"path": str(path), "n_vocab": n_vocab, "layers": spec.layers, "embd": spec.embd,
            "ff": spec.ff}


def layer_weight_bytes(model: str | os.PathLike) -> int:
    """Bytes of the model's repeating layers (``blk.*``), read from the GGUF: with every layer
    offloaded (llama-simple's ngl=99) these are what the RPC device must receive."""
    from gguf import GGUFReader
    return sum(int(t.n_bytes) for t in GGUFReader(str(model)).tensors
               if t.name.startswith("blk."))


def tiny_model(spec: TinyModelSpec = TinyModelSpec(), cache_dir: str | os.PathLike | None = None
               ) -> Path:
    """The tiny model for ``spec``, generated on first use (never shipped as a file)."""
    d = Path(cache_dir) if cache_dir else cache_root() / "models"
    d.mkdir(parents=True, exist_ok=True)
    out = d / spec.file_name
    if not out.exists():
        fd, tmp = tempfile.mkstemp(dir=d, suffix=".gguf.tmp")
        os.close(fd)
        try:
            write_tiny_gguf(tmp, spec)
            os.replace(tmp, out)  # atomic: a concurrent reader sees all or nothing
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return out


# -- LD_PRELOAD shim --------------------------------------------------------------------------

def _lib(bin_dir: Path, name: str) -> Path:
    for cand in (name, name + ".0"):
        p = bin_dir / cand
        if p.exists():
            return p
    raise FileNotFoundError(f"{name} not found in {bin_dir}")


def ensure_shim(bin_dir: str | os.PathLike, include_dirs=(), *, out_dir=None,
                cc: str = "gcc", timeout: float = 120.0) -> Path:
    """Compile rpc_preload.c against ``bin_dir``'s libggml/libggml-rpc; cached per build.

    The shim declares the two functions it calls, so no headers are needed; ``include_dirs``
    (a build's ggml/include) switches to the real headers as a check of those declarations.
    The cache key covers the source, the build's library files and the flags, so a rebuilt
    peer gets a fresh shim. Raises RuntimeError with the compiler's output on failure.
    """
    bin_dir = Path(bin_dir).resolve()
    libs = [_lib(bin_dir, "libggml-rpc.so"), _lib(bin_dir, "libggml.so")]
    include_dirs = [str(Path(d).resolve()) for d in include_dirs]
    h = hashlib.sha256(SHIM_SOURCE.read_bytes())
    h.update(str(bin_dir).encode())
    for lib in libs:
        st = lib.stat()  # follows the symlink: the real file's identity
        h.update(f"{lib.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    h.update(repr((include_dirs, cc)).encode())
    d = Path(out_dir) if out_dir else cache_root() / "shims" / h.hexdigest()[:16]
    out = d / SHIM_NAME
    if out.exists():
        return out
    args = ["-O2", "-shared", "-fPIC", str(SHIM_SOURCE)]
    if include_dirs:
        args += ["-DRPC_PRELOAD_USE_HEADERS"] + [f"-I{p}" for p in include_dirs]
    # Link the build's own libraries (their constructors then run before the shim's) and find
    # them at run time in that bin dir, the same files the tool itself loads.
    args += [str(p) for p in libs] + [f"-Wl,-rpath,{bin_dir}"]
    return compile_shared_object(cc, args, out, timeout)


def compile_shared_object(cc: str, args: list[str], out: Path, timeout: float) -> Path:
    """``cc args -o out``, written atomically (a concurrent user never sees half a file).
    Raises RuntimeError with the compiler's output on failure."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=".so.tmp")
    os.close(fd)
    cmd = [cc, *args, "-o", tmp]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"shim compile failed ({' '.join(cmd)}):\n{r.stderr.strip()}")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


# -- runs -----------------------------------------------------------------------------------

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
