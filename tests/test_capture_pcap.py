"""Transcripts to pcap and back: the golden captures, TCP correctness, elision, reassembly."""

from __future__ import annotations

import random
import shutil
import subprocess
import sys

import pytest
from scapy.layers.inet import IP, TCP
from scapy.utils import RawPcapReader, rdpcap, wrpcap

from harness.capture.pcap import (MAX_SEGMENT, read_pcap, transcripts_from_packets, write_pcap)
from harness.capture.transcript import C2S, S2C, Chunk, Transcript
from harness.proto import decode_session, get_dialect, unpack_request_payload
from needs import tool_marker
from test_capture_helpers import (GOLDEN, GOLDEN_NAMES, ROOT, pipelined_transcript,
                                  split_transcript, vector_entries, vector_streams)

D7 = get_dialect("7.0.0")


def _messages(session):
    return [(e.request, e.response) for e in session.exchanges]


# ---------------------------------------------------------------- golden files

@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_golden_pcap_decodes_to_vector_messages(name):
    [tr] = read_pcap(GOLDEN / f"{name}.pcap")
    c2s, s2c = vector_streams(name)
    assert tr.bytes_of(C2S) == c2s and tr.bytes_of(S2C) == s2c
    assert tr.meta["client"] == ["127.0.0.1", 40000] and tr.meta["server"] == ["127.0.0.1", 50052]
    assert {d: how for d, (_, how) in tr.closed.items()} == {C2S: "fin", S2C: "fin"}
    session = tr.decode()
    expected = decode_session(c2s, s2c)
    assert session.dialect == D7 and session.c2s_error is None and session.s2c_error is None
    assert _messages(session) == _messages(expected)
    assert [e.cmd.value for e in session.exchanges] == [e["cmd"] for e in vector_entries(name)]


def _one_connection(path) -> Transcript:
    found = read_pcap(path)
    assert len(found) == 1, f"{path}: {len(found)} connections"
    return found[0]


def _same_chunks(rpct: Transcript, pcap: Transcript) -> None:
    """The same chunks, at the same times; an empty capture is no evidence of either."""
    assert rpct.chunks, "no chunk to compare"
    assert [(c.direction, c.data) for c in rpct.chunks] == \
        [(c.direction, c.data) for c in pcap.chunks]
    assert all(abs(a.t - b.t) < 1e-6 for a, b in zip(rpct.chunks, pcap.chunks, strict=True))


@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_golden_rpct_equals_pcap(name):
    _same_chunks(Transcript.load(GOLDEN / f"{name}.rpct"), _one_connection(GOLDEN / f"{name}.pcap"))


