"""Every real build against itself (a basic session) and against every other (rejected at HELLO)."""

from __future__ import annotations

import numpy as np
import pytest

from harness.data import default_matrix
from harness.impls.driver import fingerprint, make_fill
from harness.impls.ctypes_driver import CtypesClientDriver
from harness.impls.registry import list_peers
from harness.impls.supervisor import start_peer_server
from harness.matrix.cells import release_cells
from harness.matrix.model import load_matrix
from harness.matrix.execute import run_cells
from needs import peer_marker
from peer_sessions import BASIC_SESSION, FILL_X, FILL_Y

BUILT = [p for p in list_peers() if p.available and p.kind in ("pin", "wheel")]
# one build per release: variants (patched, sanitizer, RDMA) speak their release's protocol,
# and of registry builds (bisect leaves many in the cache) the first of each protocol
RELEASES: list = []
for _p in BUILT:
    if not (_p.base or _p.sanitize or _p.rdma) and \
            all((r.proto or r.verified_proto) != (_p.proto or _p.verified_proto) for r in RELEASES):
        RELEASES.append(_p)

pytestmark = pytest.mark.realpeer


def _major(peer) -> int:
    return int((peer.proto or peer.verified_proto or "0").split(".")[0])


@peer_marker(not BUILT, "no real peer is built: `harness peers build --all`")
@pytest.mark.parametrize("peer", BUILT, ids=[p.name for p in BUILT])
def test_same_version_pair_runs_a_basic_session(peer, tmp_path):
    with start_peer_server(peer, workdir=tmp_path) as srv:
        drv = CtypesClientDriver(peer.lib_dir, proto=peer.proto)
        try:
            drv.run({"op": "connect", "endpoint": srv.endpoint})
            res = [drv.run(s).result for s in BASIC_SESSION]
            drv.run({"op": "close"})
        finally:
            info = drv.close()
    x = make_fill(FILL_X, 128).view(np.float32)
    y = make_fill(FILL_Y, 128).view(np.float32)
    assert res[0]["count"] >= 1
    assert res[10]["fnv"] == fingerprint(x + y)["fnv"]
    assert res[12]["fnv"] == fingerprint(x)["fnv"]
    assert res[14]["fnv"] == fingerprint(bytes(128))["fnv"]
    assert info.returncode == 0


@pytest.mark.slow
@peer_marker(len(RELEASES) < 2, "needs at least two real releases built: `harness peers build --all`")
def test_every_cross_pair_is_rejected_at_hello_as_the_version_rule_predicts(tmp_path):
    m = load_matrix(default_matrix())
    names = [p.name for p in RELEASES]
    rows = run_cells(m, release_cells(m, names), tmp_path, run_id="releases", workers=3)
    assert len(rows) == len(names) ** 2
    wrong = [(r["cell_id"], r["verdict"], r["reason"]) for r in rows if r["verdict"] != "pass"]
    assert not wrong
    for r in rows:
        if r["client"] == r["server"]:
            assert r["observed"] == "works"
        else:
            assert r["observed"] == "rejected-at-hello", r["cell_id"]
            # a clean rejection, classified with the library's own words, never a crash
            assert r["rejected_by"] in ("client", "server")
            if r["rejected_by"] == "client":
                assert "version mismatch" in r["message"]
