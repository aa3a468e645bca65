"""Numba code of the language-model block kernels (``lm/__init__.py``): one parallel pass over
rows each, float32 arithmetic, 16-bit storage decoded on load and rounded (RNE) where the
eager module rounds. The drivers count each tile of the plan as they run it."""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..codecs import decode, encode16
from ..staging import _code
from ..threads import sized_by


@njit(inline="always", cache=True)
def _rounded(code, v):
    """v rounded to the storage dtype of ``code`` and back to float32 (identity for float32)."""
    if code == 0:
        return v
    return decode(code, encode16(code, v))


@njit(inline="always", cache=True)
def _put(y, i, j, code, v):
    if code == 0:
        y[i, j] = v
    else:
        y[i, j] = encode16(code, v)


@njit(cache=True, nogil=True, parallel=True)
def rms_rows(x, code, y, w, eps, round_normed):
    """y[r] = w * round(x[r] * rsqrt(mean(x[r]^2) + eps)); squares in float32 (torch's pow),
    their sum in float64, the mean, sum with eps and rsqrt in float32 as torch's ops."""
    M, D = x.shape
    for r in prange(M):
        s = 0.0
        for j in range(D):
            v = decode(code, x[r, j])
            s += np.float32(v * v)
        m = np.float32(s / D)
        inv = np.float32(1.0) / np.float32(np.sqrt(np.float32(m + eps)))
        for j in range(D):
            n = np.float32(decode(code, x[r, j]) * inv)
            if round_normed:
                n = _rounded(code, n)
            _put(y, r, j, code, np.float32(w[j] * n))


@njit(cache=True, nogil=True, parallel=True)
def silu_mul_rows(a, b, code, y, round_silu):
    """y = round(silu(a)) * b over (rows, n) arrays, silu as torch's a / (1 + exp(-a))."""
    R, n = a.shape
    for r in prange(R):
        for j in range(n):
            v = decode(code, a[r, j])
            s = np.float32(v / (np.float32(1.0) + np.exp(-v)))
            if round_silu:
                s = _rounded(code, s)
            _put(y, r, j, code, np.float32(s * decode(code, b[r, j])))


@njit(cache=True, nogil=True, parallel=True)
def rope_rows(x, cos, sin, code, y, rnd):
    """y = round(round(x * cos) + round(rotate_half(x) * sin)) for x (B, H, L, D), tables
    (Bc, Hc, L, D) broadcast over batch / heads; y as (B*H*L, D)."""
    B, H, L, D = x.shape
    Bc, Hc = cos.shape[0], cos.shape[1]
    h = D // 2
    for t in prange(B * H * L):
        b = t // (H * L)
        hh = (t // L) % H
        l = t % L
        cb = b if Bc > 1 else 0
        ch = hh if Hc > 1 else 0
        for j in range(D):
            if j < h:
                rv = -decode(code, x[b, hh, l, j + h])
            else:
                rv = decode(code, x[b, hh, l, j - h])
            p = np.float32(decode(code, x[b, hh, l, j]) * decode(code, cos[cb, ch, l, j]))
            q = np.float32(rv * decode(code, sin[cb, ch, l, j]))
            if rnd:
                p = _rounded(code, p)
                q = _rounded(code, q)
            _put(y, t, j, code, np.float32(p + q))


# ------------------------------------------------------------------ drivers

def _count(ctx, rows, in_bytes, out_bytes, ops, resident=0):
    """Count the plan's tiles of whole rows as they run: the first loads the resident operands."""
    t = ctx.plan.config.tile("rows") or rows
    first = True
    for r0 in range(0, rows, max(t, 1)):
        n = min(t, rows - r0)
        ctx.read(n * in_bytes + (resident if first else 0))
        ctx.write(n * out_bytes)
        ctx.ops(n * ops)
        first = False


def _rows(t, rows, width):
    """A DeviceTensor's values as a C-contiguous (rows, width) storage array (a view when its
    layout is row-major; a host copy of a permuted one, not counted: the chip reads in place)."""
    return np.ascontiguousarray(t.logical()).reshape(rows, width)


def _weight(t, n):
    """A norm weight as float32 (decoded once for a kept, frozen weight)."""
    from .. import dtypes as _dt
    from .. import frozen

    def make():
        return np.ascontiguousarray(_dt.decode(np.ascontiguousarray(t.logical()).reshape(n), t.dtype),
                                    dtype=np.float32)
    kept = frozen.derived(t.buffer, ("lm_weight", t.offset, tuple(t.shape), t.dtype, t.layout), make)
    return kept if kept is not None else make()


def _elements(p) -> int:
    from ..spec import numel

    return numel(p.shapes["x" if "x" in p.shapes else "a"])


@sized_by(_elements)
def run_rms_norm(ctx):
    from ..dtypes import ITEMSIZE
    from .rms import OPS_PER_ELEMENT, OPS_PER_ROW, geometry

    p = ctx.problem
    M, D = geometry(p)
    (y,) = ctx.outputs()
    if M * D == 0:
        return [y]
    wt = ctx.inputs.get("weight")
    w = _weight(wt, D) if wt is not None else np.ones(D, np.float32)
    es = ITEMSIZE[p.dtype]
    rms_rows(_rows(ctx.inputs["x"], M, D), _code(p.dtype, ctx.chip), y.physical().reshape(M, D), w,
             np.float32(p.attrs["eps"]), bool(p.attrs["round_normed"]))
    _count(ctx, M, D * es, D * es, D * OPS_PER_ELEMENT + OPS_PER_ROW, wt.nbytes if wt is not None else 0)
    return [y]


@sized_by(_elements)
def run_silu_mul(ctx):
    from ..dtypes import ITEMSIZE
    from .swiglu import OPS_PER_ELEMENT

    p = ctx.problem
    (y,) = ctx.outputs()
    shape = tuple(p.shapes["a"])
    n = int(np.prod(shape, dtype=np.int64))
    if n == 0:
        return [y]
    width = shape[-1] if shape and shape[-1] else 1
    a, b = _rows(ctx.inputs["a"], n // width, width), _rows(ctx.inputs["b"], n // width, width)
    silu_mul_rows(a, b, _code(p.dtype, ctx.chip), y.physical().reshape(n // width, width),
                  bool(p.attrs["round_silu"]))
    es = ITEMSIZE[p.dtype]
    _count(ctx, n, 2 * es, es, OPS_PER_ELEMENT)
    return [y]


@sized_by(_elements)
def run_rope(ctx):
    from ..dtypes import ITEMSIZE
    from .rope import OPS_PER_ELEMENT, geometry, tables_resident

    p = ctx.problem
    B, H, L, D, _bc, _hc = geometry(p)
    (y,) = ctx.outputs()
    rows = B * H * L
    if rows * D == 0:
        return [y]
    x = np.ascontiguousarray(ctx.inputs["x"].logical())
    cos = np.ascontiguousarray(ctx.inputs["cos"].logical())
    sin = np.ascontiguousarray(ctx.inputs["sin"].logical())
    rope_rows(x, cos, sin, _code(p.dtype, ctx.chip), y.physical().reshape(rows, D), bool(p.attrs["round_products"]))
    es = ITEMSIZE[p.dtype]
    if tables_resident(p, ctx.chip):
        _count(ctx, rows, D * es, D * es, D * OPS_PER_ELEMENT, ctx.inputs["cos"].nbytes + ctx.inputs["sin"].nbytes)
    else:
        _count(ctx, rows, 3 * D * es, D * es, D * OPS_PER_ELEMENT)
    return [y]
