"""Decode-shaped GEMMs (a few rows of A, M <= GEMV_M) on the host: memory-bound, so B is
streamed once, in its storage dtype, and never packed.

Two B layouts, two loops (both threads over N, each thread a contiguous run of columns):
- ``nk``: B's columns contiguous along K (a linear layer's weight ``w[N, K]``): ``NB`` columns
  at a time, each output a dot product of an A row and a column decoded as it streams past
  (fp16 through F16C, bf16 by a shift: both vectorise), ``NB`` independent streams in flight;
- ``kn``: B's rows contiguous along N (``a @ b`` with ``b[K, N]``): C's row is an axpy sum over
  K, ``C[m, :] += A[m, k] * B[k, :]``, each B row read once for every A row (a slice of
  ``CHUNK_N`` columns stays in L1 across the rows).

Summed in float32 with re-association allowed (vector lanes): within the fp32 tolerance of a
GEMM, not bit-equal to a sequential sum. The kernels compute all of C at once; the chip's
tiles (``run_gemv``' counts) are the plan's, loads and stores counted as the tiled path counts
them. A 16-bit B streams at half fp32's bytes: torch's fp16 GEMV does the same (1x4096x4096:
2.1 ms fp16 against 5.5 ms fp32 on one Zen 4 core), so a float32 copy of a kept weight would
lose to it.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .codecs import bf16_to_f32, decode, encode16, f2h_cvt, h2f_cvt
from .mathfn import gelu32

GEMV_M = 2        # at most this many rows of A: from 3 rows on the tiled micro-kernel path is faster
                  # even reading a kept weight as packed float32 (3x4096x4096 fp32: 4.4 vs 5.1 ms,
                  # fp16 4.5 vs 6.1 ms on one Zen 4 core; 2 rows: 3.9 vs 4.1, 4.3 vs 2.8 ms)
NB = 4            # columns a ``nk`` loop streams at once
CHUNK_N = 1024    # columns of C a ``kn`` task keeps (4 KiB of float32 a row, 8 rows: L1)


@njit(cache=True)
def _rows_f32(A, rows, a_ks, K, code):
    """The tm rows of A decoded to float32, row m at ``m * K``."""
    tm = rows.shape[0]
    a = np.empty(tm * K, np.float32)
    for m in range(tm):
        off = rows[m]
        dst = a[m * K:(m + 1) * K]
        if a_ks == 1:
            src = A[off:off + K]
            if code == 0:
                for k in range(K):
                    dst[k] = np.float32(src[k])
            elif code == 1:
                for k in range(K):
                    dst[k] = h2f_cvt(src[k])
            elif code == 2:
                for k in range(K):
                    dst[k] = bf16_to_f32(src[k])
            else:
                for k in range(K):
                    dst[k] = decode(code, src[k])
        else:
            for k in range(K):
                dst[k] = decode(code, A[off + k * a_ks])
    return a


@njit(cache=True, fastmath={"reassoc", "contract"})
def _dot4_f32(a, b0, b1, b2, b3, out):
    """out[0:4] = a . b_i: four columns in one pass, four streams in flight."""
    s0 = s1 = s2 = s3 = np.float32(0.0)
    for k in range(a.shape[0]):
        x = a[k]
        s0 += x * b0[k]
        s1 += x * b1[k]
        s2 += x * b2[k]
        s3 += x * b3[k]
    out[0] = s0
    out[1] = s1
    out[2] = s2
    out[3] = s3


@njit(cache=True, fastmath={"reassoc", "contract"})
def _dot4_f16(a, b0, b1, b2, b3, out):
    s0 = s1 = s2 = s3 = np.float32(0.0)
    for k in range(a.shape[0]):
        x = a[k]
        s0 += x * h2f_cvt(b0[k])
        s1 += x * h2f_cvt(b1[k])
        s2 += x * h2f_cvt(b2[k])
        s3 += x * h2f_cvt(b3[k])
    out[0] = s0
    out[1] = s1
    out[2] = s2
    out[3] = s3


@njit(cache=True, fastmath={"reassoc", "contract"})
def _dot4_bf16(a, b0, b1, b2, b3, out):
    s0 = s1 = s2 = s3 = np.float32(0.0)
    for k in range(a.shape[0]):
        x = a[k]
        s0 += x * bf16_to_f32(b0[k])
        s1 += x * bf16_to_f32(b1[k])
        s2 += x * bf16_to_f32(b2[k])
        s3 += x * bf16_to_f32(b3[k])
    out[0] = s0
    out[1] = s1
    out[2] = s2
    out[3] = s3


@njit(cache=True)
def _dot4(a, b0, b1, b2, b3, code, out):
    if code == 0:
        _dot4_f32(a, b0, b1, b2, b3, out)
    elif code == 1:
        _dot4_f16(a, b0, b1, b2, b3, out)
    elif code == 2:
        _dot4_bf16(a, b0, b1, b2, b3, out)
    else:
        for c in range(NB):
            out[c] = 0.0
        for k in range(a.shape[0]):
            out[0] += a[k] * decode(code, b0[k])
            out[1] += a[k] * decode(code, b1[k])
            out[2] += a[k] * decode(code, b2[k])
            out[3] += a[k] * decode(code, b3[k])


@njit(cache=True, fastmath={"reassoc", "contract"})
def _dot1_f32(a, b):
    s = np.float32(0.0)
    for k in range(a.shape[0]):
        s += a[k] * b[k]
    return s


@njit(cache=True)
def _dot1(a, b, code):
    if code == 0:
        return _dot1_f32(a, b)
    col = np.empty(a.shape[0], np.float32)
    _decode_into(b, code, col)
    return _dot1_f32(a, col)


@njit(cache=True)
def _decode_into(b, code, col):
    if code == 0:
        for k in range(b.shape[0]):
            col[k] = np.float32(b[k])
    elif code == 1:
        for k in range(b.shape[0]):
            col[k] = h2f_cvt(b[k])
    elif code == 2:
        for k in range(b.shape[0]):
            col[k] = bf16_to_f32(b[k])
    else:
        for k in range(b.shape[0]):
            col[k] = decode(code, b[k])


@njit(inline="always", cache=True)
def _finish(v, alpha, beta, bias, j, has_bias, act, code):
    """act(alpha * v + beta * bias[j]) in C's storage type (float32 bits as float32)."""
    v = alpha * v
    if has_bias:
        v += beta * bias[j]
    if act == 1:
        v = max(v, np.float32(0.0))
    elif act == 2:
        v = gelu32(v, False)
    elif act == 3:
        v = gelu32(v, True)
    return v


