"""Fuzz targets of real servers run with the loopback bind shim: a COMM_INIT a campaign sends
to a real 8.0.0 server (which listens on 0.0.0.0 for it, spec 15.15) stays on 127.0.0.1."""

from __future__ import annotations

import pytest

from harness.conformance.raw import RawSession
from harness.fuzz.target import Target
from harness.fuzz.target_spec import TargetSpec
from harness.impls.loopback import listeners_of, require_loopback_only
from harness.impls.supervisor import free_port
from harness.proto import messages as m


@pytest.mark.realpeer
def test_a_fuzzed_rank0_comm_init_listens_on_loopback_only(tmp_path):
    target = Target(TargetSpec.parse("p8"), tmp_path / "t")
    target.start()
    try:
        comm_port = free_port()
        with RawSession("127.0.0.1", target.port, dialect="8.0.0") as s:
            s.hello()
            s.request(m.CommInitRequest(0, 0, 2, comm_port))  # rank 0 now waits in accept
            deadline_polls = 200
            while deadline_polls and not any(p == comm_port for _, p in listeners_of(
                    target.server.pid)):
                s.observe(0.01)
                deadline_polls -= 1
            listeners = require_loopback_only(target.server)
            assert ("127.0.0.1", comm_port) in listeners, listeners
    finally:
        target.stop()
