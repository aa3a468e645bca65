"""Numba bodies of the pooling family (imported lazily by the specs' ``run``).

Average pooling tiles move through the convolution family's loaders (``load_slab``: a
strided gather from any layout into an on-chip ``[rows][cols][channels]`` slab) and
stores; the windows are evaluated on chip (the padding counted only when
``count_include_pad``). Max pooling tiles load one channel plane at a time with a -inf halo
(``max_pool_tile``), channel-parallel.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .. import taskcall
from ..codecs import decode, enc16, h2f as _h2f
from ..optlevel import opt_level   # IR level 1: as fast warm as level 3, a third less LLVM work (BENCHMARKS, cold5)
from ..conv.tiles import load_slab
from ..staging import _code, _flat, load_rows, store_plain

MAX, AVG, ADAPTIVE = 0, 1, 2
IDX_BYTES = 8     # int64 indices


@njit(cache=True, nogil=True, forceinline=True)  # compiled once, inlined by LLVM (not re-typed per call site)
def _win(kind, o, n_in, n_out, k, s, p):
    """(first index, end index, divisor-length) of output o along one axis; for max/avg
    the range is the full window (padding included), clipped by the caller."""
    if kind == ADAPTIVE:
        a = (o * n_in) // n_out
        b = -((-(o + 1) * n_in) // n_out)
        return a, b, b - a
    a = o * s - p
    return a, a + (k - 1) + 1, min(a + k, n_in + p) - a


@njit(cache=True, nogil=True, forceinline=True)
def _avg_window(kind, oh, ow, H, W, OH, OW, kh, kw, sh, sw, ph, pw, include_pad, divisor):
    """Clipped input window of output (oh, ow) and its divisor, as torch's avg/adaptive pooling
    defines it; forward and backward must agree, so both take it from here."""
    ha, hb, hlen = _win(kind, oh, H, OH, kh, sh, ph)
    wa, wb, wlen = _win(kind, ow, W, OW, kw, sw, pw)
    hc0, hc1 = max(ha, 0), min(hb, H)
    wc0, wc1 = max(wa, 0), min(wb, W)
    if divisor != 0:         # divisor_override (torch divides by a negative one too)
        div = np.float32(divisor)
    elif kind == ADAPTIVE or include_pad:
        div = np.float32(hlen * wlen)
    else:
        div = np.float32(max(hc1 - hc0, 0) * max(wc1 - wc0, 0))
    return hc0, hc1, wc0, wc1, div


@njit(cache=True, nogil=True)
def pool_fwd(slab, cols, tc, lo_h, lo_w, H, W, kind, kh, kw, sh, sw, ph, pw, OH, OW, oh0, th, ow0, tw,
             include_pad, divisor, acc):
    """Average (or adaptive average) pooling of one output tile from the slab; max pooling
    is max_pool_tile's. Returns the window operations performed."""
    ops = 0
    for m in range(th * tw):
        oh = oh0 + m // tw
        ow = ow0 + m % tw
        hc0, hc1, wc0, wc1, div = _avg_window(kind, oh, ow, H, W, OH, OW, kh, kw, sh, sw, ph, pw,
                                               include_pad, divisor)
        for c in range(tc):
            acc[m * tc + c] = 0.0
        for h in range(hc0, hc1):
            for w in range(wc0, wc1):
                ops += tc
                b = ((h - lo_h) * cols + (w - lo_w)) * tc
                for c in range(tc):
                    acc[m * tc + c] += slab[b + c]
        for c in range(tc):
            acc[m * tc + c] /= div
    return ops


