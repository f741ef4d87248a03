"""Seed 000 as real C code: harness/data/patches/seed000-server-flags.patch on the 7.0.0 tree,
on the wire.

The patched build (client library and ggml-rpc-server) comes from ONE fixture,
``seed000_peer``: the ``p7f`` pin of pins.toml (p7 + the patch), which must be built. Every
cell is judged from the recorded bytes (canonical transcripts) against the real 7.0.0 peer (p7)
and the reference 7.0.0+flags peer, and the profiler's own lines (GGML_RPC_LOADPROF=1) are
checked against the same wire.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from harness.capture.canonical import first_divergence
from harness.capture.loadprof_log import LoadProfError, of_side, parse_loadprof
from harness.impls.ref_driver import RefClientDriver
from harness.impls.registry import Peer, PeerError, get_peer, probe_hello, verify_peer
from harness.impls.supervisor import ServerProcess, start_reference_server
from harness.proto import HASH_THRESHOLD, SERVER_FLAG_CACHE
from harness.strictness import PEER_MISSING
from needs import skip
from test_interop_real import run_session

ROOT = Path(__file__).resolve().parents[1]
PATCHED_PIN = "p7f"  # pins.toml entry: p7 + harness/data/patches/seed000-server-flags.patch
BASE_PIN = "p7"
RECORDED_LOG = ROOT / "fixtures" / "loadprof" / "seed000-cache-two-loads.log"
PROFILE = {"GGML_RPC_LOADPROF": "1"}
LOAD_OPT_OFF = {"GGML_RPC_LOAD_OPT": "0"}

BIG = HASH_THRESHOLD // 4 + 1024  # f32 elements: a weights tensor above the hash threshold
LOAD = [
    {"op": "buffer_type"},
    {"op": "alloc_buffer", "name": "w", "size": BIG * 4 + 65536, "usage": "weights"},
    {"op": "tensor", "name": "W", "buffer": "w", "offset": 0, "ne": [BIG]},
    {"op": "tensor", "name": "s", "buffer": "w", "offset": BIG * 4, "ne": [64]},
    {"op": "set", "tensor": "W", "fill": {"pattern": "random", "seed": 1}},
    {"op": "set", "tensor": "s", "fill": {"pattern": "random", "seed": 2}},
    {"op": "get", "tensor": "W"}, {"op": "get", "tensor": "s"},
    {"op": "free_buffer", "buffer": "w"},
]


# ------------------------------------------------------------------------------ the builds
@pytest.fixture(scope="session")
def seed000_peer() -> Peer:
    """The patched 7.0.0 build: pins.toml's p7f (`make peers` builds it). Not built is a
    failure, not a skip: these tests are the evidence that the patch does what seed 000 says."""
    peer = get_peer(PATCHED_PIN)
    assert peer.available, (f"{PATCHED_PIN} is not built ({peer.reason}): run `harness peers "
                            f"build {PATCHED_PIN} --extra-target llama-simple` or `make peers`")
    assert verify_peer(peer, expected="7.0.0").hello == "7.0.0"  # the version stays 7.0.0
    return peer


@pytest.fixture(scope="session")
def p7() -> Peer:
    try:
        peer = get_peer(BASE_PIN)
    except PeerError as e:
        skip(PEER_MISSING, str(e))
    if not peer.available:
        skip(PEER_MISSING, f"{BASE_PIN} is not built: {peer.reason}")
    return peer


# ------------------------------------------------------------------------------ sessions
@contextlib.contextmanager
def serve(server, tmp: Path, *, cache: bool, env: dict | None = None, knobs: tuple = ()):
    """A server for one cell: a real Peer, or "ref" for `harness serve --proto 7.0.0+flags`."""
    cache_dir = tmp / "cache" if cache else None
    if server == "ref":
        extra = [a for k in knobs for a in ("--knob", k)]
        with start_reference_server("7.0.0+flags", cache_dir=cache_dir and cache_dir / "rpc",
                                    workdir=tmp / "srv", extra_args=extra) as srv:
            yield srv
        return
    full_env = dict(server.server_cmd("127.0.0.1", 0, cache_dir)[1], **(env or {}))
    with ServerProcess.start(lambda h, p: server.server_cmd(h, p, cache_dir)[0], full_env,
                             name=server.name, host="127.0.0.1", workdir=tmp / "srv") as srv:
        yield srv


def load(client, srv, tmp: Path, env: dict | None = None):
    """One model-load-shaped session through a recording proxy.

    ``client``: a real Peer (its C client library) or "ref" (the reference 7.0.0+flags client).
    Returns (step results, canonical wire, the client's log lines).
    """
    from harness.impls.ctypes_driver import LOG_LINES, CtypesClientDriver
    driver = RefClientDriver("7.0.0+flags") if client == "ref" else \
        CtypesClientDriver(client.lib_dir, proto="7.0.0", env=env)
    results, wire = run_session(driver, srv, tmp, steps=LOAD)
    return results, wire, driver.log_tail(LOG_LINES)


def loads(client, server, tmp: Path, *, cache: bool, n: int | None = None,
          client_env: dict | None = None, server_env: dict | None = None, knobs: tuple = ()):
    """``n`` loads (default: two with a cache, cold then warm; one without) against one server.
    Returns ([(results, wire, client log)], server log text)."""
    n = n or (2 if cache else 1)
    with serve(server, tmp, cache=cache, env=server_env, knobs=knobs) as srv:
        runs = [load(client, srv, tmp, client_env) for _ in range(n)]
        return runs, srv.log_text()


def cmds(wire) -> list[str]:
    return [e["cmd"] for e in wire]


def check_data(results) -> None:
    """What was read back is what was set."""
    sets = [r["fnv"] for r in results if "fnv" in r and "head" not in r]
    gets = [r["fnv"] for r in results if "head" in r]
    assert sets and sets == gets


def divergences(runs_a, runs_b) -> list:
    """First difference of each pair of loads (GET_DEVICE_MEMORY aside: host RAM differs)."""
    out = []
    for (_, a, _), (_, b, _) in zip(runs_a, runs_b, strict=True):
        a = [e for e in a if e["cmd"] != "GET_DEVICE_MEMORY"]
        b = [e for e in b if e["cmd"] != "GET_DEVICE_MEMORY"]
        d = first_divergence(a, b)
        if d is not None:
            out.append(str(d))
    return out


def payload_len(e: dict) -> int:
    """Data bytes of a SET_TENSOR exchange (large payloads are summarised outside the request)."""
    return e["data"]["len"] if "data" in e else e["request"]["data"]["len"]


# ------------------------------------------------------------------------------ cells
@pytest.mark.realpeer
@pytest.mark.parametrize("cache,env,flags", [
    (False, {}, 0), (True, {}, SERVER_FLAG_CACHE), (True, LOAD_OPT_OFF, 0)],
    ids=["no-cache", "cache", "cache-load-opt-0"])
def test_patched_server_hello_byte3(seed000_peer, tmp_path, cache, env, flags):
    with serve(seed000_peer, tmp_path, cache=cache, env=env) as srv:
        assert probe_hello(srv.host, srv.port, 7) == ((7, 0, 0), flags)


@pytest.mark.realpeer
def test_the_flag_check_tells_the_old_server_apart(p7, tmp_path):
    """The same probe on the real 7.0.0 server with -c: byte 3 stays 0 (what the check guards)."""
    with serve(p7, tmp_path, cache=True) as srv:
        assert probe_hello(srv.host, srv.port, 7) == ((7, 0, 0), 0)


@pytest.mark.realpeer
@pytest.mark.parametrize("server,cache,hashes", [
    ("ref", True, True), ("ref", False, False), ("p7", True, False), ("p7", False, False),
    ("p7f", True, True), ("p7f", False, False)])
def test_patched_client_hashes_only_for_a_caching_server(seed000_peer, p7, tmp_path, server,
                                                        cache, hashes):
    peer = {"ref": "ref", "p7": p7, "p7f": seed000_peer}[server]
    runs, _ = loads(seed000_peer, peer, tmp_path, cache=cache)
    for results, _, _ in runs:
        check_data(results)
    first = runs[0][1]
    assert first[0]["response"]["flags"] == (SERVER_FLAG_CACHE if hashes else 0)
    if not hashes:  # p7 with -c included: silent degradation, the cache is never used
        assert all(cmds(w).count("SET_TENSOR_HASH") == 0 for _, w, _ in runs)
        assert all(e["request"]["cache_flag"] == 0 for _, w, _ in runs for e in w
                   if e["cmd"] == "SET_TENSOR")
        return
    hash_replies = [[e["response"]["result"] for e in w if e["cmd"] == "SET_TENSOR_HASH"]
                    for _, w, _ in runs]
    assert hash_replies == [[0], [1]]  # cold: miss then upload with cache_flag 1; warm: hit
    assert [e["request"]["cache_flag"] for e in first if e["cmd"] == "SET_TENSOR"] == [1, 0]
    assert cmds(runs[1][1]).count("SET_TENSOR") == 1  # only the small tensor is sent again


@pytest.mark.realpeer
@pytest.mark.parametrize("cache", [False, True], ids=["no-cache", "cache"])
def test_old_client_gets_a_7_0_0_server_from_the_patched_one(seed000_peer, p7, tmp_path, cache):
    """p7's client against the patched server says and hears what it does against p7's server
    (streamed receive is invisible on the wire), apart from the flags byte."""
    new, _ = loads(p7, seed000_peer, tmp_path / "new", cache=cache)
    old, _ = loads(p7, p7, tmp_path / "old", cache=cache)
    for results, wire, _ in new:
        check_data(results)
        assert cmds(wire).count("SET_TENSOR_HASH") == 1  # the old client always hashes
        assert wire[0]["response"]["flags"] == (SERVER_FLAG_CACHE if cache else 0)
        wire[0]["response"]["flags"] = 0
    assert divergences(new, old) == []


@pytest.mark.realpeer
def test_zero_copy_send_keeps_the_bytes(seed000_peer, p7, tmp_path):
    """Against a caching patched server the patched client (header and data written separately)
    and p7's client (one staged copy) send the same messages, big payload included."""
    new, _ = loads(seed000_peer, seed000_peer, tmp_path / "new", cache=True)
    old, _ = loads(p7, seed000_peer, tmp_path / "old", cache=True)
    big = [e for e in new[0][1] if e["cmd"] == "SET_TENSOR" and payload_len(e) > HASH_THRESHOLD]
    assert len(big) == 1
    assert divergences(new, old) == []


@pytest.mark.realpeer
def test_load_opt_0_on_both_sides_is_7_0_0(seed000_peer, p7, tmp_path):
    off, _ = loads(seed000_peer, seed000_peer, tmp_path / "off", cache=True,
                   client_env=LOAD_OPT_OFF, server_env=LOAD_OPT_OFF)
    old, _ = loads(p7, p7, tmp_path / "old", cache=True)
    assert off[0][1][0]["response"]["flags"] == 0
    assert divergences(off, old) == []


@pytest.mark.realpeer
def test_load_opt_0_client_hashes_for_any_server(seed000_peer, p7, tmp_path):
    off, _ = loads(seed000_peer, seed000_peer, tmp_path / "off", cache=False,
                   client_env=LOAD_OPT_OFF)
    old, _ = loads(p7, seed000_peer, tmp_path / "old", cache=False)
    assert cmds(off[0][1]).count("SET_TENSOR_HASH") == 1
    assert divergences(off, old) == []


# Each role the C 7f build plays, against each peer the other role can be; (role, other, cache)
SWAPS = [(role, other, cache) for role in ("client", "server") for other in ("p7f", "p7", "ref")
         for cache in (False, True)]


@pytest.mark.realpeer
@pytest.mark.parametrize("role,other,cache", SWAPS,
                         ids=[f"{r}-vs-{o}-{'cache' if k else 'nocache'}" for r, o, k in SWAPS])
def test_reference_7f_is_on_the_wire_what_the_c_build_is(seed000_peer, p7, tmp_path, role,
                                                        other, cache):
    """Swap the C 7f build in ``role`` for the reference 7.0.0+flags peer: the bytes stay."""
    peer = {"p7f": seed000_peer, "p7": p7, "ref": "ref"}[other]
    if role == "client":
        c_runs, _ = loads(seed000_peer, peer, tmp_path / "c", cache=cache)
        ref_runs, _ = loads("ref", peer, tmp_path / "ref", cache=cache)
    else:
        c_runs, _ = loads(peer, seed000_peer, tmp_path / "c", cache=cache)
        ref_runs, _ = loads(peer, "ref", tmp_path / "ref", cache=cache)
    assert divergences(c_runs, ref_runs) == []


@pytest.mark.realpeer
def test_a_reference_that_drops_the_flag_is_caught(seed000_peer, tmp_path):
    """Planted fault: the reference server with byte 3 forced to 0 diverges from the C build."""
    c_runs, _ = loads(seed000_peer, seed000_peer, tmp_path / "c", cache=True)
    bad, _ = loads(seed000_peer, "ref", tmp_path / "ref", cache=True, knobs=("hello_flags=0",))
    found = divergences(c_runs, bad)
    assert found and "flags" in found[0]


@pytest.mark.realpeer
def test_loadprof_lines_match_the_wire(seed000_peer, tmp_path):
    runs, server_log = loads(seed000_peer, seed000_peer, tmp_path, cache=True,
                             client_env=PROFILE, server_env=PROFILE)
    server = of_side(parse_loadprof(server_log.splitlines()), "server")
    assert len(server) == len(runs) == 2
    for (_, wire, client_log), srv in zip(runs, server):
        client = of_side(parse_loadprof(client_log), "client")
        assert len(client) == 1
        uploads = [e for e in wire if e["cmd"] == "SET_TENSOR"]
        replies = [e["response"]["result"] for e in wire if e["cmd"] == "SET_TENSOR_HASH"]
        for prof in (client[0], srv):
            assert prof.flags == SERVER_FLAG_CACHE and prof.load_opt
            assert prof.set_tensor == len(uploads)
            assert prof.bytes == sum(payload_len(e) for e in uploads)
            assert (prof.hash_calls, prof.hash_hits) == (len(replies), sum(replies))
            assert prof.span_s >= prof.gap_s >= 0 and prof.gaps >= 1
        sent = {c: cmds(wire).count(c) for c in set(cmds(wire)) - {"HELLO"}}
        assert {k: v.count for k, v in client[0].commands.items()} == sent
        assert client[0].hashed_bytes == BIG * 4  # the client hashes the big tensor each load
        # the server hashes only to save: the flagged payload goes through staging, the rest
        # straight into the (host) buffer
        flagged = sum(e["request"]["cache_flag"] for e in uploads)
        assert (srv.staged, srv.direct) == (flagged, len(uploads) - flagged)
    assert server[0].hashed_bytes == BIG * 4 and server[1].hashed_bytes == 0


@pytest.mark.realpeer
def test_no_loadprof_lines_unless_asked(seed000_peer, tmp_path):
    runs, server_log = loads(seed000_peer, seed000_peer, tmp_path, cache=False)
    assert parse_loadprof(server_log.splitlines()) == []
    assert parse_loadprof(runs[0][2]) == []


# ------------------------------------------------------------------------------ the parser
def test_parse_recorded_loadprof():
    profiles = parse_loadprof(RECORDED_LOG.read_text().splitlines())
    client, server = of_side(profiles, "client"), of_side(profiles, "server")
    assert [(p.conn, p.set_tensor, p.hash_calls, p.hash_hits) for p in client] == \
        [(1, 2, 1, 0), (1, 1, 1, 1)]
    assert [(p.conn, p.set_tensor, p.direct, p.staged, p.endpoint) for p in server] == \
        [(1, 2, 1, 1, None), (2, 1, 1, 0, None)]
    assert client[0].endpoint != client[1].endpoint  # cmd lines grouped by their summary
    assert client[0].commands["SET_TENSOR"].count == 2
    assert client[1].commands["SET_TENSOR_HASH"].count == 1
    assert client[0].flags == SERVER_FLAG_CACHE and client[0].bytes == 12587264
    assert server[0].commands == {}


GOOD = ("ggml-rpc-loadprof side=server conn=1 endpoint=- load_opt=1 flags=0x01 set_tensor=2 "
        "bytes=9 hash_calls=1 hash_hits=0 hashed_bytes=4 direct=1 staged=1 span_s=0.5 hash_s=0.1 "
        "staging_s=0.0 wire_s=0.2 gap_s=0.1 gaps=2 max_gap_s=0.1")


def test_parse_loadprof_takes_a_prefixed_line():
    [p] = parse_loadprof(["[agent stderr] " + GOOD, "unrelated line"])
    assert (p.side, p.flags, p.bytes, p.gap_s) == ("server", 1, 9, 0.1)


@pytest.mark.parametrize("line,why", [
    (GOOD.replace(" gaps=2", ""), "missing"),
    (GOOD + " extra=1", "unknown"),
    (GOOD.replace("bytes=9", "bytes=x"), "bad value bytes"),
    (GOOD.replace("load_opt=1", "load_opt=2"), "bad value load_opt"),
    (GOOD.replace("side=server", "side=proxy"), "side must be"),
    (GOOD.replace("bytes=9", "bytes"), "not key=value"),
    (GOOD + " bytes=9", "given twice"),
    ("ggml-rpc-loadprof side=client conn=3 endpoint=h:1 cmd=HELLO count=1 time_s=0.1",
     "before the summary"),
])
def test_parse_loadprof_rejects_malformed_records(line, why):
    with pytest.raises(LoadProfError, match=why):
        parse_loadprof(["ok", line])
