"""Cast execution: stream element tiles, convert in Numba, store."""
from __future__ import annotations

import functools

import numpy as np
from numba import njit

from .. import dtypes as dt
from ..codecs import decode, encode16
from ..stream import Access, out_order
from ..dtypes import ITEMSIZE

_IS_FLOAT = (0, 1, 2, 3)


@functools.lru_cache(maxsize=None)
def _widen_for(CIN):
    """Stage 1 for source code ``CIN``: to float64 and int64. A closure whose code is a
    constant: Numba prunes the other branch before typing (one function for all codes
    compiled each code's conversion, ~0.5 s of a model's first call; see BENCHMARKS.md,
    cold first call, cold4)."""

    def widen(src, fw, iw):
        cin = CIN
        for i in range(src.shape[0]):
            v = src[i]
            if cin <= 3:
                fw[i] = np.float64(decode(np.int64(cin), v))   # (int64: a literal would compile decode again)
            else:
                iw[i] = np.int64(v)
                fw[i] = np.float64(iw[i])

    widen.__qualname__ = "widen"     # its name in the cache and `torchfl kernels info`
    return njit(cache=True)(widen)


@functools.lru_cache(maxsize=None)
def _narrow_for(CIN, COUT):
    """Stage 2 for source code ``CIN`` and target code ``COUT`` (constants: the other
    codes' branches are pruned, as in :func:`_widen_for`). Quantisation in float32 as
    PT2E's quantized_decomposed ops: dequantise (q - zp) * scale, quantise rne(x * inv) + zp
    with inv = float32(1 / scale): bit-exact with them."""

    def narrow(fw, iw, dst, quant, scale, inv, zp):
        cin = CIN
        cout = COUT
        for i in range(dst.shape[0]):
            f = fw[i]
            if quant and cin == 4:
                f = np.float64(np.float32(f - zp) * scale)
            if cout == 0:
                dst[i] = np.float32(f)
            elif cout <= 3:
                dst[i] = encode16(cout, np.float32(f))
            elif cout == 7:
                dst[i] = f != 0.0
            elif cin <= 3 or quant:
                if quant:
                    f = np.rint(np.float64(np.float32(f) * inv)) + zp
                lo, hi = -128.0, 127.0
                if cout == 5:
                    lo, hi = -2147483648.0, 2147483647.0
                elif cout == 6:
                    lo, hi = -9.223372036854776e18, 9.223372036854775e18
                if f != f:
                    f = 0.0
                f = min(hi, max(lo, f))
                dst[i] = np.int64(f)
            else:
                iv = iw[i]   # integer/bool -> integer: wrap (two's complement) like torch
                if cout == 4:
                    dst[i] = (iv + 128) % 256 - 128
                elif cout == 5:
                    dst[i] = (iv + 2147483648) % 4294967296 - 2147483648
                else:
                    dst[i] = iv

    narrow.__qualname__ = "narrow"     # its name in the cache and `torchfl kernels info`
    return njit(cache=True)(narrow)


def run_cast(ctx):
    p, plan = ctx.problem, ctx.plan
    (out,) = ctx.outputs()
    n = out.numel
    if n == 0:
        return [out]
    x = ctx.inputs["x"]
    a = p.attrs
    cin, cout = dt.code(x.dtype), dt.code(out.dtype)   # a cast converts; it does not compute in fp16
    order = out_order(out.shape, out.layout)
    acc = Access(x, order)
    oflat = out.physical().reshape(-1)
    T = plan.config.tile("elements")
    if p.has("scales"):
        return _dequantise_per_channel(ctx, x, out, order, acc, oflat, T)
    fw = np.empty(min(T, n), np.float64)
    iw = np.empty(min(T, n), np.int64)
    widen, narrow = _widen_for(int(cin)), _narrow_for(int(cin), int(cout))
    for s in range(0, n, T):
        e = min(n, s + T)
        tile = acc.load(s, e)
        m = e - s
        widen(tile, fw[:m], iw[:m])
        narrow(fw[:m], iw[:m], oflat[s:e], bool(a["quantize"]), np.float32(a["scale"]), np.float32(1.0 / a["scale"]),
               float(a["zero_point"]))
        ctx.read((e - s) * ITEMSIZE[x.dtype])
        ctx.write((e - s) * ITEMSIZE[out.dtype])
        ctx.ops(e - s)
    return [out]


def _dequantise_per_channel(ctx, x, out, order, acc, oflat, T):
    """(q - zero_points[c]) * scales[c] in float32 (PT2E's dequantize_per_channel), c the
    element's index along ``axis``; the vectors are loaded once and stay on chip."""
    p = ctx.problem
    shape = tuple(out.shape)
    axis = p.attrs["axis"] % len(shape)
    scales = dt.decode(ctx.inputs["scales"].logical().reshape(-1), "float32").astype(np.float32)
    zt = ctx.inputs.get("zero_points")
    zps = np.zeros(scales.shape[0], np.float32) if zt is None else zt.logical().reshape(-1).astype(np.float32)
    ctx.read(scales.nbytes + (0 if zt is None else zt.nbytes))
    walk = tuple(shape[a] for a in order)      # the physical walk's shape
    at = order.index(axis)
    for s in range(0, out.numel, T):
        e = min(out.numel, s + T)
        ch = np.unravel_index(np.arange(s, e), walk)[at]
        v = (acc.load(s, e).astype(np.float32) - zps[ch]) * scales[ch]
        oflat[s:e] = dt.encode(v.astype(np.float32), out.dtype)
        ctx.read((e - s) * ITEMSIZE[x.dtype])
        ctx.write((e - s) * ITEMSIZE[out.dtype])
        ctx.ops(e - s)
    return [out]
