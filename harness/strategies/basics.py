"""Building blocks: buffers, dialects, type ids, names, conn_caps and ``rpc_tensor`` records."""

from __future__ import annotations

import struct
from functools import lru_cache
from typing import Iterable, NamedTuple, Sequence, Union

from hypothesis import strategies as st

from ..proto import ggml
from ..proto.constants import CONN_CAPS_SIZE
from ..proto.dialects import DIALECTS, Dialect, get_dialect
from ..proto.tensor import RpcTensor, nbytes
from ..proto.wire import I32_MAX, I32_MIN, U8_MAX, U32_MAX, U64_MAX  # noqa: F401 - re-exported


VALID_TYPE_IDS: tuple[int, ...] = tuple(i for i, t in enumerate(ggml.TYPES) if t.blck_size)
REMOVED_TYPE_IDS: tuple[int, ...] = tuple(i for i, t in enumerate(ggml.TYPES) if not t.blck_size)
# 43 = GGML_TYPE_COUNT (first id the 7.0.0 server rejects), 99 seen on the wire [V].
INVALID_TYPE_IDS: tuple[int, ...] = (43, 44, 99, 255, 1 << 31, U32_MAX)

# Elementwise ops keep graph shapes consistent, so a generated graph also computes on a real
# backend. Ids from the 7.0.0 enum (spec A.2).
_BINARY_OPS = tuple(ggml.OP[n] for n in ("ADD", "SUB", "MUL", "DIV"))
_UNARY_OPS = tuple(ggml.OP[n] for n in ("DUP", "SQR", "SQRT", "CONT"))
_OP_VIEW = ggml.OP["VIEW"]


# ---------------------------------------------------------------- building blocks

class BufferRegion(NamedTuple):
    """A server buffer as the client knows it: ALLOC_BUFFER handle, BUFFER_GET_BASE base, size.

    Pass real ones (from a live session) to place tensors inside buffers the server knows;
    otherwise :func:`buffer_regions` draws plausible ones.
    """

    handle: int
    base: int
    size: int

    @property
    def end(self) -> int:
        return self.base + self.size


#: The ``buffers`` knob: live regions to sample from, a strategy for them, or None.
Buffers = Union[Sequence[BufferRegion], st.SearchStrategy[BufferRegion], None]


@lru_cache(maxsize=None)
def _heap_pointers(align: int = 16) -> st.SearchStrategy[int]:
    # Linux x86-64 heap/mmap addresses look like 0x55xx_xxxx_xxxx .. 0x7fxx_xxxx_xxxx.
    low, high = 0x5555_0000_0000 // align, 0x7FFF_FFFF_0000 // align
    return st.integers(low, high).map(lambda p: p * align)


@lru_cache(maxsize=None)
def buffer_regions(*, min_size: int = 0,
                   max_size: int = 1 << 20) -> st.SearchStrategy[BufferRegion]:
    """Plausible buffers: 16-aligned handle, 32-aligned base (the CPU alignment), a size in
    ``[min_size, max_size]`` biased towards the small sizes the real-server vectors use."""
    common = [s for s in (256, 1024, 4096, 65536) if min_size <= s <= max_size]
    sizes = st.integers(min_size, max_size)
    if common:
        sizes = st.one_of(st.sampled_from(common), sizes)
    return st.builds(BufferRegion, _heap_pointers(16), _heap_pointers(32), sizes)


def dialects(names: Iterable[str] | None = None) -> st.SearchStrategy[Dialect]:
    """One of the known dialects (all of :data:`~harness.proto.DIALECTS` by default)."""
    return st.sampled_from([get_dialect(n) for n in (names if names is not None else DIALECTS)])


@lru_cache(maxsize=None)
def type_ids(kind: str = "valid") -> st.SearchStrategy[int]:
    """``ggml_type`` ids: ``"valid"`` (non-zero block size), ``"removed"`` (block size 0),
    ``"invalid"`` (>= GGML_TYPE_COUNT), or ``"any"`` (any u32, biased to the interesting ones)."""
    if kind == "valid":
        return st.sampled_from(VALID_TYPE_IDS)
    if kind == "removed":
        return st.sampled_from(REMOVED_TYPE_IDS)
    if kind == "invalid":
        return st.one_of(st.sampled_from(INVALID_TYPE_IDS), st.integers(ggml.TYPE_COUNT, U32_MAX))
    if kind == "any":
        return st.one_of(st.sampled_from(VALID_TYPE_IDS + REMOVED_TYPE_IDS + INVALID_TYPE_IDS),
                         st.integers(0, U32_MAX))
    raise ValueError(f"unknown type-id kind {kind!r}")


