"""The dialect table: one complete row per dialect, and the code that follows it.

Every dialect the codec knows is a row of ``harness.proto.dialects.DIALECTS`` holding its wire
switches, its peers' behaviour, its RDMA generation and its ggml numbering. The reference
peers and the RDMA transport read those fields, never the dialect's name: a throw-away
dialect defined here gets its own behaviour without any other file changing.
"""

from __future__ import annotations

import dataclasses
import types

import pytest

from harness.reference.behaviour_view import behaviour_view_for
from harness.reference.server_core import Close, ServerConfig, ServerSession, ServerState
from harness.proto import dialects, messages as m
from harness.proto.behaviour import (C_NEW, C_OLD, LOAD_OPT_PEERS, LOAD_OPT_PEERS_9, OLD_PEERS,
                                     PRE7_PEERS, PEERS_8, PARTIAL,
                                     RDMA_PROTO7, RDMA_SEED000, RDMA_V9, RECEIVE_STREAMED,
                                     PeerBehaviour, RdmaGeneration)
from harness.proto.dialects import DIALECTS, Dialect, get_dialect
from harness.proto.ggml import GGML_7, GGML_361, GGML_402, NUMBERINGS, Numbering, TypeTraits
from harness.proto.tensor import RpcTensor
from harness.transport.rdma_core import RdmaConfig, config_for_dialect

# the fields a row may leave empty
OPTIONAL = {("rdma", "data_read_piece")}
OPTIONAL_ROW = {"alias", "derived_from"}  # a row needs no short name; only a derived one a base


def missing_rows(namespace, table: dict) -> list[str]:
    """Dialects defined in ``namespace`` that the table does not list."""
    listed = {id(d) for d in table.values()}
    return [name for name, v in vars(namespace).items()
            if isinstance(v, Dialect) and id(v) not in listed]


def empty_fields(d: Dialect) -> list[str]:
    """Fields of a row (and of its behaviour records) that are None."""
    out = []
    for f in dataclasses.fields(d):
        v = getattr(d, f.name)
        if v is None and f.name not in OPTIONAL_ROW:
            out.append(f.name)
        elif dataclasses.is_dataclass(v):
            out += [f"{f.name}.{g.name}" for g in dataclasses.fields(v)
                    if getattr(v, g.name) is None and (f.name, g.name) not in OPTIONAL]
    return out


def test_every_defined_dialect_has_a_row():
    assert not missing_rows(dialects, DIALECTS)
    assert all(DIALECTS[name].name == name for name in DIALECTS)


def test_the_row_check_fails_on_a_dialect_left_out_of_the_table():
    planted = types.SimpleNamespace(D700=dialects.D700,
                                    DX=dataclasses.replace(dialects.D700, name="x"))
    assert missing_rows(planted, {"7.0.0": dialects.D700}) == ["DX"]


@pytest.mark.parametrize("name", list(DIALECTS))
def test_every_row_is_complete(name):
    d = DIALECTS[name]
    assert not empty_fields(d)
    assert isinstance(d.peer, PeerBehaviour) and isinstance(d.rdma, RdmaGeneration)
    assert NUMBERINGS[d.numbering.name] is d.numbering


def test_the_field_check_fails_on_an_empty_field():
    planted = dataclasses.replace(dialects.D900, rdma=dataclasses.replace(RDMA_V9, name=None))
    assert empty_fields(planted) == ["rdma.name"]
    assert empty_fields(dataclasses.replace(dialects.D900, evidence=None)) == ["evidence"]


def test_a_row_cannot_leave_out_its_behaviour():
    with pytest.raises(TypeError, match="peer|rdma|numbering"):
        Dialect("x", (1, 0, 0), {}, peer=OLD_PEERS, rdma=RDMA_PROTO7)


# The values the peers and the RDMA emulator used before the table, for the rows of today (a
# new row needs no entry here: the row is its own record).
TODAYS_ROWS = {"3.6.1": (PRE7_PEERS, RDMA_PROTO7, GGML_361),
               "4.0.2": (PRE7_PEERS, RDMA_PROTO7, GGML_402),
               "5.0.0": (PRE7_PEERS, RDMA_PROTO7, GGML_7),
               "6.0.0": (PRE7_PEERS, RDMA_PROTO7, GGML_7),
               "7.0.0": (OLD_PEERS, RDMA_PROTO7, GGML_7),
               "7.0.1": (OLD_PEERS, RDMA_PROTO7, GGML_7),
               "7.0.0+flags": (LOAD_OPT_PEERS, RDMA_SEED000, GGML_7),
               "8.0.0": (PEERS_8, RDMA_PROTO7, GGML_7),
               "9.0.0": (LOAD_OPT_PEERS_9, RDMA_V9, GGML_7)}


