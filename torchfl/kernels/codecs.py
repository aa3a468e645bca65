"""Jitted dtype codecs used inside kernels (imports numba: only impl modules import this).

``decode(code, bits)`` -> float32 and ``encode(code, x)`` -> storage bits, with the codes
of ``dtypes.CODE``: 0 float32, 1 float16 (IEEE half bits, RNE), 2 bfloat16 (RNE),
3 bfloat16 emulated through float16 (decode rounds to fp16 precision, encode goes through
fp16 then truncates to bf16, SPEC section 7), 4 int8, 5 int32, 6 int64, 7 bool.

The decoders are plain functions that LLVM inlines where they are called (measured:
decode loops still vectorise), which keeps them out of Numba's own IR inlining: with
``inline="always"`` every call site copied four functions' IR into the caller, and the
GEMM, attention and normalisation kernels took 1.5-2x longer to compile. The encoders stay
``inline="always"``: they are above LLVM's inlining threshold, and a call left in an
elementwise loop stops it vectorising (add / gelu on 128x3072 fp16: 0.6 -> 3-4 ms).
"""
from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

from .hostcpu import has_feature

F32, F16, BF16, BF16E, I8, I32, I64, BOOL = range(8)


@intrinsic
def f32_bits(typingctx, x):
    """float32 -> its uint32 bit pattern."""
    if not isinstance(x, types.Float):
        return None

    def codegen(context, builder, sig, args):
        v = context.cast(builder, args[0], sig.args[0], types.float32)
        return builder.bitcast(v, context.get_value_type(types.uint32))
    return types.uint32(x), codegen


