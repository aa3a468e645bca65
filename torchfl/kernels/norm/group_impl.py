"""Numba body of group norm (``norm/group.py``); ``norm.impl`` re-exports ``run_group_norm``."""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from .. import dtypes as _dt
from ..codecs import decode, encode16


@njit(cache=True, nogil=True)
def group_rows(x, y, g0, g1, G, CG, HW, code, ocode, w, b, eps, mean, rstd):
    """Groups [g0, g1) of x (N*G, M): statistics in float64, then y = (x - m) * r * w + b."""
    M = CG * HW
    for q in range(g0, g1):
        s = 0.0
        for j in range(M):
            s += decode(code, x[q, j])
        m = s / M
        v = 0.0
        for j in range(M):
            d = decode(code, x[q, j]) - m
            v += d * d
        r = 1.0 / math.sqrt(v / M + eps)
        mean[q] = m
        rstd[q] = r
        c0 = (q % G) * CG
        for j in range(M):
            c = c0 + j // HW
            o = np.float32((decode(code, x[q, j]) - m) * r * w[c] + b[c])
            if ocode == 0:
                y[q, j] = o
            else:
                y[q, j] = encode16(ocode, o)


def _param(ctx, name, C, default):
    t = ctx.inputs.get(name)
    if t is None:
        return np.full(C, default, np.float32)
    return _dt.decode(np.ascontiguousarray(t.logical()), t.dtype).astype(np.float32)


def run_group_norm(ctx):
    from ..dtypes import ITEMSIZE
    from .group import OPS_PER_ELEMENT, STAT, geometry

    p, cfg = ctx.problem, ctx.plan.config
    y, mt, rt = ctx.outputs()
    N, C, HW, G, M = geometry(p)
    es = ITEMSIZE[p.dtype]
    for nm in ("weight", "bias"):
        if nm in ctx.inputs:
            ctx.read(ctx.inputs[nm].nbytes)
    w, b = _param(ctx, "weight", C, 1.0), _param(ctx, "bias", C, 0.0)
    if N * G == 0:
        return [y, mt, rt]
    x = np.ascontiguousarray(ctx.inputs["x"].logical()).reshape(N * G, M)
    yv = y.physical().reshape(N * G, M)
    mean, rstd = mt.physical().reshape(-1), rt.physical().reshape(-1)
    code = _dt.code(p.dtype, ctx.chip.bf16_emulation)
    chunked = cfg.strategy == "chunked"
    T = 1 if chunked else cfg.tile("groups")
    for g0 in range(0, N * G, T):
        g1 = min(N * G, g0 + T)
        if M:
            group_rows(x, yv, np.int64(g0), np.int64(g1), np.int64(G), np.int64(C // G), np.int64(HW), code, code,
                       w, b, float(p.attrs["eps"]), mean, rstd)
        else:
            mean[g0:g1], rstd[g0:g1] = 0.0, 1.0 / math.sqrt(float(p.attrs["eps"]))
        k = (g1 - g0) * M
        ctx.read(k * es * (2 if chunked else 1))
        ctx.write(k * es + (0 if chunked else (g1 - g0) * 2 * STAT))
        ctx.ops(k * OPS_PER_ELEMENT)
    if chunked:
        ctx.write(N * G * 2 * STAT)
    return [y, mt, rt]
