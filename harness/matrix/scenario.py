"""Old home of the scenario API, now :mod:`harness.scenario`; kept only because
harness/matrix/rdma.py still imports ``Check`` from here. Import from harness.scenario."""

from ..scenario import Check

__all__ = ["Check"]
