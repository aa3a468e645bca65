"""Grouped GEMM execution: the offsets read first, then per expert with tokens its rows
multiplied (fp32 accumulation over all of K, rounded once; one BLAS call per expert, the
plan's ``TM x TN`` tiles counted one by one); rows past the last offset written as zeros."""
from __future__ import annotations

import numpy as np

from .. import dtypes as dt
from ..dtypes import ITEMSIZE
from ..errors import KernelError


def _offsets(offs, S):
    """The offsets as ints, checked: non-decreasing, within the S rows (what the loop assumes)."""
    o = offs.to_numpy().astype(np.int64).reshape(-1)
    if (o < 0).any() or (np.diff(o) < 0).any() or (o.size and o[-1] > S):
        raise KernelError(f"grouped_mm: offs {o.tolist()[:16]} must be non-decreasing cumulative token counts "
                          f"within the {S} rows of x (the cumsum of tokens per expert)")
    return o


def run_grouped_mm(ctx):
    p, cfg = ctx.problem, ctx.plan.config
    (out,) = ctx.outputs()
    x, w, offs = ctx.inputs["x"], ctx.inputs["w"], ctx.inputs["offs"]
    S, K = x.shape
    E, N = w.shape[0], out.shape[1]
    es = ITEMSIZE[x.dtype]
    res = np.zeros((S, N), np.float32)
    if S * N == 0:
        out.logical()[...] = dt.encode(res, out.dtype)
        return [out]
    o = _offsets(offs, S)
    ctx.read(offs.nbytes)
    if K:
        TM, TN = cfg.tile("m"), cfg.tile("n")
        xs = dt.decode(np.ascontiguousarray(x.logical()), x.dtype)
        wl = w.logical()
        start = 0
        for e in range(E):
            end = int(o[e])
            if end > start:
                we = dt.decode(np.ascontiguousarray(wl[e].T if p.attrs["w_nk"] else wl[e]), w.dtype)  # K x N
                res[start:end] = xs[start:end] @ we          # the expert's row tiles, one BLAS call
                for r0 in range(start, end, TM):               # ... counted tile by tile
                    rows = min(end, r0 + TM) - r0
                    ctx.read(K * N * es)                       # the weight, once per row tile
                    ctx.read(rows * K * es * -(-N // TN))      # the rows, once per column tile
                    ctx.ops(2 * rows * N * K)
            start = max(start, end)
    out.logical()[...] = dt.encode(res, out.dtype)
    ctx.write(S * N * es)
    return [out]
