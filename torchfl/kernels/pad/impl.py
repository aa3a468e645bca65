"""Pad execution: output rows in physical order, each filled or copied from one row of x."""
from __future__ import annotations

import numpy as np
from numba import njit

from .. import dtypes as _dt
from . import physical
from ..dtypes import ITEMSIZE


@njit(cache=True, nogil=True)
def pad_rows(src, xshape, dst, oshape, before, r0, r1, fill):
    """Output rows [r0, r1) (physical, row-major); returns how many read a row of x."""
    R = oshape.shape[0]
    W, XW, b = oshape[R - 1], xshape[R - 1], before[R - 1]
    lo = max(np.int64(0), b)
    hi = min(W, XW + b)
    read = np.int64(0)
    for r in range(r0, r1):
        rem = r
        base = np.int64(0)
        inside = True
        step = np.int64(XW)
        for d in range(R - 2, -1, -1):
            c = rem % oshape[d] - before[d]
            rem //= oshape[d]
            if c < 0 or c >= xshape[d]:
                inside = False
            base += c * step
            step *= xshape[d]
        o = r * W
        if not inside or hi <= lo:
            for j in range(W):
                dst[o + j] = fill[0]
            continue
        read += 1
        for j in range(lo):
            dst[o + j] = fill[0]
        for j in range(lo, hi):
            dst[o + j] = src[base + j - b]
        for j in range(hi, W):
            dst[o + j] = fill[0]
    return read


def run_pad(ctx):
    from . import _valid

    p, cfg = ctx.problem, ctx.plan.config
    (out,) = ctx.outputs()
    if out.numel == 0:
        return [out]
    po, px, pb = physical(p)
    if not po:
        po, px, pb = [1], [1], [0]
    x = ctx.inputs["x"]
    es = ITEMSIZE[p.dtype]
    src = x.physical().reshape(-1)
    dst = out.physical().reshape(-1)
    fill = np.asarray(_dt.encode(np.array([p.attrs["value"]], np.float64 if p.dtype in _dt.FLOATS else
                                          _dt.storage_dtype(p.dtype)), p.dtype)).astype(src.dtype)
    oshape, xshape, before = (np.array(v, np.int64) for v in (po, px, pb))
    W = po[-1]
    vc = _valid(W, px[-1], pb[-1])
    rows = out.numel // W
    T = cfg.tile("rows")
    for r0 in range(0, rows, T):
        r1 = min(rows, r0 + T)
        read = pad_rows(src, xshape, dst, oshape, before, np.int64(r0), np.int64(r1), fill)
        ctx.read(read * vc * es)
        ctx.write((r1 - r0) * W * es)
    return [out]
