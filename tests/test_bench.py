"""``harness bench`` and the bit-sliced FNV-1a-64 it measures.

The hash must equal fnv_hash() of ggml-rpc byte for byte (cache entries are named by it), so
the fast kernel is checked against the plain loop on every length class it treats
differently: the byte tail, a single block, fewer blocks than the pipeline holds, the
pipelined loop, and every starting state. Performance targets live in the bench itself;
nothing here times anything.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from harness.impls.registry import PeerError, get_peer
from harness.proto import fnv
from harness.proto.fnv import Fnv1a64, fnv1a64, fnv1a64_update
from harness.strictness import PEER_MISSING
from needs import skip

PRIME = 0x100000001B3
BASIS = 0xCBF29CE484222325
M64 = (1 << 64) - 1
BLOCK = 64


def reference(data: bytes, h: int = BASIS) -> int:
    """The spec's loop, in plain Python (the oracle)."""
    for b in data:
        h = ((h ^ b) * PRIME) & M64
    return h


def kernels():
    from harness.proto import _fnv_sliced as k
    return k


def sliced(data: bytes, h: int = BASIS) -> int:
    k = kernels()
    return int(k.sliced(np.frombuffer(data, dtype=np.uint8), np.uint64(h), k.Q, k.P64))


# Lengths around every boundary the kernel has: the byte tail (< 64), one block, the
# unpipelined path (< 3 blocks), the pipeline's fill and drain (3 and 4 blocks), and beyond.
EDGES = sorted({n + d for n in (0, BLOCK, 2 * BLOCK, 3 * BLOCK, 4 * BLOCK, 7 * BLOCK,
                                16 * BLOCK) for d in (-2, -1, 0, 1, 2) if n + d >= 0})


def test_spec_vectors():
    # TV-9
    assert fnv1a64(b"") == 0xCBF29CE484222325
    assert fnv1a64(b"a") == 0xAF63DC4C8601EC8C
    assert fnv1a64(struct.pack("<4f", 1, 2, 3, 4)) == 0x8FAA0A18FAF0FB98
    assert fnv1a64(np.array([1, 2, 3, 4], dtype=np.float32)) == 0x8FAA0A18FAF0FB98


def test_spec_vectors_through_the_kernel():
    assert sliced(b"") == 0xCBF29CE484222325
    assert sliced(b"a") == 0xAF63DC4C8601EC8C
    assert sliced(struct.pack("<4f", 1, 2, 3, 4)) == 0x8FAA0A18FAF0FB98


@pytest.mark.parametrize("n", EDGES)
def test_kernel_on_every_edge_length(n):
    rng = np.random.default_rng(n)
    data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
    for h in (BASIS, 0, M64, 0x00000000000000FF, 0xFFFFFFFFFFFFFF00):
        assert sliced(data, h) == reference(data, h), (n, hex(h))


@pytest.mark.parametrize("low", range(256))
def test_kernel_from_every_low_byte(low):
    # the bit-sliced chain starts from the state's low byte: all 256 of them, both paths
    data = bytes((i * 37 + low) & 0xFF for i in range(5 * BLOCK + 3))
    h = (0x0123456789ABCD00 | low)
    assert sliced(data, h) == reference(data, h)
    assert sliced(data[:2 * BLOCK], h) == reference(data[:2 * BLOCK], h)


def test_kernel_on_constant_and_extreme_bytes():
    for n in (BLOCK * 5, BLOCK * 5 + 17):
        for v in (0x00, 0xFF, 0x80, 0x01, 0xB3):
            data = bytes([v]) * n
            assert sliced(data) == reference(data)


@settings(max_examples=300)
@given(data=st.one_of(st.binary(max_size=3 * BLOCK + 5),
                      st.binary(min_size=3 * BLOCK - 2, max_size=20 * BLOCK)),
       h=st.integers(0, M64))
@example(data=b"", h=BASIS)
@example(data=bytes(BLOCK * 3), h=0)
def test_kernel_equals_the_loop(data, h):
    assert sliced(data, h) == reference(data, h)


