"""Tiled GEMM engine (Numba) shared by the matmul family (and usable by conv/attention).

Executes a TilePlan's (TM, TN, TK) tiling exactly: for every C tile, for every K tile,
the A tile and the B tile are *loaded* — packed into MR/NR panels, decoded from their
storage dtype (and layer-normalised for layernorm_linear) — which is the explicit
off-chip -> on-chip transfer, counted in bytes; the fp32 accumulator tile stays on chip;
the epilogue (alpha, bias, activation, RNE encode) *stores* the tile, counted. Inside a
loaded tile the CPU walks KC x MC sub-blocks with the LLVM-IR micro-kernel; that
sub-blocking is a CPU cache detail and moves no emulated bytes.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from .codecs import decode, encode16
from .ukernel import MR, NR, ukernel_6x16

KC = 256      # CPU sub-block along K (L1/L2 reuse of the packed panels)
MCP = 16      # A panels (of MR rows) per parallel block: MC = 96 rows


@njit(cache=True, parallel=True)
def _pack_a(A, rows, ks, k0, tk, tm, code, pa, has_ln, mean, rstd, g, b, has_g, has_b):
    npan = (tm + MR - 1) // MR
    for p in prange(npan):
        for r in range(MR):
            m = p * MR + r
            base = p * tk * MR + r
            if m >= tm:
                for k in range(tk):
                    pa[base + k * MR] = 0.0
                continue
            off = rows[m] + k0 * ks
            if code == 0:
                for k in range(tk):
                    pa[base + k * MR] = np.float32(A[off + k * ks])
            else:
                for k in range(tk):
                    pa[base + k * MR] = decode(code, A[off + k * ks])
            if has_ln:
                mu = mean[m]
                rs = rstd[m]
                for k in range(tk):
                    v = (pa[base + k * MR] - mu) * rs
                    if has_g:
                        v = v * g[k0 + k]
                    if has_b:
                        v = v + b[k0 + k]
                    pa[base + k * MR] = v


@njit(cache=True, parallel=True)
def _pack_b(B, base, ks, ns, k0, tk, j0, tn, code, pb):
    npan = (tn + NR - 1) // NR
    for p in prange(npan):
        full = (p + 1) * NR <= tn
        for k in range(tk):
            o = (p * tk + k) * NR
            src = base + (k0 + k) * ks + (j0 + p * NR) * ns
            if full and code == 0 and ns == 1:
                for c in range(NR):
                    pb[o + c] = B[src + c]
            elif full and code == 0:
                for c in range(NR):
                    pb[o + c] = B[src + c * ns]
            else:
                for c in range(NR):
                    n = p * NR + c
                    if n < tn:
                        v = B[src + c * ns]
                        pb[o + c] = np.float32(v) if code == 0 else decode(code, v)
                    else:
                        pb[o + c] = 0.0


@njit(cache=True, parallel=True)
def _compute(pa, pb, acc, ldc, tm, tn, tk, nthreads):
    """acc[tm, tn] += A_tile @ B_tile on packed panels. Work is split over N panels when
    there are enough of them (every thread then has the same share: FINDINGS), else over
    blocks of MC rows; per thread the loops are BLIS's kc -> MC block -> NR panel -> MR panel."""
    npa = (tm + MR - 1) // MR
    npb = (tn + NR - 1) // NR
    nblk = (npa + MCP - 1) // MCP
    if npb >= 2 * nthreads or nblk < nthreads:
        nch = min(npb, nthreads)
        for ch in prange(nch):
            j0 = ch * npb // nch
            j1 = (ch + 1) * npb // nch
            for kc0 in range(0, tk, KC):
                kc = min(KC, tk - kc0)
                for blk in range(nblk):
                    p0 = blk * MCP
                    p1 = min(npa, p0 + MCP)
                    for jp in range(j0, j1):
                        boff = (jp * tk + kc0) * NR
                        for ip in range(p0, p1):
                            ukernel_6x16(kc, pa, (ip * tk + kc0) * MR, pb, boff, acc, ip * MR * ldc + jp * NR, ldc)
    else:
        for blk in prange(nblk):
            p0 = blk * MCP
            p1 = min(npa, p0 + MCP)
            for kc0 in range(0, tk, KC):
                kc = min(KC, tk - kc0)
                for jp in range(npb):
                    boff = (jp * tk + kc0) * NR
                    for ip in range(p0, p1):
                        ukernel_6x16(kc, pa, (ip * tk + kc0) * MR, pb, boff, acc, ip * MR * ldc + jp * NR, ldc)


