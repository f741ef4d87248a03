"""Record what a real server does with every conformance case of a dialect.

usage: python -m harness.conformance.record --peer p8 --dialect 8.0.0 [--comm] [--out FILE]

``--comm`` records the two-server COMM_* cases (harness.conformance.comm) instead.

The recording is the evidence the cases' expectations are checked against
(tests/test_conformance_features.py): re-record after a new pin, then review the diff.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile

from ..impls.registry import get_peer
from ..impls.supervisor import start_peer_server
from .check import cases_for, run_case


def record(peer_name: str, dialect: str, *, observe_wait: float = 0.3) -> dict:
    peer = get_peer(peer_name)
    with tempfile.TemporaryDirectory(prefix="conformance-") as workdir:
        with start_peer_server(peer, workdir=workdir) as srv:
            results = [run_case(c, "127.0.0.1", srv.port, dialect=dialect,
                                observe_wait=observe_wait) for c in cases_for(dialect)]
            alive = srv.poll() is None
    if not alive:
        raise RuntimeError(f"{peer_name} died during the recording")
    return {
        "recorded_from": {"peer": peer.name, "package": peer.package, "version": peer.version,
                          "proto": peer.proto, "dialect": dialect},
        "cases": {r.case.id: {"title": r.case.vector, "command": r.case.command,
                              "outcome": r.outcome} for r in results},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer", required=True)
    ap.add_argument("--dialect", required=True)
    ap.add_argument("--comm", action="store_true", help="the two-server COMM_* cases")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    if args.comm:
        from .comm import record_comm
        recording = record_comm(get_peer(args.peer), args.dialect)
    else:
        recording = record(args.peer, args.dialect)
    text = json.dumps(recording, indent=1, sort_keys=True) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
