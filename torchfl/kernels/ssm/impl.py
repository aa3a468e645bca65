"""Selective-scan execution: per channel tile (``TD`` of the plan) and batch, one jitted pass
over time with the ``TD x N`` state in float32 locals; counted as the plan prices it."""
from __future__ import annotations

import numpy as np
from numba import njit

from .. import dtypes as dt
from ..dtypes import ITEMSIZE
from . import OPS_PER_CHANNEL, OPS_PER_STATE, dims


@njit(cache=True, nogil=True)
def _scan(u, dl, A, Bm, Cm, Dv, z, bias, flags, b, d0, d1, y, last):
    """Channels [d0, d1) of batch b over every step; flags = (has D, has z, has bias, softplus)."""
    L = u.shape[2]
    N = A.shape[1]
    h = np.zeros(N, np.float32)
    for d in range(d0, d1):
        h[:] = 0.0
        for t in range(L):
            x = dl[b, d, t]
            if flags[2]:
                x += bias[d]
            if flags[3] and x <= 20.0:          # torch.nn.functional.softplus, threshold 20
                x = np.float32(np.log1p(np.exp(x)))
            ut = u[b, d, t]
            acc = np.float32(0.0)
            for n in range(N):
                h[n] = np.float32(np.exp(x * A[d, n])) * h[n] + x * Bm[b, n, t] * ut
                acc += h[n] * Cm[b, n, t]
            if flags[0]:
                acc += ut * Dv[d]
            if flags[1]:
                g = z[b, d, t]
                acc *= g / (np.float32(1.0) + np.float32(np.exp(-g)))
            y[b, d, t] = acc
        for n in range(N):
            last[b, d, n] = h[n]



def _f32(ctx, name, rank):
    t = ctx.inputs.get(name)
    if t is None:
        return np.zeros((1,) * rank, np.float32), 0
    return np.ascontiguousarray(dt.decode(np.ascontiguousarray(t.logical()), t.dtype), np.float32), 1


def run_selective_scan(ctx):
    p, cfg = ctx.problem, ctx.plan.config
    y_out, s_out = ctx.outputs()
    bt, d, l, n = dims(p)
    if bt * d * l == 0 or n == 0:
        y_out.logical()[...] = dt.encode(np.zeros(y_out.shape, np.float32), y_out.dtype)
        s_out.logical()[...] = dt.encode(np.zeros(s_out.shape, np.float32), s_out.dtype)
        ctx.write(y_out.nbytes + s_out.nbytes)
        return [y_out, s_out]
    u, _ = _f32(ctx, "u", 3)
    dl, _ = _f32(ctx, "delta", 3)
    A, _ = _f32(ctx, "A", 2)
    Bm, _ = _f32(ctx, "B", 3)
    Cm, _ = _f32(ctx, "C", 3)
    Dv, has_d = _f32(ctx, "D", 1)
    z, has_z = _f32(ctx, "z", 3)
    bias, has_b = _f32(ctx, "delta_bias", 1)
    flags = np.array([has_d, has_z, has_b, bool(p.attrs["delta_softplus"])], np.bool_)
    y = np.empty((bt, d, l), np.float32)
    last = np.empty((bt, d, n), np.float32)
    es = {k: ITEMSIZE[p.dtype_of(k)] for k in p.shapes}
    eo = ITEMSIZE[y_out.dtype]
    TD = cfg.tile("channels", d)
    for d0 in range(0, d, TD):
        d1 = min(d, d0 + TD)
        td = d1 - d0
        ctx.read(td * (n * es["A"] + es.get("D", 0) + es.get("delta_bias", 0)))   # once per channel tile
        for b in range(bt):
            _scan(u, dl, A, Bm, Cm, Dv, z, bias, flags, np.int64(b), np.int64(d0), np.int64(d1), y, last)
            ctx.read(td * l * (es["u"] + es["delta"] + es.get("z", 0)) + n * l * (es["B"] + es["C"]))
            ctx.write(td * l * eo + td * n * eo)
            ctx.ops(td * l * (OPS_PER_STATE * n + OPS_PER_CHANNEL))
    y_out.logical()[...] = dt.encode(y, y_out.dtype)
    s_out.logical()[...] = dt.encode(last, s_out.dtype)
    return [y_out, s_out]
