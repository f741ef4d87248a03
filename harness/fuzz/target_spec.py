"""``--target`` parsed: which server a campaign fuzzes (a registered peer, a server binary or
build dir, the reference server with its misbehaviour knobs, a Docker image) and the dialect
it speaks. Resolving a spec starts nothing; :class:`harness.fuzz.target.Target` launches it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..impls.registry import PeerError, get_peer
from ..proto import DEFAULT, dialect_for_version, get_dialect
from ..proto.dialects import ALIASES
from ..reference.knobs import parse_knobs
from .errors import TargetError
from .signature import slug


@dataclass(frozen=True)
class TargetSpec:
    """A parsed ``--target``: ``p7`` (registered peer), ``ref`` / ``ref-<dialect>``
    (reference server), ``ref[-<dialect>]:KNOB=V[,KNOB=V]`` (the reference server with
    misbehaviour knobs, e.g. ``ref:stall_on=BUFFER_CLEAR``: a server with a planted bug, to see
    the fuzzer find it), ``docker:IMAGE`` (a server image run under Docker; ``docker:p7``
    builds and runs that pin's image), or a path to a server binary or a llama.cpp build dir."""

    kind: str  # "peer" | "ref" | "binary" | "docker"
    name: str  # for reports and file names
    dialect: str | None  # None: ask the server (HELLO) after the first start
    peer: str | None = None
    binary: str | None = None
    knobs: tuple[str, ...] = ()  # reference server only: `harness serve --knob` values
    image: str | None = None  # docker: an image in the engine, or a pin name

    @classmethod
    def parse(cls, text: str, dialect: str | None = None) -> "TargetSpec":
        text = text.strip()
        if dialect is not None and dialect_or_none(dialect) is None:
            raise TargetError(f"unknown dialect {dialect!r} (see `harness dialects`)")
        head, _, knob_text = text.partition(":")
        if head == "docker":
            if not knob_text:
                raise TargetError(f"{text}: name an image (docker:IMAGE) or a pin (docker:p7)")
            return cls("docker", "docker-" + slug(knob_text), dialect_or_none(dialect),
                       image=knob_text)
        if head == "ref" or head.startswith("ref-"):
            named = head[4:] if head.startswith("ref-") else DEFAULT.name
            name = dialect_or_none(dialect or named)
            if name is None:
                raise TargetError(f"{text}: unknown dialect (see `harness dialects`)")
            knobs = tuple(k.strip() for k in knob_text.split(",") if k.strip())
            try:
                parse_knobs(knobs)
            except ValueError as e:
                raise TargetError(f"{text}: {e}") from None
            return cls("ref", f"ref-{name}" + "".join(f"+{k}" for k in knobs), name,
                       knobs=knobs)
        path = Path(text).expanduser()
        # A bare word names a peer even where a folder of that name exists (a campaign's
        # out dir is often called after its target); paths are spelt with a slash.
        looks_like_path = os.sep in text or text.startswith(("~", "."))
        if path.exists() and (looks_like_path or not _is_peer_name(text)):
            binary = _find_server_binary(path)
            if binary is None:
                raise TargetError(f"{text}: no ggml-rpc-server / rpc-server in it")
            return cls("binary", binary.name, dialect_or_none(dialect),
                       binary=str(binary.resolve()))
        try:
            peer = get_peer(text)
        except PeerError as e:
            raise TargetError(f"unknown target {text!r}: {e} (use a peer name from `harness "
                              "peers list`, ref[-DIALECT], or a server path)") from None
        # a pin's own dialect where the version alone does not tell (p7f: 7.0.0+flags)
        proto = dialect or peer.dialect or peer.proto or peer.verified_proto
        d = dialect_or_none(proto)
        return cls("peer", peer.name, d)

    @property
    def is_reference(self) -> bool:
        return self.kind == "ref"


def _is_peer_name(text: str) -> bool:
    try:
        get_peer(text)
        return True
    except PeerError:
        return False


def dialect_or_none(name: str | None) -> str | None:
    if not name:
        return None
    try:
        return get_dialect(ALIASES.get(name, name)).name
    except ValueError:
        parts = tuple(int(x) for x in name.split(".")) if re.match(r"^\d+\.\d+\.\d+$", name) \
            else None
        d = dialect_for_version(parts) if parts else None
        return d.name if d else None


def server_binary(argv: list[str]) -> str:
    """The server executable of a launch command (past wrappers such as stdbuf)."""
    return next((a for a in argv if "rpc-server" in Path(a).name), argv[0])


def _find_server_binary(path: Path) -> Path | None:
    if path.is_file():
        return path
    for sub in ("", "bin", "build/bin"):
        for name in ("ggml-rpc-server", "rpc-server"):
            cand = path / sub / name
            if cand.is_file():
                return cand
    return None