@settings(max_examples=100)
@given(data=st.binary(max_size=8 * BLOCK), h=st.integers(0, M64))
def test_public_api_equals_the_loop(data, h):
    assert fnv1a64_update(h, data) == reference(data, h)
    assert fnv1a64_update(h, np.frombuffer(data, dtype=np.uint8)) == reference(data, h)
    assert fnv1a64_update(h, memoryview(data)) == reference(data, h)


@settings(max_examples=50)
@given(data=st.binary(min_size=0, max_size=4096), cuts=st.lists(st.integers(0, 4096),
                                                                   max_size=6))
def test_incremental_equals_one_shot(data, cuts):
    hasher = Fnv1a64()
    prev = 0
    for c in sorted(min(c, len(data)) for c in cuts) + [len(data)]:
        hasher.update(data[prev:c])
        prev = c
    assert hasher.value == reference(data)
    assert hasher.length == len(data)


def test_large_buffer_matches_the_compiled_loop():
    k = kernels()
    data = np.random.default_rng(5).integers(0, 256, (1 << 20) + 77, dtype=np.uint8)
    assert fnv1a64(data) == int(k.serial(data, np.uint64(BASIS)))


def test_kernel_self_check_is_what_runs():
    # a large hash loads the kernel; the load verified it against the loop and kept it
    fnv1a64(bytes(1 << 16))
    assert fnv._kernel not in (None, False)
    assert getattr(fnv._kernel, "__name__", "") == "sliced"


