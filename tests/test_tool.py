"""`harness --version` and `harness init` (harness/tool.py), in process."""

from __future__ import annotations

import dataclasses

import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.data import default_matrix
from harness.matrix.model import load_matrix
from harness.proto import dialects
from harness.tool import InitError, init_matrix, version_text


def test_version_prints_the_release_and_the_dialect_table():
    done = CliRunner().invoke(app, ["--version"])
    assert done.exit_code == 0
    assert done.output.startswith("ggml-rpc-harness ")
    for name in dialects.DIALECTS:
        assert name in done.output
    assert "primary (held to byte-exactness): " + ", ".join(dialects.PRIMARY) in done.output


def test_planted_a_new_dialect_row_shows_in_the_version(monkeypatch):
    """The dialects line is read from the table, not written down: a row added is listed."""
    row = dataclasses.replace(dialects.D900, name="9.1.0-example", version=(9, 1, 0))
    assert "9.1.0-example" not in version_text()
    monkeypatch.setitem(dialects.DIALECTS, row.name, row)
    assert "9.1.0-example" in version_text()


def test_init_copies_the_shipped_matrix_and_keeps_a_users_file(tmp_path):
    written = init_matrix(tmp_path / "a" / "b")
    assert written == tmp_path / "a" / "b" / "matrix.yaml"
    assert written.read_bytes() == default_matrix().read_bytes()
    assert load_matrix(written).designs  # a valid matrix, ready to edit
    written.write_text("# mine\n")
    with pytest.raises(InitError, match="exists; --force"):
        init_matrix(tmp_path / "a" / "b")
    assert written.read_text() == "# mine\n"
    init_matrix(tmp_path / "a" / "b", force=True)
    assert written.read_bytes() == default_matrix().read_bytes()


def test_init_command_exits_non_zero_when_a_matrix_is_there(tmp_path):
    runner = CliRunner()
    assert runner.invoke(app, ["init", str(tmp_path)]).exit_code == 0
    again = runner.invoke(app, ["init", str(tmp_path)])
    assert again.exit_code == 1 and "exists" in again.output