@njit(inline="always", cache=True)
def _put(C, i, v, code):
    if code == 0:
        C[i] = v
    elif code == 1:
        C[i] = f2h_cvt(v)
    else:
        C[i] = encode16(code, v)


@njit(cache=True, parallel=True)
def gemv_nk(a, tm, K, B, b_base, b_ns, N, bcode, C, crows, c_ns, ccode, alpha, beta, bias, has_bias, act,
            nthreads):
    """C[m, n] = act(alpha * a[m] . B[:, n] + beta * bias[n]) for m < tm, n < N; B's column n at
    ``b_base + n * b_ns``, contiguous along K; ``a``: ``_rows_f32``; ``bias`` float32."""
    nch = max(1, min(nthreads, (N + NB - 1) // NB))
    dec = tm > 2 and bcode != 0         # decode NB columns once, then tm float32 passes over them
    for ch in prange(nch):
        n0 = ch * N // nch
        n1 = (ch + 1) * N // nch
        out = np.empty(NB, np.float32)
        cols = np.empty(NB * K if dec else 1, np.float32)
        n = n0
        while n < n1:
            o = b_base + n * b_ns
            if n + NB <= n1:
                if dec:
                    for c in range(NB):
                        _decode_into(B[o + c * b_ns:o + c * b_ns + K], bcode, cols[c * K:(c + 1) * K])
                    for m in range(tm):
                        _dot4_f32(a[m * K:(m + 1) * K], cols[:K], cols[K:2 * K], cols[2 * K:3 * K], cols[3 * K:], out)
                        _store(C, crows[m], c_ns, n, NB, out, alpha, beta, bias, has_bias, act, ccode)
                else:
                    b0 = B[o:o + K]
                    b1 = B[o + b_ns:o + b_ns + K]
                    b2 = B[o + 2 * b_ns:o + 2 * b_ns + K]
                    b3 = B[o + 3 * b_ns:o + 3 * b_ns + K]
                    for m in range(tm):
                        _dot4(a[m * K:(m + 1) * K], b0, b1, b2, b3, bcode, out)
                        _store(C, crows[m], c_ns, n, NB, out, alpha, beta, bias, has_bias, act, ccode)
                n += NB
            else:
                for m in range(tm):
                    out[0] = _dot1(a[m * K:(m + 1) * K], B[o:o + K], bcode)
                    _store(C, crows[m], c_ns, n, np.int64(1), out, alpha, beta, bias, has_bias, act, ccode)
                n += 1


@njit(inline="always", cache=True)
def _store(C, row, c_ns, n, w, out, alpha, beta, bias, has_bias, act, ccode):
    """C[row + (n + c) * c_ns] = act(alpha * out[c] + beta * bias[n + c]) for c < w."""
    for c in range(w):
        _put(C, row + (n + c) * c_ns, _finish(out[c], alpha, beta, bias, n + c, has_bias, act, ccode), ccode)


def run_gemv(A, a_rows, a_ks, B, b_base, b_ns, C, c_rows, c_ns, M, N, K, TM, TN, b_res, code, esa, esc, esb,
             biasf, has_bias, alpha, beta, act, nthreads):
    """The few-row GEMM (M <= GEMV_M, B's columns contiguous along K) for every batch; returns
    (bytes read, bytes written, ops) as the plan's tiles move them: each tile's A and B loads
    (B once when resident, with the bias), its C store; ``biasf``: the bias as float32."""
    rd = wr = ops = 0
    epi = int(has_bias) + int(act > 0)
    b_loaded = -1
    for bt in range(a_rows.shape[0]):
        bkey = 0 if b_base.shape[0] == 1 else bt
        if b_res and b_loaded != bkey:
            rd += K * N * esa + (N * esb if has_bias else 0)     # B loaded once, kept
            b_loaded = bkey
        for i0 in range(0, M, TM):
            tm = min(TM, M - i0)
            tiles_n = (N + TN - 1) // TN
            rd += tiles_n * tm * K * esa + (0 if b_res else K * N * esa)
            if has_bias and not b_res:
                rd += N * esb
            wr += tm * N * esc
            ops += tm * N * (2 * K + epi)
        a = _rows_f32(A, a_rows[bt], a_ks, K, code)
        gemv_nk(a, M, K, B, b_base[bkey], b_ns, N, code, C, c_rows[bt], c_ns, code, np.float32(alpha),
                np.float32(beta), biasf, has_bias, act, nthreads)
    return rd, wr, ops