def _pad_name(raw: bytes) -> bytes:
    return raw[:ggml.MAX_NAME - 1].ljust(ggml.MAX_NAME, b"\0")


@lru_cache(maxsize=None)
def tensor_names(*, raw: bool = False) -> st.SearchStrategy[bytes]:
    """The 64-byte ``name`` field. By default like the C client writes it: a short ASCII name
    (often llama.cpp style, e.g. ``blk.3.attn_q.weight``), NUL-terminated and zero padded.
    ``raw=True``: any 64 bytes (no terminator guaranteed)."""
    if raw:
        return st.binary(min_size=ggml.MAX_NAME, max_size=ggml.MAX_NAME)
    llama = st.builds(lambda i, part: f"blk.{i}.{part}".encode(), st.integers(0, 79),
                      st.sampled_from(("attn_q.weight", "attn_k.weight", "ffn_up.weight",
                                       "attn_norm.weight", "ffn_down.weight")))
    short = st.text("abcdefghijklmnopqrstuvwxyz0123456789_.", max_size=63).map(str.encode)
    return st.one_of(st.just(b""), llama, short).map(_pad_name)


@lru_cache(maxsize=None)
def conn_caps(*, zero_only: bool = False) -> st.SearchStrategy[bytes]:
    """24-byte HELLO ``conn_caps``: all zero (plain TCP) or the Linux RDMA layout
    (``qpn u32, psn u32 = qpn & 0xFFFFFF, gid[16]`` with an IPv4-mapped GID, spec 10.1)."""
    zero = st.just(bytes(CONN_CAPS_SIZE))
    if zero_only:
        return zero

    def linux(qpn: int, ip: bytes) -> bytes:
        gid = bytes(10) + b"\xff\xff" + ip
        return struct.pack("<II", qpn, qpn & 0xFFFFFF) + gid

    return st.one_of(zero, st.builds(linux, st.integers(1, 0xFFFFFF),
                                     st.binary(min_size=4, max_size=4)))


def _tensor_nbytes(t: RpcTensor) -> int:
    """nbytes for placement; tensors of an invalid type are sized as if they were f32."""
    traits = ggml.type_traits(t.type)
    return nbytes(t if traits is not None and traits.blck_size else t.with_(type=ggml.TYPE_F32))


def _strides_for(type_id: int, ne) -> tuple[int, int, int, int]:
    traits = ggml.type_traits(type_id)
    ok = traits is not None and traits.blck_size
    return tuple(s & U32_MAX for s in ggml.contiguous_strides(type_id if ok else ggml.TYPE_F32, ne))


def _place(draw, t: RpcTensor, region: BufferRegion, alignment: int) -> RpcTensor:
    """Put ``t`` at an aligned offset of ``region`` so that it lies entirely inside it.

    A tensor too big for the region is shrunk to one block; if even that does not fit (tiny or
    empty region) it gets ``ne[0] = 0`` (zero elements, nbytes 0) and sits at the base.
    """
    n = _tensor_nbytes(t)
    if n > region.size:
        traits = ggml.type_traits(t.type)
        blck = traits.blck_size if traits is not None and traits.blck_size else 1
        ne = (blck, 1, 1, 1)
        t = t.with_(ne=ne, nb=_strides_for(t.type, ne))
        n = _tensor_nbytes(t)
        if n > region.size:
            ne = (0, 1, 1, 1)
            t = t.with_(ne=ne, nb=_strides_for(t.type, ne))
            n = 0
    slots = (region.size - n) // alignment
    offset = draw(st.integers(0, slots)) * alignment
    return t.with_(buffer=region.handle, data=region.base + offset)


