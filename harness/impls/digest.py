"""The RPC source digest of a llama.cpp build: builds with the same digest cannot differ on
the wire, so they form one equivalence class (the matrix and bisect run one of each).

For a source build the digest covers what decides the bytes on the wire and the server's
handling of them:

* every source file of ``ggml/src/ggml-rpc/`` (``ggml-rpc.cpp`` and the transport files);
* ``ggml/include/ggml-rpc.h`` (proto version, message structs);
* the RPC server's ``rpc-server.cpp`` (``tools/rpc`` or, earlier, ``examples/rpc``);
* the ``ggml_op`` and ``ggml_type`` enums of ``ggml/include/ggml.h``: op and type ids travel
  in GRAPH_COMPUTE and in every tensor, so a renumbering changes the wire without touching
  a file above.

Files are keyed by their role, not their path, so a move (``examples/rpc`` to ``tools/rpc``)
does not split a class. What the digest does not cover is said where it matters: the
backends' kernels (a crash inside a CPU kernel can differ between builds of one class).

For a prebuilt wheel the digest is the sha256 of its RPC library (``libggml-rpc.so``).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from .errors import BuildError

DIGEST_FORMAT = 1
RPC_DIR = PurePosixPath("ggml/src/ggml-rpc")
RPC_HEADER = PurePosixPath("ggml/include/ggml-rpc.h")
GGML_HEADER = PurePosixPath("ggml/include/ggml.h")
SERVER_SOURCES = (PurePosixPath("tools/rpc/rpc-server.cpp"),
                  PurePosixPath("examples/rpc/rpc-server.cpp"))
_SOURCE_SUFFIXES = (".cpp", ".c", ".h", ".hpp")
_ENUMS = ("ggml_op", "ggml_type")
WHEEL_RPC_LIBRARY = "libggml-rpc"


@dataclass(frozen=True)
class RpcDigest:
    digest: str  # sha256 hex over the parts
    parts: dict[str, str] = field(default_factory=dict)  # role -> sha256 of that part
    kind: str = "source"  # "source" | "library"

    @property
    def short(self) -> str:
        """The equivalence class's name: the digest's first 10 hex digits."""
        return self.digest[:10]

    def to_dict(self) -> dict:
        return {"format": DIGEST_FORMAT, "digest": self.digest, "kind": self.kind,
                "parts": dict(self.parts)}

    @classmethod
    def from_dict(cls, data: dict) -> "RpcDigest | None":
        if not isinstance(data, dict) or data.get("format") != DIGEST_FORMAT:
            return None
        return cls(data["digest"], dict(data.get("parts", {})), data.get("kind", "source"))


def _enum_text(header: str, name: str) -> str | None:
    m = re.search(r"enum\s+" + re.escape(name) + r"\s*\{(.*?)\}", header, re.S)
    if m is None:
        return None
    body = re.sub(r"//[^\n]*|/\*.*?\*/", "", m.group(1), flags=re.S)  # comments do not count
    return " ".join(body.split())


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _combine(parts: dict[str, str], kind: str) -> RpcDigest:
    text = "".join(f"{role}\t{sha}\n" for role, sha in sorted(parts.items()))
    return RpcDigest(_sha(f"{kind}:{DIGEST_FORMAT}\n{text}".encode()), parts, kind)


def digest_role(rel: PurePosixPath) -> str | None:
    """The role of a file of the llama.cpp tree (path relative to its root) in the digest,
    or None if it has none."""
    if rel in SERVER_SOURCES:
        return "rpc-server.cpp"
    if rel == RPC_HEADER or rel == GGML_HEADER:
        return str(rel)
    if rel.parent == RPC_DIR and rel.suffix in _SOURCE_SUFFIXES:
        return str(rel)
    return None


class NoRpcSources(BuildError):
    """The tree or archive has no ggml-rpc sources: the build does not speak RPC."""


def digest_of_files(files: dict[str, bytes], where: str) -> RpcDigest:
    """The digest of the files of a tree, keyed by their ``digest_role``."""
    parts: dict[str, str] = {}
    for role, data in files.items():
        if role == str(GGML_HEADER):
            text = data.decode(errors="replace")
            for enum in _ENUMS:
                body = _enum_text(text, enum)
                if body is not None:
                    parts[f"{GGML_HEADER}#enum {enum}"] = _sha(body.encode())
        else:
            parts[role] = _sha(data)
    if str(RPC_HEADER) not in parts or not any(r.startswith(f"{RPC_DIR}/") for r in parts):
        raise NoRpcSources(f"{where}: no {RPC_HEADER} and {RPC_DIR}/ (a build without the RPC "
                           "backend)")
    return _combine(parts, "source")


def tree_digest(source_dir: Path) -> RpcDigest:
    """The digest of an unpacked llama.cpp tree (after any patch: a patched build is its own
    class)."""
    root = Path(source_dir)
    candidates = [root / RPC_HEADER, root / GGML_HEADER, *(root / s for s in SERVER_SOURCES)]
    if (root / RPC_DIR).is_dir():
        candidates += sorted(p for p in (root / RPC_DIR).iterdir() if p.is_file())
    files = {}
    for path in candidates:
        role = digest_role(PurePosixPath(path.relative_to(root).as_posix()))
        if role is not None and path.is_file():
            files[role] = path.read_bytes()
    return digest_of_files(files, str(root))


def library_digest(data: bytes) -> RpcDigest:
    """The digest of a prebuilt RPC library (a wheel's ``libggml-rpc.so``, as shipped)."""
    return _combine({f"{WHEEL_RPC_LIBRARY}.so": _sha(data)}, "library")
