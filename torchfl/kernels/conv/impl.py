"""Numba bodies of the convolution family (imported lazily by the specs' ``run``).

Each tile is moved explicitly: ``load_slab`` gathers the input window of one output tile
from off-chip storage (any layout: it reads through the tensor's logical strides) into
an on-chip slab ``[rows][cols][channels]`` with a zero halo for the padding, and returns
how many elements it really read; ``load_weights`` packs a weight block into 16-wide
panels; ``compute`` runs the implicit GEMM on chip (the 6x16 register micro-kernel where
the block has >= 8 output channels, a vectorised loop otherwise); ``store`` applies the
epilogue (bias, folded batch-norm, residual, relu) and writes the tile back in the output's
layout. The Python driver in ``run.py`` calls them in the order the TilePlan says and
sums what they report.

One compiled body per storage type: the dtype is a runtime code (``dtypes.CODE``).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..codecs import decode, encode16
from .microkernel import MR, NR, mk6x16_taps



@njit(cache=True, nogil=True)
def load_slab(x, s0, s1, s2, s3, code, zp, n, c0, tc, lo_h, hi_h, lo_w, hi_w, H, W, slab):
    """x (flat storage) -> slab[(h - lo_h), (w - lo_w), c] float32; zero outside [0,H)x[0,W).
    int8 values are stored as (q - zp). Returns elements read off-chip."""
    rows = hi_h - lo_h
    cols = hi_w - lo_w
    cnt = 0
    base_n = n * s0 + c0 * s1
    c_inner = s1 <= s3 and s1 <= s2
    for i in range(rows):
        h = lo_h + i
        hin = 0 <= h < H
        for j in range(cols):
            w = lo_w + j
            o = (i * cols + j) * tc
            if not hin or w < 0 or w >= W:
                for c in range(tc):
                    slab[o + c] = 0.0
            elif c_inner:
                b = base_n + h * s2 + w * s3
                if s1 == 1:
                    for c in range(tc):
                        slab[o + c] = decode(code, x[b + c]) - zp
                else:
                    for c in range(tc):
                        slab[o + c] = decode(code, x[b + c * s1]) - zp
                cnt += tc
    if not c_inner:  # channel-outer layouts (NCHW...): read rows contiguously along w
        for c in range(tc):
            bc = base_n + c * s1
            for i in range(rows):
                h = lo_h + i
                if h < 0 or h >= H:
                    continue
                for j in range(cols):
                    w = lo_w + j
                    if 0 <= w < W:
                        slab[(i * cols + j) * tc + c] = decode(code, x[bc + h * s2 + w * s3]) - zp
                        cnt += 1
    return cnt


@njit(cache=True, nogil=True)
def load_weights(w, s0, s1, s2, s3, code, zp, k0, tk, c0, tc, R, S, wpk):
    """Weight block [k0:k0+tk, c0:c0+tc, :, :] -> wpk[panel][r][s][c][16] (zero padded).
    Returns elements read off-chip."""
    npanel = (tk + NR - 1) // NR
    for p in range(npanel):
        for r in range(R):
            for s in range(S):
                for c in range(tc):
                    o = (((p * R + r) * S + s) * tc + c) * NR
                    for j in range(NR):
                        k = p * NR + j
                        if k < tk:
                            wpk[o + j] = decode(code, w[(k0 + k) * s0 + (c0 + c) * s1 + r * s2 + s * s3]) - zp
                        else:
                            wpk[o + j] = 0.0
    return tk * tc * R * S


@njit(cache=True, nogil=True)
def _pix(toh, tow, sh, sw, cols, tc):
    """Slab offset of each output pixel's first tap (rows padded to the micro-kernel's 6)."""
    M = toh * tow
    pix = np.zeros((M + MR - 1) // MR * MR, dtype=np.int64)
    for m in range(M):
        pix[m] = (((m // tow) * sh) * cols + (m % tow) * sw) * tc
    return pix


@njit(cache=True, nogil=True)
def _compute_range(slab, pix, cols, tc, wpk, tk, R, S, dh, dw, acc, ldc, mp0, mp1):
    """Float implicit GEMM for micro-panels [mp0, mp1) (6 pixels each)."""
    npanel = (tk + NR - 1) // NR
    if tk >= 8:
        taps = np.empty(R * S, np.int64)
        for r in range(R):
            for s in range(S):
                taps[r * S + s] = (r * dh * cols + s * dw) * tc
        for mp in range(mp0, mp1):
            for p in range(npanel):
                # the packed panel p is contiguous over (r, s, c): one call covers all taps
                mk6x16_taps(slab, pix, mp * MR, taps, R * S, wpk, p * R * S * tc * NR, tc, acc,
                            mp * MR * ldc + p * NR, ldc)
    else:
        for m in range(mp0 * MR, mp1 * MR):
            row = m * ldc
            for r in range(R):
                for s in range(S):
                    t = pix[m] + (r * dh * cols + s * dw) * tc
                    wo = ((r * S + s) * tc) * NR
                    for c in range(tc):
                        a = slab[t + c]
                        for k in range(NR):
                            acc[row + k] += a * wpk[wo + c * NR + k]


@njit(cache=True, nogil=True, parallel=True)
def compute(slab, cols, tc, wpk, tk, R, S, sh, sw, dh, dw, toh, tow, acc, ldc, exact_int):
    """acc[m, k] += sum_{r,s,c} slab[pixel m, tap (r,s), c] * w[k, c, r, s] for the tile's
    toh*tow output pixels m (acc has ldc = 16*panels columns and rows padded to 6), the work
    split across host threads inside the tile. ``exact_int``: int8 path, products summed
    in int64 (exact)."""
    M = toh * tow
    pix = _pix(toh, tow, sh, sw, cols, tc)
    nmp = (M + MR - 1) // MR
    if exact_int:
        for m in prange(M):
            for k in range(tk):
                p, j = k // NR, k % NR
                a = np.int64(0)
                for r in range(R):
                    for s in range(S):
                        t = pix[m] + (r * dh * cols + s * dw) * tc
                        wo = (((p * R + r) * S + s) * tc) * NR + j
                        for c in range(tc):
                            a += np.int64(slab[t + c]) * np.int64(wpk[wo + c * NR])
                acc[m * ldc + k] += a
    else:
        nch = min(nmp, 64)
        for ch in prange(nch):
            _compute_range(slab, pix, cols, tc, wpk, tk, R, S, dh, dw, acc, ldc,
                           (nmp * ch) // nch, (nmp * (ch + 1)) // nch)


@njit(cache=True, nogil=True)
def store(acc, ldc, tk, toh, tow, n, k0, oh0, ow0, y, t0, t1, t2, t3, ycode, ea, eb, relu,
          has_res, res, r0, r1, r2, r3, rcode, out_scale, out_zp):
    """Epilogue + store of one tile: v = acc*ea[k] + eb[k] (dequantisation, bias and folded
    batch-norm in one FMA) (+ residual) (relu), encoded into y's storage (int8 output:
    q = clamp(rne(v/out_scale) + out_zp)). Returns (elements written, residual elements read)."""
    lo = np.float32(0.0) if relu else np.float32(-np.inf)
    for i in range(toh):
        for j in range(tow):
            m = i * tow + j
            mo = m * ldc
            yb = n * t0 + (oh0 + i) * t2 + (ow0 + j) * t3 + k0 * t1
            if ycode == 0 and t1 == 1 and not has_res:      # fast path: contiguous fp32 channels
                for k in range(tk):
                    y[yb + k] = max(acc[mo + k] * ea[k0 + k] + eb[k0 + k], lo)
                continue
            rb = n * r0 + (oh0 + i) * r2 + (ow0 + j) * r3 + k0 * r1
            for k in range(tk):
                v = np.float32(acc[mo + k] * ea[k0 + k] + eb[k0 + k])
                if has_res:
                    v += decode(rcode, res[rb + k * r1])
                v = max(v, lo)
                if ycode == 4:
                    q = np.round(v / out_scale) + out_zp
                    q = min(max(q, -128.0), 127.0)
                    y[yb + k * t1] = np.int8(q)
                elif ycode == 0:
                    y[yb + k * t1] = v
                else:
                    y[yb + k * t1] = encode16(ycode, v)
    return toh * tow * tk, (toh * tow * tk if has_res else 0)


@njit(cache=True, nogil=True, parallel=True)
def conv_tiles(x, s0, s1, s2, s3, code, c0, tc, H, W, wpk, tk, R, S, sh, sw, ph, pw, dh, dw, tiles, ldc,
               y, t0, t1, t2, t3, ycode, k0, ea, eb, relu, has_res, res, r0, r1, r2, r3, rcode):
    """Weight-stationary float tiles of one K block, the tiles spread over host threads (each
    tile is loaded, computed and stored by one thread, as the chip would stream them).
    tiles[t] = (n, oh0, oh1, ow0, ow1). Returns (input elements read, output elements
    written, residual elements read)."""
    nread = 0
    nwritten = 0
    nres = 0
    zp = np.float32(0.0)
    for t in prange(tiles.shape[0]):
        n, oh0, oh1, ow0, ow1 = tiles[t, 0], tiles[t, 1], tiles[t, 2], tiles[t, 3], tiles[t, 4]
        lo_h = oh0 * sh - ph
        hi_h = (oh1 - 1) * sh - ph + (R - 1) * dh + 1
        lo_w = ow0 * sw - pw
        hi_w = (ow1 - 1) * sw - pw + (S - 1) * dw + 1
        cols = hi_w - lo_w
        th, tw = oh1 - oh0, ow1 - ow0
        slab = np.empty((hi_h - lo_h) * cols * tc, np.float32)
        nread += load_slab(x, s0, s1, s2, s3, code, zp, n, c0, tc, lo_h, hi_h, lo_w, hi_w, H, W, slab)
        pix = _pix(th, tw, sh, sw, cols, tc)
        acc = np.zeros(pix.size * ldc, np.float32)
        _compute_range(slab, pix, cols, tc, wpk, tk, R, S, dh, dw, acc, ldc, 0, pix.size // MR)
        a, b = store(acc, ldc, tk, th, tw, n, k0, oh0, ow0, y, t0, t1, t2, t3, ycode, ea, eb, relu,
                     has_res, res, r0, r1, r2, r3, rcode, np.float32(1.0), np.float32(0.0))
        nwritten += a
        nres += b
    return nread, nwritten, nres


# ---------------------------------------------------------------- Python drivers (spec.impl)

def _flat(t):
    """Flat storage of a DeviceTensor and its logical element strides (layout-aware)."""
    phys = t.physical()
    es = phys.dtype.itemsize
    strides = tuple(int(s) // es for s in t.logical().strides)
    return phys.reshape(-1), strides


def _code(name, chip):
    from .. import dtypes as _dt

    return _dt.code(name, chip.bf16_emulation)


def _load_vec(ctx, name, k0, k1, dst):
    """Load params[k0:k1] of a per-channel vector into on-chip dst (float32); counted."""
    from .. import dtypes as _dt

    t = ctx.inputs[name]
    raw = t.logical()[k0:k1]
    dst[k0:k1] = _dt.decode(np.ascontiguousarray(raw), t.dtype)
    ctx.read((k1 - k0) * _dt.itemsize(t.dtype))


def run_conv2d(ctx):
    from . import _epilogue, _param_names, conv_geometry
    from .. import dtypes as _dt
    from .geometry import tile_starts, window_span

    p, chip, cfg = ctx.problem, ctx.chip, ctx.plan.config
    G = conv_geometry(p)
    N, K, Cg, Kg, R, S, g = G["N"], G["K"], G["Cg"], G["Kg"], G["R"], G["S"], G["g"]
    H, W, OH, OW = G["H"], G["W"], G["OH"], G["OW"]
    sh, sw, ph, pw, dh, dw = G["sh"], G["sw"], G["ph"], G["pw"], G["dh"], G["dw"]
    (yt,) = ctx.outputs()
    if N * K * OH * OW == 0:
        return [yt]
    tk, toh, tow, tc = cfg.tile("k"), cfg.tile("oh"), cfg.tile("ow"), cfg.tile("c")
    stationary = cfg.strategy == "weight_stationary"
    e = _epilogue(p.kernel, p)
    is_int = p.dtype == "int8"
    a = p.attrs
    x, xs = _flat(ctx.inputs["x"])
    w, wst = _flat(ctx.inputs["weight"])
    y, ys = _flat(yt)
    xcode, wcode = _code(p.dtype, chip), _code(p.dtype_of("weight"), chip)
    ycode = _code(yt.dtype, chip)
    es, ew, ey = _dt.itemsize(p.dtype), _dt.itemsize(p.dtype_of("weight")), _dt.itemsize(yt.dtype)
    xzp = np.float32(a["x_zero_point"] if is_int else 0)
    wzp = np.float32(a["w_zero_point"] if is_int else 0)
    deq = np.float32(a["x_scale"] * a["w_scale"]) if is_int else np.float32(1.0)
    out_scale = np.float32(a["out_scale"] or 1.0)
    out_zp = np.float32(a["out_zero_point"] or 0)
    bias = np.zeros(max(K, 1), np.float32)
    bnw, bnb, mean, var = (np.zeros(max(K, 1), np.float32) for _ in range(4))
    scale, shift = np.ones(max(K, 1), np.float32), np.zeros(max(K, 1), np.float32)
    ea, eb = np.ones(max(K, 1), np.float32), np.zeros(max(K, 1), np.float32)
    if e["residual"]:
        res, rs = _flat(ctx.inputs["residual"])
        rcode = _code(p.dtype_of("residual"), chip)
        er = _dt.itemsize(p.dtype_of("residual"))
    else:
        res, rs, rcode, er = np.zeros(1, np.float32), (0, 0, 0, 0), 0, 0
    eps = float(a["eps"])
    n_epi = int(e["bias"]) + 2 * int(e["bn"]) + int(e["residual"]) + int(e["relu"])

    rows_max = (toh - 1) * sh + (R - 1) * dh + 1
    cols_max = (tow - 1) * sw + (S - 1) * dw + 1
    slab = np.zeros(rows_max * cols_max * max(Cg if stationary else tc, 1), np.float32)
    npanel = -(-tk // NR)
    ldc = npanel * NR
    mpad = -(-(toh * tow) // MR) * MR
    acc = np.zeros(mpad * ldc, np.float64 if is_int else np.float32)
    wpk = np.zeros(npanel * R * S * max(Cg if stationary else tc, 1) * NR, np.float32)
    oh_tiles = tile_starts(OH, toh)
    ow_tiles = tile_starts(OW, tow)
    for gi in range(g):
        for k0, k1 in tile_starts(Kg, tk):
            kg0 = gi * Kg + k0          # global output channel of the block
            tka = k1 - k0
            # per-channel parameters of the block: loaded once, resident
            for name in _param_names(p):
                dst = {"bias": bias, "bn_weight": bnw, "bn_bias": bnb, "running_mean": mean,
                       "running_var": var}[name]
                _load_vec(ctx, name, kg0, kg0 + tka, dst)
            if e["bn"]:
                sl = slice(kg0, kg0 + tka)
                wv = bnw[sl] if p.has("bn_weight") else np.ones(tka, np.float32)
                bv = bnb[sl] if p.has("bn_bias") else np.zeros(tka, np.float32)
                inv = (1.0 / np.sqrt(var[sl].astype(np.float64) + eps)).astype(np.float32)
                scale[sl] = wv * inv
                shift[sl] = bv - mean[sl] * scale[sl]
            # fold dequantisation, bias and batch-norm into one per-channel FMA
            sl = slice(kg0, kg0 + tka)
            ea[sl] = deq * scale[sl]
            eb[sl] = (bias[sl] * scale[sl] if e["bias"] else 0.0) + shift[sl]
            if stationary:
                nread = load_weights(w, *wst, wcode, wzp, kg0, tka, 0, Cg, R, S, wpk)
                ctx.read(nread * ew)
            ntile = N * len(oh_tiles) * len(ow_tiles)
            if stationary and not is_int and ntile >= 2:
                tiles = np.array([(n, a0, a1, b0, b1) for n in range(N) for a0, a1 in oh_tiles
                                  for b0, b1 in ow_tiles], dtype=np.int64)
                nr_x, nw, nr = conv_tiles(x, *xs, xcode, gi * Cg, Cg, H, W, wpk, tka, R, S, sh, sw, ph, pw,
                                          dh, dw, tiles, ldc, y, *ys, ycode, kg0, ea, eb, e["relu"],
                                          e["residual"], res, *rs, rcode)
                ctx.read(nr_x * es + nr * er)
                ctx.write(nw * ey)
                ctx.ops(nw * (2 * Cg * R * S + n_epi))
                continue
            for n in range(N):
                for oh0, oh1 in oh_tiles:
                    lo_h, hi_h = window_span(oh0, oh1, sh, ph, dh, R)
                    for ow0, ow1 in ow_tiles:
                        lo_w, hi_w = window_span(ow0, ow1, sw, pw, dw, S)
                        th, tw = oh1 - oh0, ow1 - ow0
                        acc[:] = 0
                        cb = [(0, Cg)] if stationary else tile_starts(Cg, tc)
                        for c0, c1 in cb:
                            tca = c1 - c0
                            if not stationary:
                                nread = load_weights(w, *wst, wcode, wzp, kg0, tka, c0, tca, R, S, wpk)
                                ctx.read(nread * ew)
                            nread = load_slab(x, *xs, xcode, xzp, n, gi * Cg + c0, tca, lo_h, hi_h,
                                              lo_w, hi_w, H, W, slab)
                            ctx.read(nread * es)
                            if tca:
                                compute(slab, hi_w - lo_w, tca, wpk, tka, R, S, sh, sw, dh, dw, th, tw,
                                        acc, ldc, is_int)
                            ctx.ops(2 * th * tw * tka * tca * R * S)
                        nw, nr = store(acc, ldc, tka, th, tw, n, kg0, oh0, ow0, y, *ys, ycode, ea, eb,
                                       e["relu"], e["residual"], res, *rs, rcode, out_scale, out_zp)
                        ctx.write(nw * ey)
                        ctx.read(nr * er)
                        ctx.ops(nw * n_epi)
    return [yt]


# ---------------------------------------------------------------- backward kernels

@njit(cache=True, nogil=True)
def load_rows(src, s0, s1, s2, s3, code, n, k0, tk, lo_h, hi_h, lo_w, hi_w, dst):
    """src[n, k0:k0+tk, lo_h:hi_h, lo_w:hi_w] (all inside the tensor) -> dst[(h, w), k]."""
    cols = hi_w - lo_w
    for i in range(hi_h - lo_h):
        for j in range(cols):
            b = n * s0 + k0 * s1 + (lo_h + i) * s2 + (lo_w + j) * s3
            o = (i * cols + j) * tk
            for k in range(tk):
                dst[o + k] = decode(code, src[b + k * s1])
    return (hi_h - lo_h) * cols * tk


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


@njit(cache=True, nogil=True)
def store_plain(acc, tc, th, tw, n, c0, h0, w0, y, t0, t1, t2, t3, ycode):
    for i in range(th):
        for j in range(tw):
            m = i * tw + j
            b = n * t0 + (h0 + i) * t2 + (w0 + j) * t3
            for c in range(tc):
                v = acc[m * tc + c]
                if ycode == 0:
                    y[b + (c0 + c) * t1] = v
                else:
                    y[b + (c0 + c) * t1] = encode16(ycode, v)
    return th * tw * tc


def run_conv2d_backward_input(ctx):
    from . import _bwd_in_rows, conv_geometry
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
                        y[o] = encode16(ycode, v)
    return tk * tc * R * S


def run_conv2d_backward_weight(ctx):
    from . import conv_geometry
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
                            ctx.read(load_slab(x, *xs, code, np.float32(0), n, gi * Cg + c0, tca, lo_h,
                                               hi_h, lo_w, hi_w, H, W, slab) * es)
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

        outs[1].logical()[...] = _dt2.encode(bias_out[:K], outs[1].dtype) if outs[1].dtype != "float32" else bias_out[:K]
    return outs
