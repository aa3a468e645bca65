"""The float weight-stationary convolution: one tile (``conv_tile_fused``) or many
(``conv_tiles``) per call, the 6x16 micro-kernel over pre-packed weight panels with the
epilogue (one folded per-channel FMA, residual, relu) fused into the store of every
6-pixel micro-row.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .. import taskcall
from ..codecs import decode, enc16, h2f
from ..optlevel import opt_level   # IR level 1: the hot loops are vector-IR micro-kernels (BENCHMARKS, cold5)
from .microkernel import (MR, NR, PB, RB, epi6x16_f16, gather_rows, gather_run, mk_r1p1, mk_r1p2, mk_r2p1, mk_r2p2,
                          scatter_rows, scatter_run)
from .tiles import _pack_panel, _slab_rows


@njit(cache=True, nogil=True)
def _taps(R, S, dh, dw, cols, tc):
    """Slab offsets of the reduction's contiguous runs and the run length: with dw == 1 the
    S taps of a kernel row and their channels are one run of S*tc floats (the slab holds
    [row][col][c]; the packed weights [(r, s, c)][16] match), else one run per tap."""
    if dw == 1:
        taps = np.empty(R, np.int64)
        for r in range(R):
            taps[r] = r * dh * cols * tc
        return taps, S * tc
    taps = np.empty(R * S, np.int64)
    for r in range(R):
        for s in range(S):
            taps[r * S + s] = (r * dh * cols + s * dw) * tc
    return taps, tc


@opt_level(1)
@njit(cache=True, nogil=True)
def _mm_store(slab, pix, m0, m1, taps, kc, tc, wpk, tk, R, S, p0, p1, acc, ybase, rbase, y, t1,
              ycode, ea, eb, k0, lo, has_res, res, r1, rcode, lut):
    """Pixels [m0, m1) (m0 a multiple of 6) x output channels of panels [p0, p1) of a tile:
    per register block (up to RB micro-rows of 6 pixels x PB panels of 16 channels) the
    implicit GEMM over the whole reduction into ``acc`` (one 6x16 block a row, in L1), then
    per 6x16 block the epilogue v = acc*ea[k] + eb[k] (+ residual) (relu) and the store,
    encoded into y's storage at ybase[m] + k*t1 (the residual read at rbase[m] + k*r1). The
    caller keeps [p0, p1) to a block of packed weight panels that stays in L2 while the
    micro-rows stream past it."""
    nt = taps.size
    pst = R * S * tc * NR          # floats from one packed panel to the next
    h = np.empty(MR * NR, np.uint16)
    rt = np.empty(MR * NR, np.float32)
    rr = np.empty(MR * NR, res.dtype)
    rb, pb = (RB, PB) if tk >= 8 else (1, 1)     # (fewer than 8 channels: one scalar 6x16 block)
    for mr in range(m0, m1, MR * rb):
        nrow = 2 if rb == 2 and mr + MR < m1 else 1
        for p in range(p0, p1, pb):
            npan = 2 if pb == 2 and p + 1 < p1 else 1
            if tk < 8:
                blk = acc[0]
                for q in range(MR * NR):
                    blk[q] = 0.0
                for mi in range(MR):
                    row = mi * NR
                    for t in range(nt):
                        a0 = pix[mr + mi] + taps[t]
                        wo = p * pst + t * kc * NR
                        for c in range(kc):
                            a = slab[a0 + c]
                            for k in range(NR):
                                blk[row + k] += a * wpk[wo + c * NR + k]
            elif nrow == 2 and npan == 2:
                mk_r2p2(slab, pix, mr, taps, nt, wpk, p * pst, pst, kc, acc)
            elif nrow == 2:
                mk_r2p1(slab, pix, mr, taps, nt, wpk, p * pst, pst, kc, acc)
            elif npan == 2:
                mk_r1p2(slab, pix, mr, taps, nt, wpk, p * pst, pst, kc, acc)
            else:
                mk_r1p1(slab, pix, mr, taps, nt, wpk, p * pst, pst, kc, acc)
            for i in range(nrow):
                mi0 = mr + i * MR
                for hp in range(npan):
                    q = p + hp
                    _epilogue_store(acc[i * npan + hp], min(m1, mi0 + MR) - mi0, min(NR, tk - q * NR), k0 + q * NR,
                                    q * NR, mi0, ybase, rbase, y, t1, ycode, ea, eb, lo, has_res, res, r1, rcode,
                                    h, rt, rr, lut)


def store_task(slab, wpk, tc, tk, R, S, y, t1, ycode, ea, eb, k0, has_res, res, r1, rcode, lut) -> int:
    """Address of :func:`_mm_store` (:mod:`..taskcall`) for the argument types
    :func:`conv_tile_fused` / :func:`conv_tiles` pass it: the values the caller hands those
    kernels, int64 / float32 stand-ins for what they compute. ``slab`` None: conv_tiles'
    own float32 slab. Called, not linked in, the block loop (the register-block variants
    and the fused epilogue) is compiled once for itself instead of again inside each
    kernel's gufunc and outer library: ResNet-50 b1's compile CPU 37.6 -> 32.7 s
    (conv_tiles 9.7 -> 6.2 s, conv_tile_fused 7.4 -> 3.9 s). Tried at 2026-12-06 and
    reverted: the compile helpers queued on this task, 8.8 s to compile then; 1.4-1.9 s
    now that its epilogue and encoder are inlined by LLVM (BENCHMARKS.md)."""
    z, i64 = np.int64(0), np.zeros(1, np.int64)
    f32 = np.zeros(1, np.float32)
    acc = np.zeros((RB * PB, MR * NR), np.float32)
    return taskcall.address(_mm_store, (f32 if slab is None else slab, i64, z, z, i64, z, tc, wpk, tk, R, S, z, z,
                                        acc, i64, i64, y, t1, ycode, ea, eb, k0, np.float32(0.0), has_res, res, r1,
                                        rcode, lut))


@opt_level(1)
@njit(cache=True, nogil=True, forceinline=True)  # compiled once, inlined by LLVM (not re-typed per call site)
def _epilogue_store(acc, mn, kn, kb, kl, mr, ybase, rbase, y, t1, ycode, ea, eb, lo, has_res, res, r1, rcode, h,
                    rt, rr, lut):
    """The epilogue of a 6 x 16 block (channels kb.. of the output, kl.. of this K block):
    v = acc*ea + eb (+ residual) (relu), stored into y at ybase[m] + k*t1. The residual
    block's raw values are gathered first (rbase[m] + k*r1); a float16 output (with a
    float16 or no residual) is computed, decoded and encoded in 8-wide vectors
    (epi6x16_f16: Numba leaves these 96-element loops scalar, ~1 ns an element), other
    dtypes in scalar passes; the encoded block is then scattered."""
    a_s = ea[kb:kb + NR]
    b_s = eb[kb:kb + NR]
    if has_res:
        if mn < MR or kn < NR:
            for q in range(MR * NR):
                rr[q] = 0
        full = mn == MR and kn == NR
        if full and r1 == 1:
            gather_rows(rr, res, rbase, mr, kl, r1)
        elif full and _run6(rbase, mr, mn):
            gather_run(rr, res, rbase, mr, kl, r1)
        elif r1 == 1:
            for mi in range(mn):
                rrow = res[rbase[mr + mi] + kl:]    # a view: indices from 0, no wrap test
                for j in range(kn):
                    rr[mi * NR + j] = rrow[j]
        elif _run6(rbase, mr, mn):     # channel-outer, the six pixels side by side
            rb = rbase[mr] + kl * r1
            for j in range(kn):
                rcol = res[rb + j * r1:]
                for mi in range(MR):
                    rr[mi * NR + j] = rcol[mi]
        else:
            for j in range(kn):
                for mi in range(mn):
                    rr[mi * NR + j] = res[rbase[mr + mi] + (kl + j) * r1]
        if ycode == 1 and rcode == 1:
            epi6x16_f16(acc, ea, eb, kb, rr, True, lo, h)
            _scatter(h, mn, kn, kl, mr, ybase, y, t1)
            return
        if rcode == 1:
            for q in range(MR * NR):
                rt[q] = h2f(rr[q])
        else:
            for q in range(MR * NR):
                rt[q] = decode(rcode, rr[q])
        for mi in range(MR):
            for j in range(NR):
                q = mi * NR + j
                acc[q] = max(np.float32(acc[q] * a_s[j] + b_s[j]) + rt[q], lo)
    elif ycode == 1:
        epi6x16_f16(acc, ea, eb, kb, rr, False, lo, h)
        _scatter(h, mn, kn, kl, mr, ybase, y, t1)
        return
    else:
        for mi in range(MR):
            for j in range(NR):
                q = mi * NR + j
                acc[q] = max(np.float32(acc[q] * a_s[j] + b_s[j]), lo)
    if ycode == 0:
        if mn == MR and kn == NR and t1 == 1:
            scatter_rows(acc, y, ybase, mr, kl, t1)
            return
        if mn == MR and kn == NR and _run6(ybase, mr, mn):
            scatter_run(acc, y, ybase, mr, kl, t1)
            return
        for mi in range(mn):
            for j in range(kn):
                y[ybase[mr + mi] + (kl + j) * t1] = acc[mi * NR + j]
        return
    for q in range(MR * NR):
        h[q] = enc16(ycode, acc[q])
    _scatter(h, mn, kn, kl, mr, ybase, y, t1)


@njit(cache=True, nogil=True, forceinline=True)
def _scatter(h, mn, kn, kl, mr, ybase, y, t1):
    """The encoded block h[m * 16 + j] -> y[ybase[mr + m] + (kl + j) * t1] (a whole block
    in vectors: scatter_rows / scatter_run)."""
    full = mn == MR and kn == NR
    if full and t1 == 1:
        scatter_rows(h, y, ybase, mr, kl, t1)
    elif full and _run6(ybase, mr, mn):
        scatter_run(h, y, ybase, mr, kl, t1)
    elif t1 == 1:     # channel-inner layout: each pixel's channels are neighbours
        for mi in range(mn):
            yrow = y[ybase[mr + mi] + kl:]
            for j in range(kn):
                yrow[j] = h[mi * NR + j]
    elif _run6(ybase, mr, mn):     # channel-outer, the six pixels side by side
        yb = ybase[mr] + kl * t1
        for j in range(kn):
            ycol = y[yb + j * t1:]
            for mi in range(MR):
                ycol[mi] = h[mi * NR + j]
    else:           # channel-outer: the micro-row's pixels of one channel are neighbours
        for j in range(kn):
            for mi in range(mn):
                y[ybase[mr + mi] + (kl + j) * t1] = h[mi * NR + j]


@njit(cache=True, nogil=True, forceinline=True)
def _run6(base, mr, mn):
    """Whether the micro-row's six pixels are consecutive elements (base[mr + i] ==
    base[mr] + i): then a channel's six values are one run (no per-pixel offsets)."""
    if mn < MR:
        return False
    b = base[mr]
    for i in range(1, MR):
        if base[mr + i] != b + i:
            return False
    return True




