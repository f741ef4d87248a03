"""Codec round trips: every dialect x command x direction, the rpc_tensor layout, and the real
proto-7.0.0 transcripts in harness/data/vectors re-encoded byte for byte."""

from __future__ import annotations

import json
import struct
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.data import shipped
from harness import strategies as rst
from harness.proto import (DIALECTS, NEED_DATA, PRIMARY, Cmd, ConnectionClosed, Data,
                           EndOfMessage, LocalProtocolError, RemoteProtocolError, Request,
                           RequestHead, RequestReader, Response, ResponseReader, RpcTensor,
                           SessionDecoder, decode_session, get_dialect, has_response,
                           pack_request, pack_request_payload, pack_response,
                           pack_response_payload, spec_for, unpack_request_payload,
                           unpack_response_payload)
from harness.proto.messages import (DeviceCountRequest, EmptyResponse, GetAlignmentRequest,
                                    GetMaxSizeRequest, GraphLayout, HelloRequest)
from harness.proto.tensor import TENSOR_FIELD_OFFSETS, TENSOR_SIZE

VECTORS = shipped("vectors")

# Per-(dialect, command) properties are many small tests; a tenth of the profile's budget
# each keeps the default run fast while "thorough" still gives every pair hundreds.
PER_PAIR = settings(max_examples=max(10, settings().max_examples // 10))

REQUEST_PAIRS = [(d, c) for d in DIALECTS for _, c in sorted(DIALECTS[d].ids.items())]
RESPONSE_PAIRS = [(d, c) for d, c in REQUEST_PAIRS if has_response(DIALECTS[d], c)]


def _pair_id(pair) -> str:
    return f"{pair[0]}-{pair[1].value}"


# ---------------------------------------------------------------- message round trips

@pytest.mark.parametrize("pair", REQUEST_PAIRS, ids=_pair_id)
@PER_PAIR
@given(data=st.data())
def test_request_roundtrip(pair, data):
    """unpack(pack(msg)) == msg for valid messages, and pack(unpack(b)) == b for any payload
    bytes the decoder accepts (arbitrary field contents)."""
    d, cmd = get_dialect(pair[0]), pair[1]
    msg = data.draw(rst.messages(d, cmd), label="message")
    frame = pack_request(d, msg)
    cmd_id, length = struct.unpack_from("<BQ", frame)
    assert cmd_id == d.id_of(cmd)
    assert length == len(frame) - 9
    assert unpack_request_payload(d, cmd, frame[9:]) == msg

    layout = spec_for(d, cmd).request
    if isinstance(layout, GraphLayout):
        payload = data.draw(_graph_payloads(layout), label="payload")
    else:
        tail = data.draw(st.binary(max_size=64), label="tail") if layout.variable else b""
        payload = data.draw(st.binary(min_size=layout.fixed_size, max_size=layout.fixed_size),
                            label="fixed") + tail
    assert pack_request_payload(d, unpack_request_payload(d, cmd, payload)) == payload


@st.composite
def _graph_payloads(draw, layout: GraphLayout) -> bytes:
    """Structurally consistent GRAPH_COMPUTE payloads with arbitrary field contents."""
    n_nodes = draw(st.integers(0, 4))
    n_tensors = draw(st.integers(0, 3))
    head = draw(st.binary(min_size=layout.head.size - 4, max_size=layout.head.size - 4))
    return b"".join((head, struct.pack("<I", n_nodes),
                     draw(st.binary(min_size=8 * n_nodes, max_size=8 * n_nodes)),
                     struct.pack("<I", n_tensors),
                     draw(st.binary(min_size=TENSOR_SIZE * n_tensors,
                                    max_size=TENSOR_SIZE * n_tensors)),
                     draw(st.binary(max_size=16))))


@pytest.mark.parametrize("pair", RESPONSE_PAIRS, ids=_pair_id)
@PER_PAIR
@given(data=st.data())
def test_response_roundtrip(pair, data):
    d, cmd = get_dialect(pair[0]), pair[1]
    msg = data.draw(rst.messages(d, cmd, "response"), label="message")
    frame = pack_response(d, msg)
    (length,) = struct.unpack_from("<Q", frame)
    assert length == len(frame) - 8
    assert unpack_response_payload(d, cmd, frame[8:]) == msg

    layout = spec_for(d, cmd).response
    if layout.cls is EmptyResponse:
        payload = b""
    elif layout.variable:
        payload = data.draw(st.binary(max_size=256), label="payload")
    else:
        payload = data.draw(st.binary(min_size=layout.fixed_size, max_size=layout.fixed_size),
                            label="payload")
    assert pack_response_payload(d, unpack_response_payload(d, cmd, payload)) == payload


def _out_of_range_variants(d, cmd):
    """(field, message) pairs: the default request with one on-wire field out of range."""
    layout = spec_for(d, cmd).request
    base = layout.cls()
    if isinstance(layout, GraphLayout):
        names = ["device", "nodes", "tensors"] + (["uid"] if layout.with_uid else [])
    else:
        names = [name for name, _ in layout.fields]
    bad_tensor = RpcTensor(type=-1)
    for name in names:
        value = getattr(base, name)
        if isinstance(value, RpcTensor):
            yield name, replace(base, **{name: bad_tensor})
        elif isinstance(value, tuple):  # srcs[10], nodes, tensors
            item = bad_tensor if name in ("srcs", "tensors") else -1
            yield name, replace(base, **{name: (item,) + value[1:]})
        elif isinstance(value, int):
            yield name, replace(base, **{name: -1})
            yield name, replace(base, **{name: 1 << 64})


@pytest.mark.parametrize("name", sorted(DIALECTS))
def test_out_of_range_values_are_local_protocol_errors(name):
    """Packing a value that does not fit its wire field is the caller's error, for every
    command alike (GRAPH_COMPUTE used to leak struct.error)."""
    d = DIALECTS[name]
    checked = 0
    for cmd in d.cmd_ids:
        for field, msg in _out_of_range_variants(d, cmd):
            with pytest.raises(LocalProtocolError):
                pack_request(d, msg)
            checked += 1
    assert checked > 0


@pytest.mark.parametrize("name", sorted(DIALECTS))
def test_empty_acknowledgement_only_where_the_dialect_has_one(name):
    """EmptyResponse packs to an empty payload for the acknowledged commands of <= 5.0.0 and
    is refused everywhere else (it used to pack as a malformed empty answer)."""
    d = DIALECTS[name]
    for cmd in d.cmd_ids:
        response = spec_for(d, cmd).response
        if response is not None and response.cls is EmptyResponse:
            assert pack_response(d, EmptyResponse(cmd)) == bytes(8)
        else:
            with pytest.raises(LocalProtocolError):
                pack_response(d, EmptyResponse(cmd))


# ---------------------------------------------------------------- sizes and layouts (spec)

# (request size, response size) from spec sections 2, 5, 12; "var" = variable, None = no
# response, "req" = depends on the request.
_SIZES_7 = {
    Cmd.HELLO: (24, 28), Cmd.DEVICE_COUNT: (0, 4), Cmd.ALLOC_BUFFER: (12, 16),
    Cmd.GET_ALIGNMENT: (4, 8), Cmd.GET_MAX_SIZE: (4, 8), Cmd.BUFFER_GET_BASE: (8, 8),
    Cmd.FREE_BUFFER: (8, None), Cmd.BUFFER_CLEAR: (9, None), Cmd.SET_TENSOR: (305, None),
    Cmd.SET_TENSOR_HASH: (312, 1), Cmd.GET_TENSOR: (312, "req"), Cmd.COPY_TENSOR: (592, 1),
    Cmd.GRAPH_COMPUTE: (12, None), Cmd.GET_DEVICE_MEMORY: (4, 16), Cmd.INIT_TENSOR: (296, None),
    Cmd.GET_ALLOC_SIZE: (3260, 8), Cmd.GRAPH_RECOMPUTE: (4, None), Cmd.MEMSET_TENSOR: (313, None),
}
_SIZES_8 = {**_SIZES_7, Cmd.GRAPH_COMPUTE: (20, None), Cmd.GRAPH_RECOMPUTE: (12, None),
            Cmd.SET_TENSOR_2D: (328, None), Cmd.GET_TENSOR_2D: (328, "req"),
            Cmd.COMM_INIT: (80, 1), Cmd.COMM_ALLREDUCE: (300, None), Cmd.COMM_FREE: (4, None)}
_SIZES_OLD = {**_SIZES_7, Cmd.SET_TENSOR: (304, None)}  # no cache_flag before 7.0.0
_ACKED = {c: (_SIZES_OLD[c][0], 0) for c in (Cmd.FREE_BUFFER, Cmd.BUFFER_CLEAR,
                                             Cmd.INIT_TENSOR, Cmd.MEMSET_TENSOR)}
# Spot checks by name: what spec sections 2, 5 and 12 give for the rows of today.
KNOWN_SIZES = {
    "3.6.1": {**_SIZES_OLD, **_ACKED, Cmd.HELLO: (0, 3)},
    "4.0.2": {**_SIZES_OLD, **_ACKED},
    "5.0.0": {**_SIZES_OLD, **_ACKED},
    "6.0.0": _SIZES_OLD,
    "7.0.0": _SIZES_7,
    "7.0.1": {**_SIZES_7, Cmd.GET_DEVICE_SUPPORTS_OP: (3260, 1)},
    "7.0.0+flags": _SIZES_7,
    "8.0.0": _SIZES_8,
    "9.0.0": _SIZES_8,
}
for _name in ("3.6.1", "4.0.2"):  # MEMSET_TENSOR arrived in 5.0.0
    KNOWN_SIZES[_name] = {c: v for c, v in KNOWN_SIZES[_name].items()
                          if c is not Cmd.MEMSET_TENSOR}


def expected_sizes(d) -> dict:
    """The sizes a row's switches imply (spec 2, 5, 12), for any row, today's or a new one."""
    sizes = dict(_SIZES_8 if d.graph_uid else _SIZES_7)
    sizes[Cmd.GET_DEVICE_SUPPORTS_OP] = (3260, 1)
    if not d.cache_flag:
        sizes[Cmd.SET_TENSOR] = (304, None)
    for cmd in d.acked:
        sizes[cmd] = (sizes[cmd][0], 0)
    if not d.hello_caps:
        sizes[Cmd.HELLO] = (0, 3)
    return {c: v for c, v in sizes.items() if d.has(c)}


def test_the_derived_sizes_are_the_specs_for_todays_rows():
    for name, sizes in KNOWN_SIZES.items():
        assert expected_sizes(DIALECTS[name]) == sizes, name
        assert set(DIALECTS[name].cmd_ids) == set(sizes), name


@pytest.mark.parametrize("name", sorted(DIALECTS))
def test_message_sizes_match_spec(name):
    d = DIALECTS[name]
    for cmd, (req_size, rsp_size) in expected_sizes(d).items():
        spec = spec_for(d, cmd)
        assert spec.request.fixed_size == req_size, cmd
        if rsp_size is None:
            assert spec.response is None, cmd
        elif rsp_size == "req":
            assert spec.response.variable and spec.response_size is not None, cmd
        else:
            assert spec.response.fixed_size == rsp_size, cmd


# Command ids of spec section 4.
_IDS_7 = {Cmd.ALLOC_BUFFER: 0, Cmd.GET_ALIGNMENT: 1, Cmd.GET_MAX_SIZE: 2, Cmd.BUFFER_GET_BASE: 3,
          Cmd.FREE_BUFFER: 4, Cmd.BUFFER_CLEAR: 5, Cmd.SET_TENSOR: 6, Cmd.SET_TENSOR_HASH: 7,
          Cmd.GET_TENSOR: 8, Cmd.COPY_TENSOR: 9, Cmd.GRAPH_COMPUTE: 10,
          Cmd.GET_DEVICE_MEMORY: 11, Cmd.INIT_TENSOR: 12, Cmd.GET_ALLOC_SIZE: 13, Cmd.HELLO: 14,
          Cmd.DEVICE_COUNT: 15, Cmd.GRAPH_RECOMPUTE: 16, Cmd.MEMSET_TENSOR: 17}
_IDS_8 = {**_IDS_7, Cmd.SET_TENSOR_2D: 18, Cmd.GET_TENSOR_2D: 19, Cmd.COMM_INIT: 20,
          Cmd.COMM_ALLREDUCE: 21, Cmd.COMM_FREE: 22}


@pytest.mark.parametrize("name,ids", [("7.0.0", _IDS_7), ("7.0.0+flags", _IDS_7),
                                      ("7.0.1", {**_IDS_7, Cmd.GET_DEVICE_SUPPORTS_OP: 19}),
                                      ("8.0.0", _IDS_8), ("9.0.0", _IDS_8)])
def test_command_ids_match_spec(name, ids):
    assert dict(DIALECTS[name].cmd_ids) == ids


def test_payload_field_offsets_match_spec():
    d7, d8 = DIALECTS["7.0.0"], DIALECTS["8.0.0"]
    assert spec_for(d7, Cmd.SET_TENSOR).request.offsets == {"tensor": 0, "cache_flag": 296,
                                                            "offset": 297}
    assert spec_for(d7, Cmd.GET_TENSOR).request.offsets == {"tensor": 0, "offset": 296, "size": 304}
    assert spec_for(d7, Cmd.MEMSET_TENSOR).request.offsets == {"tensor": 0, "offset": 296,
                                                               "size": 304, "value": 312}
    assert spec_for(d7, Cmd.GET_ALLOC_SIZE).request.offsets == {"device": 0, "tensor": 4,
                                                                "srcs": 300}
    assert spec_for(d7, Cmd.GRAPH_COMPUTE).request.offsets == {"device": 0, "n_nodes": 4,
                                                               "nodes": 8}
    assert spec_for(d8, Cmd.GRAPH_COMPUTE).request.offsets == {"device": 0, "uid": 4,
                                                               "n_nodes": 12, "nodes": 16}
    assert spec_for(d8, Cmd.SET_TENSOR_2D).request.offsets == {
        "tensor": 0, "offset": 296, "size": 304, "n_copies": 312, "stride": 320}


# ---------------------------------------------------------------- rpc_tensor layout

# (offset, size) of every field, spec 3.1.
SPEC_TENSOR_FIELDS = {
    "id": (0, 8), "type": (8, 4), "buffer": (12, 8), "ne": (20, 16), "nb": (36, 16),
    "op": (52, 4), "op_params": (56, 64), "flags": (120, 4), "src": (124, 80),
    "view_src": (204, 8), "view_offs": (212, 8), "data": (220, 8), "name": (228, 64),
    "use_count": (292, 4),
}


def test_tensor_field_offsets_match_spec():
    assert TENSOR_SIZE == 296
    assert TENSOR_FIELD_OFFSETS == {k: off for k, (off, _) in SPEC_TENSOR_FIELDS.items()}
    # The fields tile the record: no gaps, no overlap, 296 bytes in all.
    spans = sorted(SPEC_TENSOR_FIELDS.values())
    assert all(a + n == b for (a, n), (b, _) in zip(spans, spans[1:]))
    assert spans[-1][0] + spans[-1][1] == TENSOR_SIZE


def test_packed_tensor_has_fields_at_spec_offsets():
    # Distinct values per field, so a field written at the wrong place cannot go unnoticed.
    t = RpcTensor(id=0x1111111111111111, type=0x22222222, buffer=0x3333333333333333,
                  ne=(0x41, 0x42, 0x43, 0x44), nb=(0x51, 0x52, 0x53, 0x54), op=0x66666666,
                  op_params=tuple(range(0x70, 0x80)), flags=0x08080808,
                  src=tuple(0x9000 + i for i in range(10)), view_src=0xAAAAAAAAAAAAAAAA,
                  view_offs=0xBBBBBBBBBBBBBBBB, data=0xCCCCCCCCCCCCCCCC,
                  name=b"tensor-name".ljust(64, b"\0"), use_count=0x0D0D0D0D)
    raw = t.pack()
    assert len(raw) == 296

    def at(field: str, fmt: str):
        off, size = SPEC_TENSOR_FIELDS[field]
        assert struct.calcsize("<" + fmt) == size
        values = struct.unpack_from("<" + fmt, raw, off)
        return values[0] if len(values) == 1 else values

    assert at("id", "Q") == t.id
    assert at("type", "I") == t.type
    assert at("buffer", "Q") == t.buffer
    assert at("ne", "4I") == t.ne
    assert at("nb", "4I") == t.nb
    assert at("op", "I") == t.op
    assert at("op_params", "16i") == t.op_params
    assert at("flags", "i") == t.flags
    assert at("src", "10Q") == t.src
    assert at("view_src", "Q") == t.view_src
    assert at("view_offs", "Q") == t.view_offs
    assert at("data", "Q") == t.data
    assert at("name", "64s") == t.name
    assert at("use_count", "i") == t.use_count
    assert RpcTensor.unpack_from(raw) == t


def test_null_tensor_is_296_zero_bytes():
    assert RpcTensor.null().pack() == bytes(296)


@given(rst.rpc_tensors(types="any", strides="any", any_pointers=True,
                       names=rst.tensor_names(raw=True)))
def test_tensor_roundtrip(t):
    assert RpcTensor.unpack_from(t.pack()) == t


# ---------------------------------------------------------------- real transcripts

def _load(name: str):
    return json.loads((VECTORS / name).read_text())


def _streams(entries) -> tuple[bytes, bytes]:
    c2s = b"".join(bytes.fromhex(e["req"]) for e in entries)
    s2c = b"".join(bytes.fromhex(e["rsp"]) for e in entries if e.get("rsp"))
    return c2s, s2c


def _assert_reencodes(session, entries) -> None:
    d = session.dialect
    assert session.c2s_error is None and session.s2c_error is None
    assert [e.cmd.value for e in session.exchanges] == [e["cmd"] for e in entries]
    for ex, entry in zip(session.exchanges, entries):
        assert pack_request(d, ex.request).hex() == entry["req"], entry["cmd"]
        if entry.get("rsp"):
            assert pack_response(d, ex.response).hex() == entry["rsp"], entry["cmd"]
        else:
            assert ex.response is None


@pytest.mark.parametrize("name", ["happy_nocache.json", "cache.json"])
@pytest.mark.parametrize("dialect", [None, "7.0.0", "7.0.0+flags"])
def test_transcript_decodes_and_reencodes(name, dialect):
    """The two real sessions re-encode byte for byte, whether the dialect is detected from
    the HELLO response or pinned (7.0.0+flags shares every 7.0.0 layout)."""
    entries = _load(name)
    c2s, s2c = _streams(entries)
    session = decode_session(c2s, s2c, dialect)
    assert session.dialect.name == (dialect or "7.0.0")
    assert session.server_hello.version == (7, 0, 0)
    _assert_reencodes(session, entries)
    assert session.c2s_bytes == len(c2s) and session.s2c_bytes == len(s2c)


@pytest.mark.parametrize("pinned", [None, "7.0.0"])
@pytest.mark.parametrize("name", ["happy_nocache.json", "cache.json"])
@settings(max_examples=max(5, settings().max_examples // 20))
@given(data=st.data())
def test_transcript_offsets_survive_any_chunking(name, pinned, data):
    """Fed in arbitrary chunks in causal order (as a capture proxy sees them), the decoder
    finds the same exchanges, and every offset points at the frame's first byte."""
    entries = _load(name)
    c2s, s2c = _streams(entries)
    req_ends, rsp_ends, r, q = [], [], 0, 0
    for e in entries:
        r += len(e["req"]) // 2
        q += len(e.get("rsp") or "") // 2
        req_ends.append(r)
        rsp_ends.append(q)

    def pieces(stream: bytes, must_cut, label: str) -> list[bytes]:
        cuts = data.draw(st.lists(st.integers(1, len(stream) - 1), max_size=60), label=label)
        points = sorted({0, len(stream), *cuts, *must_cut})
        return [stream[a:b] for a, b in zip(points, points[1:])]

    c_pieces = pieces(c2s, [], "c2s cuts")
    # Cutting s2c at every response end keeps the feed causal: no response byte is fed
    # before the request it answers.
    s_pieces = pieces(s2c, rsp_ends, "s2c cuts")
    dec = SessionDecoder(pinned)
    c_fed = s_fed = 0
    for req_end, rsp_end in zip(req_ends, rsp_ends):
        while c_fed < req_end:
            piece = c_pieces.pop(0)
            dec.feed_c2s(piece)
            c_fed += len(piece)
        while s_fed < rsp_end:
            piece = s_pieces.pop(0)
            dec.feed_s2c(piece)
            s_fed += len(piece)
    chunked = dec.close()
    _assert_reencodes(chunked, entries)
    req_off = rsp_off = 0
    for ex, entry in zip(chunked.exchanges, entries):
        assert (ex.req_offset, ex.req_size) == (req_off, len(entry["req"]) // 2), entry["cmd"]
        if entry.get("rsp"):
            assert (ex.rsp_offset, ex.rsp_size) == (rsp_off, len(entry["rsp"]) // 2), entry["cmd"]
        req_off += len(entry["req"]) // 2
        rsp_off += len(entry.get("rsp") or "") // 2


def test_happy_transcript_covers_every_70_command():
    cmds = {e["cmd"] for e in _load("happy_nocache.json")}
    assert cmds == {c.value for c in DIALECTS["7.0.0"].cmd_ids}


def test_cache_transcript_flags_reencode():
    """cache_flag 0, 1 and 2 all survive decoding (any non-zero value means "save")."""
    entries = _load("cache.json")
    session = decode_session(*_streams(entries))
    flags = [ex.request.cache_flag for ex in session.exchanges if ex.cmd is Cmd.SET_TENSOR]
    assert sorted(flags) == [0, 1, 2]


def _error_cases():
    return [pytest.param(case, id=f"{i:02d}-{case['case'][:40]}")
            for i, case in enumerate(_load("errors.json"))]


def _decode_one_frame(d, raw: bytes):
    """Decode ``raw`` as one request on a fresh stream followed by EOF.

    Returns the message, or raises RemoteProtocolError; any other exception fails the test.
    """
    reader = RequestReader(d, hello_first=False, max_payload=1 << 62, max_stream=1 << 62)
    reader.feed(raw)
    reader.feed(b"")
    msg, data = None, []
    while True:
        ev = reader.next_event()
        if isinstance(ev, ConnectionClosed):
            return msg
        if isinstance(ev, Request):
            assert msg is None, "one raw frame decoded into several requests"
            msg = ev.message
        elif isinstance(ev, RequestHead):
            msg = ev.message
        elif isinstance(ev, Data):
            data.append(ev.data)
        elif isinstance(ev, EndOfMessage):
            msg = type(msg)(**{**{f: getattr(msg, f) for f in msg.__dataclass_fields__},
                               "data": b"".join(data)})
        else:  # pragma: no cover - NEED_DATA cannot happen after EOF
            pytest.fail(f"unexpected event {ev!r}")


@pytest.mark.parametrize("case", _error_cases())
def test_error_case_raw_frames_reencode_or_are_rejected(case):
    d = DIALECTS["7.0.0"]
    for entry in case["log"]:
        raw = bytes.fromhex(entry.get("raw") or entry["req"])
        try:
            msg = _decode_one_frame(d, raw)
        except RemoteProtocolError:
            assert "raw" in entry, f"recorded request {entry['cmd']} does not decode"
            continue
        assert msg is not None
        assert pack_request(d, msg) == raw
        if entry.get("rsp"):
            rsp = bytes.fromhex(entry["rsp"])
            reader = ResponseReader(d)
            reader.expect(msg)
            reader.feed(rsp)
            ev = reader.next_event()
            assert isinstance(ev, Response)
            assert pack_response(d, ev.message) == rsp


@pytest.mark.parametrize("case", _error_cases())
def test_error_case_sessions_decode(case):
    """Decoding the whole case never raises; every exchange it decodes re-encodes exactly, and
    it stops (with a recorded error) only at a raw frame."""
    c2s = b"".join(bytes.fromhex(e.get("raw") or e["req"]) for e in case["log"])
    s2c = b"".join(bytes.fromhex(e["rsp"]) for e in case["log"] if e.get("rsp"))
    session = decode_session(c2s, s2c, "7.0.0")
    d = session.dialect
    frames = [bytes.fromhex(e.get("raw") or e["req"]) for e in case["log"]]
    assert len(session.exchanges) <= len(frames)
    for ex, frame in zip(session.exchanges, frames):
        assert ex.req_size == len(frame)
        assert pack_request(d, ex.request) == frame
    if session.c2s_error is not None:
        raw_offsets, off = [], 0
        for e, frame in zip(case["log"], frames):
            if "raw" in e:
                raw_offsets.append((off, off + len(frame)))
            off += len(frame)
        assert any(a <= session.c2s_error_offset <= b for a, b in raw_offsets), session.c2s_error


# Cases whose bytes break the framing rules of spec 1.5 / 2.2 / 4 / 6.2 step 1 themselves; a
# reader in server mode (HELLO first) must refuse them. Everything else in errors.json is
# well framed and fails (if at all) on server state.
FRAMING_ERROR_CASES = {
    "first cmd DEVICE_COUNT (no HELLO)": "cmd",
    "HELLO with size 0 (pre-v4 style)": "len",
    "HELLO with size 28": "len",
    "HELLO twice": "cmd",
    "cmd 18 (RPC_CMD_NONE)": "cmd",
    "cmd 19": "cmd",
    "cmd 255": "cmd",
    "GET_ALIGNMENT size 8 (expects 4)": "len",
    "DEVICE_COUNT size 4 (expects 0)": "len",
    "SET_TENSOR size prefix 2^62": "len",
    "GRAPH_COMPUTE n_nodes=5 but no node data": "n_nodes",
}


@pytest.mark.parametrize("case", _error_cases())
def test_error_case_server_reader_verdict(case):
    reader = RequestReader(DIALECTS["7.0.0"])  # server defaults: HELLO first, bounded lengths
    for entry in case["log"]:
        reader.feed(bytes.fromhex(entry.get("raw") or entry["req"]))
    expected = FRAMING_ERROR_CASES.get(case["case"])
    try:
        while reader.next_event() is not NEED_DATA:
            pass
    except RemoteProtocolError as e:
        assert expected is not None, f"unexpected rejection: {e}"
        assert e.field == expected
    else:
        assert expected is None, "framing error not detected"


def test_errors_json_has_the_documented_cut_frames():
    """The last eight cases store raw frames cut to at most 200 bytes (vectors README); a frame
    stored at exactly 200 bytes announces a longer payload and is rejected as truncated."""
    cases = _load("errors.json")
    raws = [bytes.fromhex(e["raw"]) for c in cases[-8:] for e in c["log"] if "raw" in e]
    assert raws and all(len(r) <= 200 for r in raws)
    cut = [r for r in raws if len(r) == 200]
    assert len(cut) == 6
    for raw in cut:
        (length,) = struct.unpack_from("<Q", raw, 1)
        assert length > len(raw) - 9
        with pytest.raises(RemoteProtocolError):
            _decode_one_frame(DIALECTS["7.0.0"], raw)


# state.json keeps only server answers (spec TV-1, TV-2, TV-10): decode each against the
# request that produced it.
def _state_requests():
    return {
        "second_conn_after_first_closed": [HelloRequest()],
        "hello_nonzero_caps_rsp": [HelloRequest(conn_caps=bytes(range(1, 25)))],
        "pipelined_3_requests": [GetAlignmentRequest(), GetMaxSizeRequest(), DeviceCountRequest()],
        "byte_by_byte_request": [GetAlignmentRequest()],
    }


def test_state_responses_decode_and_reencode():
    d = DIALECTS["7.0.0"]
    state = _load("state.json")
    checked = 0
    for key, requests in _state_requests().items():
        value = state[key]
        frames = [value[1]] if key == "second_conn_after_first_closed" else (
            value if isinstance(value, list) else [value])
        reader = ResponseReader(d)
        for req in requests:
            reader.expect(req)
        stream = bytes.fromhex("".join(frames))
        for i in range(len(stream)):  # byte at a time, as TV-10 delivered them
            reader.feed(stream[i:i + 1])
        got = []
        while True:
            ev = reader.next_event()
            if not isinstance(ev, Response):
                break
            got.append(ev.message)
        assert [pack_response(d, m).hex() for m in got] == frames, key
        checked += 1
    # The DEVICE_COUNT answer after a non-zero-caps HELLO is stored as its bare payload.
    payload = bytes.fromhex(state["after_nonzero_caps_devcount"])
    msg = unpack_response_payload(d, Cmd.DEVICE_COUNT, payload)
    assert msg.device_count == 1 and pack_response_payload(d, msg) == payload
    assert checked == 4


@pytest.mark.parametrize("name", PRIMARY)
def test_hello_frames_are_stable(name):
    """TV-1: the plain HELLO request is the same 33 bytes in every primary dialect."""
    assert pack_request(get_dialect(name), HelloRequest()).hex() == (
        "0e18000000000000000000000000000000000000000000000000000000000000" "00")


def test_big_graphs_decode_once_and_the_memo_stays_bounded(monkeypatch):
    """Decoded graphs are memoised by payload (the fuzzer re-decodes corpus steps): a second
    decode gives the same message without decoding, a refusal is raised again with its field,
    and the memo drops its oldest graphs past its byte bound."""
    from harness.proto import codec
    from harness.proto.messages import GraphComputeRequest
    from harness.proto.tensor import RpcTensor
    d = get_dialect("8.0.0")
    monkeypatch.setattr(codec, "_graph_memo", type(codec._graph_memo)())
    monkeypatch.setattr(codec, "_graph_memo_size", 0)
    tensors = tuple(RpcTensor.make(id=i + 1, ne=(4,)) for i in range(40))
    msg = GraphComputeRequest(0, 7, (1,), tensors)
    payload = codec.pack_request_payload(d, msg)
    assert len(payload) >= codec.GRAPH_MEMO_MIN
    calls = []
    real = codec._unpack_graph
    monkeypatch.setattr(codec, "_unpack_graph", lambda *a: calls.append(1) or real(*a))
    first = codec.unpack_request_payload(d, Cmd.GRAPH_COMPUTE, bytearray(payload))
    second = codec.unpack_request_payload(d, Cmd.GRAPH_COMPUTE, memoryview(payload))
    assert first == second == msg and len(calls) == 1
    short = payload[:-1]  # n_tensors promises one byte more than there is
    for _ in range(2):
        with pytest.raises(RemoteProtocolError) as e:
            codec.unpack_request_payload(d, Cmd.GRAPH_COMPUTE, short)
        assert e.value.field == "n_tensors" and "40 tensors" in e.value.reason
    assert len(calls) == 2
    monkeypatch.setattr(codec, "GRAPH_MEMO_BYTES", 2 * len(payload))
    for uid in range(8, 12):  # four more graphs: only the newest fit
        codec.unpack_request_payload(d, Cmd.GRAPH_COMPUTE, codec.pack_request_payload(
            d, GraphComputeRequest(0, uid, (1,), tensors)))
    assert codec._graph_memo_size <= 2 * len(payload) and len(codec._graph_memo) == 2


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(list(PRIMARY)), st.data())
def test_the_small_payload_memo_decodes_as_the_codec_does(dialect_name, data):
    """Small request payloads are decoded once per distinct bytes (codec._unpack_plain_memo):
    the memo's answer is the plain decoder's, for every payload; a refusal is raised every
    time, never remembered as a message."""
    from harness.proto import codec
    d = get_dialect(dialect_name)
    cmd = data.draw(st.sampled_from([c for c in d.cmd_ids if c is not Cmd.GRAPH_COMPUTE
                                     and c is not Cmd.GRAPH_RECOMPUTE]))
    layout = codec.spec_for(d, cmd).request
    fixed = layout.fixed_size
    payload = data.draw(st.one_of(st.binary(min_size=fixed, max_size=fixed + 40),
                                  st.binary(max_size=codec.PLAIN_MEMO_MAX)))
    for _ in range(2):
        try:
            plain = codec._unpack_plain(layout, cmd, payload)
        except RemoteProtocolError:
            with pytest.raises(RemoteProtocolError):
                codec.unpack_request_payload(d, cmd, memoryview(payload))
            continue
        assert codec.unpack_request_payload(d, cmd, memoryview(payload)) == plain