@intrinsic
def bits_f32(typingctx, u):
    """uint32 bit pattern -> float32."""
    if not isinstance(u, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        v = context.cast(builder, args[0], sig.args[0], types.uint32)
        return builder.bitcast(v, context.get_value_type(types.float32))
    return types.float32(u), codegen


_TWO112 = np.float32(5.192296858534828e33)   # 2**112
_DENORM_MAGIC = np.uint32(((127 - 15) + (23 - 10) + 1) << 23)


@njit(cache=True)
def f16_to_f32(h):
    h = np.uint32(h)
    sign = (h & np.uint32(0x8000)) << np.uint32(16)
    em = h & np.uint32(0x7FFF)
    if em >= np.uint32(0x7C00):                       # inf / nan
        return bits_f32(sign | np.uint32(0x7F800000) | ((em & np.uint32(0x3FF)) << np.uint32(13)))
    f = bits_f32(em << np.uint32(13)) * _TWO112      # normals and subnormals alike
    return bits_f32(f32_bits(f) | sign)


@njit(inline="always", cache=True)
def f32_to_f16(x):
    """Round to nearest even (F. Giesen's float_to_half_fast3_rtne)."""
    u = f32_bits(np.float32(x))
    sign = u & np.uint32(0x80000000)
    u = u ^ sign
    if u >= np.uint32((127 + 16) << 23):             # overflow -> inf, nan stays nan
        o = np.uint32(0x7E00) if u > np.uint32(0x7F800000) else np.uint32(0x7C00)
    elif u < np.uint32(113 << 23):                    # subnormal or zero
        f = bits_f32(u) + bits_f32(_DENORM_MAGIC)
        o = f32_bits(f) - _DENORM_MAGIC
    else:
        odd = (u >> np.uint32(13)) & np.uint32(1)
        u = u + np.uint32(0xC8000FFF)                 # ((15 - 127) << 23) + 0xfff, mod 2^32
        u = u + odd
        o = u >> np.uint32(13)
    return np.uint16(o | (sign >> np.uint32(16)))


@njit(cache=True)
def bf16_to_f32(b):
    return bits_f32(np.uint32(b) << np.uint32(16))


@njit(inline="always", cache=True)
def f32_to_bf16(x):
    u = f32_bits(np.float32(x))
    if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
        return np.uint16((u >> np.uint32(16)) | np.uint32(0x40))
    return np.uint16((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))


@njit(inline="always", cache=True)
def f32_to_bf16_trunc(x):
    return np.uint16(f32_bits(np.float32(x)) >> np.uint32(16))


@njit(cache=True)
def decode(code, v):
    """Storage value -> float32 value as the chip computes with it."""
    if code == F32:
        return np.float32(v)
    if code == F16:
        return f16_to_f32(v)
    if code == BF16:
        return bf16_to_f32(v)
    if code == BF16E:
        return f16_to_f32(f32_to_f16(bf16_to_f32(v)))
    return np.float32(v)


@njit(inline="always", cache=True)
def encode16(code, x):
    """float32 -> uint16 bits for the 16-bit float codes."""
    if code == F16:
        return f32_to_f16(x)
    if code == BF16:
        return f32_to_bf16(x)
    return f32_to_bf16_trunc(f16_to_f32(f32_to_f16(x)))   # BF16E


@njit(forceinline=True, cache=True)
def enc16(code, x):
    """:func:`encode16` compiled once per signature and inlined by LLVM (``alwaysinline``) where
    it is called, instead of copied and re-typed by Numba at each call site (attention's task
    spent 0.5 s of its compile on its one call site; the GEMM epilogue's four, 1.9 s with the
    GELUs). One compile serves callers of any flags: the encoder is integer bit work and one
    add of two positive floats, which no fast-math or error-model flag changes (bits checked
    against the inlined encoder by the GEMM and attention tests)."""
    return encode16(code, x)


@njit(inline="always", cache=True)
def h2f(h):
    """float16 bits -> float32, the codec's values, without a branch (both results are
    computed and one selected), so loops over whole blocks vectorise."""
    u = np.uint32(h)
    sign = (u & np.uint32(0x8000)) << np.uint32(16)
    em = u & np.uint32(0x7FFF)
    fin = f32_bits(bits_f32(em << np.uint32(13)) * _TWO112) | sign
    special = sign | np.uint32(0x7F800000) | ((em & np.uint32(0x3FF)) << np.uint32(13))
    return bits_f32(special if em >= np.uint32(0x7C00) else fin)


# -- float16 through the CPU's conversion instructions (F16C: vcvtph2ps / vcvtps2ph) ----------
# Bit-identical to h2f / f32_to_f16 on every value but NaNs (checked on all 2**32 float32 and
# all 2**16 float16 patterns): the hardware quiets a signalling NaN and keeps a NaN's top
# payload bits where the software encoder writes 0x7E00; a NaN stays a NaN of the same sign.
# A loop of them vectorises to the instructions: a 128x4096 GEMM epilogue's fp16 stores
# 0.33 -> 0.17 ms, its fp16 A rows' decode 0.16 -> 0.11 ms. Hosts without F16C use h2f /
# f32_to_f16 (LLVM would call a runtime helper the JIT may not link).


@intrinsic
def _f16_to_f32_cvt(typingctx, h):
    """float16 bits -> float32 (a kernel typed for several storage types may call it on
    others in branches it never takes: any number or bool is accepted, cast to uint16 first;
    a reduction's bool rows reach ``staging.load_row``'s fp16 loop that way)."""
    if not isinstance(h, (types.Number, types.Boolean)):
        return None

    def codegen(context, builder, sig, args):
        from llvmlite import ir

        v = context.cast(builder, args[0], sig.args[0], types.uint16)
        return builder.fpext(builder.bitcast(v, ir.HalfType()), ir.FloatType())
    return types.float32(h), codegen


@intrinsic
def _f32_to_f16_cvt(typingctx, x):
    """float32 -> float16 bits, round to nearest even."""
    if not isinstance(x, (types.Number, types.Boolean)):
        return None

    def codegen(context, builder, sig, args):
        from llvmlite import ir

        v = context.cast(builder, args[0], sig.args[0], types.float32)
        return builder.bitcast(builder.fptrunc(v, ir.HalfType()), ir.IntType(16))
    return types.uint16(x), codegen


if has_feature("f16c"):
    h2f_cvt, f2h_cvt = _f16_to_f32_cvt, _f32_to_f16_cvt
else:
    h2f_cvt, f2h_cvt = h2f, f32_to_f16
