"""Values built once and kept in the user cache (``<cache>/sweep``): the sweep's parts and the
covering arrays cost seconds that every campaign, worker and test would otherwise pay again
for the same result. One process builds while the others wait for it (a lock file: two workers
building the same arrays at once would only halve each other's CPU); a damaged or unreadable
entry is built again; a read-only cache costs the time, not the result."""

from __future__ import annotations

import ast
import fcntl
import hashlib
import os
import pickle
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Callable, TypeVar

T = TypeVar("T")


def _load(path: Path):
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except Exception:  # noqa: BLE001 - absent, or damaged in any way: built again
        return None


def cached(kind: str, key: str, version: str, build: Callable[[], T]) -> T:
    """``build()`` for ``key``, kept as ``<kind>-<key>-<version>.pickle``; entries of the same
    kind and key with another version are removed when a new one is written."""
    from ..impls.cache import cache_root
    path = cache_root() / "sweep" / f"{kind}-{key}-{version}.pickle"
    value = _load(path)
    if value is not None:
        return value
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(path.with_suffix(".lock"), "a")
    except OSError:
        return build()
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        value = _load(path)  # built by another process while we waited
        if value is not None:
            return value
        value = build()
        try:
            with tempfile.NamedTemporaryFile("wb", dir=path.parent, delete=False) as f:
                pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(f.name, path)  # atomic: a reader never sees half a file
            for old in path.parent.glob(f"{kind}-{key}-*.pickle"):
                if old != path:
                    old.unlink(missing_ok=True)  # built by an older harness
        except OSError:
            pass
    return value


def cached_dir(kind: str, key: str, version: str, fill: Callable[[Path], None]) -> Path | None:
    """A folder ``fill(folder)`` wrote for ``key``, kept as ``<kind>-<key>-<version>/`` and
    renamed into place whole (a reader never sees half of it); folders of the same kind and
    key with another version are removed when a new one is written. None when the cache
    cannot be written."""
    import shutil
    from ..impls.cache import cache_root
    final = cache_root() / "sweep" / f"{kind}-{key}-{version}"
    if final.is_dir():
        return final
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
        fill(tmp)
        try:
            os.rename(tmp, final)
        except OSError:  # another process renamed its own first
            shutil.rmtree(tmp, ignore_errors=True)
        for old in final.parent.glob(f"{kind}-{key}-*"):
            if old != final:
                shutil.rmtree(old, ignore_errors=True)  # built by an older harness
    except OSError:
        return None
    return final if final.is_dir() else None


@lru_cache(maxsize=None)
def source_digest(*modules: str) -> str:
    """Of the named modules of the harness (file paths under ``harness/``): a value built by
    other code is built again."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for f in (root / m for m in modules):
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def import_closure(module: str, root: Path | None = None) -> list[Path]:
    """The files of ``module`` (dotted, ``harness.fuzz.sweep``) and of every harness module it
    can import: each import statement is followed, those inside functions too, and each
    package above a module; a module's data files (non-Python files whose nearest package is
    one of these) count as its code. What nothing here imports cannot change what it builds."""
    root = root or Path(__file__).resolve().parents[1]
    top = root.name

    def file_of(name: str) -> Path | None:
        base = root.parent.joinpath(*name.split("."))
        for f in (base / "__init__.py", base.with_suffix(".py")):
            if f.is_file():
                return f
        return None

    seen: dict[str, Path] = {}
    todo = [module]
    while todo:
        name = todo.pop()
        f = file_of(name)
        if f is None or name in seen:
            continue
        seen[name] = f
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        package = parts if f.name == "__init__.py" else parts[:-1]
        for node in ast.walk(ast.parse(f.read_bytes(), str(f))):
            if isinstance(node, ast.Import):
                todo += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package[:len(package) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else []))
                todo += [target] + [f"{target}.{a.name}" for a in node.names]
        todo = [t for t in todo if t == top or t.startswith(top + ".")]
    files = set(seen.values())
    packages = {f.parent for f in files if f.name == "__init__.py"}
    for pkg in packages:
        for f in pkg.rglob("*"):
            if f.is_file() and f.suffix != ".py" and "__pycache__" not in f.parts \
                    and _owner(f, root) == pkg:
                files.add(f)
    return sorted(files)


def _owner(f: Path, root: Path) -> Path:
    """The nearest directory above ``f`` that is a package."""
    d = f.parent
    while d != root and not (d / "__init__.py").is_file():
        d = d.parent
    return d


@lru_cache(maxsize=None)
def closure_digest(module: str, root: Path | None = None) -> str:
    """Of what ``module`` can import (:func:`import_closure`): a value it built is kept
    across harness versions that changed none of that code."""
    root = root or Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for f in import_closure(module, root):
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]
