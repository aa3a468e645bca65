"""Decode-shaped GEMMs (a few rows of A, M <= GEMV_M) on the host: memory-bound, so B is
streamed once, in its storage dtype, and never packed.

B's columns contiguous along K (a linear layer's weight ``w[N, K]``), threads over N (each a
contiguous run of columns): ``NB`` columns at a time, each output a dot product of an A row and
a column decoded as it streams past (fp16 through F16C, bf16 by a shift: both vectorise), ``NB``
independent streams in flight. (``a @ b`` with ``b[K, N]`` goes the tiled path.)

Summed in float32 with re-association allowed (vector lanes): within the fp32 tolerance of a
GEMM, not bit-equal to a sequential sum. The kernels compute all of C at once; the chip's
tiles (``run_gemv``' counts) are the plan's, loads and stores counted as the tiled path counts
them. A 16-bit B streams at half fp32's bytes: torch's fp16 GEMV does the same (1x4096x4096:
2.1 ms fp16 against 5.5 ms fp32 on one Zen 4 core), so a float32 copy of a kept weight would
lose to it.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from .codecs import bits_f32, decode, enc16, f2h_cvt, h2f_cvt
from .gemv_block import LANES, make_block
from .hostcpu import has_feature
from .mathfn import gelu_erf32, gelu_tanh32
from .staging import load_row

GEMV_M = 2        # float32 (and emulated bf16) B: at most this many rows of A: from 3 rows on the tiled
                  # micro-kernel path is faster (3x4096x4096 fp32: 4.4 vs 5.1 ms on one Zen 4 core)
GEMV_M16 = 8      # float16 / bfloat16 B: up to this many rows, in register blocks of RB rows (gemv_block):
                  # the tiled path reads a kept 16-bit weight as packed float32, twice its bytes (8x4096x4096
                  # bf16: 3.97 ms tiled, 2.3 blocked, torch 2.8-3.3; fp16 4.00 tiled)
BLOCK_SHORT = 4   # ... but at most this many with columns of at most SHORT_COLUMN bytes (gemv_rows)
NB = 8            # columns the one- and two-row loop streams at once
RB, CB = 4, 6     # the blocked loop's register block: rows of A x columns of B (24 accumulators)
BF16_DOT = has_feature("avx512bf16")   # bf16 blocks as vdpbf16ps dot products (else widened by a shift)
PREFETCH_BELOW = 4096   # bytes: columns this short are prefetched a group ahead (the blocked loop)
SHORT_COLUMN = 4096     # bytes: the one- and two-row loop reads columns this short one at a time, not eight
                        # side by side (1x512x32000 fp16, one Zen 4 core, load 10: 1.9-2.2 ms against 2.7-3.3
                        # with eight streams and prefetch, torch 2.2-2.7; 1x2048x8000 2.0 vs 2.4; 4096: equal)


def gemv_rows(code: int, K: int) -> int:
    """The most rows of A the GEMV path takes for B's storage code and K (the one rule: the executor's
    kernel choice and the frozen weight's packing both read it). 16-bit columns of at most SHORT_COLUMN
    bytes take up to BLOCK_SHORT rows: there the blocks' per-call cost shows and from 5 rows the tiled
    micro-kernel wins even on float32 panels (8x512x32000 fp16 4.4 ms tiled, 6.2 blocked; bf16 4.6, 5.2)."""
    if code not in (1, 2):
        return GEMV_M
    return BLOCK_SHORT if K * 2 <= SHORT_COLUMN else GEMV_M16


def uses_gemv(M: int, K: int, code: int, b_ks: int, has_ln: bool = False) -> bool:
    """Whether a GEMM of M rows runs here: B's columns contiguous along K, no layer norm on A."""
    return M <= gemv_rows(code, K) and b_ks == 1 and not has_ln


