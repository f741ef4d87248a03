"""The public strategies: valid data decodes under the dialect it was drawn for, respects that
dialect's wire fields, and the mutations carry well-formed descriptions that match what their
bytes do to the sans-IO reader."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness import strategies as rst
from harness.proto import (DIALECTS, NEED_DATA, PRIMARY, SERVER_FLAG_CACHE, Cmd,
                           ConnectionClosed, Data, EndOfMessage, GraphComputeRequest,
                           RemoteProtocolError, Request, RequestHead, RequestReader, Response,
                           ResponseReader, RpcTensor, get_dialect, nbytes, pack_request,
                           pack_response, spec_for)
from harness.proto import ggml
from harness.proto.messages import HelloRequest, HelloResponse

ALL_DIALECTS = sorted(DIALECTS)
TENSOR_CMDS = (Cmd.SET_TENSOR, Cmd.SET_TENSOR_HASH, Cmd.GET_TENSOR, Cmd.MEMSET_TENSOR,
               Cmd.INIT_TENSOR, Cmd.COMM_ALLREDUCE, Cmd.SET_TENSOR_2D, Cmd.GET_TENSOR_2D)
REGIONS = [rst.BufferRegion(0x5600_0000_1000, 0x5600_0010_0000, 4096),
           rst.BufferRegion(0x5600_0000_2000, 0x5600_0020_0000, 256)]

# Per-dialect properties run for every dialect; a quarter of the budget each suffices.
PER_DIALECT = settings(max_examples=max(20, settings().max_examples // 4))


def decode_requests(d, frames: bytes, **kwargs) -> list:
    """Every request in ``frames`` (streamed ones reassembled), then the stream must end."""
    reader = RequestReader(d, hello_first=False, max_payload=1 << 40, max_stream=1 << 40, **kwargs)
    reader.feed(frames)
    reader.feed(b"")
    out, head, data = [], None, []
    while True:
        ev = reader.next_event()
        if isinstance(ev, ConnectionClosed):
            return out
        if isinstance(ev, Request):
            out.append(ev.message)
        elif isinstance(ev, RequestHead):
            head, data = ev.message, []
        elif isinstance(ev, Data):
            data.append(ev.data)
        elif isinstance(ev, EndOfMessage):
            out.append(_with(head, data=b"".join(data)))
        else:  # pragma: no cover
            pytest.fail(f"unexpected {ev!r}")


def _with(msg, **changes):
    return type(msg)(**{**{f: getattr(msg, f) for f in msg.__dataclass_fields__}, **changes})


# ---------------------------------------------------------------- valid messages

@pytest.mark.parametrize("name", ALL_DIALECTS)
@PER_DIALECT
@given(data=st.data())
def test_requests_decode_under_their_dialect(name, data):
    d = get_dialect(name)
    msg = data.draw(rst.messages(d), label="request")
    assert d.has(msg.cmd)
    assert decode_requests(d, pack_request(d, msg)) == [msg]
    # Fields that are not on this dialect's wire stay at their defaults.
    if not d.cache_flag and msg.cmd is Cmd.SET_TENSOR:
        assert msg.cache_flag == 0
    if not d.graph_uid and msg.cmd in (Cmd.GRAPH_COMPUTE, Cmd.GRAPH_RECOMPUTE):
        assert msg.uid == 0
    if not d.hello_caps and msg.cmd is Cmd.HELLO:
        assert msg == HelloRequest()


@pytest.mark.parametrize("name", ALL_DIALECTS)
@PER_DIALECT
@given(data=st.data())
def test_exchanges_decode_under_their_dialect(name, data):
    d = get_dialect(name)
    req, rsp = data.draw(rst.exchanges(d), label="exchange")
    if rsp is None:
        assert spec_for(d, req.cmd).response is None
        return
    assert rsp.cmd is req.cmd
    reader = ResponseReader(d)
    assert reader.expect(req)
    frame = pack_response(d, rsp)
    reader.feed(frame)
    assert reader.next_event() == Response(rsp, len(frame))
    assert reader.next_event() is NEED_DATA
    if isinstance(rsp, HelloResponse):
        assert rsp.version == d.version
        assert rsp.flags in ((0, SERVER_FLAG_CACHE) if d.server_flags else (0,))
        if not d.hello_caps:
            assert rsp.conn_caps == bytes(24)


@pytest.mark.parametrize("name", PRIMARY)
@settings(max_examples=max(10, settings().max_examples // 10))
@given(data=st.data())
def test_frames_decode(name, data):
    d = get_dialect(name)
    frame = data.draw(rst.request_frames(d), label="request frame")
    (msg,) = decode_requests(d, frame)
    assert pack_request(d, msg) == frame
    rsp_frame = data.draw(rst.response_frames(d, Cmd.HELLO), label="response frame")
    reader = ResponseReader(d)
    reader.expect(HelloRequest())
    reader.feed(rsp_frame)
    assert isinstance(reader.next_event(), Response)


@pytest.mark.parametrize("name", ALL_DIALECTS)
def test_every_command_of_the_dialect_is_reachable(name):
    """messages(d, cmd) exists for every command of d, and only for those."""
    d = get_dialect(name)
    for cmd in Cmd:
        if d.has(cmd):
            rst.messages(d, cmd)
            if spec_for(d, cmd).response is not None:
                rst.messages(d, cmd, "response")
            else:
                with pytest.raises(ValueError):
                    rst.messages(d, cmd, "response")
        else:
            with pytest.raises(ValueError):
                rst.messages(d, cmd)


def test_bad_direction_is_refused():
    with pytest.raises(ValueError):
        rst.messages("7.0.0", direction="sideways")


@pytest.mark.parametrize("name", PRIMARY)
@settings(max_examples=max(10, settings().max_examples // 4))
@given(data=st.data())
def test_sessions_start_with_a_single_hello(name, data):
    d = get_dialect(name)
    session = data.draw(rst.sessions(d), label="session")
    cmds = [req.cmd for req, _ in session]
    assert cmds[0] is Cmd.HELLO and Cmd.HELLO not in cmds[1:]
    frames = b"".join(pack_request(d, req) for req, _ in session)
    reader = RequestReader(d)  # server mode: HELLO first
    reader.feed(frames)
    reader.feed(b"")
    while not isinstance(reader.next_event(), ConnectionClosed):
        pass


def _in_region(t: RpcTensor, regions) -> bool:
    region = next((r for r in regions if r.handle == t.buffer), None)
    return region is not None and region.base <= t.data and t.data + nbytes(t) <= region.end


@pytest.mark.parametrize("name", ["7.0.0", "8.0.0"])
@settings(max_examples=max(20, settings().max_examples // 2))
@given(data=st.data())
def test_tensor_requests_stay_inside_the_given_buffers(name, data):
    d = get_dialect(name)
    cmd = data.draw(st.sampled_from([c for c in TENSOR_CMDS if d.has(c)]), label="cmd")
    msg = data.draw(rst.messages(d, cmd, buffers=REGIONS), label="message")
    t = msg.tensor
    assert _in_region(t, REGIONS)
    n = nbytes(t)
    if cmd is Cmd.SET_TENSOR:
        assert msg.offset + len(msg.data) <= n
    elif cmd in (Cmd.GET_TENSOR, Cmd.MEMSET_TENSOR):
        assert msg.offset + msg.size <= n
    elif cmd in (Cmd.SET_TENSOR_2D, Cmd.GET_TENSOR_2D):
        assert msg.size >= 1 and msg.n_copies >= 1 and msg.stride >= msg.size
        assert msg.offset + (msg.n_copies - 1) * msg.stride + msg.size <= n
        if cmd is Cmd.SET_TENSOR_2D:
            assert len(msg.data) == msg.size * msg.n_copies


# ---------------------------------------------------------------- tensors

@given(rst.rpc_tensors(buffers=REGIONS))
def test_rpc_tensors_are_realistic(t):
    traits = ggml.type_traits(t.type)
    assert traits is not None and traits.blck_size > 0
    assert t.ne[0] % traits.blck_size == 0 or t.ne[0] == 0
    assert t.nb == ggml.contiguous_strides(t.type, t.ne)
    assert t.id != 0 and t.name[-1] == 0
    assert _in_region(t, REGIONS)
    assert t.data % 32 == 0  # placed at the CPU backend's alignment


@given(rst.rpc_tensors(types="removed"), rst.rpc_tensors(types="invalid"))
def test_rpc_tensor_type_knobs(removed, invalid):
    assert removed.type in rst.REMOVED_TYPE_IDS
    assert invalid.type >= ggml.TYPE_COUNT
    assert removed.buffer == removed.data == 0  # no buffers given: a host tensor


@given(rst.rpc_tensors(types="any", strides="any", any_pointers=True))
def test_rpc_tensors_any_values_pack(t):
    assert len(t.pack()) == 296


# ---------------------------------------------------------------- graphs

def _ids(g: GraphComputeRequest) -> list[int]:
    return [t.id for t in g.tensors]


def _refs(t: RpcTensor) -> list[int]:
    return [i for i in (*t.src, t.view_src) if i]


@pytest.mark.parametrize("name", ["7.0.0", "9.0.0"])
@given(data=st.data())
def test_valid_graphs_are_well_formed(name, data):
    d = get_dialect(name)
    shape = data.draw(st.sampled_from(("chain", "dag")), label="shape")
    g = data.draw(rst.graphs(d, shape=shape, buffers=REGIONS[:1]), label="graph")
    ids = _ids(g)
    assert len(ids) == len(set(ids))
    position = {i: k for k, i in enumerate(ids)}
    for t in g.tensors:
        for ref in _refs(t):  # every reference resolves to an earlier record: post-order, no cycle
            assert position[ref] < position[t.id]
    assert set(g.nodes) <= set(ids)
    for node_id in g.nodes:
        node = g.tensors[position[node_id]]
        assert node.flags & ggml.FLAG_COMPUTE and node.op != 0
    if shape == "chain":
        for prev, node in zip(g.nodes, g.nodes[1:]):
            assert g.tensors[position[node]].src[0] == prev
    if not d.graph_uid:
        assert g.uid == 0
    assert decode_requests(d, pack_request(d, g)) == [g]


@pytest.mark.parametrize("shape", ["cycle", "duplicate_ids", "dangling"])
@given(data=st.data())
def test_hostile_graph_shapes(shape, data):
    g = data.draw(rst.graphs("8.0.0", shape=shape), label="graph")
    ids = _ids(g)
    first = {}
    for k, t in enumerate(g.tensors):
        first.setdefault(t.id, k)
    if shape == "duplicate_ids":
        assert len(ids) > len(set(ids))
    elif shape == "dangling":
        assert any(ref not in first for t in g.tensors for ref in _refs(t))
    else:
        # Some record refers to itself or to a record that comes after it.
        assert any(first[ref] >= k for k, t in enumerate(g.tensors) for ref in _refs(t))
    assert decode_requests(get_dialect("8.0.0"), pack_request(get_dialect("8.0.0"), g)) == [g]


# ---------------------------------------------------------------- mutations

def _catalogue_keys(d) -> set:
    return {(e["kind"], e["what"], e["cmd"]) for e in rst.mutation_catalogue(d)}


def _catalogue_fields(d) -> dict:
    return {(e["kind"], e["what"], e["cmd"]): set(e["fields"]) for e in rst.mutation_catalogue(d)}


def _check_well_formed(m, d) -> None:
    assert isinstance(m, rst.Mutation) and isinstance(m.data, bytes)
    description, data = m  # a plain (description, bytes) pair as well
    rst.check_description(description)
    assert json.loads(json.dumps(description)) == description
    assert description["dialect"] == d.name
    cmd = description["cmd"] if not description["cmd"].startswith("UNKNOWN_") else "UNKNOWN"
    key = (description["kind"], description["what"], cmd)
    assert key in _catalogue_keys(d)
    # The registry declares every field an operator writes (the report's command x field table).
    assert description["field"] in _catalogue_fields(d)[key]


@pytest.mark.parametrize("name", ALL_DIALECTS)
@settings(max_examples=max(20, settings().max_examples // 2))
@given(data=st.data())
def test_mutation_descriptions_are_well_formed(name, data):
    d = get_dialect(name)
    _check_well_formed(data.draw(rst.mutations(d), label="mutation"), d)


@pytest.mark.parametrize("name", PRIMARY)
@settings(max_examples=max(5, settings().max_examples // 20))
@given(data=st.data())
def test_every_catalogued_mutation_can_be_drawn(name, data):
    d = get_dialect(name)
    strategies = {"framing": rst.framing_mutations, "flag": rst.flag_mutations,
                  "field": rst.field_mutations}
    kinds_whats = sorted({(e["kind"], e["what"]) for e in rst.mutation_catalogue(d)})
    # Every operator in the public lists applies to some command of the newest dialects.
    if name == "9.0.0":
        assert {w for _, w in kinds_whats} == set(
            rst.FRAMING_WHATS + rst.FLAG_WHATS + rst.FIELD_WHATS)
    for kind, what in kinds_whats:
        m = data.draw(strategies[kind](d, what=what), label=f"{kind}/{what}")
        assert (m.description["kind"], m.description["what"]) == (kind, what)
        _check_well_formed(m, d)


def test_catalogue_covers_all_primary_commands():
    for name in PRIMARY:
        d = get_dialect(name)
        cmds = {e["cmd"] for e in rst.mutation_catalogue(d) if e["kind"] == "framing"}
        assert cmds == {c.value for c in d.cmd_ids} | {"UNKNOWN"}
        field_cmds = {e["cmd"] for e in rst.mutation_catalogue(d) if e["kind"] == "field"}
        assert field_cmds == {c.value for c in d.cmd_ids} - {"HELLO", "DEVICE_COUNT"}


@pytest.mark.parametrize("bad", [
    {},
    {"kind": "framing", "what": "len_too_large", "cmd": "GET_ALIGNMENT", "cmd_id": 1,
     "field": "len", "dialect": "7.0.0", "direction": "request", "at": "after_hello",
     "colour": "red"},
    {"kind": "framing", "what": "made_up", "cmd": "GET_ALIGNMENT", "cmd_id": 1,
     "field": "len", "dialect": "7.0.0", "direction": "request", "at": "after_hello"},
    {"kind": "framing", "what": "unknown_cmd", "cmd": "SET_TENSOR_2D", "cmd_id": 18,
     "field": "cmd", "dialect": "7.0.0", "direction": "request", "at": "after_hello"},
    {"kind": "flag", "what": "hello_flags", "cmd": "HELLO", "cmd_id": 14, "field": "flags",
     "dialect": "7.0.0", "direction": "response", "at": "connect", "value": True},
    {"kind": "field", "what": "op_invalid", "cmd": "INIT_TENSOR", "cmd_id": "12",
     "field": "tensor.op", "dialect": "7.0.0", "direction": "request", "at": "after_hello"},
])
def test_check_description_rejects_malformed(bad):
    with pytest.raises(ValueError):
        rst.check_description(bad)


def _server_reader(d, m, **kwargs) -> RequestReader:
    """A server-mode reader positioned where the mutation says its bytes go."""
    reader = RequestReader(d, **kwargs)
    if m.description["at"] != "connect":
        reader.feed(pack_request(d, HelloRequest()))
        assert isinstance(reader.next_event(), Request)
    return reader


def _events_until_stop(reader, limit: int = 100_000) -> list:
    events = []
    for _ in range(limit):
        ev = reader.next_event()
        events.append(ev)
        if ev is NEED_DATA or isinstance(ev, ConnectionClosed):
            return events
    raise AssertionError("no progress")  # pragma: no cover


@pytest.mark.parametrize("name", PRIMARY)
@settings(max_examples=max(20, settings().max_examples // 2))
@given(data=st.data())
def test_framing_mutations_break_framing(name, data):
    """The reference reader (server defaults) refuses each framing mutation the way its
    description says."""
    d = get_dialect(name)
    m = data.draw(rst.framing_mutations(d), label="mutation")
    desc = m.description
    reader = _server_reader(d, m)
    reader.feed(m.data)
    if desc.get("eof"):
        reader.feed(b"")
    problem = framing_problem(rst.MUTATIONS[("framing", desc["what"])], reader)
    assert problem is None, (desc, problem)


def framing_problem(op, reader) -> str | None:
    """How the reader meeting a framing mutation's bytes differs from what the registry says of
    the operator (``refused_at``, ``may_wait``); None when it does not."""
    try:
        events = _events_until_stop(reader)
    except RemoteProtocolError as e:
        return None if e.field in op.refused_at else \
            f"refused at {e.field!r}, the registry says {op.refused_at}"
    if not op.may_wait:
        return "not refused, the registry says it is"
    if not (events[-1] is NEED_DATA and reader.in_frame):
        return "taken as a whole frame, the reader should be waiting inside one"
    return None


def test_a_framing_mutation_must_say_how_it_is_refused():
    with pytest.raises(ValueError, match="refused_at"):
        rst.mutation("framing", "unsaid", fields=("len",))
    with pytest.raises(ValueError, match="refused_at"):
        rst.mutation("field", "framing_claim", fields=("device",), refused_at=("len",))
    assert "unsaid" not in rst.FRAMING_WHATS


def test_a_framing_mutation_the_reader_accepts_fails_the_framing_check():
    """Planted: the registry claims len_large is always refused; a length within the bound
    leaves the reader waiting, which the check reports."""
    from dataclasses import replace
    d = get_dialect("7.0.0")

    def reader():
        r = RequestReader(d)
        r.feed(pack_request(d, HelloRequest()))
        r.next_event()
        r.feed(bytes([d.id_of(Cmd.SET_TENSOR)]) + (1 << 20).to_bytes(8, "little"))
        return r
    op = rst.MUTATIONS[("framing", "len_large")]
    assert framing_problem(op, reader()) is None
    assert framing_problem(replace(op, may_wait=False), reader()) == \
        "not refused, the registry says it is"
    assert "refused at" in framing_problem(replace(op, refused_at=("cmd",)),
                                           _reader_refusing_at_len(d))


def _reader_refusing_at_len(d):
    r = RequestReader(d)
    r.feed(pack_request(d, HelloRequest()))
    r.next_event()
    r.feed(bytes([d.id_of(Cmd.GET_ALIGNMENT)]) + (5).to_bytes(8, "little"))
    return r


@pytest.mark.parametrize("name", [n for n in PRIMARY])
@settings(max_examples=max(20, settings().max_examples // 4))
@given(data=st.data())
def test_flag_mutations_carry_the_flag(name, data):
    d = get_dialect(name)
    m = data.draw(rst.flag_mutations(d), label="mutation")
    desc = m.description
    if desc["direction"] == "response":
        reader = ResponseReader(d)
        reader.expect(HelloRequest())
        reader.feed(m.data)
        rsp = reader.next_event().message
        assert rsp.version == d.version
        if desc["what"] == "hello_flags":
            assert rsp.flags == desc["value"] and rsp.conn_caps == bytes(24)
        else:
            assert rsp.conn_caps[desc["index"]] == desc["value"] != 0
            assert sum(1 for b in rsp.conn_caps if b) == 1
        return
    (msg,) = decode_requests(d, m.data)
    if desc["what"] == "client_conn_caps":
        assert msg.conn_caps[desc["index"]] == desc["value"] != 0
    else:
        assert msg.cmd is Cmd.SET_TENSOR and msg.cache_flag == desc["value"]


@pytest.mark.parametrize("name", PRIMARY)
@settings(max_examples=max(20, settings().max_examples // 2))
@given(data=st.data())
def test_field_mutations_stay_framed(name, data):
    """Field mutations keep the framing intact: they decode and re-encode byte for byte;
    only the graph count mutations may be refused, and then for the count they changed."""
    d = get_dialect(name)
    m = data.draw(rst.field_mutations(d, buffers=REGIONS), label="mutation")
    desc = m.description
    assert desc["at"] == "after_setup"
    try:
        (msg,) = decode_requests(d, m.data)
    except RemoteProtocolError as e:
        if desc["what"] == "interesting_value":  # any u32/u64, counts and lengths included
            return
        assert desc["what"] in ("n_nodes_mismatch", "n_tensors_mismatch")
        # A longer node array swallows the n_tensors field, so either count may be refused.
        assert e.field == "n_tensors" or e.field == desc["field"].split(".")[1]
        return
    assert pack_request(d, msg) == m.data
    if desc["what"] == "n_nodes_mismatch":  # the decoder believes the count
        assert len(msg.nodes) == desc["value"]


@settings(max_examples=max(20, settings().max_examples // 2))
@given(data=st.data())
def test_data_pointer_mutations_are_relative_to_the_given_buffer(data):
    region = REGIONS[0]
    cmd = data.draw(st.sampled_from((Cmd.GET_TENSOR, Cmd.SET_TENSOR, Cmd.MEMSET_TENSOR)),
                    label="cmd")
    m = data.draw(rst.field_mutations("7.0.0", cmd, what="data_near_bounds", buffers=[region]),
                  label="mutation")
    (msg,) = decode_requests(get_dialect("7.0.0"), m.data)
    n = nbytes(msg.tensor)
    expected = {"base-1": region.base - 1, "base": region.base, "end-nbytes": region.end - n,
                "end-nbytes+1": region.end - n + 1, "end-1": region.end - 1,
                "end": region.end, "end+1": region.end + 1, "zero": 0,
                "max": (1 << 64) - 1, "wrap": (1 << 64) - max(n, 1)}
    assert msg.tensor.data == m.description["value"] == expected[m.description["case"]]
    assert msg.tensor.buffer == region.handle
    assert m.description["field"] == "tensor.data"


def test_flag_mutations_need_flag_bytes():
    """3.6.1 has neither HELLO caps nor cache_flag: asking for flag mutations is an error."""
    with pytest.raises(ValueError):
        rst.flag_mutations("3.6.1")


def test_every_command_has_a_request_drawer():
    for d in DIALECTS.values():
        assert set(d.cmd_ids) <= set(rst.REQUEST_DRAWERS), d.name


@settings(max_examples=10)
@given(data=st.data())
def test_a_registered_mutation_is_catalogued_drawn_and_covered(data):
    """Adding a mutation is one decorated function: it shows up in the catalogue, the
    strategies, the description check and the report's coverage tables, no other file
    touched."""
    from collections import Counter

    from harness.fuzz.report import coverage_summary

    what = "throwaway_alignment_device"

    @rst.mutation("field", what, fields=("device",),
                  applies=lambda d, cmd: cmd is Cmd.GET_ALIGNMENT)
    def _(draw, site):
        return site.mutation("device", replace(site.request, device=0xDEAD), value=0xDEAD)

    try:
        d = get_dialect("7.0.0")
        entry = {"kind": "field", "what": what, "cmd": "GET_ALIGNMENT", "direction": "request",
                 "fields": ["device"]}
        assert entry in rst.mutation_catalogue(d)
        assert what in rst.FIELD_WHATS
        m = data.draw(rst.field_mutations(d, what=what), label="mutation")
        _check_well_formed(m, d)
        (msg,) = decode_requests(d, m.data)
        assert msg.cmd is Cmd.GET_ALIGNMENT and msg.device == 0xDEAD
        before = coverage_summary("7.0.0", Counter())
        assert f"field:{what}:GET_ALIGNMENT" in before["missing"]
        after = coverage_summary("7.0.0", Counter({f"field|{what}|GET_ALIGNMENT|device": 3}))
        assert f"field:{what}:GET_ALIGNMENT" not in after["missing"]
        assert after["mutations_exercised"] == 1
        assert after["command_field"]["GET_ALIGNMENT"]["device"] == 3
    finally:
        rst.unregister("field", what)
    assert what not in rst.FIELD_WHATS
    assert not any(e["what"] == what for e in rst.mutation_catalogue("7.0.0"))


@pytest.mark.parametrize("name", ["7.0.0", "8.0.0"])
def test_every_field_a_framing_operator_lists_is_drawn_by_the_sweep(name):
    """A field in the catalogue that no draw can write would stay "not exercised" in every
    report (DEVICE_COUNT's empty payload under `truncated` did)."""
    from harness.fuzz import sweep
    listed = {(f"{kind}:{what}", cmd, f)
              for (kind, what, cmd), fs in _catalogue_fields(name).items() if kind == "framing"
              for f in fs}
    drawn = {(f"{s.desc['kind']}:{s.desc['what']}", s.desc["cmd"], s.desc["field"])
             for sc in sweep.catalogue_walk(name, local_only=False) for s in sc.case.steps
             if s.desc is not None and s.desc["kind"] == "framing"}
    drawn = {(k, "UNKNOWN" if c.startswith("UNKNOWN_") else c, f) for k, c, f in drawn}
    assert not listed - drawn, sorted(listed - drawn)
