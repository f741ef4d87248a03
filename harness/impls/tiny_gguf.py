"""A tiny random llama model as a GGUF, generated on first use into the cache (never shipped as a
file): what the end-to-end model client (:mod:`.model_client`) loads locally and over RPC."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .cache import cache_root


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
