"""pytest plugin: ``pytest --matrix matrix.yaml`` runs the matrix cells as tests.

Each cell is one test item named by its cell id, so ``-k`` selects cells
(``pytest --matrix matrix.yaml -k "no-bump and weights-cache"``). A cell whose verdict is not
the expected one fails with the verdict's reason. A cell that does not apply is skipped with
its reason; a cell skipped because a peer or program is missing fails, unless
``--matrix-allow-skip REASON`` (repeatable, as ``harness matrix --allow-skip``) accepts it.
The cells' folders go to ``--matrix-out`` (default ``reports/pytest-<run-id>``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ..strictness import UNCODED, coded
from .errors import MatrixError
from .skips import AllowSkip, describe_refused

_OPTION = "--matrix"


def pytest_addoption(parser):
    group = parser.getgroup("ggml-rpc matrix")
    group.addoption(_OPTION, action="store", default=None, metavar="MATRIX_YAML",
                    help="run the cells of this matrix.yaml as tests")
    group.addoption("--matrix-out", action="store", default="reports", metavar="DIR",
                    help="where cell folders are written")
    group.addoption("--matrix-releases", action="store_true", default=False,
                    help="include the releases matrix (every real build against every other)")
    group.addoption("--matrix-allow-skip", action="append", default=[], metavar="REASON",
                    help="accept cells skipped for this reason code (peer-missing, "
                         "program-missing, device-missing) or reason substring (e.g. p8)")


def pytest_configure(config):
    config.addinivalue_line("markers", "matrix: runs matrix cells")


def pytest_load_initial_conftests(early_config, parser, args):
    # Make the matrix file a collection target, so `pytest --matrix m.yaml` collects its cells.
    for i, a in enumerate(args):
        path = a.split("=", 1)[1] if a.startswith(_OPTION + "=") else (
            args[i + 1] if a == _OPTION and i + 1 < len(args) else None)
        if path:
            args.append(path)
            return


def pytest_collect_file(file_path: Path, parent):
    wanted = parent.config.getoption(_OPTION)
    if wanted and file_path.resolve() == Path(wanted).resolve():
        return MatrixFile.from_parent(parent, path=file_path)
    return None


class MatrixFile(pytest.File):
    def collect(self):
        # pytest loads this plugin in every run: the matrix machinery only when --matrix is given
        from .cells import expand, release_cells
        from .execute import plan
        from .model import load_matrix

        matrix = load_matrix(self.path)
        cells = expand(matrix)
        if self.config.getoption("--matrix-releases"):
            cells += release_cells(matrix)
        self.config._ggml_rpc_matrix = matrix
        for job in plan(matrix, cells):
            yield MatrixItem.from_parent(self, name=job.cell.id, job=job)


class MatrixCellFailure(MatrixError):
    pass


class MatrixItem(pytest.Item):
    def __init__(self, *, job, **kw):
        super().__init__(**kw)
        self.job = job
        self.add_marker(pytest.mark.matrix)

    def runtest(self):
        from .execute import Timeouts, run_cell
        from .job import new_run_id

        cfg = self.config
        if not hasattr(cfg, "_ggml_rpc_run"):
            cfg._ggml_rpc_run = new_run_id("pytest")
        matrix = cfg._ggml_rpc_matrix
        run_dir = Path(cfg.getoption("--matrix-out")) / cfg._ggml_rpc_run
        row = run_cell(self.job, run_dir,
                       Timeouts(matrix.defaults.deadline, matrix.defaults.idle_timeout),
                       cfg._ggml_rpc_run)
        if row["verdict"] == "skip":
            allowed = [*(a.match for a in matrix.allowed_skips),
                       *cfg.getoption("--matrix-allow-skip")]
            if AllowSkip.parse(allowed).allows(row):
                pytest.skip(coded(row["skip_code"] or UNCODED, row["reason"]))
            raise MatrixCellFailure(f"skipped, and --matrix-allow-skip does not accept it: "
                                    f"{describe_refused([row])[0]}")
        if row["verdict"] != "pass":
            raise MatrixCellFailure(f"{row['verdict']}: {row['reason']} "
                                    f"(evidence: {run_dir / row['folder']})")

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, MatrixCellFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, None, f"matrix cell {self.name}"
