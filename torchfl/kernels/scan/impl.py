"""Scan execution: lines of the ``outer x L x inner`` view summed in order, tile by tile."""
from __future__ import annotations

import numpy as np
from numba import njit

from .. import dtypes as _dt
from ..codecs import decode, encode16
from . import FLOATS, geometry, out_dtype
from ..dtypes import ITEMSIZE


@njit(cache=True, nogil=True)
def scan_float(src, dst, l0, l1, inner, code, ocode):
    """Lines [l0, l1) of src (outer, L, inner): float32 running sums, rounded on store."""
    L = src.shape[1]
    for line in range(l0, l1):
        o = line // inner
        i = line - o * inner
        acc = np.float32(0.0)
        for t in range(L):
            acc += decode(code, src[o, t, i])
            if ocode == 0:
                dst[o, t, i] = acc
            else:
                dst[o, t, i] = encode16(ocode, acc)


@njit(cache=True, nogil=True)
def scan_int(src, dst, l0, l1, inner):
    """Lines [l0, l1) of src: exact int64 running sums."""
    L = src.shape[1]
    for line in range(l0, l1):
        o = line // inner
        i = line - o * inner
        acc = np.int64(0)
        for t in range(L):
            acc += np.int64(src[o, t, i])
            dst[o, t, i] = acc


def run_scan(ctx):
    p, cfg = ctx.problem, ctx.plan.config
    (out,) = ctx.outputs()
    outer, L, inner = geometry(p)
    x = ctx.inputs["x"]
    if out.numel == 0:
        return [out]
    src = np.ascontiguousarray(x.logical()).reshape(outer, L, inner)   # a view when x is row-major
    dst = out.physical().reshape(outer, L, inner)
    ei, eo = ITEMSIZE[p.dtype], ITEMSIZE[out_dtype(p)]
    lines = outer * inner
    T = cfg.tile("lines") if cfg.strategy != "line_split" else 1
    for l0 in range(0, lines, T):
        l1 = min(lines, l0 + T)
        if p.dtype in FLOATS:
            chip = ctx.chip
            scan_float(src, dst, np.int64(l0), np.int64(l1), np.int64(inner),
                       _dt.code(p.dtype, chip.bf16_emulation), _dt.code(out.dtype, chip.bf16_emulation))
        else:
            scan_int(src, dst, np.int64(l0), np.int64(l1), np.int64(inner))
        m = (l1 - l0) * L
        ctx.read(m * ei)
        ctx.write(m * eo)
        ctx.ops(m)
    return [out]
