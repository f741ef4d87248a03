"""Allow-lists of the differential: differences between two servers that are not bugs
(built-in ones, the lists shipped per dialect in harness/data/differential, a user's
``--allow FILE``), loaded, validated and matched against a divergence's line."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from ..data import ALLOW_LISTS, shipped
from .errors import DifferentialError


#: Differences that are not bugs: the same on every run of any two builds.
UNWRITTEN = "unwritten"  # an answer entry's bytes: those the session did not write
DEFAULT_ALLOW: list[dict] = [
    {"cmd": "GET_DEVICE_MEMORY", "kind": "answer",
     "reason": "free and total device memory are the host's (and the server's budget)"},
    {"cmd": "GET_TENSOR", "kind": "answer", "bytes": UNWRITTEN,
     "reason": "bytes never written: a fresh buffer holds what its allocator left there (only "
               "bytes the session did not write, harness/fuzz/written.py, are masked)"},
    {"cmd": "GET_TENSOR_2D", "kind": "answer", "bytes": UNWRITTEN,
     "reason": "bytes never written: a fresh buffer holds what its allocator left there (only "
               "bytes the session did not write, harness/fuzz/written.py, are masked)"},
    {"cmd": "*", "kind": "close", "match": r" same-step$",
     "reason": "both answered the same steps and nothing answered follows: whether a client "
               "sees the close before it has sent the rest is timing, which the wire cannot "
               "prove either way (two identical servers differ here)"},
]


SHIPPED_ALLOW_DIR = shipped(ALLOW_LISTS)


def shipped_allow_list(dialect: str) -> Path | None:
    """The allow-list shipped for a dialect's real builds (harness/data/differential), if any."""
    path = SHIPPED_ALLOW_DIR / f"allow-{dialect}.yaml"
    return path if path.is_file() else None


def load_allow(path: Path | None, *, defaults: bool = True,
               _including: set[Path] | None = None) -> list[dict]:
    entries = list(DEFAULT_ALLOW) if defaults else []
    if path is None:
        return entries
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise DifferentialError(f"cannot read allow-list {path}: {e}") from None
    if not isinstance(data, list):
        raise DifferentialError(f"{path}: an allow-list is a list of entries")
    for e in data:
        if isinstance(e, dict) and set(e) == {"include"}:
            # another list's entries (a patched build shares its base's real-server bugs)
            chain = (_including or set()) | {Path(path).resolve()}
            included = Path(path).parent / str(e["include"])
            if included.resolve() in chain:
                raise DifferentialError(f"{path}: include cycle through {included}")
            entries += load_allow(included, defaults=False, _including=chain)
            continue
        if not isinstance(e, dict) or "cmd" not in e or e.get("kind", "answer") not in (
                "answer", "close", "death"):
            raise DifferentialError(f"{path}: bad entry {e!r} (needs cmd, kind answer|close|"
                                    "death, optional bytes: [start, end], reason)")
        if "match" in e:
            try:
                re.compile(e["match"])
            except (re.error, TypeError) as err:
                raise DifferentialError(f"{path}: bad match {e['match']!r}: {err}") from None
        b = e.get("bytes")
        if b is not None and b != UNWRITTEN and not (
                isinstance(b, list) and len(b) == 2 and all(isinstance(x, int) and x >= 0
                                                            for x in b)):
            raise DifferentialError(f"{path}: bytes must be [start, end] or {UNWRITTEN!r}, "
                                    f"not {b!r}")
        entries.append({"kind": "answer", **e, "_from": str(path)})
    if _including is None:
        # an entry that repeats another (often one an include already holds) can never let a
        # session pass (the first match takes it), and its count of 0 reads as a stale entry
        first: dict[tuple, str] = {}
        for e in entries:
            key = (e["cmd"], e["kind"], repr(e.get("bytes")), e.get("match"))
            if key in first:
                raise DifferentialError(
                    f"{e['_from']}: the entry {e['cmd']} {e['kind']} "
                    f"{e.get('match') or ''} repeats one in {first[key]}")
            first[key] = e.pop("_from", "the built-in list")
    return entries


def allowing(allow: list[dict], kind: str, cmd: str, line: str = "") -> dict | None:
    """The first entry naming the kind and command (``cmd: "*"``: any) whose optional
    ``match``, a regular expression, the divergence's line contains (e.g. one assert of one
    side); None if no entry allows it. An answer entry without ``match`` masks bytes
    (:func:`_masked`): it lets no line pass."""
    return next((e for e in allow if e["kind"] == kind and e["cmd"] in (cmd, "*")
                 and (kind != "answer" or "match" in e)
                 and (e.get("match") is None or re.search(e["match"], line))), None)


def _allowed(allow: list[dict], kind: str, cmd: str, line: str = "") -> bool:
    return allowing(allow, kind, cmd, line) is not None