def test_golden_files_are_reproducible_and_small():
    out = subprocess.run([sys.executable, str(ROOT / "fixtures" / "make_golden_captures.py"),
                          "--check"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    for p in GOLDEN.iterdir():
        assert p.stat().st_size < 100_000, p.name


# ---------------------------------------------------------------- the synthetic TCP conversation

def test_tcp_handshake_sequence_numbers_and_close():
    packets = rdpcap(str(GOLDEN / "cache.pcap"))
    tcp = [p[TCP] for p in packets]
    assert [str(t.flags) for t in tcp[:3]] == ["S", "SA", "A"]
    assert tcp[1].ack == tcp[0].seq + 1 and tcp[2].ack == tcp[1].seq + 1
    client, server = tcp[0].sport, tcp[0].dport
    nxt = {client: tcp[0].seq + 1, server: tcp[1].seq + 1}
    for p in packets[2:]:
        t = p[TCP]
        peer = server if t.sport == client else client
        assert t.seq == nxt[t.sport], p.summary()
        assert t.ack == nxt[peer], p.summary()  # everything the peer sent is acknowledged
        assert p[IP].len == len(p[IP])
        nxt[t.sport] += len(t.payload) + (1 if "F" in str(t.flags) else 0)
    assert [str(p[TCP].flags) for p in packets[-4:]] == ["FA", "A", "FA", "A"]
    assert any(len(p[TCP].payload) for p in packets[3:-4]), "no data between open and close"


def _timestamps_match(tr: Transcript, pcap) -> None:
    data = [p for p in rdpcap(str(pcap)) if TCP in p and len(p[TCP].payload)]
    assert data, f"{pcap}: no data packet"
    for p, c in zip(data, tr.chunks, strict=True):
        assert abs(float(p.time) - c.t) < 1e-6


def test_timestamps_are_the_chunk_times():
    _timestamps_match(Transcript.load(GOLDEN / "happy_nocache.rpct"),
                      GOLDEN / "happy_nocache.pcap")


def test_large_chunks_are_cut_into_segments(tmp_path):
    blob = random.Random(1).randbytes(3 * MAX_SEGMENT + 123)
    tr = Transcript()
    tr.add(10.0, C2S, blob)
    tr.add(10.5, S2C, b"ok")
    write_pcap(tr, tmp_path / "big.pcap")
    sizes = [len(p[TCP].payload) for p in rdpcap(str(tmp_path / "big.pcap")) if len(p[TCP].payload)]
    assert sizes == [MAX_SEGMENT] * 3 + [123, 2]
    [back] = read_pcap(tmp_path / "big.pcap")
    assert back.bytes_of(C2S) == blob
    assert [c.length for c in back.chunks] == [len(blob), 2]  # one send stays one chunk


def test_elided_chunks_keep_their_wire_length(tmp_path):
    tr = Transcript(keep=100)
    tr.add(1.0, C2S, bytes(range(100)))
    tr.add(1.1, C2S, b"x" * 70_000)  # beyond keep: length only
    tr.add(1.2, S2C, b"answer")
    tr.close(1.3, C2S, "rst")
    assert tr.chunks[1].data is None
    write_pcap(tr, tmp_path / "elided.pcap")
    truncated = []
    with RawPcapReader(str(tmp_path / "elided.pcap")) as reader:
        for raw, meta in reader:
            if meta.caplen < meta.wirelen:
                truncated.append((meta.caplen, meta.wirelen))
    assert truncated == [(54, 54 + MAX_SEGMENT), (54, 54 + 5_000)]  # Ethernet+IP+TCP only
    [back] = read_pcap(tmp_path / "elided.pcap")
    assert [(c.direction, c.length, c.data is None) for c in back.chunks] == \
        [(C2S, 100, False), (C2S, 70_000, True), (S2C, 6, False)]
    assert back.closed[C2S][1] == "rst"
    assert str(rdpcap(str(tmp_path / "elided.pcap"))[-1][TCP].flags) == "RA"


def test_several_connections_in_one_file(tmp_path):
    a = Transcript.load(GOLDEN / "cache.rpct")
    b = pipelined_transcript("happy_nocache")
    write_pcap([a, b], tmp_path / "two.pcap")
    back = {tr.meta["client"][1]: tr for tr in read_pcap(tmp_path / "two.pcap")}
    assert sorted(back) == [40000, 40001]
    assert back[40000].bytes_of(C2S) == a.bytes_of(C2S)
    assert back[40001].bytes_of(S2C) == b.bytes_of(S2C)


# ---------------------------------------------------------------- reassembly

def test_tiny_segments_reassemble(tmp_path):
    tr = split_transcript(Transcript.load(GOLDEN / "happy_nocache.rpct"), [1, 2, 3, 4, 5, 6, 7])
    write_pcap(tr, tmp_path / "tiny.pcap")
    [back] = read_pcap(tmp_path / "tiny.pcap")
    assert [(c.direction, c.data) for c in back.chunks] == [(c.direction, c.data) for c in tr.chunks]
    assert _messages(back.decode()) == _messages(decode_session(*vector_streams("happy_nocache")))


def test_out_of_order_and_retransmitted_segments(tmp_path):
    tr = split_transcript(Transcript.load(GOLDEN / "cache.rpct"), [50, 7, 300])
    write_pcap(tr, tmp_path / "clean.pcap")
    packets = list(rdpcap(str(tmp_path / "clean.pcap")))
    head, body, tail = packets[:3], packets[3:-4], packets[-4:]
    rng = random.Random(3)
    mangled = []
    for p in body:
        mangled.append(p)
        if rng.random() < 0.2:
            mangled.append(p.copy())  # a retransmission
    # swap neighbours of the same direction: out of order on the wire
    for i in range(0, len(mangled) - 1, 5):
        if mangled[i][TCP].sport == mangled[i + 1][TCP].sport:
            mangled[i], mangled[i + 1] = mangled[i + 1], mangled[i]
    wrpcap(str(tmp_path / "mangled.pcap"), head + mangled + tail)
    [back] = read_pcap(tmp_path / "mangled.pcap")
    assert back.bytes_of(C2S) == tr.bytes_of(C2S) and back.bytes_of(S2C) == tr.bytes_of(S2C)
    assert _messages(back.decode()) == _messages(decode_session(*vector_streams("cache")))


def test_capture_without_handshake_needs_the_server_port(tmp_path):
    packets = [p for p in rdpcap(str(GOLDEN / "cache.pcap")) if "S" not in str(p[TCP].flags)]
    [back] = transcripts_from_packets(packets, server_port=50052)
    assert back.meta["server"] == ["127.0.0.1", 50052]
    assert back.bytes_of(C2S) == vector_streams("cache")[0]
    # without it: 50052 is ggml-rpc's default port; failing that, the client spoke first
    [guess] = transcripts_from_packets(packets)
    assert guess.meta["server"][1] == 50052
    for p in packets:
        for field in ("sport", "dport"):
            if getattr(p[TCP], field) == 50052:
                setattr(p[TCP], field, 1234)
        del p[TCP].chksum
    [first] = transcripts_from_packets(packets)
    assert first.meta["server"][1] == 1234 and first.bytes_of(C2S) == vector_streams("cache")[0]


def _payloads_round_trip(pcap, name: str) -> None:
    session = _one_connection(pcap).decode()
    assert session.exchanges, f"{pcap}: no exchange"
    for ex, e in zip(session.exchanges, vector_entries(name), strict=True):
        frame = bytes.fromhex(e["req"])
        assert ex.request == unpack_request_payload(D7, ex.cmd, frame[9:])


def test_request_payloads_survive_the_round_trip(tmp_path):
    """Every request in the pcap unpacks to the same message as the vector's bytes."""
    _payloads_round_trip(GOLDEN / "happy_nocache.pcap", "happy_nocache")


def _checksums_valid(pcap) -> None:
    from scapy.layers.l2 import Ether

    packets = rdpcap(str(pcap))
    assert any(TCP in p and len(p[TCP].payload) for p in packets), f"{pcap}: no data packet"
    for p in packets:
        fresh = p.copy()
        del fresh[IP].chksum, fresh[TCP].chksum  # scapy recomputes them on build
        rebuilt = Ether(bytes(fresh))
        assert (rebuilt[IP].chksum, rebuilt[TCP].chksum) == (p[IP].chksum, p[TCP].chksum)


def test_checksums_are_valid():
    _checksums_valid(GOLDEN / "happy_nocache.pcap")


def test_an_empty_capture_passes_none_of_the_checks(tmp_path):
    """Planted: a connection that carried nothing (the loops and zips passed on it before)."""
    empty = tmp_path / "empty.pcap"
    write_pcap(Transcript(), empty)
    nothing = Transcript()
    for check in (lambda: _same_chunks(nothing, _one_connection(empty)),
                  lambda: _timestamps_match(nothing, empty),
                  lambda: _payloads_round_trip(empty, "happy_nocache"),
                  lambda: _checksums_valid(empty)):
        with pytest.raises(AssertionError):
            check()
    # and a capture cut short: zip(strict=True) no longer stops at the shorter side
    short = tmp_path / "short.pcap"
    tr = Transcript.load(GOLDEN / "happy_nocache.rpct")
    write_pcap(Transcript(chunks=tr.chunks[:4], meta=tr.meta), short)
    with pytest.raises((AssertionError, ValueError)):
        _payloads_round_trip(short, "happy_nocache")
    with pytest.raises(ValueError):
        _timestamps_match(tr, short)


@tool_marker(shutil.which("tshark") is None, "tshark is not installed (apt-get install tshark)")
def test_wireshark_finds_nothing_to_complain_about(tmp_path):
    tr = split_transcript(Transcript.load(GOLDEN / "cache.rpct"), [100, 3])
    tr.chunks[5].data = None  # one elided chunk: a capture with a short snap length
    write_pcap(tr, tmp_path / "check.pcap")
    for path in (GOLDEN / "happy_nocache.pcap", tmp_path / "check.pcap"):
        out = subprocess.run(["tshark", "-r", str(path), "-o", "tcp.check_checksum:TRUE",
                              "-o", "ip.check_checksum:TRUE", "-q", "-z", "expert"],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        # tshark's expert summary heads its sections "Errors (n)", "Warns (n)", "Notes (n)"
        assert "Errors (" not in out.stdout and "Warns (" not in out.stdout, out.stdout


def test_sequence_numbers_wrap_beyond_4_gib(tmp_path):
    """A 5 GiB upload (elided, so the file stays small) reassembles across the 2^32 wrap."""
    tr = Transcript(keep=0)
    tr.chunks.append(Chunk(1.0, C2S, 9, b"\x0f" + bytes(8)))  # DEVICE_COUNT
    for i in range(5):
        tr.add_elided(2.0 + i, C2S, 1 << 30)
    tail = bytes(range(256)) * 4
    tr.chunks.append(Chunk(8.0, C2S, len(tail), tail))
    tr.chunks.append(Chunk(8.5, S2C, 12, b"\x04" + bytes(7) + b"\x01\x00\x00\x00"))
    write_pcap(tr, tmp_path / "wrap.pcap")
    [back] = read_pcap(tmp_path / "wrap.pcap")
    assert back.total(C2S) == 9 + (5 << 30) + len(tail)
    assert back.chunks[-2].data == tail and back.chunks[0].data == tr.chunks[0].data
    assert back.chunks[-1].data == tr.chunks[-1].data
