"""A cache entry's manifest.json: what was built from what, and whether the entry is usable."""

from __future__ import annotations

import json
import os
from pathlib import Path

from .cache import entry_dirs
from .pins import Pin, pin_from_record
from .recipe import cmake_flags

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 1  # new keys are optional, so entries written before variants stay valid
_VARIANT_FIELDS = ("base", "patch_sha256", "sanitize", "rdma")


def read_manifest(entry_dir: Path) -> dict | None:
    try:
        return json.loads((Path(entry_dir) / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return None


def write_manifest(entry_dir: Path, manifest: dict) -> None:
    (Path(entry_dir) / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")


def manifest_problem(pin: Pin, manifest: dict | None, targets: tuple[str, ...] = ()) -> str | None:
    """Why a cache entry cannot be used as is (None when it can)."""
    if manifest is None:
        return "not built"
    recorded = manifest.get("pin", {})
    if manifest.get("format") != MANIFEST_FORMAT or recorded.get("name") != pin.name:
        return "cache entry from another harness version"
    defaults = Pin.__dataclass_fields__
    for name in _VARIANT_FIELDS:
        value = recorded.get(name, defaults[name].default)
        if (tuple(value) if isinstance(value, list) else value) != getattr(pin, name):
            return f"cache entry built with another {name.replace('_', ' ')}"
    # entries from before the flags were recorded are releases built with today's flags
    if manifest.get("cmake_flags") not in (None, cmake_flags(pin)):
        return "cache entry built with other cmake options"
    # a registry build not yet resolved (proto "") takes what its build verified
    if pin.proto and manifest.get("verified_proto") != pin.proto:
        return f"cache entry verified as {manifest.get('verified_proto')}, pin says {pin.proto}"
    missing = [f for f in manifest.get("files", []) if not os.path.lexists(pin.bin_dir / f)]
    if missing or not manifest.get("files"):
        return f"cache entry incomplete (missing {', '.join(missing[:3]) or 'file list'})"
    lacking = [t for t in targets if t not in manifest.get("targets", [])]
    if lacking:
        return f"cache entry lacks targets {', '.join(lacking)}"
    return None


def built_entries() -> list[tuple[Pin, dict]]:
    """(pin, manifest) of every entry in the cache whose manifest names the pin it holds."""
    out = []
    for entry in entry_dirs():
        manifest = read_manifest(entry)
        if not manifest or not isinstance(manifest.get("pin"), dict):
            continue
        try:
            pin = pin_from_record(manifest["pin"])
        except TypeError:
            continue  # a manifest from a harness with other pin fields
        if pin.key == entry.name:
            out.append((pin, manifest))
    return out