@intrinsic
def _prefetch(typingctx, arr, idx):
    """Prefetch the cache line holding ``arr[idx]`` into L2 (``prefetcht1``; no fault if out of range)."""
    if not isinstance(arr, types.Array):
        return None

    def codegen(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        ptr = builder.gep(ary.data, [context.cast(builder, args[1], sig.args[1], types.intp)])
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                                            "llvm.prefetch.p0i8")
        builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(i32, 0), ir.Constant(i32, 2), ir.Constant(i32, 1)])
        return context.get_dummy_value()
    return types.none(arr, idx), codegen


@njit(cache=True)
def _rows_f32(A, rows, a_ks, K, code):
    """The tm rows of A decoded to float32, row m at ``m * K``."""
    tm = rows.shape[0]
    a = np.empty(tm * K, np.float32)
    for m in range(tm):
        load_row(A, rows[m], a_ks, K, code, a[m * K:(m + 1) * K])
    return a


def _widen(v):
    """One stored value as float32, chosen by its storage type when compiled (no branch in a loop)."""


@overload(_widen, inline="always")
def _widen_impl(v):
    if v == types.uint16:          # float16 bits: F16C where the CPU has it
        return lambda v: h2f_cvt(v)
    if v == types.int16:           # bfloat16 bits (``run_gemv`` passes a bf16 B as int16)
        return lambda v: bits_f32(np.uint32(np.uint16(v)) << np.uint32(16))
    if isinstance(v, types.Float):
        return lambda v: np.float32(v)
    return None


@njit(inline="always", cache=True)
def _cols8(B, o, ns, K):
    """The eight columns at ``o + c * ns`` as slices (indices from 0: no wraparound check)."""
    return (B[o:o + K], B[o + ns:o + ns + K], B[o + 2 * ns:o + 2 * ns + K], B[o + 3 * ns:o + 3 * ns + K],
            B[o + 4 * ns:o + 4 * ns + K], B[o + 5 * ns:o + 5 * ns + K], B[o + 6 * ns:o + 6 * ns + K],
            B[o + 7 * ns:o + 7 * ns + K])


@njit(cache=True, fastmath={"reassoc", "contract"})
def _dot8_widened(a, B, o, ns, out):
    """out[0:8] = a . B[o + c*ns : +len(a)] for c < 8 (float32, fp16 or bf16 bits widened as they
    stream past): eight columns in one pass, eight streams in flight (four: fp16 1x4096x4096
    2.08 ms, eight: 1.56, torch 1.62 on one Zen 4 core)."""
    b0, b1, b2, b3, b4, b5, b6, b7 = _cols8(B, o, ns, a.shape[0])
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = np.float32(0.0)
    for k in range(a.shape[0]):
        x = a[k]
        s0 += x * _widen(b0[k])
        s1 += x * _widen(b1[k])
        s2 += x * _widen(b2[k])
        s3 += x * _widen(b3[k])
        s4 += x * _widen(b4[k])
        s5 += x * _widen(b5[k])
        s6 += x * _widen(b6[k])
        s7 += x * _widen(b7[k])
    out[0], out[1], out[2], out[3] = s0, s1, s2, s3
    out[4], out[5], out[6], out[7] = s4, s5, s6, s7


@njit(cache=True)
def _dot8(a, B, o, ns, code, out):
    if code <= 2:
        _dot8_widened(a, B, o, ns, out)
    else:
        for c in range(NB):
            out[c] = _dot1(a, B[o + c * ns:o + c * ns + a.shape[0]], code)


@njit(cache=True, fastmath={"reassoc", "contract"})
def _dot1_widened(a, b):
    s = np.float32(0.0)
    for k in range(a.shape[0]):
        s += a[k] * _widen(b[k])
    return s


@njit(cache=True)
def _dot1(a, b, code):
    """a . decode(b) (a remainder column; emulated bf16: decoded first, then one vectorised dot)."""
    if code <= 2:
        return _dot1_widened(a, b)
    col = np.empty(a.shape[0], np.float32)
    for k in range(a.shape[0]):
        col[k] = decode(code, b[k])
    return _dot1_widened(a, col)


