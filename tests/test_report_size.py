"""Reports that fit: a passing cell's long payloads become their length and SHA-256 after its
verdict (headers and short payloads stay, so decode and the readers work unchanged) and its
files are gzip-compressed; a failing cell, and any cell with --keep-payloads, keeps everything
the recording kept, uncompressed."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.capture.pcap import read_pcap
from harness.capture.proxy import compact
from harness.capture.transcript import C2S, MAGIC, MAGIC_HASHED, S2C, Chunk, Transcript
from harness.proto import get_dialect, pack_request
from harness.proto import messages as m
from harness.proto.tensor import RpcTensor

ROOT = Path(__file__).resolve().parents[1]
D7 = get_dialect("7.0.0")


def _upload(n: int) -> tuple[Transcript, bytes]:
    payload = bytes(range(256)) * (n // 256)
    t = RpcTensor.make(id=1, ne=(n // 4,))
    frame = pack_request(D7, m.SetTensorRequest(tensor=t, offset=0, data=payload))
    tr = Transcript()
    tr.add(0.0, C2S, pack_request(D7, m.GetAlignmentRequest(0)))
    tr.add(0.1, S2C, (8).to_bytes(8, "little") + (32).to_bytes(8, "little"))
    tr.add(0.2, C2S, frame)
    return tr, frame


def test_long_payloads_become_length_and_hash_and_short_ones_stay(tmp_path):
    tr, frame = _upload(1 << 16)
    small = compact(tr, 0, head_bytes=512, heads_keep=1 << 20, hash_elided=True)
    elided = [c for c in small.chunks if c.data is None]
    assert len(elided) == 1 and elided[0].length == len(frame) - 9 - 512
    assert elided[0].sha256 == hashlib.sha256(frame[9 + 512:]).digest()
    assert small.total(C2S) == tr.total(C2S) and small.total(S2C) == tr.total(S2C)
    small.save(tmp_path / "c.rpct")
    assert json.loads((tmp_path / "c.rpct").read_bytes().split(b"\n", 1)[0])["format"] == \
        MAGIC_HASHED
    back = Transcript.load(tmp_path / "c.rpct")
    assert [(c.length, c.data, c.sha256) for c in back.chunks] == \
        [(c.length, c.data, c.sha256) for c in small.chunks]
    # the decoder sees the same messages, with the payload summarised by length
    a, b = tr.decode(D7), back.decode(D7)
    assert a.commands == b.commands and len(a.commands) == 2
    assert [e.data_length for e in a.exchanges] == [e.data_length for e in b.exchanges]
    # a transcript with nothing hashed stays format 1, readable by older harnesses
    tr.save(tmp_path / "full.rpct")
    assert json.loads((tmp_path / "full.rpct").read_bytes().split(b"\n", 1)[0])["format"] == MAGIC


def test_bytes_the_recording_never_had_get_no_hash_and_are_never_zeros():
    tr = Transcript(chunks=[Chunk(0.0, C2S, 9, pack_request(D7, m.GetAlignmentRequest(0))),
                            Chunk(0.1, C2S, 4096, None)])  # the proxy had elided these
    small = compact(tr, 1 << 20, head_bytes=512, heads_keep=1 << 20, hash_elided=True)
    tail = [c for c in small.chunks if c.data is None]
    assert tail and all(c.sha256 is None for c in tail)
    assert sum(c.length for c in tail) == 4096  # not 4,096 zero bytes passed off as data


@pytest.mark.parametrize("cut", [1, 20])
def test_a_truncated_hashed_transcript_is_an_error(tmp_path, cut):
    tr, _ = _upload(1 << 14)
    compact(tr, 0, head_bytes=16, heads_keep=1 << 20, hash_elided=True).save(tmp_path / "c")
    raw = (tmp_path / "c").read_bytes()
    (tmp_path / "c").write_bytes(raw[:-cut])
    with pytest.raises(ValueError, match="truncated"):
        Transcript.load(tmp_path / "c")


def test_pcap_of_an_elided_transcript_reads_back(tmp_path):
    from harness.capture.pcap import write_pcap
    tr, frame = _upload(1 << 16)
    small = compact(tr, 0, head_bytes=512, heads_keep=1 << 20, hash_elided=True)
    write_pcap([small], tmp_path / "w.pcap")
    (back,) = read_pcap(tmp_path / "w.pcap")
    assert back.total(C2S) == tr.total(C2S) and back.total(S2C) == tr.total(S2C)
    assert (tmp_path / "w.pcap").stat().st_size < 4096 + len(frame) // 8


# ------------------------------------------------------------------ a real matrix run
MATRIX = {
    "version": 1,
    "defaults": {"deadline": 60, "idle_timeout": 20, "workers": 2},
    "implementations": {"ref-7": {"kind": "ref", "proto": "7.0.0"},
                        "ref-7f": {"kind": "ref", "proto": "7.0.0+flags"}},
    "designs": {"no-bump": {"roles": {"old-client": "ref-7", "new-client": "ref-7f",
                                      "old-server": "ref-7", "new-server": "ref-7f"}}},
    "scenarios": ["roundtrip"],
    "cache_options": {"roundtrip": [False]},
    "expectations": [{"outcome": "works"}],
}


def _run(tmp_path: Path, data: dict, *extra: str) -> tuple[Path, dict]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    spec = tmp_path / "m.yaml"
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    out = tmp_path / "reports"
    proc = subprocess.run([sys.executable, "-m", "harness", "run", "old-client", "old-server",
                           "--matrix", str(spec), "--out", str(out), *extra], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]
    (run,) = out.glob("run-*")
    (row,) = [json.loads(x) for x in (run / "results.jsonl").read_text().splitlines()]
    return run / row["folder"], row


def _payload_bytes(folder: Path) -> int:
    return sum(len(c.data or b"") for f in folder.glob("conn*.rpct")
               for c in Transcript.load(f).chunks)


def test_a_passing_cell_is_elided_a_failing_one_and_keep_payloads_are_not(tmp_path):
    passing, row = _run(tmp_path / "a", MATRIX)
    assert row["verdict"] == "pass"
    kept, row_k = _run(tmp_path / "b", MATRIX, "--keep-payloads")
    assert row_k["verdict"] == "pass"
    planted = json.loads(json.dumps(MATRIX))
    planted["expectations"] = [{"outcome": "rejected-at-hello", "side": "server"}]
    failing, row_f = _run(tmp_path / "c", planted)  # the same session, judged a failure
    assert row_f["verdict"] == "fail"
    full = _payload_bytes(kept)
    assert _payload_bytes(failing) == full  # the failing cell's evidence is whole
    assert _payload_bytes(passing) < full / 4
    hashed = [c for f in passing.glob("conn*.rpct") for c in Transcript.load(f).chunks
              if c.data is None and c.sha256]
    assert hashed, "no elided payload carries its hash"
    # the checks ran on the whole session: the verdicts and their evidence are the same
    assert [c["name"] for c in row["checks"]] == [c["name"] for c in row_k["checks"]]
    # the elided cell still decodes, from the transcript and from the pcap
    proc = subprocess.run([sys.executable, "-m", "harness", "decode",
                           str(passing / "wire.pcap")], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and "SET_TENSOR" in proc.stdout, proc.stdout + proc.stderr
    (pc,) = read_pcap(passing / "wire.pcap")
    (tr,) = [Transcript.load(f) for f in passing.glob("conn0.rpct")]
    assert pc.total(C2S) == tr.total(C2S) and pc.total(S2C) == tr.total(S2C)
    # ... and its files are written compressed, under their usual names
    assert all(f.read_bytes()[:2] == b"\x1f\x8b" for f in [passing / "wire.pcap",
                                                            *passing.glob("conn*.rpct")])
    assert (kept / "wire.pcap").read_bytes()[:2] != b"\x1f\x8b"  # kept whole: kept plain
    assert (failing / "conn0.rpct").read_bytes()[:2] != b"\x1f\x8b"


# ------------------------------------------------------------------ compressed files
def test_compressed_transcript_and_pcap_read_back_as_the_plain_ones(tmp_path):
    from harness.capture.decode import load_transcripts
    from harness.capture.pcap import write_pcap
    tr, _ = _upload(1 << 14)
    tr.save(tmp_path / "plain.rpct")
    tr.save(tmp_path / "gz.rpct", compress=True)
    assert (tmp_path / "gz.rpct").read_bytes()[:2] == b"\x1f\x8b"
    assert (tmp_path / "gz.rpct").stat().st_size < (tmp_path / "plain.rpct").stat().st_size / 4
    a, b = Transcript.load(tmp_path / "plain.rpct"), Transcript.load(tmp_path / "gz.rpct")
    assert [(c.direction, c.length, c.data) for c in a.chunks] == \
        [(c.direction, c.length, c.data) for c in b.chunks]
    tr.save(tmp_path / "again.rpct", compress=True)  # deterministic: no time stamp inside
    assert (tmp_path / "again.rpct").read_bytes() == (tmp_path / "gz.rpct").read_bytes()
    write_pcap([tr], tmp_path / "w.pcap", compress=True)
    (back,) = load_transcripts(tmp_path / "w.pcap")
    assert back.bytes_of(C2S) == tr.bytes_of(C2S) and back.bytes_of(S2C) == tr.bytes_of(S2C)
    (rpct,) = load_transcripts(tmp_path / "gz.rpct")
    assert rpct.bytes_of(C2S) == tr.bytes_of(C2S)


def test_tshark_reads_a_compressed_pcap(tmp_path):
    import shutil
    from harness.capture.pcap import write_pcap
    from harness.strictness import TOOL_MISSING
    from needs import skip
    if shutil.which("tshark") is None:
        skip(TOOL_MISSING, "tshark is not installed")
    tr, _ = _upload(1 << 12)
    write_pcap([tr], tmp_path / "w.pcap", compress=True)
    proc = subprocess.run(["tshark", "-r", str(tmp_path / "w.pcap"), "-q", "-z", "conv,tcp"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "127.0.0.1:40000" in proc.stdout, proc.stdout + proc.stderr


def test_a_damaged_or_oversized_compressed_file_is_a_clear_error(tmp_path):
    import gzip

    from harness.capture import compressed
    from harness.capture.decode import load_transcripts
    tr, _ = _upload(1 << 14)
    tr.save(tmp_path / "gz.rpct", compress=True)
    raw = (tmp_path / "gz.rpct").read_bytes()
    (tmp_path / "cut.rpct").write_bytes(raw[:len(raw) // 2])
    with pytest.raises(ValueError, match="damaged compressed"):
        Transcript.load(tmp_path / "cut.rpct")
    (tmp_path / "junk").write_bytes(b"\x1f\x8b" + b"\xff" * 64)
    with pytest.raises(ValueError, match="damaged compressed"):
        load_transcripts(tmp_path / "junk")
    # a small file that expands without end stops at the bound, not in memory
    (tmp_path / "bomb").write_bytes(gzip.compress(b"\0" * (8 << 20)))
    with pytest.raises(ValueError, match="expands past"):
        compressed.read_bounded(tmp_path / "bomb", limit=1 << 20)
