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

from ._codec_shim import decode_value, encode_value  # TODO core codecs
from .microkernel import MR, NR, mk6x16

EPI_BIAS, EPI_BN, EPI_RES, EPI_RELU = 1, 2, 4, 8


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
                for c in range(tc):
                    slab[o + c] = decode_value(x[b + c * s1], code) - zp
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
                        slab[(i * cols + j) * tc + c] = decode_value(x[bc + h * s2 + w * s3], code) - zp
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
                            wpk[o + j] = decode_value(w[(k0 + k) * s0 + (c0 + c) * s1 + r * s2 + s * s3], code) - zp
                        else:
                            wpk[o + j] = 0.0
    return tk * tc * R * S


@njit(cache=True, nogil=True, parallel=True)
def compute(slab, cols, tc, wpk, tk, R, S, sh, sw, dh, dw, toh, tow, acc, ldc, exact_int):
    """acc[m, k] += sum_{r,s,c} slab[pixel m, tap (r,s), c] * w[k, c, r, s] for the tile's
    toh*tow output pixels m (acc has ldc = 16*panels columns and rows padded to 6).
    ``exact_int``: int8 path, products accumulated in int64 then stored (exact)."""
    M = toh * tow
    npanel = (tk + NR - 1) // NR
    nmp = (M + MR - 1) // MR
    pix = np.zeros(nmp * MR, dtype=np.int64)
    for m in range(M):
        pix[m] = (((m // tow) * sh) * cols + (m % tow) * sw) * tc
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
    elif tk >= 8:
        for mp in prange(nmp):
            for p in range(npanel):
                for r in range(R):
                    for s in range(S):
                        tap = (r * dh * cols + s * dw) * tc
                        boff = ((p * R + r) * S + s) * tc * NR
                        mk6x16(slab, pix, mp * MR, tap, wpk, boff, tc, acc, mp * MR * ldc + p * NR, ldc)
    else:
        for m in prange(M):
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
def store(acc, ldc, tk, toh, tow, n, k0, oh0, ow0, y, t0, t1, t2, t3, ycode, epi, bias, scale, shift,
          res, r0, r1, r2, r3, rcode, out_scale, out_zp, deq):
    """Epilogue + store of one tile: v = acc*deq (+bias) (*scale+shift) (+res) (relu), encoded
    into y's storage (for int8 output: q = clamp(rne(v/out_scale)+out_zp)).
    Returns (elements written, residual elements read)."""
    nres = 0
    for i in range(toh):
        for j in range(tow):
            m = i * tow + j
            yb = n * t0 + (oh0 + i) * t2 + (ow0 + j) * t3
            rb = n * r0 + (oh0 + i) * r2 + (ow0 + j) * r3
            for k in range(tk):
                kk = k0 + k
                v = acc[m * ldc + k] * deq
                if epi & EPI_BIAS:
                    v += bias[kk]
                if epi & EPI_BN:
                    v = v * scale[kk] + shift[kk]
                if epi & EPI_RES:
                    v += decode_value(res[rb + kk * r1], rcode)
                    nres += 1
                if epi & EPI_RELU:
                    v = max(v, np.float32(0.0))
                if ycode == 4:
                    q = np.round(v / out_scale) + out_zp
                    q = min(max(q, -128.0), 127.0)
                    y[yb + kk * t1] = np.int8(q)
                elif ycode == 0:
                    y[yb + kk * t1] = v
                else:
                    y[yb + kk * t1] = encode_value(v, ycode)
    return toh * tow * tk, nres
