"""Compiled FNV-1a-64 kernels (numba); imported lazily by ``fnv`` so that processes which never
hash a large buffer (a reference server without a cache) do not pay for loading LLVM.

``serial`` is fnv_hash() as ggml-rpc writes it: one xor/multiply per byte, a dependency chain
bound by multiply latency (about 4 cycles a byte). ``sliced`` computes the same value without
that chain:

* The xor only touches the low byte, and the low byte of a product depends only on the low
  bytes of its factors, so the low byte evolves on its own: l' = ((l ^ b) * 0xb3) & 0xff.
* Given l, the 64-bit state is linear: h ^ b = h + d with d = (l ^ b) - l, so over a 64-byte
  block h' = h * P^64 + sum_j d_j * P^(64 - j); the sum is independent multiplies (vectorised).
* The 8-bit chain is solved 64 bytes at a time on bit planes (plane k = bit k of each byte):
  bit k of y * 0xb3 is y_k xor a function of bits below k, so plane by plane, bit k of l
  toggles by a known mask and is a prefix-xor of it (one carry-less multiply by all-ones).
* Planes of a block depend on lower planes of the same block and on the same plane of the
  previous block, so the loop is skewed: one iteration runs planes 0-1 of block w, 2-3 of
  w-1, 4-5 of w-2 and 6-7 of w-3, four independent chains instead of one.

The test suite checks ``sliced`` against ``serial`` and the spec vectors byte for byte.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils, config
from numba.extending import intrinsic

from .wire import U64_MAX

FNV_PRIME = 0x100000001B3
_M64 = U64_MAX
BLOCK = 64

# Q[j] = P^(64 - j): the weight of byte j's difference at the end of its block.
Q = np.array([pow(FNV_PRIME, BLOCK - j, 1 << 64) for j in range(BLOCK)], dtype=np.uint64)
P64 = np.uint64(pow(FNV_PRIME, BLOCK, 1 << 64))

_I8, _I32, _I64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
_V8 = ir.VectorType(_I8, BLOCK)
_V64 = ir.VectorType(_I64, BLOCK)
_V1 = ir.VectorType(ir.IntType(1), BLOCK)
_Z = np.uint64(0)
_ONE = np.uint64(1)
_S63 = np.uint64(63)


def _has_clmul() -> bool:
    # Only when numba compiles for this very CPU and it has PCLMULQDQ (any x86-64 since ~2010).
    if config.CPU_NAME or config.CPU_FEATURES:
        return False
    try:
        from llvmlite import binding
        return bool(binding.get_host_cpu_features().get("pclmul", False))
    except Exception:  # noqa: BLE001 - no feature query: take the portable path
        return False


def _block_ptr(context, builder, aryty, ary, off):
    a = context.make_array(aryty)(context, builder, ary)
    return builder.bitcast(builder.gep(a.data, [off]), _V8.as_pointer())


@intrinsic
def _planes2(typingctx, arr, off, k):
    """Bit planes k and k+1 of the 64 bytes at arr[off:]: bit j of plane k = bit k of byte j."""
    if not isinstance(k, types.IntegerLiteral):
        return None
    k0 = k.literal_value
    sig = types.UniTuple(types.uint64, 2)(arr, off, k)

    def codegen(context, builder, signature, args):
        v = builder.load(_block_ptr(context, builder, signature.args[0], args[0], args[1]),
                         align=1)
        out = []
        for kk in (k0, k0 + 1):
            bit = builder.and_(v, ir.Constant(_V8, [1 << kk] * BLOCK))
            out.append(builder.bitcast(builder.icmp_unsigned("!=", bit,
                                                             ir.Constant(_V8, [0] * BLOCK)), _I64))
        return context.make_tuple(builder, signature.return_type, out)
    return sig, codegen


@intrinsic
def _block_sum(typingctx, arr, off, q, y0, y1, y2, y3, y4, y5, y6, y7):
    """sum_j d_j * q[j] (mod 2^64) with d_j = y_j - (y_j ^ b_j), y given as its 8 planes."""
    sig = types.uint64(arr, off, q, y0, y1, y2, y3, y4, y5, y6, y7)

    def codegen(context, builder, signature, args):
        b = builder.load(_block_ptr(context, builder, signature.args[0], args[0], args[1]),
                         align=1)
        qa = context.make_array(signature.args[2])(context, builder, args[2])
        qv = builder.load(builder.bitcast(qa.data, _V64.as_pointer()), align=8)
        zero = ir.Constant(_V8, [0] * BLOCK)
        y = zero
        for k in range(8):
            y = builder.or_(y, builder.select(builder.bitcast(args[3 + k], _V1),
                                              ir.Constant(_V8, [1 << k] * BLOCK), zero))
        d = builder.sub(builder.zext(y, _V64), builder.zext(builder.xor(y, b), _V64))
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_I64, [_V64]),
                                            "llvm.vector.reduce.add.v64i64")
        return builder.call(fn, [builder.mul(d, qv)])
    return sig, codegen


if _has_clmul():
    @intrinsic
    def _pxor(typingctx, x):
        """Prefix xor of the bits of x (bit j = xor of bits 0..j): x clmul all-ones."""
        sig = types.uint64(x)

        def codegen(context, builder, signature, args):
            v2 = ir.VectorType(_I64, 2)
            v = builder.insert_element(ir.Constant(v2, [0, 0]), args[0], ir.Constant(_I32, 0))
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(v2, [v2, v2, _I8]), "llvm.x86.pclmulqdq")
            r = builder.call(fn, [v, ir.Constant(v2, [-1, -1]), ir.Constant(_I8, 0)])
            return builder.extract_element(r, ir.Constant(_I32, 0))
        return sig, codegen
else:
    @njit(inline="always")
    def _pxor(x):
        x ^= x << np.uint64(1)
        x ^= x << np.uint64(2)
        x ^= x << np.uint64(4)
        x ^= x << np.uint64(8)
        x ^= x << np.uint64(16)
        x ^= x << np.uint64(32)
        return x


# The four stages of one block. b<k>: data planes; i<k>: bit k of l before the block (0 or 1)
# and, returned, after it; y<k>: planes of y = l_prev ^ b (the value multiplied by 0xb3);
# c<n>: carry planes of y * 0xb3 into a higher column (derived column by column with full
# adders; bit k of the product is the xor of everything entering column k).
@njit(inline="always")
def _stage_a(arr, off, i0, i1):
    b0, b1 = _planes2(arr, off, 0)
    l0 = _pxor(b0) ^ (_Z - i0)
    y0 = ((l0 << _ONE) | i0) ^ b0
    l1 = _pxor(b1 ^ y0) ^ (_Z - i1)
    y1 = ((l1 << _ONE) | i1) ^ b1
    return y0, y1, y1 & y0, l0 >> _S63, l1 >> _S63


@njit(inline="always")
def _stage_b(arr, off, i2, i3, y1, c2):
    b2, b3 = _planes2(arr, off, 2)
    l2 = _pxor(b2 ^ y1 ^ c2) ^ (_Z - i2)
    y2 = ((l2 << _ONE) | i2) ^ b2
    u = y2 ^ y1
    c5 = (y2 & y1) | (u & c2)
    l3 = _pxor(b3 ^ y2 ^ c5) ^ (_Z - i3)
    y3 = ((l3 << _ONE) | i3) ^ b3
    u = y3 ^ y2
    c8 = (y3 & y2) | (u & c5)
    return y2, y3, c8, l2 >> _S63, l3 >> _S63


@njit(inline="always")
def _stage_c(arr, off, i4, i5, y0, y1, y3, c8):
    b4, b5 = _planes2(arr, off, 4)
    l4 = _pxor(b4 ^ y3 ^ y0 ^ c8) ^ (_Z - i4)
    y4 = ((l4 << _ONE) | i4) ^ b4
    u = y4 ^ y3
    s10 = u ^ y0
    c11 = (y4 & y3) | (u & y0)
    c13 = s10 & c8
    l5 = _pxor(b5 ^ y4 ^ y1 ^ y0 ^ c11 ^ c13) ^ (_Z - i5)
    y5 = ((l5 << _ONE) | i5) ^ b5
    u = y5 ^ y4
    s15 = u ^ y1
    c16 = (y5 & y4) | (u & y1)
    u = s15 ^ y0
    c19 = (s15 & y0) | (u & c11)
    c21 = (u ^ c11) & c13
    return y4, y5, c16, c19, c21, l4 >> _S63, l5 >> _S63


@njit(inline="always")
def _stage_d(arr, off, q, i6, i7, y0, y1, y2, y3, y4, y5, c16, c19, c21):
    b6, b7 = _planes2(arr, off, 6)
    l6 = _pxor(b6 ^ y5 ^ y2 ^ y1 ^ c16 ^ c19 ^ c21) ^ (_Z - i6)
    y6 = ((l6 << _ONE) | i6) ^ b6
    u = y6 ^ y5
    s23 = u ^ y2
    c24 = (y6 & y5) | (u & y2)
    u = s23 ^ y1
    s26 = u ^ c16
    c27 = (s23 & y1) | (u & c16)
    u = s26 ^ c19
    c30 = (s26 & c19) | (u & c21)
    l7 = _pxor(b7 ^ y6 ^ y3 ^ y2 ^ y0 ^ c24 ^ c27 ^ c30) ^ (_Z - i7)
    y7 = ((l7 << _ONE) | i7) ^ b7
    s = _block_sum(arr, off, q, y0, y1, y2, y3, y4, y5, y6, y7)
    return s, l6 >> _S63, l7 >> _S63


@njit(cache=True, nogil=True)
def serial(arr, h):  # pragma: no cover - compiled
    p = np.uint64(FNV_PRIME)
    for i in range(arr.shape[0]):
        h = (h ^ np.uint64(arr[i])) * p
    return h


@njit(cache=True, nogil=True)
def sliced(arr, h, q, p64):  # pragma: no cover - compiled
    nb = arr.shape[0] // BLOCK
    i0 = h & _ONE
    i1 = (h >> np.uint64(1)) & _ONE
    i2 = (h >> np.uint64(2)) & _ONE
    i3 = (h >> np.uint64(3)) & _ONE
    i4 = (h >> np.uint64(4)) & _ONE
    i5 = (h >> np.uint64(5)) & _ONE
    i6 = (h >> np.uint64(6)) & _ONE
    i7 = (h >> np.uint64(7)) & _ONE
    if nb >= 3:
        # prologue: fill the pipeline
        a0, a1, ac2, i0, i1 = _stage_a(arr, 0, i0, i1)
        b0, b1 = a0, a1
        b2, b3, bc8, i2, i3 = _stage_b(arr, 0, i2, i3, a1, ac2)
        a0, a1, ac2, i0, i1 = _stage_a(arr, BLOCK, i0, i1)
        c0, c1, c2, c3 = b0, b1, b2, b3
        c4, c5, c16, c19, c21, i4, i5 = _stage_c(arr, 0, i4, i5, b0, b1, b3, bc8)
        b0, b1 = a0, a1
        b2, b3, bc8, i2, i3 = _stage_b(arr, BLOCK, i2, i3, a1, ac2)
        a0, a1, ac2, i0, i1 = _stage_a(arr, 2 * BLOCK, i0, i1)
        # steady state: stage d of block w-3, c of w-2, b of w-1, a of w (independent chains)
        for w in range(3, nb):
            s, i6, i7 = _stage_d(arr, (w - 3) * BLOCK, q, i6, i7, c0, c1, c2, c3, c4, c5,
                                 c16, c19, c21)
            h = h * p64 + s
            c0, c1, c2, c3 = b0, b1, b2, b3
            c4, c5, c16, c19, c21, i4, i5 = _stage_c(arr, (w - 2) * BLOCK, i4, i5, b0, b1, b3,
                                                     bc8)
            b0, b1 = a0, a1
            b2, b3, bc8, i2, i3 = _stage_b(arr, (w - 1) * BLOCK, i2, i3, a1, ac2)
            a0, a1, ac2, i0, i1 = _stage_a(arr, w * BLOCK, i0, i1)
        # epilogue: drain it
        s, i6, i7 = _stage_d(arr, (nb - 3) * BLOCK, q, i6, i7, c0, c1, c2, c3, c4, c5,
                             c16, c19, c21)
        h = h * p64 + s
        c0, c1, c2, c3 = b0, b1, b2, b3
        c4, c5, c16, c19, c21, i4, i5 = _stage_c(arr, (nb - 2) * BLOCK, i4, i5, b0, b1, b3, bc8)
        b0, b1 = a0, a1
        b2, b3, bc8, i2, i3 = _stage_b(arr, (nb - 1) * BLOCK, i2, i3, a1, ac2)
        s, i6, i7 = _stage_d(arr, (nb - 2) * BLOCK, q, i6, i7, c0, c1, c2, c3, c4, c5,
                             c16, c19, c21)
        h = h * p64 + s
        c0, c1, c2, c3 = b0, b1, b2, b3
        c4, c5, c16, c19, c21, i4, i5 = _stage_c(arr, (nb - 1) * BLOCK, i4, i5, b0, b1, b3, bc8)
        s, i6, i7 = _stage_d(arr, (nb - 1) * BLOCK, q, i6, i7, c0, c1, c2, c3, c4, c5,
                             c16, c19, c21)
        h = h * p64 + s
    else:
        for w in range(nb):
            off = w * BLOCK
            y0, y1, c2, i0, i1 = _stage_a(arr, off, i0, i1)
            y2, y3, c8, i2, i3 = _stage_b(arr, off, i2, i3, y1, c2)
            y4, y5, c16, c19, c21, i4, i5 = _stage_c(arr, off, i4, i5, y0, y1, y3, c8)
            s, i6, i7 = _stage_d(arr, off, q, i6, i7, y0, y1, y2, y3, y4, y5, c16, c19, c21)
            h = h * p64 + s
    # the tail: fewer than 64 bytes, byte by byte
    p = np.uint64(FNV_PRIME)
    for i in range(nb * BLOCK, arr.shape[0]):
        h = (h ^ np.uint64(arr[i])) * p
    return h
