"""Frame reader properties, after h11's reader tests and its AFL invariant.

* Chunking independence: whole input, one byte at a time and random chunkings give the same
  events (consecutive Data events merged: their boundaries may legitimately differ).
* Trailing bytes that do not complete a frame stay in ``reader.trailing``.
* Lengths over the reader's bounds are refused as soon as the header is in, before anything
  is allocated for the payload.
* Arbitrary bytes produce events or RemoteProtocolError, never another exception.
* A valid frame cut anywhere and followed by EOF is a RemoteProtocolError, except at a frame
  boundary (ConnectionClosed).
"""

from __future__ import annotations

import struct
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness import strategies as rst
from harness.proto import (DIALECTS, NEED_DATA, PRIMARY, Cmd, ConnectionClosed, Data,
                           EndOfMessage, RemoteProtocolError, Request, RequestHead,
                           RequestReader, Response, ResponseHead, ResponseReader, RpcTensor,
                           SessionDecoder, get_dialect, pack_request, pack_response, spec_for)
from harness.proto.messages import HelloRequest, SetTensorRequest

# The byte-at-a-time and every-cut properties do O(bytes) work per example; a third of the
# profile's budget keeps them quick by default.
HEAVY = settings(max_examples=max(20, settings().max_examples // 3))

STREAMED_RESPONSES = (Cmd.GET_TENSOR, Cmd.GET_TENSOR_2D)


# ---------------------------------------------------------------- helpers

def drain(reader, events: list, limit: int = 1_000_000) -> object:
    """Pull events until the reader needs data or reports the end; returns the last one."""
    for _ in range(limit):
        ev = reader.next_event()
        if ev is NEED_DATA or isinstance(ev, ConnectionClosed):
            events.append(ev)
            return ev
        events.append(ev)
    raise AssertionError("reader made no progress")  # pragma: no cover


def run(reader, chunks, *, eof: bool = True) -> list:
    """Feed ``chunks`` (then EOF), collecting every event; NEED_DATA is kept only at the end."""
    events: list = []
    for chunk in chunks:
        reader.feed(chunk)
        drain(reader, events)
        if events and events[-1] is NEED_DATA:
            events.pop()
    if eof:
        reader.feed(b"")
        drain(reader, events)
    else:
        events.append(NEED_DATA)
    return normalise(events)


def normalise(events: list) -> list:
    """Merge consecutive Data events: how a payload is split into Data is not part of the
    contract, only the bytes are."""
    out: list = []
    for ev in events:
        if isinstance(ev, Data) and out and isinstance(out[-1], Data):
            out[-1] = Data(out[-1].data + ev.data)
        else:
            out.append(ev)
    return out


def split(data: bytes, cuts) -> list[bytes]:
    points = [0, *sorted(set(c for c in cuts if 0 < c < len(data))), len(data)]
    return [data[a:b] for a, b in zip(points, points[1:])]


def one_byte_chunks(data: bytes) -> list[bytes]:
    return [data[i:i + 1] for i in range(len(data))]


@st.composite
def chunkings(draw, data: bytes) -> list[bytes]:
    """A random split of ``data`` into chunks (possibly a single one)."""
    if not data:
        return []
    cuts = draw(st.lists(st.integers(1, max(1, len(data) - 1)), max_size=12))
    return split(data, cuts)


@st.composite
def request_streams(draw, dialect):
    """A HELLO-first sequence of valid requests of ``dialect`` and its bytes."""
    d = get_dialect(dialect)
    requests = [req for req, _ in draw(rst.sessions(d, max_exchanges=5))]
    return requests, b"".join(pack_request(d, m) for m in requests)


@st.composite
def response_streams(draw, dialect):
    """Exchanges that have a response, whether each response is streamed, and the bytes."""
    d = get_dialect(dialect)
    pairs = [(q, r) for q, r in draw(rst.sessions(d, max_exchanges=6)) if r is not None]
    stream = [draw(st.booleans()) if q.cmd in STREAMED_RESPONSES else False for q, _ in pairs]
    return pairs, stream, b"".join(pack_response(d, r) for _, r in pairs)


def response_reader(d, pairs, stream, **kwargs) -> ResponseReader:
    reader = ResponseReader(d, **kwargs)
    for (q, _), s in zip(pairs, stream):
        assert reader.expect(q, stream=s)
    return reader


def messages_of(events: list) -> list:
    """Reassemble decoded messages from Request / RequestHead + Data + EndOfMessage."""
    out, head, data = [], None, []
    for ev in events:
        if isinstance(ev, (Request, Response)):
            out.append(ev.message)
        elif isinstance(ev, (RequestHead, ResponseHead)):
            head, data = ev, []
        elif isinstance(ev, Data):
            data.append(ev.data)
        elif isinstance(ev, EndOfMessage):
            msg = head.message if isinstance(head, RequestHead) else head.request
            out.append((msg, b"".join(data)))
    return out


# ---------------------------------------------------------------- chunking independence

@pytest.mark.parametrize("dialect", PRIMARY)
@HEAVY
@given(data=st.data(), data_chunk=st.sampled_from((1 << 20, 7)))
def test_request_reader_chunking_independent(dialect, data, data_chunk):
    d = get_dialect(dialect)
    requests, stream = data.draw(request_streams(d), label="stream")

    def reader():
        return RequestReader(d, data_chunk=data_chunk)

    whole = run(reader(), [stream])
    assert run(reader(), one_byte_chunks(stream)) == whole
    assert run(reader(), data.draw(chunkings(stream), label="chunks")) == whole
    assert isinstance(whole[-1], ConnectionClosed)
    # ... and the events are the requests that were packed.
    decoded = messages_of(whole)
    assert len(decoded) == len(requests)
    for got, want in zip(decoded, requests):
        if isinstance(got, tuple):
            assert got[0] == type(want)(**{**_fields(want), "data": b""}) and got[1] == want.data
        else:
            assert got == want


def _fields(msg) -> dict:
    return {f: getattr(msg, f) for f in msg.__dataclass_fields__}


@pytest.mark.parametrize("dialect", PRIMARY)
@HEAVY
@given(data=st.data(), data_chunk=st.sampled_from((1 << 20, 5)))
def test_response_reader_chunking_independent(dialect, data, data_chunk):
    d = get_dialect(dialect)
    pairs, stream_flags, stream = data.draw(response_streams(d), label="stream")

    def reader():
        return response_reader(d, pairs, stream_flags, data_chunk=data_chunk)

    whole = run(reader(), [stream])
    assert run(reader(), one_byte_chunks(stream)) == whole
    assert run(reader(), data.draw(chunkings(stream), label="chunks")) == whole
    decoded = messages_of(whole)
    assert len(decoded) == len(pairs)
    for got, (_, rsp) in zip(decoded, pairs):
        assert got == rsp if not isinstance(got, tuple) else got[1] == rsp.data


# ---------------------------------------------------------------- trailing bytes

@pytest.mark.parametrize("dialect", PRIMARY)
@settings(max_examples=max(10, settings().max_examples // 4))
@given(data=st.data())
def test_request_reader_keeps_partial_header_as_trailing(dialect, data):
    d = get_dialect(dialect)
    _, stream = data.draw(request_streams(d), label="stream")
    cmd_id = data.draw(st.sampled_from(sorted(i for i in d.ids if i != 14)), label="cmd")
    partial = bytes([cmd_id]) + data.draw(st.binary(max_size=7), label="len bytes")

    expected = run(RequestReader(d), [stream], eof=False)
    reader = RequestReader(d)
    got = run(reader, data.draw(chunkings(stream + partial), label="chunks"), eof=False)
    assert got == expected and got[-1] is NEED_DATA
    assert reader.trailing == partial
    # Completing the header with EOF instead is a truncated frame.
    reader.feed(b"")
    with pytest.raises(RemoteProtocolError):
        drain(reader, [])


@pytest.mark.parametrize("dialect", PRIMARY)
@settings(max_examples=max(10, settings().max_examples // 4))
@given(data=st.data())
def test_response_reader_keeps_partial_frame_as_trailing(dialect, data):
    d = get_dialect(dialect)
    pairs, flags, stream = data.draw(response_streams(d), label="stream")
    extra_req, extra_rsp = data.draw(rst.exchanges(d, data.draw(st.sampled_from(
        [c for c in d.cmd_ids if spec_for(d, c).response is not None]), label="cmd")),
        label="pending exchange")
    frame = pack_response(d, extra_rsp)
    partial = frame[:data.draw(st.integers(1, len(frame) - 1), label="cut")]

    expected = run(response_reader(d, pairs, flags), [stream], eof=False)
    reader = response_reader(d, pairs, flags)
    reader.expect(extra_req)  # not streamed: the frame is consumed only once complete
    got = run(reader, data.draw(chunkings(stream + partial), label="chunks"), eof=False)
    assert got == expected and got[-1] is NEED_DATA
    assert reader.trailing == partial
    reader.feed(frame[len(partial):])
    assert reader.next_event() == Response(extra_rsp, len(frame))


def test_response_reader_rejects_bytes_nobody_asked_for():
    reader = ResponseReader(get_dialect("7.0.0"))
    reader.feed(b"\x00")
    with pytest.raises(RemoteProtocolError):
        reader.next_event()


@pytest.mark.parametrize("dialect", PRIMARY)
@settings(max_examples=max(10, settings().max_examples // 4))
@given(data=st.data())
def test_zero_copy_payload_matches_the_frame(dialect, data):
    """take_payload_into + payload_received (receive straight into the caller's memory)
    deliver exactly the SET_TENSOR data, whatever part of it was already buffered."""
    d = get_dialect(dialect)
    cmd = data.draw(st.sampled_from([c for c in (Cmd.SET_TENSOR, Cmd.SET_TENSOR_2D) if d.has(c)]),
                    label="cmd")
    msg = data.draw(rst.messages(d, cmd), label="message")
    frame = pack_request(d, msg)
    header_len = 9 + spec_for(d, cmd).request.fixed_size
    buffered = data.draw(st.integers(header_len, len(frame)), label="buffered")
    reader = RequestReader(d, hello_first=False)
    reader.feed(frame[:buffered])
    head = reader.next_event()
    assert head == RequestHead(_with_empty_data(msg), len(msg.data))
    dest = bytearray(head.data_length)
    view = memoryview(dest)
    taken = reader.take_payload_into(view)
    assert taken == buffered - header_len
    rest = frame[buffered:]
    view[taken:] = rest  # what the transport's recv_into would have written
    reader.payload_received(len(rest))
    assert reader.next_event() == EndOfMessage()
    assert reader.next_event() is NEED_DATA
    assert bytes(dest) == msg.data and reader.bytes_consumed == len(frame)


def _with_empty_data(msg):
    return type(msg)(**{**_fields(msg), "data": b""})


# ---------------------------------------------------------------- bounds

def _past_hello(d, **kwargs) -> RequestReader:
    reader = RequestReader(d, **kwargs)
    reader.feed(pack_request(d, HelloRequest()))
    assert isinstance(reader.next_event(), Request)
    return reader


@pytest.mark.parametrize("length", [1 << 62, (1 << 64) - 1, (1 << 40) + 1])
def test_huge_set_tensor_length_refused_before_allocating(length):
    """SET_TENSOR len 2^62 (TV-11) is refused once the 9 header bytes are in; the reader
    allocates nothing for the payload."""
    reader = _past_hello(get_dialect("7.0.0"))
    header = struct.pack("<BQ", 6, length)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        reader.feed(header[:8])
        assert reader.next_event() is NEED_DATA
        reader.feed(header[8:])
        with pytest.raises(RemoteProtocolError) as info:
            reader.next_event()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.field == "len" and info.value.command == "SET_TENSOR"
    assert peak < 64 * 1024


def test_streamed_length_within_bound_allocates_nothing():
    """A 1 TiB SET_TENSOR is within the default stream bound: the reader streams it and never
    holds more than what was fed."""
    d = get_dialect("7.0.0")
    reader = _past_hello(d)
    header_only = SetTensorRequest(tensor=RpcTensor.make(id=0x1000, ne=(4,), buffer=0x5000,
                                                         data=0x6000))
    body = pack_request(d, header_only)[9:]
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        reader.feed(struct.pack("<BQ", 6, 1 << 40) + body + b"x" * 1000)
        head = reader.next_event()
        chunk = reader.next_event()
        assert reader.next_event() is NEED_DATA
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(head, RequestHead) and head.data_length == (1 << 40) - 305
    assert chunk == Data(b"x" * 1000)
    assert reader.payload_remaining == (1 << 40) - 305 - 1000
    assert peak < 64 * 1024


@pytest.mark.parametrize("dialect", PRIMARY)
@given(data=st.data())
def test_lengths_over_the_bounds_are_refused_at_the_header(dialect, data):
    d = get_dialect(dialect)
    max_payload = data.draw(st.integers(20, 1 << 20), label="max_payload")
    max_stream = data.draw(st.integers(400, 1 << 30), label="max_stream")
    reader = _past_hello(d, max_payload=max_payload, max_stream=max_stream)
    cmd = data.draw(st.sampled_from([c for c in d.cmd_ids if c is not Cmd.HELLO]), label="cmd")
    layout = spec_for(d, cmd).request
    if layout.variable:
        bound = max_stream if cmd in (Cmd.SET_TENSOR, Cmd.SET_TENSOR_2D) else max_payload
        length = data.draw(st.integers(bound + 1, (1 << 64) - 1), label="len")
    else:  # fixed-size commands: anything but the exact size (spec 1.5)
        length = data.draw(st.integers(0, (1 << 64) - 1).filter(lambda n: n != layout.fixed_size),
                           label="len")
    header = struct.pack("<BQ", d.id_of(cmd), length)
    reader.feed(header[:-1])
    assert reader.next_event() is NEED_DATA
    reader.feed(header[-1:])
    with pytest.raises(RemoteProtocolError) as info:
        reader.next_event()
    assert info.value.field == "len"


# ---------------------------------------------------------------- never another exception

ALL_DIALECTS = sorted(DIALECTS)


@st.composite
def hostile_inputs(draw, d):
    """Random bytes, valid streams with random corruption, and structured mutations."""
    kind = draw(st.sampled_from(("random", "corrupted", "mutation")))
    if kind == "random":
        return draw(st.binary(max_size=600))
    if kind == "mutation":
        m = draw(rst.mutations(d))
        prefix = pack_request(d, HelloRequest()) if m.description["at"] != "connect" else b""
        return prefix + m.data if m.description["direction"] == "request" else m.data
    _, stream = draw(request_streams(d))
    buf = bytearray(stream)
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(buf) - 1))
        buf[i] = draw(st.integers(0, 255))
    return bytes(buf[:draw(st.integers(0, len(buf)))])


def _must_only_raise_remote(reader, chunks, eof: bool) -> None:
    try:
        for chunk in chunks:
            reader.feed(chunk)
            drain(reader, [])
        if eof:
            reader.feed(b"")
            drain(reader, [])
    except RemoteProtocolError:
        pass


@settings(max_examples=max(50, settings().max_examples))
@given(data=st.data(), name=st.sampled_from(ALL_DIALECTS), hello_first=st.booleans(),
       eof=st.booleans())
def test_request_reader_only_raises_remote_protocol_error(data, name, hello_first, eof):
    d = get_dialect(name)
    raw = data.draw(hostile_inputs(d), label="input")
    reader = RequestReader(d, hello_first=hello_first, max_payload=1 << 16, max_stream=1 << 20,
                           data_chunk=data.draw(st.sampled_from((3, 1 << 20)), label="chunk"))
    _must_only_raise_remote(reader, data.draw(chunkings(raw), label="chunks"), eof)


@settings(max_examples=max(50, settings().max_examples))
@given(data=st.data(), name=st.sampled_from(ALL_DIALECTS), eof=st.booleans())
def test_response_reader_only_raises_remote_protocol_error(data, name, eof):
    d = get_dialect(name)
    pairs, flags, stream = data.draw(response_streams(d), label="expected")
    kind = data.draw(st.sampled_from(("random", "corrupted", "flag")), label="kind")
    if kind == "random":
        raw = data.draw(st.binary(max_size=400), label="input")
    elif kind == "flag" and d.hello_caps:
        raw = data.draw(rst.flag_mutations(d), label="mutation").data
    else:
        buf = bytearray(stream)
        if buf:
            i = data.draw(st.integers(0, len(buf) - 1), label="at")
            buf[i] ^= data.draw(st.integers(1, 255), label="xor")
        raw = bytes(buf) + data.draw(st.binary(max_size=16), label="extra")
    reader = response_reader(d, pairs, flags)
    _must_only_raise_remote(reader, data.draw(chunkings(raw), label="chunks"), eof)


@settings(max_examples=max(50, settings().max_examples))
@given(data=st.data(), pinned=st.sampled_from([None, *ALL_DIALECTS]))
def test_session_decoder_never_raises(data, pinned):
    """The capture decoder records errors in the session instead of raising; whatever the two
    streams hold, only RemoteProtocolError may escape (none is expected to)."""
    d = get_dialect(pinned or "7.0.0")
    c2s = data.draw(hostile_inputs(d), label="c2s")
    s2c = data.draw(st.one_of(st.binary(max_size=200), response_streams(d).map(lambda r: r[2]),
                              rst.flag_mutations(d).map(lambda m: m.data) if d.hello_caps
                              else st.binary(max_size=8)), label="s2c")
    dec = SessionDecoder(pinned, keep_data=data.draw(st.sampled_from((0, 1 << 20)), label="keep"))
    c_chunks = data.draw(chunkings(c2s), label="c2s chunks")
    s_chunks = data.draw(chunkings(s2c), label="s2c chunks")
    order = data.draw(st.permutations([("c", i) for i in range(len(c_chunks))]
                                      + [("s", i) for i in range(len(s_chunks))]), label="order")
    # Keep each direction in order; interleave the two arbitrarily.
    ci = si = 0
    try:
        for side, _ in order:
            if side == "c":
                dec.feed_c2s(c_chunks[ci])
                ci += 1
            else:
                dec.feed_s2c(s_chunks[si])
                si += 1
        session = dec.close()
    except RemoteProtocolError:
        return
    assert session.c2s_bytes <= len(c2s) and session.s2c_bytes <= len(s2c)


# ---------------------------------------------------------------- truncation

def _request_events_at_cut(d, frame: bytes, cut: int, hello_first: bool):
    reader = RequestReader(d, hello_first=hello_first, max_payload=1 << 62, max_stream=1 << 62)
    reader.feed(frame[:cut])
    reader.feed(b"")
    events: list = []
    drain(reader, events)
    return events


@pytest.mark.parametrize("dialect", PRIMARY)
@HEAVY
@given(data=st.data())
def test_truncated_request_frame_is_an_error(dialect, data):
    d = get_dialect(dialect)
    msg = data.draw(rst.messages(d), label="message")
    frame = pack_request(d, msg)
    hello_first = msg.cmd is Cmd.HELLO
    assert isinstance(_request_events_at_cut(d, frame, 0, hello_first)[-1], ConnectionClosed)
    events = _request_events_at_cut(d, frame, len(frame), hello_first)
    assert isinstance(events[-1], ConnectionClosed) and len(events) >= 2
    for cut in range(1, len(frame)):
        with pytest.raises(RemoteProtocolError):
            _request_events_at_cut(d, frame, cut, hello_first)


@pytest.mark.parametrize("dialect", PRIMARY)
@HEAVY
@given(data=st.data(), stream=st.booleans())
def test_truncated_response_frame_is_an_error(dialect, data, stream):
    d = get_dialect(dialect)
    cmd = data.draw(st.sampled_from([c for c in d.cmd_ids if spec_for(d, c).response is not None]),
                    label="cmd")
    req, rsp = data.draw(rst.exchanges(d, cmd), label="exchange")
    frame = pack_response(d, rsp)
    for cut in range(0, len(frame) + 1):
        reader = ResponseReader(d)
        reader.expect(req, stream=stream and cmd in STREAMED_RESPONSES)
        reader.feed(frame[:cut])
        reader.feed(b"")
        if cut == len(frame):
            events: list = []
            drain(reader, events)
            assert isinstance(events[-1], ConnectionClosed)
        else:  # a response was due: EOF anywhere before its end is the server's fault
            with pytest.raises(RemoteProtocolError):
                drain(reader, [])


@pytest.mark.parametrize("name", ALL_DIALECTS)
def test_truncation_of_every_default_request(name):
    """Deterministic sweep: the default message of every command of every dialect, cut at
    every byte, in the middle of a stream (after HELLO)."""
    d = get_dialect(name)
    hello = pack_request(d, HelloRequest())
    for cmd in d.cmd_ids:
        if cmd is Cmd.HELLO:
            continue
        frame = pack_request(d, spec_for(d, cmd).request.cls())
        for cut in range(1, len(frame)):
            reader = RequestReader(d)
            reader.feed(hello + frame[:cut])
            reader.feed(b"")
            with pytest.raises(RemoteProtocolError):
                drain(reader, [])