@njit(inline="always", cache=True)
def _finish(v, alpha, beta, bias, j, has_bias, act, code):
    """act(alpha * v + beta * bias[j]) in C's storage type (float32 bits as float32)."""
    v = alpha * v
    if has_bias:
        v += beta * bias[j]
    if act == 1:
        v = max(v, np.float32(0.0))
    elif act == 2:
        v = gelu_erf32(v)
    elif act == 3:
        v = gelu_tanh32(v)
    return v


@njit(inline="always", cache=True)
def _put(C, i, v, code):
    if code == 0:
        C[i] = v
    elif code == 1:
        C[i] = f2h_cvt(v)
    else:
        C[i] = enc16(code, v)


@njit(cache=True, parallel=True)
def gemv_nk(a, tm, K, B, b_base, b_ns, N, bcode, C, crows, c_ns, ccode, alpha, beta, bias, has_bias, act,
            nthreads):
    """C[m, n] = act(alpha * a[m] . B[:, n] + beta * bias[n]) for m < tm, n < N; B's column n at
    ``b_base + n * b_ns``, contiguous along K; ``a``: ``_rows_f32``; ``bias`` float32."""
    nch = max(1, min(nthreads, (N + NB - 1) // NB))
    short = K * B.itemsize <= SHORT_COLUMN
    for ch in prange(nch):
        n0 = np.int64(ch) * N // nch         # int64, not the prange index's uint64 (one callee signature)
        n1 = (np.int64(ch) + 1) * N // nch
        acc = np.empty((tm, n1 - n0), np.float32)   # the chunk's sums; the epilogue runs once per row
        n = n0
        while n < n1:
            o = b_base + n * b_ns
            if n + NB <= n1 and not short:
                for m in range(tm):
                    _dot8(a[m * K:(m + 1) * K], B, o, b_ns, bcode, acc[m, n - n0:n - n0 + NB])
                n += NB
            else:           # short columns one at a time: one sequential stream, which the prefetcher follows
                for m in range(tm):
                    acc[m, n - n0] = _dot1(a[m * K:(m + 1) * K], B[o:o + K], bcode)
                n += 1
        for m in range(tm):
            _store(C, crows[m], c_ns, n0, n1 - n0, acc[m], alpha, beta, bias, has_bias, act, ccode)


@njit(forceinline=True, cache=True)  # compiled once, inlined by LLVM (not re-typed per call site)
def _store(C, row, c_ns, n, w, out, alpha, beta, bias, has_bias, act, ccode):
    """C[row + (n + c) * c_ns] = act(alpha * out[c] + beta * bias[n + c]) for c < w: a chunk's epilogue,
    run once per row of a chunk from one call site. Inlined at every group of columns (two sites:
    eight columns and the remainder) it made the fp16 GEMV's compile 11.9 s against 6.9 s now
    (ResNet-50's cold first call +4-5 s; warm time the same or better: 2x512x32000 3.40 -> 2.94 ms)."""
    for c in range(w):
        _put(C, row + (n + c) * c_ns, _finish(out[c], alpha, beta, bias, n + c, has_bias, act, ccode), ccode)


_blk = make_block(RB, CB)
_blk1 = make_block(RB, 1)


@njit(cache=True)
def _rows_bits(A, rows, a_ks, K, mp):
    """The tm rows of A as stored (bfloat16 bits: the dot-product blocks' operand), row m at ``m * K``,
    zero rows up to ``mp`` (a whole number of RB-row blocks)."""
    a = np.zeros(mp * K, np.int16)
    for m in range(rows.shape[0]):
        for k in range(K):
            a[m * K + k] = np.int16(A[rows[m] + k * a_ks])
    return a


@njit(cache=True)
def _rows_padded(A, rows, a_ks, K, code, mp):
    """``_rows_bits`` decoded to float32 (the widening blocks' operand)."""
    a = np.zeros(mp * K, np.float32)
    for m in range(rows.shape[0]):
        load_row(A, rows[m], a_ks, K, code, a[m * K:(m + 1) * K])
    return a


@njit(cache=True, fastmath={"reassoc", "contract"})
def _tail(a, ao, B, bo, n):
    """The dot of the last ``n`` (< one vector step) k of an A row and a B column."""
    s = np.float32(0.0)
    for k in range(n):
        s += _widen(a[ao + k]) * _widen(B[bo + k])
    return s


@njit(cache=True, parallel=True)
def gemv_blocked(a, tm, K, B, b_base, b_ns, N, C, crows, c_ns, ccode, alpha, beta, bias, has_bias, act, nthreads):
    """C[m, n] for m < tm <= GEMV_M16 (see gemv_nk), B 16-bit: the columns in groups of CB, each group
    streamed once for all rows in RB-row register blocks (``a``: ``_rows_bits`` or ``_rows_padded``, its rows a whole
    number of blocks). Threads over N, one contiguous run of columns each."""
    mp = a.shape[0] // K if K else 0
    step = (2 if a.itemsize == 2 else 1) * LANES
    nv = K // step
    kt = nv * step
    nch = max(1, min(nthreads, (N + CB - 1) // CB))
    line = 64 // B.itemsize
    pf = K * B.itemsize <= PREFETCH_BELOW and b_ns == K     # the group's columns one run in memory
    for ch in prange(nch):
        n0 = np.int64(ch) * N // nch
        n1 = (np.int64(ch) + 1) * N // nch
        acc = np.empty((tm, n1 - n0), np.float32)
        part = np.empty(RB * CB, np.float32)
        n = n0
        while n < n1:
            w = CB if n + CB <= n1 else 1
            o = b_base + n * b_ns
            if pf and n + 2 * CB <= n1:     # short columns: the next group's lines ahead of the streams
                for e in range(o + CB * b_ns, o + CB * b_ns + (CB - 1) * b_ns + K, line):
                    _prefetch(B, e)
            for m0 in range(0, mp, RB):
                if w == CB:
                    _blk(nv, a, m0 * K, K, B, o, b_ns, part)
                else:
                    _blk1(nv, a, m0 * K, K, B, o, b_ns, part)
                rr = min(RB, tm - m0)
                for r in range(rr):
                    for c in range(w):
                        acc[m0 + r, n - n0 + c] = part[r * w + c]
                if kt < K:      # the last k (under one step); a call per element always: 8x512x1200 0.096 -> 0.154 ms
                    for r in range(rr):
                        for c in range(w):
                            acc[m0 + r, n - n0 + c] += _tail(a, (m0 + r) * K + kt, B, o + c * b_ns + kt, K - kt)
            n += w
        for m in range(tm):
            _store(C, crows[m], c_ns, n0, n1 - n0, acc[m], alpha, beta, bias, has_bias, act, ccode)


def run_gemv(A, a_rows, a_ks, B, b_base, b_ns, C, c_rows, c_ns, M, N, K, TM, TN, b_res, code, esa, esc, esb,
             biasf, has_bias, alpha, beta, act, nthreads):
    """The few-row GEMM (``uses_gemv``: B's columns contiguous along K) for every batch; returns
    (bytes read, bytes written, ops) as the plan's tiles move them: each tile's A and B loads
    (B once when resident, with the bias), its C store; ``biasf``: the bias as float32."""
    rd = wr = ops = 0
    epi = int(has_bias) + int(act > 0)
    b_loaded = -1
    Bw = B.view(np.int16) if code == 2 else B      # bf16 bits: the type picks the widening (_widen)
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
        if M <= GEMV_M:
            a = _rows_f32(A, a_rows[bt], a_ks, K, code)
            gemv_nk(a, M, K, Bw, b_base[bkey], b_ns, N, code, C, c_rows[bt], c_ns, code, np.float32(alpha),
                    np.float32(beta), biasf, has_bias, act, nthreads)
            continue
        mp = -(-M // RB) * RB
        a = (_rows_bits(A, a_rows[bt], a_ks, K, mp) if code == 2 and BF16_DOT
             else _rows_padded(A, a_rows[bt], a_ks, K, code, mp))
        gemv_blocked(a, M, K, Bw, b_base[bkey], b_ns, N, C, c_rows[bt], c_ns, code, np.float32(alpha),
                     np.float32(beta), biasf, has_bias, act, nthreads)
    return rd, wr, ops