# long: one channel's plane, row maxima and window maxima share its buffers; already the plain function the parallel loop calls to keep compile time down
@opt_level(1)
@njit(cache=True, nogil=True)
def _max_pool_channel(x, s0, s1, s2, s3, code, n, ch, lo_h, lo_w, rows, cols, h0, h1, w0, w1, H, W, kh, kw, sh, sw,
                      dh, dw, oh0, th, ow0, tw, y, t0, t1, t2, t3, with_idx, yi, i0, i1, i2, i3):
    """One channel ``ch`` of max_pool_tile (a plain function the parallel loop calls: a large
    prange body costs Numba's parallel passes seconds of compile, see ARCHITECTURE.md)."""
    plane = np.empty(rows * cols, np.float32)
    vm = np.empty(cols, np.float32)
    out = np.empty(tw, np.float32)
    oidx = np.empty(tw, np.int64)
    otap = np.empty(tw, np.float32)
    for o in range(rows * cols):
        plane[o] = -np.inf
    base = n * s0 + ch * s1
    nan = 0
    nw = w1 - w0
    for h in range(h0, h1):
        # row views: indices from 0 up, so Numba's negative-index wrap test folds away
        # and the loops vectorise
        prow = plane[(h - lo_h) * cols + (w0 - lo_w):]
        b = base + h * s2 + w0 * s3
        if code == 1 and s3 == 1:
            xrow = x[b:b + nw]
            for k in range(nw):
                prow[k] = _h2f(xrow[k])
        elif code == 1:
            for k in range(nw):
                prow[k] = _h2f(x[b + k * s3])
        else:
            for k in range(nw):
                prow[k] = decode(code, x[b + k * s3])
        for k in range(nw):
            nan += prow[k] != prow[k]
    for i in range(th):
        if nan == 0:
            # down the columns (contiguous, every column), then along the row (strided)
            prow = plane[(i * sh) * cols:]
            for w in range(cols):
                vm[w] = prow[w]
            for r in range(1, kh):
                prow = plane[(i * sh + r * dh) * cols:]
                for w in range(cols):
                    v = prow[w]
                    vm[w] = v if v > vm[w] else vm[w]
            vs = vm[::sw]           # strided views: indices from 0, no wrap test
            for j in range(tw):
                out[j] = vs[j]
            for s in range(1, kw):
                vs = vm[s * dw::sw]
                for j in range(tw):
                    v = vs[j]
                    out[j] = v if v > out[j] else out[j]
            if with_idx:
                # the first in-bounds tap (window order) holding the max, as torch's
                # strict > keeps it: taps scanned last to first, each match overwrites;
                # integer arithmetic, no select (Numba's selects here become branches)
                for j in range(tw):
                    oidx[j] = -1
                hs = lo_h + i * sh
                for r in range(kh - 1, -1, -1):
                    h = hs + r * dh
                    if h < 0 or h >= H:
                        continue
                    for s in range(kw - 1, -1, -1):
                        ps = plane[(i * sh + r * dh) * cols + s * dw::sw]   # strided view
                        w0s = lo_w + s * dw
                        for j in range(tw):
                            w = w0s + j * sw
                            hit = np.int64((ps[j] == out[j]) & (w >= 0) & (w < W))
                            oidx[j] += hit * (h * W + w - oidx[j])
        elif not with_idx:
            for j in range(tw):
                out[j] = -np.inf
            for r in range(kh):
                for s in range(kw):
                    ps = plane[(i * sh + r * dh) * cols + s * dw:]
                    for j in range(tw):
                        v = ps[j * sw]
                        a = out[j]
                        out[j] = v if (v > a or v != v) else a
        else:
            # the winning tap's number r * kw + s is tracked as a float32 (exact),
            # selected like the value (an int64 select stays a mispredicted branch)
            for j in range(tw):
                out[j] = -np.inf
                otap[j] = -1.0
            for r in range(kh):
                for s in range(kw):
                    ps = plane[(i * sh + r * dh) * cols + s * dw:]
                    tap = np.float32(r * kw + s)
                    for j in range(tw):
                        v = ps[j * sw]
                        take = (v > out[j]) | (v != v)
                        out[j] = v if take else out[j]
                        otap[j] = tap if take else otap[j]
            hs = lo_h + i * sh
            hf = hs if hs >= 0 else hs + ((-hs + dh - 1) // dh) * dh
            for j in range(tw):
                ws = lo_w + j * sw
                t = np.int64(otap[j])
                if t < 0:   # no tap beat -inf: torch's index is the first in-bounds tap
                    oidx[j] = hf * W + (ws if ws >= 0 else ws + ((-ws + dw - 1) // dw) * dw)
                else:
                    oidx[j] = (hs + (t // kw) * dh) * W + ws + (t % kw) * dw
        if with_idx:
            ib = n * i0 + ch * i1 + (oh0 + i) * i2 + ow0 * i3
            for j in range(tw):
                yi[ib + j * i3] = oidx[j]
        yb = n * t0 + ch * t1 + (oh0 + i) * t2 + ow0 * t3
        if code == 0:
            for j in range(tw):
                y[yb + j * t3] = out[j]
        elif code == 1 and t3 == 1:
            yrow = y[yb:yb + tw]
            for j in range(tw):
                yrow[j] = enc16(code, out[j])   # code == 1 here: one signature with the line below
        else:
            for j in range(tw):
                y[yb + j * t3] = enc16(code, out[j])


def max_pool_tile(x, s0, s1, s2, s3, code, n, c0, tc, lo_h, hi_h, lo_w, hi_w, H, W, kh, kw, sh, sw, dh, dw,
                  oh0, th, ow0, tw, y, t0, t1, t2, t3, with_idx, yi, i0, i1, i2, i3):
    """Max pooling of one tile without indices, its channels spread over host threads. Each
    channel's input window (the same elements load_slab reads: the window clipped to the
    tensor) is loaded into an on-chip plane whose halo holds -inf (max ignores the
    padding); the max is separable: per output row first down the columns (kh taps, whole
    contiguous rows, no bounds tests: it vectorises), then along that row (kw taps).
    A plane holding a NaN, or a call that wants the indices (int64 h*W + w into ``yi``),
    takes the tap-by-tap loop (whole rows, taps in window order; a later tap wins only if
    greater or NaN, like torch's; the -inf halo never wins). Returns (elements read,
    elements written, window operations: the valid taps)."""
    z = np.int64(0)    # the channel task's computed arguments are int64 (cast so in _max_pool_tile)
    task = taskcall.address(_max_pool_channel, (x, s0, s1, s2, s3, code, n, z, lo_h, lo_w, z, z, z, z, z, z, H, W,
                                                kh, kw, sh, sw, dh, dw, oh0, th, ow0, tw, y, t0, t1, t2, t3, with_idx,
                                                yi, i0, i1, i2, i3))
    return _max_pool_tile(task, x, s0, s1, s2, s3, code, n, c0, tc, lo_h, hi_h, lo_w, hi_w, H, W, kh, kw, sh, sw,
                          dh, dw, oh0, th, ow0, tw, y, t0, t1, t2, t3, with_idx, yi, i0, i1, i2, i3)


@opt_level(1)
@njit(cache=True, nogil=True, parallel=True)
def _max_pool_tile(task, x, s0, s1, s2, s3, code, n, c0, tc, lo_h, hi_h, lo_w, hi_w, H, W, kh, kw, sh, sw, dh, dw,
                   oh0, th, ow0, tw, y, t0, t1, t2, t3, with_idx, yi, i0, i1, i2, i3):
    """:func:`max_pool_tile`'s jitted body; ``task`` is ``_max_pool_channel``'s address
    (:mod:`..taskcall`: called, not linked in and compiled again in this function's library)."""
    rows, cols = np.int64(hi_h - lo_h), np.int64(hi_w - lo_w)
    h0, h1 = np.int64(max(lo_h, 0)), np.int64(max(max(lo_h, 0), min(hi_h, H)))
    w0, w1 = np.int64(max(lo_w, 0)), np.int64(max(max(lo_w, 0), min(hi_w, W)))
    for c in prange(tc):
        taskcall.call(task, (x, s0, s1, s2, s3, code, n, np.int64(c0 + np.int64(c)), lo_h, lo_w, rows, cols, h0, h1,
                             w0, w1, H, W, kh, kw, sh, sw, dh, dw, oh0, th, ow0, tw, y, t0, t1, t2, t3, with_idx, yi,
                             i0, i1, i2, i3))
    ops = 0
    for i in range(th):
        nr = 0
        for r in range(kh):
            h = lo_h + i * sh + r * dh
            if h >= 0 and h < H:
                nr += 1
        for j in range(tw):
            ns = 0
            for s in range(kw):
                w = lo_w + j * sw + s * dw
                if w >= 0 and w < W:
                    ns += 1
            ops += nr * ns
    return (h1 - h0) * (w1 - w0) * tc, th * tw * tc, ops * tc


@njit(cache=True, nogil=True)
def load_idx(src, s0, s1, s2, s3, n, c0, tc, lo_h, hi_h, lo_w, hi_w, dst):
    cols = hi_w - lo_w
    for i in range(hi_h - lo_h):
        for j in range(cols):
            b = n * s0 + c0 * s1 + (lo_h + i) * s2 + (lo_w + j) * s3
            for c in range(tc):
                dst[(i * cols + j) * tc + c] = src[b + c * s1]
    return (hi_h - lo_h) * cols * tc


@njit(cache=True, nogil=True)
def pool_bwd(g, gidx, rlo, rows, clo, cols, tc, H, W, kind, kh, kw, sh, sw, ph, pw, OH, OW,
             include_pad, divisor, h0, th, w0, tw, acc):
    """grad_input tile [h0:h0+th, w0:w0+tw] from the loaded grad_out rows. Returns ops."""
    for i in range(th * tw * tc):
        acc[i] = 0.0
    ops = 0
    for i in range(rows):
        oh = rlo + i
        for j in range(cols):
            ow = clo + j
            b = (i * cols + j) * tc
            if kind == MAX:
                for c in range(tc):
                    ops += 1
                    q = gidx[b + c]
                    h = q // W
                    w = q % W
                    if h0 <= h < h0 + th and w0 <= w < w0 + tw:
                        acc[((h - h0) * tw + (w - w0)) * tc + c] += g[b + c]
                continue
            hc0, hc1, wc0, wc1, div = _avg_window(kind, oh, ow, H, W, OH, OW, kh, kw, sh, sw, ph, pw,
                                                   include_pad, divisor)
            ops += tc
            for h in range(max(hc0, h0), min(hc1, h0 + th)):
                for w in range(max(wc0, w0), min(wc1, w0 + tw)):
                    o = ((h - h0) * tw + (w - w0)) * tc
                    ops += tc
                    for c in range(tc):
                        acc[o + c] += g[b + c] / div
    return ops


def _params(G, p):
    h, w = G["axes"]
    kind = MAX if p.kernel.startswith("max") else ADAPTIVE if p.kernel.startswith("adaptive") else AVG
    a = p.attrs
    return dict(kind=kind, kh=h.k, kw=w.k, sh=h.s, sw=w.s, ph=h.p, pw=w.p, dh=h.d, dw=w.d,
                include_pad=bool(a.get("count_include_pad", True)),
                divisor=int(a.get("divisor_override") or 0))


def run_pool(ctx):
    from . import pool_geometry
    from .. import dtypes as _dt
    from ..conv.geometry import tile_starts

    p, chip, cfg = ctx.problem, ctx.chip, ctx.plan.config
    G = pool_geometry(p)
    N, C, H, W, OH, OW = (G[k] for k in ("N", "C", "H", "W", "OH", "OW"))
    hax, wax = G["axes"]
    outs = ctx.outputs()
    if N * C * OH * OW == 0:
        return outs
    P = _params(G, p)
    tc, th, tw = cfg.tile("c"), cfg.tile("oh"), cfg.tile("ow")
    x, xs = _flat(ctx.inputs["x"])
    y, ys = _flat(outs[0])
    code = _code(p.dtype, chip)
    es = _dt.itemsize(p.dtype)
    oh_t = [(a, b, *hax.span(a, b)) for a, b in tile_starts(OH, th)]
    ow_t = [(a, b, *wax.span(a, b)) for a, b in tile_starts(OW, tw)]
    if P["kind"] == MAX:
        return _run_max_pool(ctx, outs, x, xs, y, ys, code, es, P, N, C, H, W, tc, oh_t, ow_t)
    rows = max(hi - lo for _, _, lo, hi in oh_t)
    cols = max(hi - lo for _, _, lo, hi in ow_t)
    slab = np.zeros(rows * cols * tc, np.float32)
    acc = np.zeros(th * tw * tc, np.float32)
    for n in range(N):
        for c0, c1 in tile_starts(C, tc):
            tca = c1 - c0
            for oh0, oh1, lo_h, hi_h in oh_t:
                for ow0, ow1, lo_w, hi_w in ow_t:
                    ctx.read(load_slab(x, *xs, code, np.float32(0), n, c0, tca, lo_h, hi_h, lo_w, hi_w,
                                       H, W, slab) * es)
                    ops = pool_fwd(slab, hi_w - lo_w, tca, lo_h, lo_w, H, W, P["kind"], P["kh"], P["kw"],
                                   P["sh"], P["sw"], P["ph"], P["pw"], OH, OW, oh0, oh1 - oh0, ow0, ow1 - ow0,
                                   P["include_pad"], P["divisor"], acc)
                    nout = (oh1 - oh0) * (ow1 - ow0) * tca
                    ctx.ops(ops + nout)     # + the divide
                    ctx.write(store_plain(acc, tca, oh1 - oh0, ow1 - ow0, n, c0, oh0, ow0, y, *ys, code) * es)
    return outs


def _run_max_pool(ctx, outs, x, xs, y, ys, code, es, P, N, C, H, W, tc, oh_t, ow_t):
    """max_pool2d: the same tiles as the general path, each pooled by the channel-parallel
    max_pool_tile (indices, when asked for, written beside the values). Without indices it
    runs ~1 ns per input element on one core, so inputs under ~1M elements (ResNet's stem
    pool at batch 1) stay on one thread: waking the workers costs more than that on a
    loaded machine (threads.py)."""
    from ..conv.geometry import tile_starts
    from ..threads import threads_for

    with_idx = len(outs) > 1
    yi, yis = _flat(outs[1]) if with_idx else (np.zeros(1, np.int64), (0, 0, 0, 0))
    with threads_for(N * C * H * W * 64):
        for n in range(N):
            for c0, c1 in tile_starts(C, tc):
                for oh0, oh1, lo_h, hi_h in oh_t:
                    for ow0, ow1, lo_w, hi_w in ow_t:
                        nr, nw, ops = max_pool_tile(x, *xs, code, n, c0, c1 - c0, lo_h, hi_h, lo_w, hi_w, H, W,
                                                    P["kh"], P["kw"], P["sh"], P["sw"], P["dh"], P["dw"],
                                                    oh0, oh1 - oh0, ow0, ow1 - ow0, y, *ys, with_idx, yi, *yis)
                        ctx.read(nr * es)
                        ctx.ops(ops)
                        ctx.write(nw * (es + (IDX_BYTES if with_idx else 0)))
    return outs


def run_pool_backward(ctx):
    from . import pool_geometry
    from .. import dtypes as _dt
    from ..conv.geometry import tile_starts

    p, chip, cfg = ctx.problem, ctx.chip, ctx.plan.config
    G = pool_geometry(p)
    N, C, H, W, OH, OW = (G[k] for k in ("N", "C", "H", "W", "OH", "OW"))
    hax, wax = G["axes"]
    (dxt,) = ctx.outputs()
    if N * C * H * W == 0:
        return [dxt]
    P = _params(G, p)
    tc, th, tw = cfg.tile("c"), cfg.tile("h"), cfg.tile("w")
    g, gs = _flat(ctx.inputs["grad_out"])
    is_max = P["kind"] == MAX
    if is_max:
        gi, gis = _flat(ctx.inputs["indices"])
    dx, dxs = _flat(dxt)
    code = _code(p.dtype, chip)
    es = _dt.itemsize(p.dtype)
    h_t = [(a, b, *hax.out_range(a, b)) for a, b in tile_starts(H, th)]
    w_t = [(a, b, *wax.out_range(a, b)) for a, b in tile_starts(W, tw)]
    rows = max(hi - lo for _, _, lo, hi in h_t)
    cols = max(hi - lo for _, _, lo, hi in w_t)
    gbuf = np.zeros(max(1, rows * cols * tc), np.float32)
    ibuf = np.zeros(max(1, rows * cols * tc), np.int64)
    acc = np.zeros(th * tw * tc, np.float32)
    for n in range(N):
        for c0, c1 in tile_starts(C, tc):
            tca = c1 - c0
            for h0, h1, rlo, rhi in h_t:
                for w0, w1, clo, chi in w_t:
                    ctx.read(load_rows(g, *gs, code, n, c0, tca, rlo, rhi, clo, chi, gbuf) * es)
                    if is_max:
                        ctx.read(load_idx(gi, *gis, n, c0, tca, rlo, rhi, clo, chi, ibuf) * 8)
                    ctx.ops(pool_bwd(gbuf, ibuf, rlo, rhi - rlo, clo, chi - clo, tca, H, W, P["kind"],
                                     P["kh"], P["kw"], P["sh"], P["sw"], P["ph"], P["pw"], OH, OW,
                                     P["include_pad"], P["divisor"], h0, h1 - h0, w0, w1 - w0, acc))
                    ctx.write(store_plain(acc, tca, h1 - h0, w1 - w0, n, c0, h0, w0, dx, *dxs, code) * es)
    return [dxt]
