"""Numba bodies of the embedding family (imported lazily by the specs' ``run``)."""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..codecs import decode, encode16
from ..staging import _code, _flat


@njit(cache=True, nogil=True)
def gather(w, w0, w1, code, ids, i0, i1, c0, c1, V, out, ocode, D):
    """out[i, c0:c1] = w[ids[i], c0:c1] for i in [i0, i1); returns how many ids were out of range."""
    bad = 0
    for i in prange(i0, i1):
        q = np.int64(ids[i])
        if q < 0 or q >= V:
            bad += 1
            continue
        base = q * w0
        for c in range(c0, c1):
            v = decode(code, w[base + c * w1])
            if ocode == 0:
                out[i * D + c] = v
            else:
                out[i * D + c] = encode16(ocode, v)
    return bad


@njit(cache=True, nogil=True)
def scatter_add(g, rows, est, code, ids, n, c0, c1, V, pad, scale, acc, td):
    """acc[id, 0:c1-c0] += grad[i, c0:c1] (scaled); returns the first bad index or -1."""
    for i in range(n):
        q = np.int64(ids[i])
        if q < 0 or q >= V:
            return i
        if q == pad:
            continue
        f = scale[q]
        for c in range(c0, c1):
            acc[q * td + c - c0] += decode(code, g[rows[i] + c * est]) * f
    return -1


@njit(cache=True, nogil=True)
def store_cols(acc, td, V, c0, c1, y, D, ocode):
    for q in range(V):
        for c in range(c0, c1):
            v = acc[q * td + c - c0]
            if ocode == 0:
                y[q * D + c] = v
            else:
                y[q * D + c] = encode16(ocode, v)


def _ids(t):
    """Indices in logical (row-major) order: a gather list, not data movement of its own."""
    return np.ascontiguousarray(t.logical()).reshape(-1).astype(np.int64, copy=False)


def _bad(kernel, t, i, V):
    from ..errors import KernelError

    flat = _ids(t)
    if i is None:   # the first offending position
        i = int(np.nonzero((flat < 0) | (flat >= V))[0][0])
    pos = np.unravel_index(int(i), t.shape) if t.shape else ()
    raise KernelError(f"kernel {kernel}: index {int(flat[i])} at position {tuple(int(v) for v in pos)} is out "
                      f"of range for a table of {V} rows (valid: 0..{V - 1}, as torch)")


def run_embedding(ctx):
    from . import _dims
    from .. import dtypes as _dt
    from ..conv.geometry import tile_starts

    p, chip, cfg = ctx.problem, ctx.chip, ctx.plan.config
    V, D, n = _dims(p)
    (yt,) = ctx.outputs()
    if n * D == 0:
        return [yt]
    w, (w0, w1) = _flat(ctx.inputs["weight"])
    ids = _ids(ctx.inputs["indices"])
    out = yt.physical().reshape(-1)
    code = _code(p.dtype_of("weight"), chip)
    es = _dt.itemsize(p.dtype_of("weight"))
    ei = _dt.itemsize(p.dtype_of("indices"))
    ti, td = cfg.tile("indices"), cfg.tile("columns")
    for c0, c1 in tile_starts(D, td):
        for i0, i1 in tile_starts(n, ti):
            if gather(w, w0, w1, code, ids, i0, i1, c0, c1, V, out, code, D):
                _bad(p.kernel, ctx.inputs["indices"], None, V)
            k = i1 - i0
            ctx.read(k * (ei + (c1 - c0) * es))
            ctx.write(k * (c1 - c0) * es)
    return [yt]


def run_embedding_backward(ctx):
    from . import _dims
    from .. import dtypes as _dt
    from ..conv.geometry import tile_starts
    from ..norm.bodies import _tables

    p, chip, cfg = ctx.problem, ctx.chip, ctx.plan.config
    V, D, n = _dims(p)
    (yt,) = ctx.outputs()
    if V * D == 0:
        return [yt]
    gt = ctx.inputs["grad_out"]
    # row i (flattened leading dims) of grad_out starts at rows[i]; columns are est apart
    g, rows, _, est = _tables(gt, tuple(range(gt.ndim - 1)))
    ids = _ids(ctx.inputs["indices"])
    es = _dt.itemsize(p.dtype_of("grad_out"))
    ei = _dt.itemsize(p.dtype_of("indices"))
    code = _code(p.dtype_of("grad_out"), chip)
    pad = p.attrs["padding_idx"]
    pad = -1 if pad is None else (pad + V if pad < 0 else pad)
    scale = np.ones(max(V, 1), np.float32)
    if p.attrs["scale_grad_by_freq"]:
        cnt = np.bincount(ids[(ids >= 0) & (ids < V)], minlength=V).astype(np.float32)
        scale = (1.0 / np.maximum(cnt, 1)).astype(np.float32)
        ctx.read(n * ei)
        ctx.ops(n)
    out = yt.physical().reshape(-1)
    ocode = _code(yt.dtype, chip)
    td = cfg.tile("columns")
    if cfg.strategy == "accumulate":
        acc = np.zeros(V * td, np.float32)
        for c0, c1 in tile_starts(D, td):
            acc[:] = 0
            bad = scatter_add(g, rows, est, code, ids, n, c0, c1, V, pad, scale, acc, td)
            if bad >= 0:
                _bad(p.kernel, ctx.inputs["indices"], bad, V)
            ctx.read(n * (ei + (c1 - c0) * es))
            ctx.ops(n * (c1 - c0))
            store_cols(acc, td, V, c0, c1, out, D, ocode)
            ctx.write(V * (c1 - c0) * es)
    else:
        out[:] = 0
        ctx.write(V * D * es)
        row = np.zeros(D, np.float32)
        cols = np.arange(D, dtype=np.int64) * est
        for i in range(n):
            q = int(ids[i])
            if not 0 <= q < V:
                _bad(p.kernel, ctx.inputs["indices"], i, V)
            ctx.read(ei + 2 * D * es)
            ctx.write(D * es)
            ctx.ops(D)
            if q == pad:
                continue
            row[:] = _dt.decode(out[q * D:(q + 1) * D], yt.dtype)
            row += _dt.decode(g[rows[i] + cols], gt.dtype) * scale[q]
            out[q * D:(q + 1) * D] = _dt.encode(row, yt.dtype)
    return [yt]