def test_small_hashes_do_not_load_numba():
    # the reference server's resident memory (and every process's start-up) depends on it
    code = ("import sys; from harness.proto import fnv1a64; import harness.reference.server; "
            "[fnv1a64(bytes(4096)) for _ in range(8)]; print('numba' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       cwd=Path(__file__).resolve().parents[1], check=False)
    assert r.stdout.strip() == "False", r.stderr


# ------------------------------------------------------------------------------ bench

def test_figure_ratio_is_the_median_of_paired_rounds():
    from harness.bench.figures import BenchFigure
    f = BenchFigure("x", "x", "GiB/s", 2.0, 1.0, "a", ">= 1x anchor", None, paired=True,
               values=[1.0, 2.0, 3.0], anchor_values=[1.0, 4.0, 1.0])
    assert f.ratio == 1.0  # ratios 1, 0.5, 3
    unpaired = BenchFigure("y", "y", "s", 10.0, 20.0, "a", "<= 180 s", True)
    assert unpaired.ratio == 0.5
    assert BenchFigure("z", "z", "s", None, 1.0, "a", "-", None).ratio is None


def test_markdown_has_every_figure():
    from harness.bench.figures import BenchFigure
    from harness.bench.render import markdown
    figs = [BenchFigure("a", "fig a", "GiB/s", 1.0, 2.0, "anchor a", ">= 1x anchor", False,
                        notes="n"),
            BenchFigure("b", "fig b", "s", None, None, "anchor b", "<= 1 s", None)]
    m = {"cpu": "cpu", "cores": 2, "python": "3", "loadavg": [0.5, 0, 0]}
    doc = {"id": "t", "quick": True, "peer": "p7", "peer_proto": "7.0.0", "seconds": 1.0,
           "repeats": 3, "machine_start": m, "machine_end": m,
           "figures": [f.to_json() for f in figs]}
    text = markdown(doc)
    assert "| fig a | 1.00 GiB/s | 2.00 GiB/s (anchor a) | 0.50x | >= 1x anchor | NO |" in text
    assert "| fig b | - | - | - | <= 1 s | - |" in text


def test_a_figure_whose_run_failed_is_failed_and_fails_the_bench(tmp_path, monkeypatch):
    from harness.bench import measure, render
    from harness.bench.cli import bench_command
    from rich.console import Console
    # planted: the matrix run exits 1 (as it did without a Docker engine: 48 cells skipped)
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'matrix failed: 48 cells skipped' ; exit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(measure.sys, "executable", str(fake))
    monkeypatch.setattr(measure, "PROJECT_ROOT", tmp_path)  # no .ci/with-docker here
    cfg = measure.BenchConfig(out=tmp_path, peer="p7")
    f = measure.measure_matrix(cfg, tmp_path)
    assert f.failed and "exited 1" in f.failed
    assert f.value is None and f.met is None  # a failed run's wall time is no figure
    assert render.rows([f.to_json()])[0][-1] == "FAILED"
    monkeypatch.setattr(measure, "run_bench", lambda cfg: (tmp_path, [f]))
    assert bench_command(Console(file=open(tmp_path / "out.txt", "w")), quick=True, out=tmp_path,
                         peer="p7") == (1, tmp_path)


def test_campaign_figures_measure_the_random_phase_not_the_sweep(tmp_path, monkeypatch):
    """A 4-s --quick campaign with the deterministic phases on was the sweep's first cases and
    the minimisation of what they found (44 and 193 msg/s against p7): the figure measures
    generated and evolved sessions and says so, and fails if a sweep ran in it anyway."""
    from harness.bench import measure
    from harness.fuzz import campaign
    configs = []

    def run_campaign(cfg, **kw):  # a campaign whose sweep, when on, fills its 4 s
        configs.append(cfg)
        swept = 120 if cfg.sweep_share > 0 else 0
        rate = 44.0 if swept else 4000.0
        return tmp_path, {"messages_per_s": rate, "elapsed_s": 4.0, "messages_sent": int(rate * 4),
                          "cases": 100, "restarts": 3, "distinct_signatures": 1,
                          "sweep": {"done": swept}, "errors": []}

    monkeypatch.setattr(campaign, "run_campaign", run_campaign)
    cfg = measure.BenchConfig.quick_config(out=tmp_path, log=lambda line: None)
    f = measure.campaign_figure(cfg, "p7", "1", 1, tmp_path, [9000.0])
    assert configs[-1].sweep_share == 0 and f.value == 4000.0 and f.failed is None
    assert "generated and evolved sessions" in f.title
    assert "deterministic phases off: 0 sweep cases" in f.notes
    # Planted fault: the campaign's default share of sweep -> the figure is the sweep's rate,
    # which the bench refuses to report under this title.
    monkeypatch.setattr(measure, "CAMPAIGN_SWEEP_SHARE", 0.2)
    g = measure.campaign_figure(cfg, "p7", "1", 1, tmp_path, [9000.0])
    assert configs[-1].sweep_share == 0.2 and g.failed and g.value is None


def _p7():
    try:
        peer = get_peer("p7")
    except PeerError as e:
        skip(PEER_MISSING, str(e))
    if not peer.available:
        skip(PEER_MISSING, f"p7 is not built: {peer.reason}")
    return peer


FIGURES = {"upload-c-ref-64M", "upload-ref-c-64M", "download-c-ref-64M", "download-ref-c-64M",
           "upload-ref-ref-64M", "loopback-64M", "rss-ref-server", "fnv", "fuzz-conn", "fuzz-1",
           "fuzz-workers", "matrix"}


@pytest.mark.slow
@pytest.mark.realpeer
def test_bench_quick_writes_every_figure(tmp_path):
    _p7()
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, "-m", "harness", "bench", "--quick", "--out",
                        str(tmp_path)], cwd=root, capture_output=True, text=True, timeout=600,
                       check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (folder,) = tmp_path.glob("bench-*")
    doc = json.loads((folder / "bench.json").read_text())
    assert doc["format"] == "ggml-rpc-bench/1" and doc["quick"] is True
    figs = {f["id"]: f for f in doc["figures"]}
    assert set(figs) == FIGURES
    for f in figs.values():
        assert {"value", "anchor", "ratio", "target", "met", "unit", "title"} <= set(f)
    # everything but the skipped matrix was measured, with its anchor
    for fid, f in figs.items():
        if fid == "matrix":
            assert f["value"] is None and "skipped" in f["notes"]
            continue
        assert f["value"] > 0 and f["anchor"] > 0 and f["ratio"] > 0, f
    assert figs["fnv"]["extra"]["hashes_agree"] is True
    # Only the send path has a bar; campaign rates (restarts, minimisation) are reported.
    assert figs["fuzz-conn"]["target"].startswith(">=") and figs["fuzz-conn"]["met"] is not None
    assert figs["fuzz-1"]["met"] is None and figs["fuzz-workers"]["met"] is None
    text = (folder / "bench.md").read_text()
    for f in figs.values():
        assert f["title"] in text