@st.composite
def rpc_tensors(draw, *, types: str | st.SearchStrategy[int] = "valid",
                buffers: Buffers = None,
                ids: st.SearchStrategy[int] | None = None,
                names: st.SearchStrategy[bytes] | None = None,
                ops: st.SearchStrategy[int] | None = None,
                flags: st.SearchStrategy[int] | None = None,
                max_dim: int = 4, strides: str = "contiguous", alignment: int = 32,
                any_pointers: bool = False) -> RpcTensor:
    """``rpc_tensor`` records (:class:`~harness.proto.RpcTensor`).

    * ``types``: ``"valid"`` | ``"removed"`` | ``"invalid"`` | ``"any"`` (see :func:`type_ids`)
      or a strategy of ids.
    * Shape: ``ne[0]`` is a multiple of the type's block size (what real clients send),
      every ``ne[i]`` at most ``max_dim`` blocks/elements; ``strides="contiguous"`` gives the
      ``nb`` of a fresh ggml tensor, ``"any"`` arbitrary u32 strides.
    * Placement: with ``buffers`` (a sequence of, or strategy for, :class:`BufferRegion`) the
      tensor gets that buffer's handle and a ``data`` pointer (``alignment``-aligned) such
      that ``[data, data + nbytes)`` lies inside ``[base, base + size)``; ``"valid"`` types
      are then limited to those of which one block fits the buffer. Without buffers
      ``buffer = data = 0`` (a host tensor, or one of another server). ``any_pointers=True``
      draws both as arbitrary u64 instead.
    * ``ids`` (default: non-zero heap-like addresses), ``names`` (default
      :func:`tensor_names`), ``ops`` and ``flags`` (default 0). ``op_params``, ``src``,
      ``view_*`` and ``use_count`` are zero, as for a standalone tensor.
    """
    if strides not in ("contiguous", "any"):
        raise ValueError(f"strides must be 'contiguous' or 'any', not {strides!r}")
    region = None if buffers is None or any_pointers else draw(_regions(buffers))
    return _draw_tensor(draw, region, types=types, ids=ids, names=names, ops=ops, flags=flags,
                        max_dim=max_dim, strides=strides, alignment=alignment,
                        any_pointers=any_pointers)


def _draw_tensor(draw, region: BufferRegion | None, *, types="valid", ids=None, names=None,
                 ops=None, flags=None, max_dim: int = 4, strides: str = "contiguous",
                 alignment: int = 32, any_pointers: bool = False) -> RpcTensor:
    """rpc_tensors' body as a plain function, so other strategies can call it without
    building (and validating) a new strategy object per draw."""
    if types == "valid" and region is not None:
        # Only types of which one block fits the region, so the tensor can lie inside it.
        fitting = tuple(i for i in VALID_TYPE_IDS if ggml.TYPES[i].type_size <= region.size)
        types = _sampled(fitting) if fitting else type_ids("valid")
    elif isinstance(types, str):
        types = type_ids(types)
    type_id = draw(types)
    traits = ggml.type_traits(type_id)
    blck = traits.blck_size if traits is not None and traits.blck_size else 1
    dim = st.integers(1, max_dim)
    ne = (blck * draw(dim), draw(dim), draw(dim), draw(dim))
    if strides == "contiguous":
        nb = _strides_for(type_id, ne)
    else:
        nb = tuple(draw(_U32_QUAD))
    t = RpcTensor(id=draw(ids if ids is not None else _heap_pointers(16)), type=type_id,
                  ne=ne, nb=nb, op=draw(ops) if ops is not None else 0,
                  flags=draw(flags) if flags is not None else 0,
                  name=draw(names if names is not None else tensor_names()))
    if any_pointers:
        return t.with_(buffer=draw(_U64), data=draw(_U64))
    if region is None:
        return t
    if strides == "any" and _tensor_nbytes(t) > region.size:
        t = t.with_(nb=_strides_for(type_id, ne))  # so that _place can fit it
    return _place(draw, t, region, alignment)


_U64 = st.integers(0, U64_MAX)
_U32_QUAD = st.lists(st.integers(0, U32_MAX), min_size=4, max_size=4)



def _regions(buffers, default: st.SearchStrategy[BufferRegion] | None = None,
             ) -> st.SearchStrategy[BufferRegion]:
    if buffers is None:
        return default if default is not None else buffer_regions()
    if isinstance(buffers, st.SearchStrategy):
        return buffers
    return _sampled(tuple(buffers))


@lru_cache(maxsize=256)
def _sampled(items: tuple) -> st.SearchStrategy:
    return st.sampled_from(items)
