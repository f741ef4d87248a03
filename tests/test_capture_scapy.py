"""The generated scapy layers and the session-aware dissector, against the real-server vectors."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.layers.inet import TCP
from scapy.packet import Raw
from scapy.utils import rdpcap

from harness import strategies as rst
from harness.capture import dissect
from harness.capture import scapy_layer as sl
from harness.capture.pcap import write_pcap
from harness.proto import (DIALECTS, TABLE, Cmd, get_dialect, pack_request, pack_response,
                           spec_for)
from harness.proto.messages import GraphLayout
from test_capture_helpers import (GOLDEN, GOLDEN_NAMES, pipelined_transcript, split_transcript,
                                  vector_entries, vector_frames, vector_streams)

D7 = get_dialect("7.0.0")


# ---------------------------------------------------------------- generated classes

def test_one_class_per_table_layout():
    layouts = {id(r.request) for r in TABLE} | {id(r.response) for r in TABLE if r.response}
    classes = {sl.layer_for(r.request) for r in TABLE} | \
        {sl.layer_for(r.response) for r in TABLE if r.response}
    assert len(classes) == len(layouts)
    assert len({c.__name__ for c in sl.PAYLOAD_LAYERS}) == len(sl.PAYLOAD_LAYERS)


def _request_layer(dialect: str, cmd: Cmd):
    return sl.layer_for(spec_for(get_dialect(dialect), cmd).request)


def _field_names(cls) -> list[str]:
    return [f.name for f in cls.fields_desc]


def test_dialect_variants_follow_row_when():
    # HELLO: empty request before 4.0, 24-byte caps after; 3-byte vs 28-byte response
    assert _field_names(_request_layer("3.6.1", Cmd.HELLO)) == []
    assert _field_names(_request_layer("7.0.0", Cmd.HELLO)) == ["conn_caps"]
    old_rsp = sl.layer_for(spec_for(get_dialect("3.6.1"), Cmd.HELLO).response)
    assert _field_names(old_rsp) == ["major", "minor", "patch"]
    # SET_TENSOR gains cache_flag in 7.0.0
    assert "cache_flag" not in _field_names(_request_layer("6.0.0", Cmd.SET_TENSOR))
    assert _field_names(_request_layer("7.0.0", Cmd.SET_TENSOR)) == \
        ["tensor", "cache_flag", "offset", "data"]
    # the graph uid from 8.0.0 on, in GRAPH_COMPUTE and GRAPH_RECOMPUTE
    assert "uid" not in _field_names(_request_layer("7.0.0", Cmd.GRAPH_COMPUTE))
    assert _field_names(_request_layer("8.0.0", Cmd.GRAPH_COMPUTE))[:3] == ["device", "uid", "n_nodes"]
    assert _field_names(_request_layer("9.0.0", Cmd.GRAPH_RECOMPUTE)) == ["device", "uid"]
    assert _request_layer("7.0.0", Cmd.GRAPH_COMPUTE) is not _request_layer("8.0.0", Cmd.GRAPH_COMPUTE)


def test_command_ids_per_dialect():
    f701 = sl.request_frame_class("7.0.1")
    f8 = sl.request_frame_class("8.0.0")
    assert f701(cmd=19).command is Cmd.GET_DEVICE_SUPPORTS_OP
    assert f8(cmd=19).command is Cmd.GET_TENSOR_2D
    assert [f8(cmd=i).command for i in range(18, 23)] == [
        Cmd.SET_TENSOR_2D, Cmd.GET_TENSOR_2D, Cmd.COMM_INIT, Cmd.COMM_ALLREDUCE, Cmd.COMM_FREE]
    assert sl.request_frame_class("7.0.0")(cmd=19).command is None
    # the same bytes dissect differently in the two dialects
    frame = b"\x13" + (3260).to_bytes(8, "little") + bytes(3260)
    assert isinstance(f701(frame).payload, _request_layer("7.0.1", Cmd.GET_DEVICE_SUPPORTS_OP))
    as_8 = f8(frame).payload  # GET_TENSOR_2D is 328 bytes: the excess shows up as Raw
    assert isinstance(as_8, _request_layer("8.0.0", Cmd.GET_TENSOR_2D))
    assert len(as_8[Raw].load) == 3260 - 328


def test_rpc_tensor_sub_packet_has_every_field():
    assert _field_names(sl.RPC_Tensor) == ["id", "type", "buffer", "ne", "nb", "op", "op_params",
                                           "flags", "src", "view_src", "view_offs", "data", "name",
                                           "use_count"]
    assert len(bytes(sl.RPC_Tensor())) == 296


# ---------------------------------------------------------------- golden vectors

@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_dissect_streams_matches_vectors(name):
    c2s, s2c = vector_streams(name)
    dis = dissect.dissect_streams(c2s, s2c)
    frames = vector_frames(name)
    assert dis.session.c2s_error is None and dis.session.s2c_error is None
    assert len(dis.exchanges) == len(frames)
    for ex, (req, rsp) in zip(dis.exchanges, frames):
        assert bytes(ex.request) == req
        assert pack_request(D7, sl.to_message(ex.request)) == req  # re-encoding is byte exact
        if rsp is None:
            assert ex.response is None
        else:
            assert bytes(ex.response) == rsp
            assert pack_response(D7, sl.to_message(ex.response, ex.cmd)) == rsp
    assert len(dis.packets) == sum(1 + (r is not None) for _, r in frames)


def test_dissected_fields():
    dis = dissect.dissect_streams(*vector_streams("happy_nocache"))
    by_cmd = {}
    for ex in dis.exchanges:
        by_cmd.setdefault(ex.cmd, ex)
    st_req = by_cmd[Cmd.SET_TENSOR].request
    assert st_req.cmd == 6 and st_req.len == 321
    tensor = st_req.payload.tensor
    assert tensor.getfieldval("name").rstrip(b"\0") == b"a" and tensor.ne == [4, 1, 1, 1]
    assert st_req.payload.cache_flag == 0 and st_req.payload.data == bytes.fromhex(
        "0000803f000000400000404000008040")
    graph = by_cmd[Cmd.GRAPH_COMPUTE].request.payload
    assert graph.n_nodes == 1 and graph.nodes == [0x3000] and graph.n_tensors == 3
    assert [t.id for t in graph.tensors] == [0x1000, 0x2000, 0x3000]
    assert graph.tensors[2].op == 2 and graph.tensors[2].flags == 16
    assert graph.tensors[2].src[:2] == [0x1000, 0x2000]
    hello = by_cmd[Cmd.HELLO].response.payload
    assert (hello.major, hello.minor, hello.patch) == (7, 0, 0)
    assert by_cmd[Cmd.GET_ALLOC_SIZE].request.payload.srcs[0].id == 0x1000


# ---------------------------------------------------------------- pcap and TCP segmentation

@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_dissect_golden_pcap(name):
    [dis] = dissect.dissect_packets(rdpcap(str(GOLDEN / f"{name}.pcap")))
    assert [(bytes(e.request), bytes(e.response) if e.response else None)
            for e in dis.exchanges] == vector_frames(name)


@pytest.mark.parametrize("sizes", [[1], [1, 2, 3, 4, 5, 6, 7], [7, 3, 1, 5]])
def test_frames_split_over_many_segments(tmp_path, sizes):
    from harness.capture.transcript import Transcript

    tr = split_transcript(Transcript.load(GOLDEN / "happy_nocache.rpct"), sizes)
    write_pcap(tr, tmp_path / "split.pcap")
    packets = rdpcap(str(tmp_path / "split.pcap"))
    assert max(len(p[TCP].payload) for p in packets) <= max(sizes)
    [dis] = dissect.dissect_packets(packets)
    assert [(bytes(e.request), bytes(e.response) if e.response else None)
            for e in dis.exchanges] == vector_frames("happy_nocache")


def test_several_frames_per_segment(tmp_path):
    write_pcap(pipelined_transcript("cache"), tmp_path / "pipelined.pcap")
    packets = rdpcap(str(tmp_path / "pipelined.pcap"))
    [dis] = dissect.dissect_packets(packets)
    assert [(bytes(e.request), bytes(e.response) if e.response else None)
            for e in dis.exchanges] == vector_frames("cache")


def test_stacked_frames_in_one_segment():
    c2s, _ = vector_streams("cache")
    pkt = sl.request_frame_class(D7)(c2s)
    frames = pkt.frames()
    assert len(frames) == len(vector_frames("cache"))
    assert bytes(pkt) == c2s
    # a frame cut by the segment end stays visible as Raw and still rebuilds byte for byte
    cut = sl.request_frame_class(D7)(c2s[:40])
    assert bytes(cut) == c2s[:40] and cut.haslayer(Raw)


@pytest.fixture
def bound_port():
    sl.bind_port(50052)
    yield 50052
    sl.unbind_port(50052)


def test_bind_port_dissects_request_segments(bound_port):
    packets = rdpcap(str(GOLDEN / "happy_nocache.pcap"))
    requests = [p for p in packets if p.haslayer(TCP) and p[TCP].dport == bound_port
                and len(p[TCP].payload)]
    frames = [p[TCP].payload for p in requests]
    assert all(isinstance(f, sl.RPC_Request) for f in frames)
    assert [f.command for f in frames] == [Cmd(e["cmd"]) for e in vector_entries("happy_nocache")]
    responses = [p for p in packets if p.haslayer(TCP) and p[TCP].sport == bound_port
                 and len(p[TCP].payload)]
    assert all(isinstance(p[TCP].payload, sl.RPC_Response) for p in responses)
    # binding must not change what the pcap reader reassembles
    [dis] = dissect.dissect_packets(packets)
    assert len(dis.exchanges) == 26


# ---------------------------------------------------------------- every dialect x command

def _pairs(direction: str):
    out = []
    for d in DIALECTS.values():
        for cmd in d.cmd_ids:
            spec = spec_for(d, cmd)
            if direction == "request" or spec.response is not None:
                out.append((d.name, cmd))
    return out


@pytest.mark.parametrize("pair", _pairs("request"), ids=lambda p: f"{p[0]}-{p[1].value}")
@settings(max_examples=8)
@given(data=st.data())
def test_request_packets_match_codec(pair, data):
    d, cmd = get_dialect(pair[0]), pair[1]
    msg = data.draw(rst.messages(d, cmd), label="message")
    wire = pack_request(d, msg)
    assert bytes(sl.request_packet(msg, d)) == wire
    dissected = sl.request_frame_class(d)(wire)
    assert sl.to_message(dissected) == msg
    if isinstance(spec_for(d, cmd).request, GraphLayout):
        assert dissected.payload.n_nodes == len(msg.nodes)


@pytest.mark.parametrize("pair", _pairs("response"), ids=lambda p: f"{p[0]}-{p[1].value}")
@settings(max_examples=8)
@given(data=st.data())
def test_response_packets_match_codec(pair, data):
    d, cmd = get_dialect(pair[0]), pair[1]
    msg = data.draw(rst.messages(d, cmd, "response"), label="message")
    wire = pack_response(d, msg)
    assert bytes(sl.response_packet(msg, d)) == wire
    layer = sl.layer_for(spec_for(d, cmd).response)
    assert sl.to_message(sl.response_frame_class(layer)(wire), cmd) == msg


def test_random_garbage_never_breaks_dissection(bound_port):
    """Any bytes after a whole frame header dissect (as far as they go) and rebuild exactly;
    under TCP even a cut header does (scapy falls back to Raw)."""
    from scapy.layers.inet import IP

    rng = random.Random(7)
    frame_cls = sl.request_frame_class(D7)
    for _ in range(300):
        blob = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 400)))
        if len(blob) >= 9:
            assert bytes(frame_cls(blob)) == blob
        seg = IP(bytes(IP(src="127.0.0.1", dst="127.0.0.1") / TCP(dport=bound_port) / blob))
        assert bytes(seg[TCP].payload) == blob
