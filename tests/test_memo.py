"""The sweep's cache key (harness/fuzz/memo.py): the code the sweep can import, so a change
elsewhere in the harness keeps the built sweep and a change to that code builds it again."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness.fuzz import memo

HARNESS = Path(memo.__file__).resolve().parents[1]


@pytest.fixture
def tree(tmp_path) -> Path:
    """A copy of the harness package's sources, to change without touching the real one."""
    copy = tmp_path / "harness"
    shutil.copytree(HARNESS, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def _digest(root: Path, module: str = "harness.fuzz.sweep") -> str:
    memo.closure_digest.cache_clear()  # the tree changes between calls
    return memo.closure_digest(module, root)


def _names(root: Path, module: str = "harness.fuzz.sweep") -> set[str]:
    return {f.relative_to(root).as_posix() for f in memo.import_closure(module, root)}


def test_the_closure_follows_imports_inside_functions_and_leaves_out_the_rest():
    names = _names(HARNESS)
    # sweep.prepare imports the cache module inside the function
    assert {"fuzz/sweep.py", "fuzz/interactions.py", "proto/dialects.py",
            "strategies/framing.py", "impls/cache.py", "impls/pins.toml"} <= names
    # what the sweep never imports: the matrix, the reports, the CLI
    assert not {n for n in names if n.startswith(("matrix/", "report/", "cli"))}
    assert not {n for n in names if "__pycache__" in n}


def test_a_change_outside_the_closure_keeps_the_key_and_one_inside_changes_it(tree):
    key = _digest(tree)
    (tree / "matrix" / "execute.py").write_text("# changed\n", encoding="utf-8")
    assert _digest(tree) == key
    # a module imported only inside a function of a module the sweep imports
    cache = tree / "impls" / "cache.py"
    cache.write_text(cache.read_text() + "\n# changed\n")
    assert _digest(tree) != key
    key = _digest(tree)
    (tree / "strategies" / "framing.py").write_text(
        (tree / "strategies" / "framing.py").read_text() + "\n# a new mutation\n")
    assert _digest(tree) != key


def test_planted_a_closure_of_top_level_imports_only_misses_the_function_level_one(
        tree, monkeypatch):
    """The check above is not vacuous: following only module-level imports loses
    impls/cache.py, whose change then keeps a stale key."""
    import ast
    real_walk = ast.walk
    monkeypatch.setattr(memo.ast, "walk", lambda node: iter(getattr(node, "body", [])))
    assert "impls/cache.py" not in _names(tree)
    monkeypatch.setattr(memo.ast, "walk", real_walk)
    assert "impls/cache.py" in _names(tree)


def test_the_key_of_the_installed_sweep_is_a_short_hex_digest():
    key = memo.closure_digest("harness.fuzz.sweep")
    assert len(key) == 16 and int(key, 16) >= 0