@njit(cache=True)
def _gelu(v, act):
    if act == 2:
        return 0.5 * v * (1.0 + math.erf(v * 0.7071067811865476))
    u = 0.7978845608028654 * (v + 0.044715 * v * v * v)
    return 0.5 * v * (1.0 + math.tanh(u))


@njit(cache=True, parallel=True)
def _store(acc, ldc, tm, tn, j0, C, crows, cns, code, alpha, beta, bias, has_bias, bcode, act):
    plain = (not has_bias) and act == 0 and alpha == 1.0
    tmp = np.empty(0, np.float32)
    for m in prange(tm):
        row = crows[m] + j0 * cns
        a0 = m * ldc
        if plain and code == 0 and cns == 1:
            for n in range(tn):
                C[row + n] = acc[a0 + n]
            continue
        for n in range(tn):
            v = alpha * acc[a0 + n]
            if has_bias:
                bv = bias[j0 + n]
                v += beta * (np.float32(bv) if bcode == 0 else decode(bcode, bv))
            if act == 1:
                v = max(v, np.float32(0.0))
            elif act >= 2:
                v = np.float32(_gelu(np.float64(v), act))
            if code == 0:
                C[row + n * cns] = v
            else:
                C[row + n * cns] = encode16(code, v)


def run_float(A, a_rows, a_ks, B, b_base, b_ks, b_ns, C, c_rows, c_ns, *, M, N, K, TM, TN, TK,
              b_res, code, esa, esc, bias=None, alpha=1.0, beta=1.0, act=0, ln=None, counter=None):
    """Run the tiled float GEMM over batches (a_rows/c_rows: [batch, M] element offsets,
    b_base: [batch]); returns (bytes_read, bytes_written, ops) actually moved/computed.

    ``ln`` = (mean, rstd, gamma|None, beta|None) applies layer-norm while packing A.
    """
    from numba import get_num_threads

    nthreads = get_num_threads()
    batch = a_rows.shape[0]
    tm_pad = (min(TM, M) + MR - 1) // MR * MR
    ldc = (min(TN, N) + NR - 1) // NR * NR
    pa = np.empty(tm_pad * min(TK, K) if not b_res else tm_pad * K, np.float32)
    pb = np.empty(ldc * (K if b_res else min(TK, K)), np.float32)
    acc = np.empty(tm_pad * ldc, np.float32)
    has_bias = bias is not None
    bias_arr = bias if has_bias else np.zeros(1, np.float32 if code == 0 else np.uint16)
    esb = esa
    has_ln = ln is not None
    e32 = np.zeros(1, np.float32)
    mean, rstd, g, bb = (ln if has_ln else (e32, e32, None, None))
    has_g, has_b = g is not None, bb is not None
    g = e32 if g is None else g
    bb = e32 if bb is None else bb
    rd = wr = ops = 0
    epi = int(has_bias) + int(act > 0)
    ln_ops = 4 if has_ln else 0
    b_loaded = -1
    for bt in range(batch):
        rows_b = a_rows[bt]
        crow_b = c_rows[bt]
        for i0 in range(0, M, TM):
            tm = min(TM, M - i0)
            rows = rows_b[i0:i0 + tm]
            for j0 in range(0, N, TN):
                tn = min(TN, N - j0)
                acc[:] = 0.0
                for k0 in range(0, K, TK):
                    tk = min(TK, K - k0)
                    if has_ln:
                        _pack_a(A, rows, a_ks, k0, tk, tm, code, pa, True, mean[i0:i0 + tm], rstd[i0:i0 + tm],
                                g, bb, has_g, has_b)
                    else:
                        _pack_a(A, rows, a_ks, k0, tk, tm, code, pa, False, e32, e32, e32, e32, False, False)
                    rd += tm * tk * esa
                    ops += ln_ops * tm * tk
                    if b_res:
                        key = 0 if b_base.shape[0] == 1 else bt
                        if b_loaded != key:
                            _pack_b(B, b_base[key], b_ks, b_ns, 0, K, 0, N, code, pb)
                            rd += K * N * esa + (N * esb if has_bias else 0)
                            b_loaded = key
                    else:
                        _pack_b(B, b_base[0 if b_base.shape[0] == 1 else bt], b_ks, b_ns, k0, tk, j0, tn, code, pb)
                        rd += tk * tn * esa
                    _compute(pa, pb, acc, ldc, tm, tn, tk, nthreads)
                    ops += 2 * tm * tn * tk
                if has_bias and not b_res:
                    rd += tn * esb
                _store(acc, ldc, tm, tn, j0, C, crow_b[i0:i0 + tm], c_ns, code, np.float32(alpha),
                       np.float32(beta), bias_arr, has_bias, code, act)
                wr += tm * tn * esc
                ops += tm * tn * epi
    return rd, wr, ops


