"""`harness decode`: listings of the golden captures, JSON lines, every-field dumps, errors."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from harness.capture.decode import format_record, iter_lines, session_records
from harness.capture.transcript import C2S, S2C, Transcript
from harness.cli import app
from harness.proto import RpcTensor, get_dialect, pack_request
from harness.proto.messages import HelloRequest, SetTensorRequest
from test_capture_helpers import GOLDEN, vector_entries

runner = CliRunner()


def _decode(*args: str) -> list[str]:
    result = runner.invoke(app, ["decode", *args])
    assert result.exit_code == 0, result.output
    return result.output.splitlines()


def _find(lines: list[str], pattern: str) -> str:
    hits = [ln for ln in lines if re.search(pattern, ln)]
    assert hits, f"no line matches {pattern!r}"
    return hits[0]


def test_listing_of_the_golden_pcap():
    lines = _decode(str(GOLDEN / "happy_nocache.pcap"))
    assert lines[0].startswith("# connection 0 127.0.0.1:40000 -> 127.0.0.1:50052: dialect 7.0.0, "
                               "26 requests")
    assert lines[1].split() == ["0", "+0.001000", "C->S", "HELLO", "conn_caps=24B"]
    assert lines[2].split() == ["0", "+0.001400", "S->C", "HELLO", "major=7", "minor=0", "patch=0",
                                "flags=0", "conn_caps=24B"]
    assert _find(lines, r"S->C GET_ALIGNMENT").split()[-1] == "alignment=32"
    assert _find(lines, r"^ +7 .* C->S SET_TENSOR ").endswith(
        "'a'> cache_flag=0 offset=0 data=16B")
    assert "hash=0x8faa0a18faf0fb98" in _find(lines, r"^ +24 .* C->S SET_TENSOR_HASH")
    assert _find(lines, r"^ +24 .* S->C SET_TENSOR_HASH").split()[-1] == "result=0"
    assert "nodes=(12288,) tensors=[3 tensors]" in _find(lines, r"C->S GRAPH_COMPUTE")
    assert lines[-2].split()[2:] == ["C->S", "CLOSE", "FIN", "after", "9139", "bytes"]
    assert lines[-1].split()[2:] == ["S->C", "CLOSE", "FIN", "after", "338", "bytes"]
    # one line per message: 26 requests, 17 responses, 2 closes, 1 header
    assert len(lines) == 1 + 26 + 17 + 2


def test_rpct_and_pcap_list_the_same():
    for name in ("happy_nocache", "cache"):
        assert _decode(str(GOLDEN / f"{name}.rpct")) == _decode(str(GOLDEN / f"{name}.pcap"))


def test_json_lines():
    lines = _decode(str(GOLDEN / "happy_nocache.pcap"), "--json")
    docs = [json.loads(ln) for ln in lines]
    requests = [d for d in docs if d["kind"] == "request"]
    assert [d["cmd"] for d in requests] == [e["cmd"] for e in vector_entries("happy_nocache")]
    assert [d["size"] for d in requests] == [len(e["req"]) // 2 for e in vector_entries("happy_nocache")]
    set_tensor = next(d for d in requests if d["cmd"] == "SET_TENSOR")
    assert set_tensor["fields"]["tensor"]["name"] == "a"
    assert set_tensor["fields"]["tensor"]["ne"] == [4, 1, 1, 1]
    assert set_tensor["fields"]["data"] == "0000803f000000400000404000008040"
    alloc = next(d for d in requests if d["cmd"] == "GET_ALLOC_SIZE")
    assert len(alloc["fields"]["srcs"]) == 10 and alloc["fields"]["srcs"][0]["id"] == 0x1000
    assert all(d["captured"] for d in docs if "fields" in d)
    caps = docs[0]["fields"]["conn_caps"]
    assert caps == "00" * 24
    assert docs[-1] == {"conversation": 0, "kind": "close", "direction": "s2c", "t": pytest.approx(0.0274),
                        "text": "FIN after 338 bytes"}


def test_fields_dump_includes_tensor_fields():
    lines = _decode(str(GOLDEN / "happy_nocache.pcap"), "--fields")
    text = "\n".join(lines)
    assert "            op = 2 (ADD)" in text
    assert "            flags = 16 (COMPUTE)" in text
    assert "            type = 0 (f32)" in text
    assert "            name = 'c'" in text
    assert "            src = [0x1000, 0x2000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0]" in text
    assert "        nodes = [0x3000]" in text


def test_dialect_option_and_bad_input(tmp_path):
    assert _decode(str(GOLDEN / "cache.rpct"), "--dialect", "7.0.0")[0].endswith(
        "dialect 7.0.0, 12 requests, 2684 B client->server, 136 B server->client")
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"not a capture")
    result = runner.invoke(app, ["decode", str(junk)])
    assert result.exit_code == 1


def _transcript(*chunks, closed=()):
    tr = Transcript(meta={"t_open": 0.0})
    for t, direction, data in chunks:
        tr.add(t, direction, data)
    for t, direction, how in closed:
        tr.close(t, direction, how)
    return tr


def test_errors_show_where_they_happen():
    d = get_dialect("7.0.0")
    hello = pack_request(d, HelloRequest())
    hello_rsp = bytes.fromhex(vector_entries("happy_nocache")[0]["rsp"])
    bad = b"\x13" + bytes(8)  # command 19 does not exist in 7.0.0
    tr = _transcript((0.1, C2S, hello), (0.2, S2C, hello_rsp), (0.3, C2S, bad),
                     closed=[(0.4, S2C, "rst")])
    lines = [format_record(r) for r in session_records(tr, tr.decode())]
    assert [ln.split()[2:4] for ln in lines] == [["C->S", "HELLO"], ["S->C", "HELLO"],
                                                 ["C->S", "ERROR"], ["S->C", "CLOSE"]]
    assert "Unknown command: 19" in lines[2] and "+0.300000" in lines[2]
    assert lines[3].endswith("RST after 36 bytes")


def test_large_payloads_are_summarised_in_json(tmp_path):
    d = get_dialect("7.0.0")
    hello_rsp = bytes.fromhex(vector_entries("happy_nocache")[0]["rsp"])
    payload = bytes(range(256)) * 4
    st = pack_request(d, SetTensorRequest(tensor=RpcTensor.make(id=1, ne=(256,), name="w"),
                                          data=payload))
    tr = _transcript((0.1, C2S, pack_request(d, HelloRequest())), (0.2, S2C, hello_rsp),
                     (0.3, C2S, st))
    tr.save(tmp_path / "big.rpct")
    docs = [json.loads(ln) for ln in iter_lines(tmp_path / "big.rpct", as_json=True)]
    data = docs[-1]["fields"]["data"]
    from harness.proto import fnv1a64

    assert data == {"len": 1024, "fnv1a64": f"{fnv1a64(payload):016x}"}
    text = list(iter_lines(tmp_path / "big.rpct"))
    assert f"data=1024B fnv1a64={fnv1a64(payload):016x}" in text[-1]


def test_elided_payloads_are_marked_not_hashed(tmp_path):
    d = get_dialect("7.0.0")
    st = pack_request(d, SetTensorRequest(tensor=RpcTensor.make(id=1, ne=(1000,), name="w"),
                                          data=bytes(range(250)) * 16))
    tr = Transcript(meta={"t_open": 0.0}, keep=400)  # header kept, data beyond 400 B elided
    tr.add(0.1, C2S, st[:400])
    tr.add(0.2, C2S, st[400:])
    assert tr.chunks[1].data is None
    tr.save(tmp_path / "elided.rpct")
    [doc] = [json.loads(ln) for ln in iter_lines(tmp_path / "elided.rpct", as_json=True)]
    assert doc["captured"] is False
    assert doc["fields"]["data"] == {"len": 4000, "fnv1a64": None}
    assert doc["fields"]["tensor"]["name"] == "w"
    [_, line] = iter_lines(tmp_path / "elided.rpct")
    assert line.endswith("data=4000B [not all bytes captured]")


def test_a_passing_cells_transcript_with_hashed_payloads_decodes(tmp_path, monkeypatch):
    """A passing cell keeps long payloads as their length and SHA-256 (transcript format 2):
    `harness decode` reads it like any other (it refused it as 'neither a pcap nor a
    transcript'), gzip-compressed as the matrix writes it."""
    import gzip

    from harness.capture import decode as decode_mod
    from harness.capture.proxy import compact
    from harness.capture.transcript import MAGIC, MAGIC_HASHED

    d = get_dialect("7.0.0")
    st = pack_request(d, SetTensorRequest(tensor=RpcTensor.make(id=1, ne=(4096,), name="w"),
                                          data=bytes(range(256)) * 64))
    tr = Transcript(meta={"t_open": 0.0})
    tr.add(0.1, C2S, st)
    small = compact(tr, 0, head_bytes=512, heads_keep=1 << 20, hash_elided=True)
    small.save(tmp_path / "plain.rpct")
    (tmp_path / "conn0.rpct").write_bytes(gzip.compress((tmp_path / "plain.rpct").read_bytes()))
    assert MAGIC_HASHED.encode() in gzip.decompress((tmp_path / "conn0.rpct").read_bytes())[:200]
    [header, line] = _decode(str(tmp_path / "conn0.rpct"))
    assert header.startswith("# connection 0") and "C->S SET_TENSOR" in line, line
    assert "data=16384B" in line
    # planted: the reader as it was, taking format 1 only
    monkeypatch.setattr(decode_mod, "FORMATS", (MAGIC,))
    with pytest.raises(ValueError, match="neither a pcap nor a ggml-rpc transcript"):
        list(iter_lines(tmp_path / "conn0.rpct"))


def _upload_transcript() -> Transcript:
    d = get_dialect("7.0.0")
    t = RpcTensor.make(id=1, type=0, ne=(16,), buffer=0x1000, data=0x1000)
    tr = Transcript(keep=1 << 20)
    tr.add(0.0, C2S, pack_request(d, HelloRequest()))
    frame = pack_request(d, SetTensorRequest(t, 0, 0, bytes(range(1, 65))))
    tr.add(0.1, C2S, frame[:-64])
    tr.add(0.2, C2S, frame[-64:])  # the payload, a chunk of its own (what elision drops)
    return tr


def _is_a_fresh_decode(tr: Transcript) -> bool:
    first = tr.decode(keep_data=0)
    return tr.decode(keep_data=0) is first and tr.decode(dialect="7.0.0", keep_data=0) is not first


def _payload_hash(tr: Transcript) -> str:
    [ex] = [e for e in tr.decode(keep_data=0).exchanges if e.data_hash is not None]
    return ex.data_hash


def test_a_transcript_decodes_once_until_its_chunks_change():
    """The matrix reads a cell's transcript several times: one decode, remembered while the
    chunks are the same; an elided payload or a chunk more decodes again (planted: a memo
    keyed on the chunk count alone would return the stale session after elision)."""
    tr = _upload_transcript()
    assert _is_a_fresh_decode(tr)
    before, kept = tr.decode(keep_data=0), _payload_hash(tr)
    payload = tr.chunks[2]
    tr.chunks[2] = type(payload)(payload.t, payload.direction, payload.length, None)
    after = tr.decode(keep_data=0)
    assert after is not before
    assert _payload_hash(tr) != kept  # zeros now stand for the elided bytes
    tr.add(0.3, S2C, b"\x00")
    assert tr.decode(keep_data=0) is not after
