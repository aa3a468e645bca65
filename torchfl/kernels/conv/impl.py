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

import functools
import math
import threading

import numba
import numpy as np
from numba import njit, prange

from ..codecs import _TWO112, bits_f32, decode, encode16, f16_to_f32, f32_bits, f32_to_f16
from .microkernel import MR, NR, epi6x16_f16, mk6x16_taps, tr16x8_f16



@njit(cache=True)
def _f16_table():
    t = np.empty(65536, np.float32)
    for i in range(65536):
        t[i] = f16_to_f32(np.uint16(i))
    return t


F16_LUT = _f16_table()
"""float16 bits -> float32, the codec's own values (a table lookup: the scattered decodes
of slab and weight loads do not vectorise, a lookup is one load)."""


@njit(inline="always", cache=True)
def h2f(h):
    """float16 bits -> float32, the codec's values, without a branch (both results are
    computed and one selected), so loops over whole blocks vectorise."""
    u = np.uint32(h)
    sign = (u & np.uint32(0x8000)) << np.uint32(16)
    em = u & np.uint32(0x7FFF)
    fin = f32_bits(bits_f32(em << np.uint32(13)) * _TWO112) | sign
    special = sign | np.uint32(0x7F800000) | ((em & np.uint32(0x3FF)) << np.uint32(13))
    return bits_f32(special if em >= np.uint32(0x7C00) else fin)


@njit(inline="always", cache=True)
def _dec(code, v, lut):
    if code == 1 and lut.size == 65536:
        return lut[np.intp(v)]     # (any storage type compiles; only uint16 bits take this branch)
    return decode(code, v)


@njit(cache=True, nogil=True)
def _slab_rows(x, s0, s1, s2, s3, code, zp, n, c0, tc, lo_h, lo_w, cols, H, W, slab, i0, i1, lut):
    """Rows [i0, i1) of a slab (see load_slab): the halo is written as zeros here, so the
    slab may be reused scratch. Returns elements read off-chip."""
    cnt = 0
    base_n = n * s0 + c0 * s1
    c_inner = s1 <= s3 and s1 <= s2
    jlo = min(max(0, -lo_w), cols)          # columns [jlo, jhi) lie inside [0, W)
    jhi = max(jlo, min(cols, W - lo_w))
    for i in range(i0, i1):
        h = lo_h + i
        row = i * cols * tc
        if h < 0 or h >= H:
            for o in range(row, row + cols * tc):
                slab[o] = 0.0
            continue
        for o in range(row, row + jlo * tc):
            slab[o] = 0.0
        for o in range(row + jhi * tc, row + cols * tc):
            slab[o] = 0.0
        bh = base_n + h * s2
        if c_inner:
            for j in range(jlo, jhi):
                b = bh + (lo_w + j) * s3
                o = row + j * tc
                if s1 == 1:
                    for c in range(tc):
                        slab[o + c] = _dec(code, x[b + c], lut) - zp
                else:
                    for c in range(tc):
                        slab[o + c] = _dec(code, x[b + c * s1], lut) - zp
        else:  # channel-outer layouts (NCHW...): 16 channels at a time, each read along w,
            # so the slab's writes fill whole cache lines
            for cb in range(0, tc, 16):
                ce = min(tc, cb + 16)
                j0 = jlo
                if code == 1 and s3 == 1 and ce - cb == 16:    # float16 NCHW: 8 x 16 blocks
                    while j0 + 8 <= jhi:
                        tr16x8_f16(x, bh + cb * s1 + lo_w + j0, s1, slab, row + j0 * tc + cb, tc)
                        j0 += 8
                for j in range(j0, jhi):
                    o = row + j * tc
                    bj = bh + (lo_w + j) * s3
                    for c in range(cb, ce):
                        slab[o + c] = _dec(code, x[bj + c * s1], lut) - zp
        cnt += (jhi - jlo) * tc
    return cnt