@njit(cache=True)
def _int8_tile(A, rows, ks, k0, tk, tm, za, B, base, bks, bns, j0, tn, zb, acc, ldc):
    """acc[m, n] += sum_k (A - za)(B - zb) in int32 (exact)."""
    bt = np.empty((tk, tn), np.int32)
    for k in range(tk):
        for n in range(tn):
            bt[k, n] = np.int32(B[base + (k0 + k) * bks + (j0 + n) * bns]) - zb
    for m in range(tm):
        off = rows[m] + k0 * ks
        for k in range(tk):
            a = np.int32(A[off + k * ks]) - za
            if a != 0:
                for n in range(tn):
                    acc[m * ldc + n] += a * bt[k, n]


@njit(cache=True)
def _int8_store(acc, ldc, tm, tn, j0, C, crows, cns, scale, bias, has_bias, out_q, oscale, ozero, act):
    for m in range(tm):
        row = crows[m]
        for n in range(tn):
            v = np.float32(acc[m * ldc + n]) * scale
            if has_bias:
                v += bias[j0 + n]
            if act == 1:
                v = max(v, np.float32(0.0))
            elif act >= 2:
                v = np.float32(_gelu(np.float64(v), act))
            if out_q:
                q = np.rint(v / oscale) + ozero
                C[row + (j0 + n) * cns] = min(127.0, max(-128.0, q))
            else:
                C[row + (j0 + n) * cns] = v


def run_int8(A, a_rows, a_ks, B, b_base, b_ks, b_ns, C, c_rows, c_ns, *, M, N, K, TM, TN, TK, b_res,
             esc, za, zb, scale, bias=None, act=0, out_q=False, oscale=1.0, ozero=0):
    """int8 GEMM with int32 accumulation over the same tiling; returns the counts."""
    batch = a_rows.shape[0]
    ldc = min(TN, N)
    acc = np.empty(min(TM, M) * ldc, np.int32)
    has_bias = bias is not None
    bias_arr = bias if has_bias else np.zeros(1, np.float32)
    rd = wr = ops = 0
    epi = int(has_bias) + int(act > 0)
    b_loaded = -1
    for bt in range(batch):
        bkey = 0 if b_base.shape[0] == 1 else bt
        for i0 in range(0, M, TM):
            tm = min(TM, M - i0)
            rows = a_rows[bt][i0:i0 + tm]
            for j0 in range(0, N, TN):
                tn = min(TN, N - j0)
                acc[:] = 0
                for k0 in range(0, K, TK):
                    tk = min(TK, K - k0)
                    rd += tm * tk
                    if b_res:
                        if b_loaded != bkey:
                            rd += K * N + (N * 4 if has_bias else 0)
                            b_loaded = bkey
                    else:
                        rd += tk * tn
                    _int8_tile(A, rows, a_ks, k0, tk, tm, np.int32(za), B, b_base[bkey], b_ks, b_ns, j0, tn,
                               np.int32(zb), acc, ldc)
                    ops += 2 * tm * tn * tk
                if has_bias and not b_res:
                    rd += tn * 4
                _int8_store(acc, ldc, tm, tn, j0, C, c_rows[bt][i0:i0 + tm], c_ns, np.float32(scale), bias_arr,
                            has_bias, out_q, np.float32(oscale), np.float32(ozero), act)
                wr += tm * tn * esc
                ops += tm * tn * epi
    return rd, wr, ops
