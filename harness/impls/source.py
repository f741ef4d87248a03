"""Facts about a llama.cpp source tree, and patching it.

A patch is a unified diff relative to the llama.cpp root, applied with GNU patch (-p1, as
``git diff`` writes it). It is dry-run first, so a patch that does not apply changes nothing;
no fuzz is allowed (a hunk that only fits loosely is likely the wrong place), offsets are.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from pathlib import Path

from .errors import PatchRejected, ToolMissing
from .tools import find_tool

PATCH_TIMEOUT = 120.0
_RPC_CMAKE = Path("ggml") / "src" / "ggml-rpc" / "CMakeLists.txt"
_HUNK_FAILED_RE = re.compile(r"^Hunk #(\d+) FAILED at (\d+)")
_CHECKING_RE = re.compile(r"^(?:checking|patching) file (.+)$")


def proto_from_header(text: str) -> str | None:
    """RPC_PROTO_{MAJOR,MINOR,PATCH}_VERSION from the text of ggml-rpc.h."""
    parts = []
    for which in ("MAJOR", "MINOR", "PATCH"):
        m = re.search(rf"#define\s+RPC_PROTO_{which}_VERSION\s+(\d+)", text)
        if not m:
            return None
        parts.append(m.group(1))
    return ".".join(parts)


def header_proto(source_dir: Path) -> str | None:
    """The proto of the tree under source_dir (its ggml/include/ggml-rpc.h)."""
    header = Path(source_dir) / "ggml" / "include" / "ggml-rpc.h"
    try:
        return proto_from_header(header.read_text(errors="replace"))
    except OSError:
        return None


# where llama.cpp has kept the RPC server over time (tools/ since mid 2025)
SERVER_DIRS = (Path("tools") / "rpc", Path("examples") / "rpc")
_TARGET_RES = (re.compile(r"set\s*\(\s*TARGET\s+([\w.-]*rpc-server)\s*\)"),
               re.compile(r"add_executable\s*\(\s*([\w.-]*rpc-server)\b"))


def server_target_from_cmake(text: str) -> str | None:
    """The RPC server's target named in the text of its CMakeLists.txt."""
    for pattern in _TARGET_RES:
        m = pattern.search(text)
        if m:
            return m.group(1)
    return None


def server_target(source_dir: Path) -> str | None:
    """The cmake target of the tree's RPC server (``rpc-server`` up to mid 2026, then
    ``ggml-rpc-server``), read from its CMakeLists.txt; None when the tree has none."""
    for sub in SERVER_DIRS:
        try:
            text = (Path(source_dir) / sub / "CMakeLists.txt").read_text(errors="replace")
        except OSError:
            continue
        found = server_target_from_cmake(text)
        if found:
            return found
    return None


# a build dir inside the tree (cmake -B build) holds this; its contents are outputs, not sources
_BUILD_DIR_MARK = "CMakeCache.txt"
_VCS_DIRS = frozenset({".git", ".hg", ".svn"})
GIT_TIMEOUT = 30.0


def tree_fingerprint(source_dir: Path) -> str:
    """sha256 of a llama.cpp tree's content: every file's path and bytes (a symlink's target),
    leaving out version-control metadata and build dirs inside the tree. Two trees with the
    same fingerprint build the same peer with the same recipe, wherever they lie on disk."""
    root = Path(source_dir)
    h = hashlib.sha256()
    for top, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _VCS_DIRS
                         and not (Path(top) / d / _BUILD_DIR_MARK).is_file())
        for name in sorted(files):
            path = Path(top) / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                data = b"symlink:" + os.readlink(path).encode()
            elif path.is_file():
                data = path.read_bytes()
            else:
                continue  # a socket or fifo left in the tree is not a source
            h.update(rel.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
    return h.hexdigest()


def tree_commit(source_dir: Path) -> str | None:
    """The git commit a checked-out tree is at (None outside git, or when git is absent)."""
    git = find_tool("git")
    if git is None or not (Path(source_dir) / ".git").exists():
        return None
    try:
        done = subprocess.run([git, "-C", str(source_dir), "rev-parse", "HEAD"],
                              capture_output=True, text=True, timeout=GIT_TIMEOUT,
                              stdin=subprocess.DEVNULL)
    except (subprocess.SubprocessError, OSError):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


def has_rdma_transport(source_dir: Path) -> bool:
    """True when the tree's ggml-rpc has the GGML_RPC_RDMA cmake option (the verbs transport)."""
    try:
        text = (Path(source_dir) / _RPC_CMAKE).read_text(errors="replace")
    except OSError:
        return False
    return re.search(r"option\s*\(\s*GGML_RPC_RDMA\b", text) is not None


def _hunk_text(diff: str, file: str, number: int, limit: int = 12) -> list[str]:
    """The ``number``-th hunk (1-based) of ``file`` in ``diff``: its @@ line and first lines."""
    in_file, seen, out = False, 0, []
    for line in diff.splitlines():
        if line.startswith("+++ "):
            target = line[4:].split("\t")[0].strip()
            in_file = target.split("/", 1)[-1] == file or target == file
            continue
        if not in_file:
            continue
        if line.startswith("@@"):
            seen += 1
            if seen > number:
                break
        if seen == number:
            out.append(line)
    return out[:limit] + (["    ..."] if len(out) > limit else [])


def apply_patch(source_dir: Path, patch_file: Path) -> list[str]:
    """Apply ``patch_file`` to the tree; returns patch's report (offsets) for the manifest.

    Raises PatchRejected naming each rejected hunk (file, number, line, and its text), with
    the tree untouched.
    """
    tool = find_tool("patch")
    if tool is None:
        raise ToolMissing("cannot apply a patch: GNU patch is not installed (apt-get install patch)")
    try:
        diff = Path(patch_file).read_text(errors="replace")
    except OSError as e:
        raise PatchRejected(f"cannot read patch {patch_file}: {e}") from None
    base = [tool, "-p1", "--batch", "--forward", "--fuzz=0", "--no-backup-if-mismatch",
            "-d", str(source_dir), "-i", str(Path(patch_file).resolve())]
    for dry in (True, False):
        cmd = base + (["--dry-run"] if dry else [])
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, errors="replace",
                                  timeout=PATCH_TIMEOUT, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise PatchRejected(f"patch {patch_file} took over {PATCH_TIMEOUT:g} s",
                                command=cmd) from None
        output = (done.stdout + done.stderr).splitlines()
        if done.returncode != 0:
            raise PatchRejected(_rejection(patch_file, diff, output), command=cmd,
                                output_tail=output[-30:])
    return output


def _rejection(patch_file: Path, diff: str, output: list[str]) -> str:
    lines, current = [], None
    for line in output:
        m = _CHECKING_RE.match(line)
        if m:
            current = m.group(1).strip()
            continue
        m = _HUNK_FAILED_RE.match(line)
        if m and current:
            number, at = int(m.group(1)), int(m.group(2))
            lines.append(f"  hunk #{number} of {current} (at line {at}) does not apply:")
            lines += ["    " + h for h in _hunk_text(diff, current, number)]
    if not lines:  # a missing file, a reversed patch, garbage input: patch's own words
        lines = ["  " + line for line in output if line.strip()][:10]
    return f"patch {Path(patch_file).name} does not apply:\n" + "\n".join(lines)
