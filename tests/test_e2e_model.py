"""End-to-end: llama-simple with the generated tiny model, locally and over RPC."""

from __future__ import annotations

import subprocess

import pytest

from harness.impls.model_client import compare_local_rpc, run_llama_simple
from harness.impls.preload_shim import ensure_shim
from harness.impls.tiny_gguf import TinyModelSpec, tiny_model, write_tiny_gguf
from needs import module
from test_realclient_support import FakeServer, RealServer, realpeer, require_peer_dir

GGUF_INSTALL = "pip install gguf (the project's build extra: make install)"


def test_tiny_gguf_has_what_llama_needs(tmp_path):
    gguf = module("gguf", GGUF_INSTALL)
    path = tmp_path / "tiny.gguf"
    info = write_tiny_gguf(path, TinyModelSpec())
    assert info["n_vocab"] == 3 + 256 + 12 + 66
    r = gguf.GGUFReader(str(path))
    keys = set(r.fields)
    for k in ("general.architecture", "llama.context_length", "llama.embedding_length",
              "llama.block_count", "llama.attention.layer_norm_rms_epsilon",
              "tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type"):
        assert k in keys, k
    names = {t.name for t in r.tensors}
    assert {"token_embd.weight", "output_norm.weight", "blk.1.ffn_down.weight"} <= names


def test_tiny_model_is_cached(tmp_path):
    module("gguf", GGUF_INSTALL)
    a = tiny_model(TinyModelSpec(seed=3), cache_dir=tmp_path)
    mtime = a.stat().st_mtime_ns
    b = tiny_model(TinyModelSpec(seed=3), cache_dir=tmp_path)
    assert a == b and b.stat().st_mtime_ns == mtime
    assert [p.name for p in tmp_path.iterdir()] == [a.name]  # no temp files left


@realpeer
def test_shim_compiles_once_per_build(tmp_path):
    bin_dir = require_peer_dir(server=False)
    shim = ensure_shim(bin_dir, out_dir=tmp_path)
    mtime = shim.stat().st_mtime_ns
    assert ensure_shim(bin_dir, out_dir=tmp_path) == shim and shim.stat().st_mtime_ns == mtime
    dyn = subprocess.run(["readelf", "-d", str(shim)], capture_output=True, text=True).stdout
    assert "libggml-rpc.so" in dyn and "libggml.so" in dyn and str(bin_dir.resolve()) in dyn


@pytest.fixture
def model_env(tmp_path):
    module("gguf", GGUF_INSTALL)
    bin_dir = require_peer_dir(llama_simple=True)
    model = tiny_model(cache_dir=tmp_path / "models")
    return bin_dir, model, ensure_shim(bin_dir, out_dir=tmp_path)


@realpeer
def test_same_text_locally_and_over_rpc(model_env, tmp_path):
    bin_dir, model, shim = model_env
    with RealServer(bin_dir, tmp_path / "server.log", env={"GGML_RPC_DEBUG": "1"}) as srv:
        check = compare_local_rpc(bin_dir, srv.endpoint, model=model, shim=shim, timeout=180)
        log = srv.log()
    s = check.summary()
    assert check.local.ok and check.rpc.ok, s
    assert check.equal, s
    assert check.local.decoded_tokens == check.rpc.decoded_tokens == 24
    assert check.local_text.startswith("<s> Hello world")
    assert check.rpc.env["GGML_RPC_SERVERS"] == srv.endpoint
    assert f"rpc_preload: registered RPC server {srv.endpoint}" in check.rpc.log
    assert not any("rpc_preload" in ln for ln in check.local.log)
    # The weights went over the wire and the graph ran on the server.
    assert "[set_tensor]" in log and "[graph_compute]" in log


@realpeer
def test_rpc_run_against_wrong_version_aborts(model_env):
    bin_dir, model, shim = model_env
    with FakeServer(FakeServer.hello_reply(9), hold=10) as fake:
        run = run_llama_simple(bin_dir, model, servers=[fake.endpoint], shim=shim, timeout=60)
    assert not run.ok and run.exit.aborted
    assert "version mismatch" in run.exit.message and "9.0.0" in run.exit.message
    assert run.stdout == b""  # it died in the shim's constructor, before main()
