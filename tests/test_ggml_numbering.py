"""Each dialect's ggml op/type numbering is the one its real build has: names read through
the build's own libggml-base (ggml_op_name, ggml_type_name/size, ggml_blck_size) and, where the
pin is built from an sdist, the enum lengths in its ggml.h."""

from __future__ import annotations

import ctypes
import re
import tarfile

import pytest

from harness.impls.registry import get_peer, get_pin
from harness.proto import get_dialect
from harness.proto.ggml import GGML_7, GGML_361, GGML_402

PINS = ["p3", "p4", "p5", "p6", "p7", "p8"]


def _library(peer) -> ctypes.CDLL:
    for name in ("libisoc23shim.so",):  # the wheel's glibc compat shim, loaded first
        shim = peer.lib_dir / name
        if shim.exists():
            ctypes.CDLL(str(shim), mode=ctypes.RTLD_GLOBAL)
    lib = ctypes.CDLL(str(peer.lib_dir / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    lib.ggml_op_name.restype = lib.ggml_type_name.restype = ctypes.c_char_p
    lib.ggml_op_name.argtypes = lib.ggml_type_name.argtypes = [ctypes.c_int]
    lib.ggml_type_size.restype, lib.ggml_type_size.argtypes = ctypes.c_size_t, [ctypes.c_int]
    lib.ggml_blck_size.restype, lib.ggml_blck_size.argtypes = ctypes.c_int64, [ctypes.c_int]
    return lib


def _header_counts(archive, subdir: str) -> tuple[int, int] | None:
    with tarfile.open(archive) as tf:
        member = next((m for m in tf.getmembers()
                       if m.name.endswith(f"{subdir}/ggml/include/ggml.h")), None)
        if member is None:
            return None
        text = tf.extractfile(member).read().decode()
    ops = text[text.index("enum ggml_op {"):].split("};", 1)[0]
    n_ops = len([n for n in re.findall(r"^\s*GGML_OP_([A-Z0-9_]+)\s*(?:=\s*0\s*)?,", ops, re.M)
                 if n != "COUNT"])
    n_types = int(re.search(r"GGML_TYPE_COUNT\s*=\s*(\d+)", text).group(1))
    return n_ops, n_types


def test_older_trees_shift_the_op_ids():
    assert GGML_402.op["UNARY"] == 88 and GGML_7.op["UNARY"] == 91
    assert GGML_361.op["CONV_2D"] == 55 and GGML_7.op["CONV_2D"] == 56
    assert get_dialect("3.6.1").numbering is GGML_361 and GGML_361.type_count == 41


@pytest.mark.realpeer
@pytest.mark.parametrize("pin", PINS)
def test_dialect_numbering_is_the_real_builds(pin):
    peer = get_peer(pin)
    if not peer.available:
        pytest.fail(f"{pin} is one of the test peers (make peers): {peer.reason}")
    numbering = get_dialect(peer.proto).numbering
    lib = _library(peer)
    assert [lib.ggml_op_name(i).decode() for i in range(numbering.op_count)] == \
        list(numbering.ops)
    for i, t in enumerate(numbering.types):
        name = lib.ggml_type_name(i)
        if t.blck_size:  # removed ids have no traits worth comparing
            assert (name.decode(), lib.ggml_type_size(i), lib.ggml_blck_size(i)) == \
                (t.name, t.type_size, t.blck_size), (pin, i)
    pin_info = get_pin(pin)
    if pin_info.kind == "sdist":  # the enum lengths, which the library cannot tell
        from harness.impls.registry import downloads_dir
        archives = sorted(downloads_dir().glob(f"*{pin_info.version}*.tar.gz"))
        assert archives, f"the {pin} sdist is not in the download cache"
        assert _header_counts(archives[0], pin_info.source_subdir) == \
            (numbering.op_count, numbering.type_count)
