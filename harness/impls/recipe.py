"""How a pin is configured: the cmake options of a release build and what each variant adds.

Kept apart from the build driver so a manifest can tell that an entry was made with other
options (``manifest.manifest_problem``) without importing the builder.
"""

from __future__ import annotations

from . import sanitize
from .pins import Pin

# Portable, shared, RPC-only, nothing fetched at build time. RDMA is off unless the variant
# asks for it: with libibverbs-dev installed, sources with the transport would silently turn
# it on. The install RPATH ($ORIGIN) is used at build time so the bin dir still works after it
# is moved into the cache.
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=ON",
    "-DGGML_RPC=ON",
    "-DGGML_NATIVE=OFF",
    "-DGGML_OPENMP=ON",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
    "-DCMAKE_INSTALL_RPATH=$ORIGIN",
)


def cmake_flags(pin: Pin, tests: bool = False) -> list[str]:
    """Everything passed to cmake's configure step for ``pin`` (its variant included)."""
    flags = [f for f in CMAKE_FLAGS if not (pin.sanitize and f.startswith("-DCMAKE_BUILD_TYPE="))]
    flags.append(f"-DGGML_RPC_RDMA={'ON' if pin.rdma else 'OFF'}")
    flags += sanitize.cmake_flags(pin.sanitize,
                                  sanitize.clang_toolchain() if pin.sanitize else None)
    flags.append(f"-DLLAMA_BUILD_TESTS={'ON' if tests else 'OFF'}")
    return flags
