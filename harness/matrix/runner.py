"""Old name of :mod:`harness.matrix.execute`, kept only for the tests that import it
(tests/test_chop.py, tests/test_peers_pairs.py, tests/test_rdma_matrix.py)."""

from .execute import run_cells

__all__ = ["run_cells"]