def test_todays_rows_keep_their_behaviour():
    for name, (peer, rdma, numbering) in TODAYS_ROWS.items():
        d = DIALECTS[name]
        assert (d.peer, d.rdma, d.numbering) == (peer, rdma, numbering), name


PEER_FIELDS = [f.name for f in dataclasses.fields(PeerBehaviour)]  # every one, a new one too


@pytest.mark.parametrize("name", list(DIALECTS))
def test_peers_and_rdma_follow_the_row(name):
    d = DIALECTS[name]
    view = behaviour_view_for(d)
    assert [getattr(view, f) for f in PEER_FIELDS] == [getattr(d.peer, f) for f in PEER_FIELDS]
    assert config_for_dialect(d).generation == d.rdma
    assert config_for_dialect(name) is RdmaConfig.of(d.rdma)


def _null_hash_lookup(view) -> str:
    """What the reference server does with a SET_TENSOR_HASH of a null tensor and no cache."""
    session = ServerSession(ServerState(ServerConfig(dialect=view.dialect)), view)
    try:
        session.handle(m.SetTensorHashRequest(RpcTensor.null(), 0, 0))
    except Close:
        return "closed"
    return "answered"


def test_the_reference_server_reads_its_behaviour_through_its_view():
    """A view's override reaches the server (the row alone says 7.0.0 looks the hash up
    first, so without the override the null tensor goes unchecked)."""
    row = behaviour_view_for("7.0.0")
    assert _null_hash_lookup(row) == "answered"
    assert _null_hash_lookup(row.with_(server_hash_checks_tensor=True)) == "closed"


def test_a_server_reading_the_row_past_its_view_fails_the_check(monkeypatch):
    # planted: the session ignores the view it is given and reads its dialect's row
    original = ServerSession.__init__

    def row_only(self, state, behaviour=None):
        original(self, state, None)
    monkeypatch.setattr(ServerSession, "__init__", row_only)
    view = behaviour_view_for("7.0.0").with_(server_hash_checks_tensor=True)
    assert _null_hash_lookup(view) != "closed"


# A throw-away dialect: one row, nothing else touched.
RING4 = RdmaGeneration("test-ring-4", send_slots=4, recv_policy=PARTIAL, send_framing=C_NEW,
                       read_calls=C_OLD)
TINY_GGML = Numbering("test-tiny", (TypeTraits("f32", 4, 1),), ("NONE", "ADD"))
D_TEST = Dialect("10.0.0-test", (10, 0, 0), dialects.D900.ids, graph_uid=True,
                 server_flags=True, peer=LOAD_OPT_PEERS, rdma=RING4, numbering=TINY_GGML)


def test_a_new_dialect_is_one_row():
    p = behaviour_view_for(D_TEST)
    assert p.server_receive == RECEIVE_STREAMED and p.client_zero_copy
    cfg = config_for_dialect(D_TEST)
    assert (cfg.name, cfg.send_slots, cfg.recv_policy, cfg.send_framing, cfg.read_calls) == \
        ("test-ring-4", 4, PARTIAL, C_NEW, C_OLD)
    assert get_dialect(D_TEST) is D_TEST


def test_the_server_validates_types_in_the_rows_numbering():
    """Type 1 (f16) exists in the 7.0.0 numbering but not in the test dialect's."""
    tensor = RpcTensor(id=1, type=1, buffer=0, ne=(4, 1, 1, 1), nb=(2, 8, 8, 8), data=0)
    for d, ok in ((dialects.D900, True), (D_TEST, False)):
        session = ServerSession(ServerState(ServerConfig(dialect=d)))
        if ok:
            session.handle(m.InitTensorRequest(tensor))
        else:
            with pytest.raises(Close, match="invalid tensor type received: 1"):
                session.handle(m.InitTensorRequest(tensor))


