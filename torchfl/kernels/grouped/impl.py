"""Grouped GEMM execution: the offsets read first, then per expert with tokens its rows
multiplied (fp32 accumulation over all of K, rounded once; the plan's ``TM x TN`` tiles counted
one by one); rows past the last offset written as zeros.

Each expert's rows run on the matmul family's tiled engine (``gemm.run_float``: the stored
fp16/bf16 operands read as they are, B packed per column tile) with the plan's tiles, so the
grouped kernel is at least as fast as the same experts run as one ``matmul`` each (issue 48's
goal; before, it decoded every weight to float32 and called numpy: 107 vs 90 ms). Operands of
two dtypes (the family admits them) take the decoded path."""
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
    if K and x.dtype == w.dtype and out.dtype == x.dtype:
        _tiled(ctx, x, w, out, o)
        return [out]
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


def _tiled(ctx, x, w, out, o):
    """Every expert's rows on the tiled GEMM engine, counted tile by tile as the plan prices them."""
    from ..gemm import run_float
    from ..matmul.impl import _estrides, _flat

    p, cfg = ctx.problem, ctx.plan.config
    S, K = x.shape
    E, N = w.shape[0], out.shape[1]
    es = ITEMSIZE[x.dtype]
    TM, TN, TK = cfg.tile("m"), cfg.tile("n"), cfg.tile("k")
    code = dt.code(p.dtype, ctx.chip.bf16_emulation)
    (sx, sxk), _ = _estrides(x)
    (so, son), _ = _estrides(out)
    sw, _ = _estrides(w)
    b_ks, b_ns = (sw[2], sw[1]) if p.attrs["w_nk"] else (sw[1], sw[2])
    A, B, C = _flat(x), _flat(w), _flat(out)
    last = int(o[-1]) if o.size else 0
    if last < S:                                       # rows no expert took: zeros
        out.logical()[last:] = dt.encode(np.zeros((S - last, N), np.float32), out.dtype)
    start = 0
    for e in range(E):
        end = int(o[e])
        if end > start:
            m = end - start
            rows = np.arange(start, end, dtype=np.int64)
            run_float(A, (rows * sx).reshape(1, m), sxk, B, np.array([e * sw[0]], np.int64), b_ks, b_ns, C,
                      (rows * so).reshape(1, m), son, M=m, N=N, K=K, TM=TM, TN=TN, TK=TK, b_res=False, code=code,
                      esa=es, esc=es)
            for r0 in range(start, end, TM):           # counted as the plan prices it
                r = min(end, r0 + TM) - r0
                ctx.read(K * N * es)                   # the weight, once per row tile
                ctx.read(r * K * es * -(-N // TN))     # the rows, once per column tile
                ctx.ops(2 * r * N * K)
        start = max(start, end)
    ctx.write(S * N * es)