@njit(cache=True, nogil=True)
def _panel_block(taps, kc):
    """Weight panels per block: as many as keep ~192 KB of packed weights in L2, a multiple
    of PB (the register block's panels; two 3x3x512 panels are ~600 KB)."""
    n = (192 * 1024) // max(1, taps.size * kc * NR * 4)
    return max(PB, n - n % PB)


@njit(cache=True, nogil=True)
def _tile_pixels(th, tw, sh, sw, cols, tc, sbase, n, oh0, ow0, t0, t2, t3, k0t1, r0, r2, r3, k0r1,
                 pix, ybase, rbase, m0):
    """Slab offset, output and residual offsets of each pixel of one tile, from index m0."""
    for i in range(th):
        for j in range(tw):
            m = m0 + i * tw + j
            pix[m] = sbase + ((i * sh) * cols + j * sw) * tc
            ybase[m] = n * t0 + (oh0 + i) * t2 + (ow0 + j) * t3 + k0t1
            rbase[m] = n * r0 + (oh0 + i) * r2 + (ow0 + j) * r3 + k0r1


@opt_level(1)
@njit(cache=True, nogil=True, parallel=True)
def conv_tile_fused(task, x, s0, s1, s2, s3, code, tc, H, W, w, w0, w1, w2, w3, wcode, wpk, pack, tk, R, S, sh, sw, ph,
                    pw, dh, dw, n, c0, oh0, oh1, ow0, ow1, slab, y, t0, t1, t2, t3, ycode, k0, ea, eb, relu,
                    has_res, res, r0, r1, r2, r3, rcode, lut):
    """One large weight-stationary float tile in two parallel phases: (1) the K block's
    weight panels and the tile's input slab rows are loaded (independent pieces, handed to
    host threads one by one), (2) compute + epilogue + store per 6-pixel micro-row.
    ``pack`` False: wpk already holds the block's panels (a frozen weight's, packed once).
    ``task``: :func:`store_task` (``_mm_store`` called through its address).
    Returns (input elements read, weight elements read)."""
    lo_h = oh0 * sh - ph
    rows = (oh1 - oh0 - 1) * sh + (R - 1) * dh + 1
    lo_w = ow0 * sw - pw
    cols = (ow1 - ow0 - 1) * sw + (S - 1) * dw + 1
    npanel = (tk + NR - 1) // NR
    rpc = max(1, 2048 // max(cols * tc, 1))          # slab rows per piece (~8 KB of input)
    nrc = (rows + rpc - 1) // rpc
    npk = npanel if pack else 0
    nread = 0
    for it in prange(npk + nrc):
        if it < npk:
            _pack_panel(w, w0, w1, w2, w3, wcode, k0, tk, np.int64(0), tc, R, S, wpk, np.int64(it), lut)
        else:
            i0 = (it - npk) * rpc
            nread += _slab_rows(x, s0, s1, s2, s3, code, np.float32(0.0), n, c0, tc, lo_h, lo_w, cols, H, W,
                                slab, i0, min(rows, i0 + rpc), lut)
    th, tw = oh1 - oh0, ow1 - ow0
    M = th * tw
    mpad = (M + MR - 1) // MR * MR
    pix = np.zeros(mpad, np.int64)
    ybase = np.zeros(mpad, np.int64)
    rbase = np.zeros(mpad, np.int64)
    _tile_pixels(th, tw, sh, sw, cols, tc, np.int64(0), n, oh0, ow0, t0, t2, t3, k0 * t1, r0, r2, r3, k0 * r1,
                 pix, ybase, rbase, np.int64(0))
    taps, kc = _taps(R, S, dh, dw, cols, tc)
    lo = np.float32(0.0) if relu else np.float32(-np.inf)
    nmp = mpad // MR
    pb = min(npanel, _panel_block(taps, kc))
    nb = (npanel + pb - 1) // pb
    per = max(RB, min(8, (nmp * nb) // 16))            # micro-rows per piece, whole register blocks
    per -= per % RB
    npc = (nmp + per - 1) // per
    for it in prange(nb * npc):
        b, c = np.int64(it // npc), np.int64(it % npc)
        acc = np.empty((RB * PB, MR * NR), np.float32)
        taskcall.call(task, (slab, pix, np.int64(c * per * MR), np.int64(min(M, (c + 1) * per * MR)), taps,
                             np.int64(kc), tc, wpk, tk, R, S, np.int64(b * pb), np.int64(min(npanel, (b + 1) * pb)),
                             acc, ybase, rbase, y, t1, ycode, ea, eb, k0, lo, has_res, res, r1, rcode, lut))
    return nread, tk * tc * R * S


@opt_level(1)
@njit(cache=True, nogil=True, parallel=True)
def conv_tiles(task, x, s0, s1, s2, s3, code, c0, tc, H, W, wpk, tk, R, S, sh, sw, ph, pw, dh, dw, tiles, groups,
               y, t0, t1, t2, t3, ycode, k0, ea, eb, relu, has_res, res, r0, r1, r2, r3, rcode, lut, nthreads):
    """Weight-stationary float tiles of one K block, spread over host threads in chunks.
    Each tile's slab is loaded as the chip loads it; tiles of one shape too small to fill
    the 6-pixel micro-kernel are computed together (``groups[g]:groups[g+1]`` index
    ``tiles``), their pixels side by side in one micro-row, and stored tile by tile. A chunk
    loads its tiles' slabs first, then streams them past one L2-sized block of weight
    panels after another. tiles[t] = (n, oh0, oh1, ow0, ow1); ``nthreads``: the host threads
    (an argument: numba.get_num_threads() inside would make the function uncacheable);
    ``task``: :func:`store_task` (``_mm_store`` called through its address).
    Returns input elements read."""
    ng = groups.size - 1
    # chunks: each streams every weight panel once, so a chunk of a few pixels is bound by
    # that stream (a 1x1 stride-2 conv of 49 one-pixel tiles: 9 chunks read its 8 MB of
    # panels 9 times); ~48 pixels a chunk, but at least one per host thread
    npx = np.int64(0)
    for t in range(tiles.shape[0]):
        npx += (tiles[t, 2] - tiles[t, 1]) * (tiles[t, 4] - tiles[t, 3])
    nch = max(1, min(ng, 32, max(nthreads, npx // 48)))
    lo = np.float32(0.0) if relu else np.float32(-np.inf)
    gs = np.zeros(ng, np.int64)      # slab floats and padded pixels of each group
    gm = np.zeros(ng, np.int64)
    for g in range(ng):
        msum = 0
        for t in range(groups[g], groups[g + 1]):
            th, tw = tiles[t, 2] - tiles[t, 1], tiles[t, 4] - tiles[t, 3]
            gs[g] += ((th - 1) * sh + (R - 1) * dh + 1) * ((tw - 1) * sw + (S - 1) * dw + 1) * tc
            msum += th * tw
        gm[g] = (msum + MR - 1) // MR * MR
    t_any, kc = _taps(R, S, dh, dw, np.int64(1), tc)
    nt = t_any.size
    npanel = (tk + NR - 1) // NR
    nread = 0
    for ch in prange(nch):
        g0, g1 = (ng * ch) // nch, (ng * (ch + 1)) // nch
        slab = np.empty(max(1, gs[g0:g1].sum()), np.float32)
        mtot = gm[g0:g1].sum()
        pix = np.zeros(mtot, np.int64)
        ybase = np.zeros(mtot, np.int64)
        rbase = np.zeros(mtot, np.int64)
        gtaps = np.empty((g1 - g0, nt), np.int64)
        gmo = np.empty(g1 - g0, np.int64)
        gcnt = np.empty(g1 - g0, np.int64)
        sb = np.int64(0)       # (int64 from the start: a literal 0 would compile callees twice)
        mb = np.int64(0)
        for g in range(g0, g1):
            M = np.int64(0)
            cols = np.int64(1)
            gsb = sb
            for t in range(groups[g], groups[g + 1]):
                n, oh0, oh1, ow0, ow1 = tiles[t, 0], tiles[t, 1], tiles[t, 2], tiles[t, 3], tiles[t, 4]
                lo_h = oh0 * sh - ph
                rows = (oh1 - oh0 - 1) * sh + (R - 1) * dh + 1
                lo_w = ow0 * sw - pw
                cols = (ow1 - ow0 - 1) * sw + (S - 1) * dw + 1
                nread += _slab_rows(x, s0, s1, s2, s3, code, np.float32(0.0), n, c0, tc, lo_h, lo_w, cols, H, W,
                                    slab[sb:], np.int64(0), rows, lut)
                _tile_pixels(oh1 - oh0, ow1 - ow0, sh, sw, cols, tc, sb, n, oh0, ow0, t0, t2, t3, k0 * t1,
                             r0, r2, r3, k0 * r1, pix, ybase, rbase, mb + M)
                sb += rows * cols * tc
                M += (oh1 - oh0) * (ow1 - ow0)
            for m in range(mb + M, mb + gm[g]):
                pix[m] = gsb         # padding rows read the group's first slab (never stored)
            gtaps[g - g0, :] = _taps(R, S, dh, dw, cols, tc)[0]
            gmo[g - g0] = mb
            gcnt[g - g0] = M
            mb += gm[g]
        acc = np.empty((RB * PB, MR * NR), np.float32)
        pb = _panel_block(t_any, kc)
        for b0 in range(0, npanel, pb):
            for gi in range(g1 - g0):
                taskcall.call(task, (slab, pix, np.int64(gmo[gi]), np.int64(gmo[gi] + gcnt[gi]), gtaps[gi],
                                     np.int64(kc), tc, wpk, tk, R, S, np.int64(b0), np.int64(min(npanel, b0 + pb)),
                                     acc, ybase, rbase, y, t1, ycode, ea, eb, k0, lo, has_res, res, r1, rcode, lut))
    return nread


@njit(cache=True, nogil=True)
def fold_epilogue(K, deq, eps, has_bias, bias, bcode, has_bn, has_w, bnw, wcode, has_b, bnb, bbcode,
                  mean, mcode, var, vcode, ea, eb):
    """Per-channel epilogue as one FMA: ea = deq * scale, eb = bias * scale + shift with the
    inference batch-norm scale = w / sqrt(var + eps), shift = b - mean * scale."""
    for k in range(K):
        scale = np.float32(1.0)
        shift = np.float32(0.0)
        if has_bn:
            inv = np.float32(1.0 / np.sqrt(np.float64(decode(vcode, var[k])) + eps))
            wv = decode(wcode, bnw[k]) if has_w else np.float32(1.0)
            bv = decode(bbcode, bnb[k]) if has_b else np.float32(0.0)
            scale = np.float32(wv * inv)
            shift = np.float32(bv - decode(mcode, mean[k]) * scale)
        ea[k] = np.float32(deq * scale)
        eb[k] = (np.float32(decode(bcode, bias[k]) * scale) if has_bias else np.float32(0.0)) + shift
