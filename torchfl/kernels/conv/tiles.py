"""Convolution tiles moved and computed explicitly (the split-channel and int8 path, and the
loads the fused path shares).

``load_slab`` gathers the input window of one output tile from off-chip storage (any layout:
it reads through the tensor's logical strides) into an on-chip slab ``[rows][cols][channels]``
with a zero halo for the padding, and returns how many elements it really read;
``load_weights`` packs a weight block into 16-wide panels; ``compute`` runs the implicit GEMM
on chip (the 6x16 register micro-kernel where the block has >= 8 output channels, a
vectorised loop otherwise); ``store`` applies the epilogue (bias, folded batch-norm,
residual, relu) and writes the tile back in the output's layout.

One compiled body per storage type: the dtype is a runtime code (``dtypes.CODE``).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..codecs import decode, enc16, f16_to_f32
from ..optlevel import opt_level   # IR level 1: the hot loops are vector-IR micro-kernels (BENCHMARKS, cold5)
from .microkernel import MR, NR, mk6x16_taps, tr16x8_f16


@njit(cache=True)
def _f16_table():
    t = np.empty(65536, np.float32)
    for i in range(65536):
        t[i] = f16_to_f32(np.uint16(i))
    return t


F16_LUT = _f16_table()
"""float16 bits -> float32, the codec's own values (a table lookup: the scattered decodes
of slab and weight loads do not vectorise, a lookup is one load)."""


@njit(forceinline=True, cache=True)  # compiled once, inlined by LLVM (not re-typed per call site)
def _dec(code, v, lut):
    if code == 1 and lut.size == 65536:
        return lut[np.intp(v)]     # (any storage type compiles; only uint16 bits take this branch)
    return decode(code, v)


@opt_level(1)
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


@opt_level(1)
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


@opt_level(1)
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
                    y[yb + k * t1] = enc16(ycode, v)
    return toh * tow * tk, (toh * tow * tk if has_res else 0)
