"""Convolution backward: the input gradient (a transposed convolution of dy with the
weights) and the weight gradient (dy against the input slabs), tile by tile.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..codecs import decode, enc16
from ..staging import _code, _flat, load_rows, store_plain
from ..threads import conv_small, sized_by_plan
from .tiles import F16_LUT, _slab_rows


@njit(cache=True, nogil=True)
def load_weights_t(w, s0, s1, s2, s3, code, k0, tk, c0, tc, R, S, wt):
    """w[k0:k0+tk, c0:c0+tc, r, s] -> wt[r][s][k][c] (c innermost)."""
    for r in range(R):
        for s in range(S):
            for k in range(tk):
                o = ((r * S + s) * tk + k) * tc
                for c in range(tc):
                    wt[o + c] = decode(code, w[(k0 + k) * s0 + (c0 + c) * s1 + r * s2 + s * s3])
    return tk * tc * R * S


@njit(cache=True, nogil=True, parallel=True)
def compute_bwd_input(dys, lo_oh, lo_ow, rows, cols, tk, wt, tc, R, S, sh, sw, ph, pw, dh, dw, h0, th, w0, tw,
                      acc):
    """acc[(h, w), c] = sum over valid taps of dy[oh, ow, k] * w[k, c, r, s], where
    h = oh*sh - ph + r*dh. Returns the multiply-adds performed."""
    macs = 0
    for m in prange(th * tw):
        h = h0 + m // tw
        wv = w0 + m % tw
        for c in range(tc):
            acc[m * tc + c] = 0.0
        nv = 0
        for r in range(R):
            t = h + ph - r * dh
            if t < 0 or t % sh:
                continue
            oi = t // sh - lo_oh
            if oi < 0 or oi >= rows:
                continue
            for s in range(S):
                u = wv + pw - s * dw
                if u < 0 or u % sw:
                    continue
                oj = u // sw - lo_ow
                if oj < 0 or oj >= cols:
                    continue
                b = (oi * cols + oj) * tk
                nv += 1
                for k in range(tk):
                    a = dys[b + k]
                    wo = ((r * S + s) * tk + k) * tc
                    for c in range(tc):
                        acc[m * tc + c] += a * wt[wo + c]
        macs += nv * tk * tc
    return macs


@sized_by_plan(conv_small)     # a small conv's loops on one thread (threads.py)
def run_conv2d_backward_input(ctx):
    from .backward_tiling import _bwd_in_rows
    from .geometry import conv_geometry
    from .. import dtypes as _dt
    from .geometry import tile_starts

    p, chip, cfg = ctx.problem, ctx.chip, ctx.plan.config
    G = conv_geometry(p)
    N, C, Cg, Kg, R, S, g, H, W = (G[k] for k in ("N", "C", "Cg", "Kg", "R", "S", "g", "H", "W"))
    OH, OW = G["OH"], G["OW"]
    (dxt,) = ctx.outputs()
    if N * C * H * W == 0:
        return [dxt]
    tc, th, tw = cfg.tile("c"), cfg.tile("h"), cfg.tile("w")
    dy, dys = _flat(ctx.inputs["grad_out"])
    w, ws = _flat(ctx.inputs["weight"])
    dx, dxs = _flat(dxt)
    code, wcode = _code(p.dtype, chip), _code(p.dtype_of("weight"), chip)
    es, ew = _dt.itemsize(p.dtype), _dt.itemsize(p.dtype_of("weight"))
    hr = [(a, b, *_bwd_in_rows(a, b, G["sh"], G["ph"], G["dh"], R, OH)) for a, b in tile_starts(H, th)]
    wr = [(a, b, *_bwd_in_rows(a, b, G["sw"], G["pw"], G["dw"], S, OW)) for a, b in tile_starts(W, tw)]
    rmax = max(max(0, hi - lo) for _, _, lo, hi in hr)
    cmax = max(max(0, hi - lo) for _, _, lo, hi in wr)
    slab = np.zeros(max(1, rmax * cmax * Kg), np.float32)
    wt = np.zeros(max(1, R * S * Kg * tc), np.float32)
    acc = np.zeros(max(1, th * tw * tc), np.float32)
    for gi in range(g):
        for c0, c1 in tile_starts(Cg, tc):
            tca = c1 - c0
            ctx.read(load_weights_t(w, *ws, wcode, gi * Kg, Kg, c0, tca, R, S, wt) * ew)
            for n in range(N):
                for h0, h1, lo_h, hi_h in hr:
                    for w0, w1, lo_w, hi_w in wr:
                        hi_h2, hi_w2 = max(lo_h, hi_h), max(lo_w, hi_w)
                        ctx.read(load_rows(dy, *dys, code, n, gi * Kg, Kg, lo_h, hi_h2, lo_w, hi_w2, slab) * es)
                        macs = compute_bwd_input(slab, lo_h, lo_w, hi_h2 - lo_h, hi_w2 - lo_w, Kg, wt, tca, R, S,
                                                 G["sh"], G["sw"], G["ph"], G["pw"], G["dh"], G["dw"],
                                                 h0, h1 - h0, w0, w1 - w0, acc)
                        ctx.ops(2 * macs)
                        ctx.write(store_plain(acc, tca, h1 - h0, w1 - w0, n, gi * Cg + c0, h0, w0, dx,
                                              *dxs, _code(dxt.dtype, chip)) * es)
    return [dxt]


@njit(cache=True, nogil=True, parallel=True)
def compute_bwd_weight(dyb, tk, slab, cols, tc, R, S, sh, sw, dh, dw, th, tw, acc, bacc, do_bias):
    """acc[r][s][k][c] += sum_m dy[m, k] * slab[pixel m, tap (r,s), c]; bacc[k] += sum_m dy."""
    for k in prange(tk):
        for m in range(th * tw):
            a = dyb[m * tk + k]
            if do_bias:
                bacc[k] += a
            pix = (((m // tw) * sh) * cols + (m % tw) * sw) * tc
            for r in range(R):
                for s in range(S):
                    t = pix + (r * dh * cols + s * dw) * tc
                    o = ((r * S + s) * tk + k) * tc
                    for c in range(tc):
                        acc[o + c] += a * slab[t + c]


@njit(cache=True, nogil=True)
def store_wgrad(acc, tk, tc, R, S, k0, c0, y, t0, t1, t2, t3, ycode):
    for r in range(R):
        for s in range(S):
            for k in range(tk):
                for c in range(tc):
                    v = acc[((r * S + s) * tk + k) * tc + c]
                    o = (k0 + k) * t0 + (c0 + c) * t1 + r * t2 + s * t3
                    if ycode == 0:
                        y[o] = v
                    else:
                        y[o] = enc16(ycode, v)
    return tk * tc * R * S


@sized_by_plan(conv_small)
def run_conv2d_backward_weight(ctx):
    from .geometry import conv_geometry
    from .. import dtypes as _dt
    from .geometry import tile_starts, window_span

    p, chip, cfg = ctx.problem, ctx.chip, ctx.plan.config
    G = conv_geometry(p)
    N, K, Cg, Kg, R, S, g, H, W = (G[k] for k in ("N", "K", "Cg", "Kg", "R", "S", "g", "H", "W"))
    OH, OW, sh, sw, ph, pw, dh, dw = (G[k] for k in ("OH", "OW", "sh", "sw", "ph", "pw", "dh", "dw"))
    outs = ctx.outputs()
    dwt = outs[0]
    do_bias = bool(p.attrs["bias_grad"])
    es = _dt.itemsize(p.dtype)
    code = _code(p.dtype, chip)
    ycode = _code(dwt.dtype, chip)
    if K == 0 or (Cg * R * S == 0 and not do_bias):
        return outs
    tk, tc, toh = cfg.tile("k"), cfg.tile("c"), cfg.tile("oh")
    dy, dys = _flat(ctx.inputs["grad_out"])
    x, xs = _flat(ctx.inputs["x"])
    dwf, dwst = _flat(dwt)
    lo_w, hi_w = window_span(0, OW, sw, pw, dw, S) if OW else (0, 0)
    cols = hi_w - lo_w
    rows_max = (toh - 1) * sh + (R - 1) * dh + 1
    dyb = np.zeros(max(1, toh * OW * tk), np.float32)
    slab = np.zeros(max(1, rows_max * max(cols, 0) * max(tc, 1)), np.float32)
    acc = np.zeros(max(1, R * S * tk * max(tc, 1)), np.float32)
    bacc = np.zeros(max(1, tk), np.float32)
    bias_out = np.zeros(max(K, 1), np.float32)
    oh_tiles = tile_starts(OH, toh)
    for gi in range(g):
        for k0, k1 in tile_starts(Kg, tk):
            tka = k1 - k0
            kg0 = gi * Kg + k0
            bacc[:] = 0
            cblocks = tile_starts(Cg, tc) if Cg else [(0, 0)]
            for bi, (c0, c1) in enumerate(cblocks):
                tca = c1 - c0
                acc[:] = 0
                first = bi == 0 and do_bias
                for n in range(N):
                    for oh0, oh1 in oh_tiles:
                        th = oh1 - oh0
                        ctx.read(load_rows(dy, *dys, code, n, kg0, tka, oh0, oh1, 0, OW, dyb) * es)
                        if tca:
                            lo_h, hi_h = window_span(oh0, oh1, sh, ph, dh, R)
                            ctx.read(_slab_rows(x, *xs, code, np.float32(0), n, gi * Cg + c0, tca, lo_h, lo_w,
                                                hi_w - lo_w, H, W, slab, 0, hi_h - lo_h, F16_LUT) * es)
                        compute_bwd_weight(dyb, tka, slab, cols, tca, R if tca else 0, S, sh, sw, dh, dw,
                                           th, OW, acc, bacc, first)
                        ctx.ops(2 * th * OW * tka * tca * R * S + (th * OW * tka if first else 0))
                if tca:
                    ctx.write(store_wgrad(acc, tka, tca, R, S, kg0, c0, dwf, *dwst, ycode) * es)
            if do_bias:
                bias_out[kg0:kg0 + tka] = bacc[:tka]
                ctx.write(tka * es)
    if do_bias:
        from .. import dtypes as _dt2

        grad_b = bias_out[:K]
        outs[1].logical()[...] = _dt2.encode(grad_b, outs[1].dtype) if outs[1].dtype != "float32" else grad_b
    return outs