def test_dialects_command_shows_every_row_with_its_behaviour():
    """`harness dialects` is the table itself: every row, wire switches and peer behaviour."""
    import json
    from dataclasses import asdict

    from typer.testing import CliRunner

    from harness.cli import app
    from harness.proto import DIALECTS
    out = CliRunner().invoke(app, ["dialects", "--json"])
    assert out.exit_code == 0, out.output
    rows = {r["name"]: r for r in json.loads(out.output)}
    assert set(rows) == set(DIALECTS)
    for d in DIALECTS.values():
        r = rows[d.name]
        assert (r["server_flags"], r["graph_uid"], r["peer"], r["rdma"]["name"],
                r["numbering"]) == (d.server_flags, d.graph_uid, asdict(d.peer), d.rdma.name,
                                    d.numbering.name)
        assert len(r["commands"]) == len(d.ids)
    table = CliRunner().invoke(app, ["dialects"], env={"COLUMNS": "80"})
    assert table.exit_code == 0 and "Peer behaviour" in table.output
    assert all(name in table.output for name in DIALECTS)  # no name cut at 80 columns


# ------------------------------------------------------------------ derived rows
@pytest.mark.parametrize("version, base", [("4.0.3", "4.0.2"), ("4.0.0", "4.0.2"),
                                           ("5.1.0", "5.0.0"), ("8.1.0", "8.0.0")])
def test_a_version_without_a_row_is_derived_from_its_major(version, base):
    from harness.proto.dialects import derived_dialect
    d = get_dialect(version)
    b = DIALECTS[base]
    assert d.name == d.version_str == version and version not in DIALECTS
    assert (dict(d.ids), d.hello_caps, d.cache_flag, d.graph_uid) == (
        dict(b.ids), b.hello_caps, b.cache_flag, b.graph_uid)
    assert d.evidence.startswith("[INF]") and base in d.evidence
    assert derived_dialect(d.version) is d  # one object per version


def test_a_derived_row_passes_the_wire_label_check_of_what_it_announces():
    # a real 4.0.3 server labelled by its derived row: the label agrees with the wire
    from harness.matrix.labels import server_label_mismatch

    class Hello:
        version, flags = (4, 0, 3), 0

    class S:
        server_hello = Hello()
    assert server_label_mismatch("4.0.3", [S()]) is None
    assert "announced 4.0.3" in server_label_mismatch("4.0.2", [S()])


def test_no_row_of_the_major_means_no_dialect():
    from harness.proto.dialects import dialect_for_version
    assert dialect_for_version((10, 0, 0)) is None
    with pytest.raises(ValueError, match="unknown dialect"):
        get_dialect("10.0.0")


# Every version without a row that a build may announce, up to one minor and one patch past the
# newest row of its major, and the row it is derived from (derived_dialect: the row of its
# major closest below it). Pinned, so what a new row does to derivation shows in its diff: when
# the table and the rows disagree, the test prints the table as the rows now make it, to paste
# over this one (docs/EXTENDING.md, "Add a dialect").
DERIVED = {
    "3.6.1": ("3.0.0", "3.0.1", "3.0.2", "3.1.0", "3.1.1", "3.1.2", "3.2.0", "3.2.1", "3.2.2",
              "3.3.0", "3.3.1", "3.3.2", "3.4.0", "3.4.1", "3.4.2", "3.5.0", "3.5.1", "3.5.2",
              "3.6.0", "3.6.2", "3.7.0", "3.7.1", "3.7.2"),
    "4.0.2": ("4.0.0", "4.0.1", "4.0.3", "4.1.0", "4.1.1", "4.1.2", "4.1.3"),
    "5.0.0": ("5.0.1", "5.1.0", "5.1.1"),
    "6.0.0": ("6.0.1", "6.1.0", "6.1.1"),
    "7.0.1": ("7.0.2", "7.1.0", "7.1.1", "7.1.2"),
    "8.0.0": ("8.0.1", "8.1.0", "8.1.1"),
    "9.0.0": ("9.0.1", "9.1.0", "9.1.1"),
}
TABLE_BEGIN, TABLE_END = "--- derived table as the rows make it ---", "--- end ---"


def derivable_versions() -> list[tuple[int, int, int]]:
    rows = [d.version for d in DIALECTS.values() if d.name == d.version_str]
    out = []
    for major in sorted({v[0] for v in rows}):
        mine = [v for v in rows if v[0] == major]
        out += [(major, minor, patch) for minor in range(max(v[1] for v in mine) + 2)
                for patch in range(max(v[2] for v in mine) + 2)
                if (major, minor, patch) not in mine]
    return out