@njit(cache=True, nogil=True)
def load_slab(x, s0, s1, s2, s3, code, zp, n, c0, tc, lo_h, hi_h, lo_w, hi_w, H, W, slab):
    """x (flat storage) -> slab[(h - lo_h), (w - lo_w), c] float32; zero outside [0,H)x[0,W).
    int8 values are stored as (q - zp). Returns elements read off-chip."""
    return _slab_rows(x, s0, s1, s2, s3, code, zp, n, c0, tc, lo_h, lo_w, hi_w - lo_w, H, W, slab, np.int64(0),
                      hi_h - lo_h, np.zeros(1, np.float32))


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
def _pack_panel(w, s0, s1, s2, s3, code, k0, tk, c0, tc, R, S, wpk, p, lut):
    """Float weights of output channels [16p, 16p + 16) of the block -> packed panel p
    (see load_weights): [(r, s, c)][16]."""
    pb = p * R * S * tc * NR
    kn = min(NR, tk - p * NR)
    kb = (k0 + p * NR) * s0 + c0 * s1
    T = R * S
    if code == 1 and kn == NR and s3 == 1 and s2 == S and (T >= 8 or (T == 1 and s1 == 1)):
        # float16 weights whose taps (or, 1x1, channels) are contiguous per output channel:
        # 8 of them x the panel's 16 output channels at a time (tr16x8_f16), the rest
        # one by one
        if T == 1:
            c = 0
            while c + 8 <= tc:
                tr16x8_f16(w, kb + c, s0, wpk, pb + c * NR, NR)
                c += 8
            for c in range(c, tc):
                for j in range(NR):
                    wpk[pb + c * NR + j] = _dec(code, w[kb + c + j * s0], lut)
        else:
            for c in range(tc):
                t = 0
                while t + 8 <= T:
                    tr16x8_f16(w, kb + c * s1 + t, s0, wpk, pb + (t * tc + c) * NR, tc * NR)
                    t += 8
                for t in range(t, T):
                    for j in range(NR):
                        wpk[pb + (t * tc + c) * NR + j] = _dec(code, w[kb + c * s1 + t + j * s0], lut)
        return
    for r in range(R):
        for s in range(S):
            for c in range(tc):
                o = pb + ((r * S + s) * tc + c) * NR
                b = kb + c * s1 + r * s2 + s * s3
                for j in range(kn):
                    wpk[o + j] = _dec(code, w[b + j * s0], lut)
                for j in range(kn, NR):
                    wpk[o + j] = 0.0


@njit(cache=True, nogil=True, parallel=True)
def pack_weights(w, s0, s1, s2, s3, code, k0, tk, c0, tc, R, S, wpk, lut):
    """load_weights for float weights, the panels spread over host threads. Returns
    elements read."""
    npanel = (tk + NR - 1) // NR
    for p in prange(npanel):
        _pack_panel(w, s0, s1, s2, s3, code, k0, tk, c0, tc, R, S, wpk, np.int64(p), lut)
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


@njit(cache=True, nogil=True)
def _compute_int_range(slab, pix, cols, tc, wpk, tk, R, S, dh, dw, acc, tmp, ldc, mp0, mp1, chunk):
    """int8 implicit GEMM for micro-panels [mp0, mp1), exact: the float32 micro-kernel sums
    ``chunk`` taps at a time (integers, every partial sum below 2**24, so no rounding) into
    ``tmp``, each chunk's block then added into the float64 accumulator."""
    npanel = (tk + NR - 1) // NR
    T = R * S
    taps = np.empty(T, np.int64)
    for r in range(R):
        for s in range(S):
            taps[r * S + s] = (r * dh * cols + s * dw) * tc
    for mp in range(mp0, mp1):
        for p in range(npanel):
            off = mp * MR * ldc + p * NR
            for t0 in range(0, T, chunk):
                nt = min(chunk, T - t0)
                for i in range(MR):
                    for j in range(NR):
                        tmp[off + i * ldc + j] = 0.0
                mk6x16_taps(slab, pix, mp * MR, taps[t0:t0 + nt], nt, wpk, (p * T + t0) * tc * NR, tc, tmp, off,
                            ldc)
                for i in range(MR):
                    for j in range(NR):
                        acc[off + i * ldc + j] += tmp[off + i * ldc + j]


