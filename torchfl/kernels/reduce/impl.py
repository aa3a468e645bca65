"""Numba body of the reductions (imported lazily by the specs' ``run``).

Layout-free addressing as in the norm family: output m reads ``base[m] + offset[r]``
from offset tables built from the input's logical strides, streamed in chunks into an
on-chip buffer and folded into a float64 accumulator.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from ..codecs import enc16
from ..staging import _code
from ..norm.bodies import _load, _tables

SUM, MEAN, AMAX, ANY, ALL, NORM = 0, 1, 2, 3, 4, 5
L2, L1, LINF, LNEGINF, L0, LP = 0, 1, 2, 3, 4, 5     # vector_norm's orders: 2, 1, inf, -inf, 0, any other


def _norm_kind(order: float) -> int:
    return {2.0: L2, 1.0: L1, math.inf: LINF, -math.inf: LNEGINF, 0.0: L0}.get(order, LP)


@njit(inline="always", cache=True)
def _put(out, m, acc, ocode):
    """Output m of a float reduction: float32, or the 16-bit code's bits."""
    if ocode == 0:
        out[m] = acc
    else:
        out[m] = enc16(ocode, np.float32(acc))


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def reduce_tile(x, seg, el, est, code, m0, m1, R, tr, op, out, ocode):
    for m in prange(m0, m1):
        buf = np.empty(max(tr, 1), np.float32)
        acc = -np.inf if op == AMAX else 0.0
        nan = False
        for r0 in range(0, R, tr):
            r1 = min(R, r0 + tr)
            _load(x, seg[m], el, est, code, r0, r1, buf)
            if op == AMAX:
                for i in range(r1 - r0):
                    v = buf[i]
                    if math.isnan(v):
                        nan = True
                    elif v > acc:
                        acc = v
            else:
                for i in range(r1 - r0):
                    acc += buf[i]
        if op == MEAN:
            acc = acc / R if R else np.nan
        _put(out, m, np.nan if nan else acc, ocode)


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def norm_tile(x, seg, el, est, code, m0, m1, R, tr, kind, order, out, ocode):
    """Vector norms of outputs [m0, m1) in float64: the sum of x*x (rooted), of |x|, of |x|**order
    (rooted by 1/order; a negative order maps 0 to inf), the count of nonzeros (NaN counts, as
    torch's x != 0), or the largest / smallest |x| (NaN propagates, as torch's)."""
    for m in prange(m0, m1):
        buf = np.empty(max(tr, 1), np.float32)
        acc = 0.0
        if kind == LNEGINF:
            acc = np.inf
        nan = False
        for r0 in range(0, R, tr):
            r1 = min(R, r0 + tr)
            _load(x, seg[m], el, est, code, r0, r1, buf)
            for i in range(r1 - r0):
                v = abs(np.float64(buf[i]))
                if kind == L2:
                    acc += v * v
                elif kind == L1:
                    acc += v
                elif kind == L0:
                    if v != 0:
                        acc += 1.0
                elif kind == LP:
                    acc += v ** order if v != 0 else (0.0 if order > 0 else np.inf)
                elif math.isnan(v):
                    nan = True
                elif kind == LINF:
                    acc = max(acc, v)
                else:
                    acc = min(acc, v)
        if kind == L2:
            acc = math.sqrt(acc)
        elif kind == LP:
            acc = acc ** (1.0 / order)
        _put(out, m, np.nan if nan else acc, ocode)


@njit(cache=True, nogil=True)
def truth_tile(x, seg, el, est, code, m0, m1, R, tr, op, out):
    """any (op ANY) / all (op ALL) of outputs [m0, m1): a bool per output; an element is true
    when nonzero (NaN is nonzero). Stops reading nothing early: every element is counted."""
    for m in prange(m0, m1):
        buf = np.empty(max(tr, 1), np.float32)
        hit = op == ALL
        for r0 in range(0, R, tr):
            r1 = min(R, r0 + tr)
            _load(x, seg[m], el, est, code, r0, r1, buf)
            for i in range(r1 - r0):
                if op == ANY:
                    if buf[i] != 0:
                        hit = True
                elif buf[i] == 0:
                    hit = False
        out[m] = hit


@njit(cache=True, nogil=True)
def exact_sum_tile(x, seg, el, est, m0, m1, R, out):
    """Integer / bool sum of outputs [m0, m1) into int64, exactly (masks, ids)."""
    for m in prange(m0, m1):
        acc = np.int64(0)
        for r in range(R):
            acc += np.int64(x[seg[m] + (r * est if est >= 0 else el[r])])
        out[m] = acc


def run_reduce(ctx):
    from . import EXACT, _sizes, norm_order, op_count
    from ..conv.geometry import tile_starts
    from .. import dtypes as _dt

    p, chip, cfg = ctx.problem, ctx.chip, ctx.plan.config
    M, R, dims = _sizes(p)
    (yt,) = ctx.outputs()
    if M == 0:
        return [yt]
    kept = tuple(d for d in range(len(p.shapes["x"])) if d not in dims)
    x, seg, el, est = _tables(ctx.inputs["x"], kept)
    out = yt.physical().reshape(-1)
    code = _code(p.dtype, chip)
    op = {"sum": SUM, "mean": MEAN, "amax": AMAX, "any": ANY, "all": ALL, "vector_norm": NORM}[p.kernel]
    order = norm_order(p) if op == NORM else 0.0
    es = _dt.itemsize(p.dtype)
    oes = _dt.itemsize(yt.dtype)
    tm, tr = cfg.tile("outputs"), cfg.tile("chunk")
    for m0, m1 in tile_starts(M, tm):
        if op == NORM:
            norm_tile(x, seg, el, est, code, m0, m1, R, tr, _norm_kind(order), order, out, code)
        elif op >= ANY:
            truth_tile(x, seg, el, est, code, m0, m1, R, tr, np.int64(op), out)
        elif p.dtype in EXACT:
            exact_sum_tile(x, seg, el, est, m0, m1, R, out)
        else:
            reduce_tile(x, seg, el, est, code, m0, m1, R, tr, op, out, code)
        n = m1 - m0
        ctx.read(n * R * es)
        ctx.write(n * oes)
        ctx.ops(op_count(p, n, R))
    return [yt]