def derived_table() -> dict[str, tuple[str, ...]]:
    table: dict[str, list[str]] = {}
    for v in derivable_versions():
        d = get_dialect("%d.%d.%d" % v)
        assert d.derived_from in DIALECTS and not d.primary, d
        table.setdefault(d.derived_from, []).append(d.name)
    order = sorted(table, key=lambda name: DIALECTS[name].version)
    return {base: tuple(table[base]) for base in order}


def format_table(table: dict[str, tuple[str, ...]]) -> str:
    import textwrap
    lines = ["DERIVED = {"]
    for base, versions in table.items():
        items = ", ".join(f'"{v}"' for v in versions) + ("," if len(versions) == 1 else "")
        body = textwrap.wrap(items, 84)
        lines.append(f'    "{base}": (' + body[0])
        lines += ["              " + b for b in body[1:]]
        lines[-1] += "),"
    return "\n".join(lines + ["}"])


def derivation_changes(pinned: dict, now: dict) -> list[str]:
    was = {v: base for base, vs in pinned.items() for v in vs}
    new = {v: base for base, vs in now.items() for v in vs}
    return [f"{v}: {was.get(v, '(not derivable)')} -> {new.get(v, '(not derivable)')}"
            for v in sorted(set(was) | set(new), key=lambda s: tuple(map(int, s.split("."))))
            if was.get(v) != new.get(v)]


def test_every_derivable_version_maps_to_its_pinned_row():
    now = derived_table()
    changes = derivation_changes(DERIVED, now)
    if changes:  # printed verbatim (no traceback), so the table can be pasted as it stands
        pytest.fail("a row changed what derived versions map to:\n" + "\n".join(changes)
                    + f"\n{TABLE_BEGIN}\n{format_table(now)}\n{TABLE_END}", pytrace=False)


def test_a_new_row_shows_in_the_derivation_check(monkeypatch):
    # planted: a row one minor above DEFAULT's major's newest (7.1.0 today) takes over the
    # versions derived so far from that major's newest row
    from harness.proto.dialects import DEFAULT, derived_dialect
    major = DEFAULT.version[0]
    minor = max(d.version[1] for d in DIALECTS.values() if d.version[0] == major) + 1
    name = f"{major}.{minor}.0"
    was = get_dialect(f"{major}.{minor}.1").derived_from
    row = dataclasses.replace(DEFAULT, name=name, version=(major, minor, 0), primary=False,
                              alias=None)
    monkeypatch.setitem(DIALECTS, row.name, row)
    derived_dialect.cache_clear()
    try:
        changes = derivation_changes(DERIVED, derived_table())
    finally:
        monkeypatch.undo()
        derived_dialect.cache_clear()
    assert f"{major}.{minor}.1: {was} -> {name}" in changes
    assert f"{major}.{minor + 1}.0: (not derivable) -> {name}" in changes
    assert f"{name}: {was} -> (not derivable)" in changes  # now a row of its own
    assert all(c.startswith(f"{major}.") for c in changes), changes


def test_the_pinned_table_prints_as_it_is_written():
    # the printed table reads as the pinned one and is written as it is, so pasting the printed
    # table over the pinned one is the whole edit
    from pathlib import Path
    for table in (DERIVED, {"7.1.0": ("7.2.0",)}):  # a one-version row stays a tuple
        scope: dict = {}
        exec(format_table(table), scope)
        assert scope["DERIVED"] == table
    assert format_table(DERIVED) in Path(__file__).read_text()