@njit(cache=True, nogil=True, parallel=True)
def compute_int(slab, cols, tc, wpk, tk, R, S, sh, sw, dh, dw, toh, tow, acc, tmp, ldc, chunk):
    """``compute`` for int8 tiles through the float32 micro-kernel, ``chunk`` taps
    per exact float32 partial sum (see _compute_int_range); threads split the micro-panels."""
    M = toh * tow
    pix = _pix(toh, tow, sh, sw, cols, tc)
    nmp = (M + MR - 1) // MR
    nch = min(nmp, 64)
    for ch in prange(nch):
        _compute_int_range(slab, pix, cols, tc, wpk, tk, R, S, dh, dw, acc, tmp, ldc,
                           (nmp * ch) // nch, (nmp * (ch + 1)) // nch, chunk)


def exact_chunk(x_bound, wpk, tc):
    """Taps per float32 partial sum that keep every int8 partial sum exact: the largest
    |x - x_zero_point| times the largest |w - w_zero_point| of the packed block times tc
    channels per tap, below 2**24 (0: not even one tap; use the int64 path)."""
    w_bound = float(np.abs(wpk).max()) if wpk.size else 0.0
    per_tap = x_bound * max(w_bound, 1.0) * max(tc, 1)
    return int((1 << 24) // per_tap)


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
          has_res, res, r0, r1, r2, r3, rcode, out_inv, out_zp, qmin, qmax):
    """Epilogue + store of one tile: v = acc*ea[k] + eb[k] (dequantisation, bias and folded
    batch-norm in one FMA) (+ residual) (relu), encoded into y's storage (int8 output:
    q = clamp(rne(v * out_inv) + out_zp, qmin, qmax) with out_inv = float32(1 / out_scale), the
    rounding of PT2E's quantize_per_tensor). Returns (elements written, residual elements read)."""
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
                    q = np.round(v * out_inv) + out_zp
                    q = min(max(q, qmin), qmax)
                    y[yb + k * t1] = np.int8(q)
                elif ycode == 0:
                    y[yb + k * t1] = v
                else:
                    y[yb + k * t1] = encode16(ycode, v)
    return toh * tow * tk, (toh * tow * tk if has_res else 0)


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


@njit(cache=True, nogil=True)
def _mm_store(slab, pix, m0, m1, taps, kc, tc, wpk, tk, R, S, p0, p1, acc, ybase, rbase, y, t1,
              ycode, ea, eb, k0, lo, has_res, res, r1, rcode, lut):
    """Pixels [m0, m1) (m0 a multiple of 6) x output channels of panels [p0, p1) of a tile:
    per 6 pixels x 16 channels the implicit GEMM over the whole reduction into ``acc``
    (6 x 16, in registers and L1), then at once the epilogue v = acc*ea[k] + eb[k]
    (+ residual) (relu) and the store, encoded into y's storage at ybase[m] + k*t1 (the
    residual read at rbase[m] + k*r1). The caller keeps [p0, p1) to a block of packed
    weight panels that stays in L2 while the micro-rows (each in L1) stream past it.""" 
    nt = taps.size
    h = np.empty(MR * NR, np.uint16)
    rt = np.empty(MR * NR, np.float32)
    rr = np.empty(MR * NR, res.dtype)
    for mr in range(m0, m1, MR):
        for p in range(p0, p1):
            kn = min(NR, tk - p * NR)
            for q in range(MR * NR):
                acc[q] = 0.0
            if tk >= 8:
                mk6x16_taps(slab, pix, mr, taps, nt, wpk, p * R * S * tc * NR, kc, acc, 0, NR)
            else:
                for mi in range(MR):
                    row = mi * NR
                    for t in range(nt):
                        a0 = pix[mr + mi] + taps[t]
                        wo = p * R * S * tc * NR + t * kc * NR
                        for c in range(kc):
                            a = slab[a0 + c]
                            for k in range(NR):
                                acc[row + k] += a * wpk[wo + c * NR + k]
            _epilogue_store(acc, min(m1, mr + MR) - mr, kn, k0 + p * NR, p * NR, mr, ybase, rbase, y, t1, ycode,
                            ea, eb, lo, has_res, res, r1, rcode, h, rt, rr, lut)


@njit(cache=True, nogil=True)
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
        if r1 == 1:
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
        for mi in range(mn):
            for j in range(kn):
                y[ybase[mr + mi] + (kl + j) * t1] = acc[mi * NR + j]
        return
    for q in range(MR * NR):
        h[q] = encode16(ycode, acc[q])
    _scatter(h, mn, kn, kl, mr, ybase, y, t1)


@njit(cache=True, nogil=True, inline="always")
def _scatter(h, mn, kn, kl, mr, ybase, y, t1):
    """The encoded block h[m * 16 + j] -> y[ybase[mr + m] + (kl + j) * t1]."""
    if t1 == 1:     # channel-inner layout: each pixel's channels are neighbours
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


@njit(cache=True, nogil=True, inline="always")
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
    """Weight panels per block: as many as keep ~192 KB of packed weights in L2."""
    return max(1, (192 * 1024) // max(1, taps.size * kc * NR * 4))


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


@njit(cache=True, nogil=True, parallel=True)
def conv_tile_fused(x, s0, s1, s2, s3, code, tc, H, W, w, w0, w1, w2, w3, wcode, wpk, tk, R, S, sh, sw, ph, pw,
                    dh, dw, n, c0, oh0, oh1, ow0, ow1, slab, y, t0, t1, t2, t3, ycode, k0, ea, eb, relu,
                    has_res, res, r0, r1, r2, r3, rcode, lut):
    """One large weight-stationary float tile in two parallel phases: (1) the K block's
    weight panels and the tile's input slab rows are loaded (independent pieces, handed to
    host threads one by one), (2) compute + epilogue + store per 6-pixel micro-row.
    Returns (input elements read, weight elements read)."""
    lo_h = oh0 * sh - ph
    rows = (oh1 - oh0 - 1) * sh + (R - 1) * dh + 1
    lo_w = ow0 * sw - pw
    cols = (ow1 - ow0 - 1) * sw + (S - 1) * dw + 1
    npanel = (tk + NR - 1) // NR
    rpc = max(1, 2048 // max(cols * tc, 1))          # slab rows per piece (~8 KB of input)
    nrc = (rows + rpc - 1) // rpc
    nread = 0
    for it in prange(npanel + nrc):
        if it < npanel:
            _pack_panel(w, w0, w1, w2, w3, wcode, k0, tk, np.int64(0), tc, R, S, wpk, np.int64(it), lut)
        else:
            i0 = (it - npanel) * rpc
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
    per = max(1, min(8, (nmp * nb) // 16))             # micro-rows per piece
    npc = (nmp + per - 1) // per
    for it in prange(nb * npc):
        b, c = it // npc, it % npc
        acc = np.empty(MR * NR, np.float32)
        _mm_store(slab, pix, c * per * MR, min(M, (c + 1) * per * MR), taps, kc, tc, wpk, tk, R, S, b * pb,
                  min(npanel, (b + 1) * pb), acc, ybase, rbase, y, t1, ycode, ea, eb, k0, lo, has_res, res, r1,
                  rcode, lut)
    return nread, tk * tc * R * S


@njit(cache=True, nogil=True, parallel=True)
def conv_tiles(x, s0, s1, s2, s3, code, c0, tc, H, W, wpk, tk, R, S, sh, sw, ph, pw, dh, dw, tiles, groups,
               y, t0, t1, t2, t3, ycode, k0, ea, eb, relu, has_res, res, r0, r1, r2, r3, rcode, lut):
    """Weight-stationary float tiles of one K block, spread over host threads in chunks.
    Each tile's slab is loaded as the chip loads it; tiles of one shape too small to fill
    the 6-pixel micro-kernel are computed together (``groups[g]:groups[g+1]`` index
    ``tiles``), their pixels side by side in one micro-row, and stored tile by tile. A chunk
    loads its tiles' slabs first, then streams them past one L2-sized block of weight
    panels after another. tiles[t] = (n, oh0, oh1, ow0, ow1). Returns input elements read."""
    ng = groups.size - 1
    nch = min(ng, 32)
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
        acc = np.empty(MR * NR, np.float32)
        pb = _panel_block(t_any, kc)
        for b0 in range(0, npanel, pb):
            for gi in range(g1 - g0):
                _mm_store(slab, pix, gmo[gi], gmo[gi] + gcnt[gi], gtaps[gi], kc, tc, wpk, tk, R, S, b0,
                          min(npanel, b0 + pb), acc, ybase, rbase, y, t1, ycode, ea, eb, k0, lo, has_res, res, r1,
                          rcode, lut)
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


# ---------------------------------------------------------------- Python drivers (spec.impl)

def _flat(t):
    """Flat storage of a DeviceTensor and its logical element strides (layout-aware)."""
    return _flat_view(t), _strides(t.shape, t.layout)


def _flat_view(t):
    """The storage of a DeviceTensor as one flat array."""
    from .. import dtypes as _dt

    n = 1
    for d in t.shape:
        n *= d
    return t.buffer.view(_dt.storage_dtype(t.dtype), (n,), t.offset)


@functools.lru_cache(maxsize=4096)
def _strides(shape, layout):
    """Logical element strides of a dense tensor of ``shape`` stored in ``layout``."""
    from ..tensor import layout_perm

    perm = layout_perm(layout, len(shape))
    pshape = [shape[q] for q in perm]
    pstr = [0] * len(pshape)
    acc = 1
    for i in range(len(pshape) - 1, -1, -1):
        pstr[i] = acc
        acc *= pshape[i]
    strides = [0] * len(perm)
    for i, q in enumerate(perm):
        strides[q] = pstr[i]
    return tuple(strides)


_TLS = threading.local()


def _scratch(name, n, dtype=np.float32):
    """On-chip scratch of ``n`` elements, reused between calls (per host thread): fresh
    arrays cost page faults and evict the caches on every call."""
    bufs = _TLS.__dict__.setdefault("bufs", {})
    a = bufs.get(name)
    if a is None or a.size < n or a.dtype != dtype:
        a = bufs[name] = np.empty(max(int(n), 1), dtype)
    return a[:n]


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


class _Site:
    """What a forward conv call site needs that depends only on its problem and plan
    (computed once per bound call: ``ctx.cache``)."""

    def __init__(self, p, chip, cfg):
        from . import _epilogue, _param_names, conv_geometry
        from .. import dtypes as _dt
        from .geometry import tile_starts

        self.G = G = conv_geometry(p)
        self.e = e = _epilogue(p.kernel, p)
        self.is_int = p.dtype == "int8"
        self.stationary = cfg.strategy == "weight_stationary"
        self.fast = self.stationary and not self.is_int
        self.tk, self.toh, self.tow, self.tc = cfg.tile("k"), cfg.tile("oh"), cfg.tile("ow"), cfg.tile("c")
        self.params = _param_names(p)
        self.codes = {n: _code(p.dtype_of(n), chip) for n in p.shapes}
        self.nvec = sum(_dt.itemsize(p.dtype_of(n)) for n in self.params)
        self.n_epi = int(e["bias"]) + 2 * int(e["bn"]) + int(e["residual"]) + int(e["relu"])
        self.kblocks = tile_starts(G["Kg"], self.tk) if G["Kg"] else []
        oh_tiles, ow_tiles = tile_starts(G["OH"], self.toh), tile_starts(G["OW"], self.tow)
        tiles = [(n, a0, a1, b0, b1) for n in range(G["N"]) for a0, a1 in oh_tiles for b0, b1 in ow_tiles]
        self.tiles = np.array(tiles, dtype=np.int64).reshape(-1, 5)
        self.tile0 = tiles[0] if tiles else None
        self.single = len(tiles) == 1
        # tiles of one shape that underfill the 6-pixel micro-kernel are computed together
        bounds = [0]
        for t, (n, a0, a1, b0, b1) in enumerate(tiles):
            if t == 0:
                continue
            s0 = tiles[bounds[-1]]
            px = (a1 - a0) * (b1 - b0)
            same = (a1 - a0, b1 - b0) == (s0[2] - s0[1], s0[4] - s0[3])
            want = MR // math.gcd(MR, px) if px < 4 * MR else 1
            if not same or t - bounds[-1] >= want:
                bounds.append(t)
        bounds.append(len(tiles))
        self.groups = np.array(bounds, dtype=np.int64)
        rows_max = (self.toh - 1) * G["sh"] + (G["R"] - 1) * G["dh"] + 1
        cols_max = (self.tow - 1) * G["sw"] + (G["S"] - 1) * G["dw"] + 1
        self.slab_n = rows_max * cols_max * max(G["Cg"], 1)


def run_conv2d(ctx):
    site = ctx.cache.get("conv")
    if site is None:
        site = ctx.cache["conv"] = _Site(ctx.problem, ctx.chip, ctx.plan.config)
    if site.fast:
        return _run_stationary_float(ctx, site)
    return _run_conv2d_general(ctx)


def _run_stationary_float(ctx, site):
    """Float weight-stationary conv: per K block the weights are packed once (panels spread
    over host threads), then each tile is loaded, computed and stored (epilogue fused into
    the store of every 6-pixel micro-row)."""
    from .. import dtypes as _dt

    p, chip = ctx.problem, ctx.chip
    G, e = site.G, site.e
    N, K, Cg, R, S, OH, OW = G["N"], G["K"], G["Cg"], G["R"], G["S"], G["OH"], G["OW"]
    (yt,) = ctx.outputs()
    if N * K * OH * OW == 0:
        return [yt]
    codes = site.codes
    x, xs = _flat(ctx.inputs["x"])
    w, wst = _flat(ctx.inputs["weight"])
    y, ys = _flat(yt)
    xcode, wcode, ycode = codes["x"], codes["weight"], _code(yt.dtype, chip)
    es, ew, ey = _dt.itemsize(p.dtype), _dt.itemsize(p.dtype_of("weight")), _dt.itemsize(yt.dtype)
    if e["residual"]:
        res, rs = _flat(ctx.inputs["residual"])
        rcode, er = codes["residual"], _dt.itemsize(p.dtype_of("residual"))
    else:   # a stand-in of the output's storage type: conv2d_bn_relu and conv2d_bn_add_relu then
        # share one compiled conv_tile_fused / conv_tiles (a float32 stand-in compiled a second
        # 21 s specialisation for uint16 storage)
        res, rs, rcode, er = np.zeros(1, y.dtype), (0, 0, 0, 0), 0, 0
    # per-channel parameters, loaded once per K block (resident), folded into one FMA
    vec = {}
    for name in ("bias", "bn_weight", "bn_bias", "running_mean", "running_var"):
        t = ctx.inputs.get(name) if name in site.params else None
        vec[name] = (_flat_view(t), codes[name]) if t is not None else (_NO_RES, 0)
    ea, eb = np.zeros(K + NR, np.float32), np.zeros(K + NR, np.float32)   # padded: whole 16-wide rows
    fold_epilogue(K, np.float32(1.0), float(p.attrs["eps"]), e["bias"], *vec["bias"], e["bn"],
                  "bn_weight" in site.params, *vec["bn_weight"], "bn_bias" in site.params, *vec["bn_bias"],
                  *vec["running_mean"], *vec["running_var"], ea, eb)
    ctx.read(K * site.nvec)
    npanel = -(-site.tk // NR)
    wpk = _scratch("wpk", npanel * R * S * max(Cg, 1) * NR)
    slab = _scratch("slab", site.slab_n) if site.single else None
    # the parallel loops hand their pieces out one at a time (uneven pieces; a host thread
    # that starts late on a shared machine takes fewer)
    with numba.parallel_chunksize(1):
        _conv_blocks(ctx, site, G, x, xs, xcode, w, wst, wcode, y, ys, ycode, res, rs, rcode, ea, eb, wpk, slab,
                     es, ew, ey, er)
    return [yt]


def _conv_blocks(ctx, site, G, x, xs, xcode, w, wst, wcode, y, ys, ycode, res, rs, rcode, ea, eb, wpk, slab,
                 es, ew, ey, er):
    N, Cg, Kg, R, S, g = G["N"], G["Cg"], G["Kg"], G["R"], G["S"], G["g"]
    H, W, OH, OW = G["H"], G["W"], G["OH"], G["OW"]
    sh, sw, ph, pw, dh, dw = G["sh"], G["sw"], G["ph"], G["pw"], G["dh"], G["dw"]
    relu, has_res = site.e["relu"], site.e["residual"]
    per_out = 2 * Cg * R * S + site.n_epi
    for gi in range(g):
        for k0, k1 in site.kblocks:
            kg0 = gi * Kg + k0          # global output channel of the block
            tka = k1 - k0
            if site.single:
                n, a0, a1, b0, b1 = site.tile0
                nr, nw = conv_tile_fused(x, *xs, xcode, Cg, H, W, w, *wst, wcode, wpk, tka, R, S, sh, sw, ph, pw,
                                         dh, dw, n, gi * Cg, a0, a1, b0, b1, slab, y, *ys, ycode, kg0, ea, eb,
                                         relu, has_res, res, *rs, rcode, F16_LUT)
                ctx.read(nw * ew)
            else:
                ctx.read(pack_weights(w, *wst, wcode, kg0, tka, 0, Cg, R, S, wpk, F16_LUT) * ew)
                nr = conv_tiles(x, *xs, xcode, gi * Cg, Cg, H, W, wpk, tka, R, S, sh, sw, ph, pw, dh, dw,
                                site.tiles, site.groups, y, *ys, ycode, kg0, ea, eb, relu, has_res, res,
                                *rs, rcode, F16_LUT)
            nout = N * OH * OW * tka
            ctx.read(nr * es + (nout * er if has_res else 0))
            ctx.write(nout * ey)
            ctx.ops(nout * per_out)


_NO_RES = np.zeros(1, np.float32)


def _sub_channel_zero_points(wpk, zps, run):
    """Packed int8 weight panels (load_weights: [panel][r][s][c][16], stored as q) minus each
    output channel's own zero point; the panel's padding channels stay zero."""
    tk = zps.shape[0]
    npanel = -(-tk // NR)
    zp = np.zeros(npanel * NR, np.float32)
    zp[:tk] = zps
    view = wpk[:npanel * run * NR].reshape(npanel, run, NR)
    view -= zp.reshape(npanel, 1, NR)


def _run_conv2d_general(ctx):
    """split_c and int8 convs: channel blocks accumulate into a whole-tile accumulator."""
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
    out_inv = np.float32(1.0 / (a["out_scale"] or 1.0))
    out_zp = np.float32(a["out_zero_point"] or 0)
    qmin, qmax = np.float32(a.get("out_min", -128)), np.float32(a.get("out_max", 127))
    wsc = np.ones(max(K, 1), np.float32)     # per-channel weight scales (w_scales input), else deq has w_scale
    wzv = np.zeros(max(K, 1), np.float32)                                   # per-channel weight zero points
    per_channel_zp = p.has("w_zero_points")
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
    # int8: exact float32 chunks through the micro-kernel (compute_int); the
    # chunk depends on the packed block's largest |w - zp|, so it is known once it is loaded
    tmp = np.zeros(mpad * ldc, np.float32) if is_int else acc
    x_bound = float(max(127 - a["x_zero_point"], a["x_zero_point"] + 128)) if is_int else 0.0
    block = {"chunk": 0}

    def chunk(tca):
        if not is_int:
            return 0
        if block.get("tca") != tca:
            block["tca"], block["chunk"] = tca, exact_chunk(x_bound, wpk, tca)
        return block["chunk"]
    oh_tiles = tile_starts(OH, toh)
    ow_tiles = tile_starts(OW, tow)
    for gi in range(g):
        for k0, k1 in tile_starts(Kg, tk):
            kg0 = gi * Kg + k0          # global output channel of the block
            tka = k1 - k0
            # per-channel parameters of the block: loaded once, resident
            for name in _param_names(p):
                dst = {"bias": bias, "bn_weight": bnw, "bn_bias": bnb, "running_mean": mean,
                       "running_var": var, "w_scales": wsc, "w_zero_points": wzv}[name]
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
            if p.has("w_scales"):
                deq = np.float32(a["x_scale"])
            ea[sl] = deq * wsc[sl] * scale[sl]
            eb[sl] = (bias[sl] * scale[sl] if e["bias"] else 0.0) + shift[sl]
            if stationary:
                nread = load_weights(w, *wst, wcode, wzp, kg0, tka, 0, Cg, R, S, wpk)
                if per_channel_zp:
                    _sub_channel_zero_points(wpk, wzv[kg0:kg0 + tka], R * S * Cg)
                block.clear()
                ctx.read(nread * ew)
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
                                if per_channel_zp:
                                    _sub_channel_zero_points(wpk, wzv[kg0:kg0 + tka], R * S * tca)
                                block.clear()
                                ctx.read(nread * ew)
                            nread = _slab_rows(x, *xs, xcode, xzp, n, gi * Cg + c0, tca, lo_h, lo_w,
                                               hi_w - lo_w, H, W, slab, 0, hi_h - lo_h, F16_LUT)
                            ctx.read(nread * es)
                            if tca and chunk(tca) > 0:
                                compute_int(slab, hi_w - lo_w, tca, wpk, tka, R, S, sh, sw, dh, dw, th, tw,
                                            acc, tmp, ldc, chunk(tca))
                            elif tca:
                                compute(slab, hi_w - lo_w, tca, wpk, tka, R, S, sh, sw, dh, dw, th, tw,
                                        acc, ldc, is_int)
                            ctx.ops(2 * th * tw * tka * tca * R * S)
                        nw, nr = store(acc, ldc, tka, th, tw, n, kg0, oh0, ow0, y, *ys, ycode, ea, eb,
                                       e["relu"], e["residual"], res, *rs, rcode, out_inv, out_zp, qmin, qmax)
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

        outs[1].logical()[...] = _dt2.encode(bias_out[:K], outs[1].dtype) if outs[1].dtype != "float32" else bias_out[:K]
    return outs