# ------------------------------------------------------------------ every field is read
# Each peer-behaviour field, overridden in a view, changes what the reference does (or, for
# the facts of real servers only, what the conformance catalogue expects): a field nothing
# reads is a table entry that says nothing. A new field needs a probe here.
def _receive_steps(view) -> int:
    """The largest receive the reference server asks for while a 4 MiB upload arrives."""
    import socket
    import threading

    from harness.reference.client import RefClient
    from harness.reference.server import RECV_CHUNK, ReferenceServer
    from harness.transport.tcp import TcpTransport

    asked: list[int] = []

    class Recording(TcpTransport):
        def recv_into(self, buf, *a, **kw):
            asked.append(len(buf))
            return super().recv_into(buf, *a, **kw)
    server = ReferenceServer(ServerConfig(dialect=view.dialect), behaviour=view)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        a = socket.create_connection(listener.getsockname())
        b, _ = listener.accept()
    t = threading.Thread(target=server.serve_transport, args=(Recording(b, timeout=30),))
    t.start()
    client = RefClient(TcpTransport(a, timeout=30), view.dialect)
    client.hello()
    handle, _ = client.alloc_buffer(8 << 20)
    base = client.buffer_get_base(handle)
    tensor = RpcTensor.make(id=1, ne=(1 << 20,), buffer=handle, data=base)
    client.set_tensor(tensor, bytes(4 << 20))
    client.close()
    t.join(30)
    # the payload's receives land in the tensor's buffer; the rest in the 1 MiB read buffer
    return max(n for n in asked if n != RECV_CHUNK)


def _hash_decision(view) -> bool:
    from harness.reference.client import RefClient
    client = RefClient(None, view.dialect, behaviour=view)  # no HELLO: no cache known
    return client._should_hash(64 << 20, weights=True)


def _upload_writes(view) -> str:
    """How the reference client writes a SET_TENSOR: one staged message or header and data."""
    from harness.reference.client import RefClient
    from harness.reference.knobs import Misbehaviour

    class Writes:
        how = ""

        def sendall(self, data):
            Writes.how = "staged"

        def sendall_parts(self, parts):
            Writes.how = "parts"

        def flush(self):
            raise ConnectionResetError("the probe stops after the write")
    client = RefClient(Writes(), view.dialect, behaviour=view,
                       knobs=Misbehaviour(skip_hello=True))
    with pytest.raises(Exception):
        client._send_set_tensor(m.SetTensorRequest(RpcTensor.null(), 0, 0),
                                memoryview(bytes(64)))
    return Writes.how


def _bad_upload_closes_before_its_payload(view) -> bool:
    """A SET_TENSOR of a null tensor announcing 1 MiB, its payload not sent yet: a streamed
    receiver closes at once, a whole-message one reads (discards) the payload first."""
    from harness.proto.connection import ClientConnection
    from harness.reference.server_protocol import ConnectionRecord, ServerProtocol
    from harness.strategies import hello_request_frame
    proto = ServerProtocol(ServerState(ServerConfig(dialect=view.dialect)), view,
                           ConnectionRecord("probe", 0.0))
    proto.receive_data(hello_request_frame(view.dialect))
    proto.pump(lambda parts: None)
    head = ClientConnection(view.dialect, strict=False).send_head(
        m.SetTensorRequest(RpcTensor.null(), 0, 0), 1 << 20)
    proto.receive_data(head)
    proto.pump(lambda parts: None)
    return proto.closed


def _catalogue_cases(view) -> list[str]:
    """The catalogue cases that apply to the view's row: for the facts of real servers the
    reference does not reproduce (an abort, a use-after-free), what reads the field."""
    from harness.conformance.check import CASES
    row = dataclasses.replace(view.dialect, peer=view.peer)
    return sorted(c.id for c in CASES if c.applies_to(row))


PROBES = {
    "client_hash": ("9.0.0", {"client_hash": "always"}, _hash_decision),
    "server_receive": ("9.0.0", {"server_receive": "whole"}, _bad_upload_closes_before_its_payload),
    "server_chunk": ("9.0.0", {"server_chunk": 4096}, _receive_steps),
    "client_zero_copy": ("7.0.0", {"client_zero_copy": True}, _upload_writes),
    "server_hash_checks_tensor": ("7.0.0", {"server_hash_checks_tensor": True}, _null_hash_lookup),
    "server_tensor_bounds_close": ("8.0.0", {"server_tensor_bounds_close": False},
                                   _catalogue_cases),
    "server_free_drops_graphs": ("7.0.0", {"server_free_drops_graphs": False},
                                 _catalogue_cases),
}


def test_every_peer_field_has_a_probe():
    assert sorted(PROBES) == sorted(PEER_FIELDS)


@pytest.mark.parametrize("field", sorted(PROBES))
def test_an_override_of_each_field_reaches_what_reads_it(field):
    dialect, override, probe = PROBES[field]
    row = behaviour_view_for(dialect)
    assert probe(row) != probe(row.with_(**override)), field
