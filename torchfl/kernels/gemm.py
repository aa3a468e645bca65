"""Tiled GEMM engine (Numba) shared by the matmul family (and usable by conv/attention).

Executes a TilePlan's (TM, TN, TK) tiling exactly: for every C tile, for every K tile,
the A tile and the B tile are *loaded* — decoded from their storage dtype (A layer-
normalised for layernorm_linear), B packed into NR-column panels, A kept in rows the
micro-kernel broadcasts from — which is the explicit
off-chip -> on-chip transfer, counted in bytes; the fp32 accumulator tile stays on chip;
the epilogue (alpha, bias, activation, RNE encode) *stores* the tile, counted. Inside a
loaded tile the CPU walks KC x MC sub-blocks with the LLVM-IR micro-kernel; that
sub-blocking is a CPU cache detail and moves no emulated bytes. A resident B (plan
``b_resident``) is packed once per batch by ``_pack_b`` and shared by every tile.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from . import taskcall
from .codecs import decode, enc16, encode16, f2h_cvt, h2f_cvt
from .gemv import run_gemv, uses_gemv
from .mathfn import gelu32, gelu_erf32, gelu_tanh32
from .optlevel import opt_level
from .ukernel import KC, MCP, MR, NR, ukernel_gemm   # MR x NR micro-kernel, KC x MCP*MR A blocks


@njit(cache=True)
def aligned_f32(n):
    """``np.empty(n, np.float32)`` starting on a 64-byte cache line: the micro-kernel's
    512-bit loads of packed panels and accumulator rows then never straddle two lines
    (a 128x1024x1024 nest: 143 -> 156 GFLOP/s against 16-byte-aligned buffers)."""
    buf = np.empty(n + 16, np.float32)
    off = (-(buf.ctypes.data >> 2)) & 15
    return buf[off:off + n]


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


# GELU and the 16-bit encoder (codecs.enc16) for _epilogue_row, inlined by LLVM (forceinline: compiled once
# each) instead of by Numba (``inline="always"`` copied and re-typed GELU's erf/tanh/exp chain and
# encode16's codecs at each of the row's four call sites: 1.9 s of its 2.5 s compile). A compiled
# helper keeps its own flags: these are _epilogue_row's (error_model="numpy", no fastmath), the
# flags Numba's inlining lowered them with, so the bits are the same. Each wrapper copies its own
# form's chain only (mathfn.gelu_erf32 / gelu_tanh32; gelu32(v, False) carried the tanh chain too).
@njit(forceinline=True, cache=True, error_model="numpy")
def _gelu_erf(v):
    return gelu_erf32(v)


@njit(forceinline=True, cache=True, error_model="numpy")
def _gelu_tanh(v):
    return gelu_tanh32(v)


@njit(cache=True, error_model="numpy")
def _epilogue_row(C, row, c_ns, acc, a0, c0, c1, alpha, beta, biasf, j0, has_bias, act, code, rowv):
    """C[row + n*c_ns] = act(alpha * acc[a0 + n] + beta * biasf[j0 + n]) for n in [c0, c1), in
    C's storage type. One pass per stage over a row so each loop vectorises (the per-element
    epilogue it replaced, with its branches, ran GELU at ~8 ns an element; IEEE division, or
    Numba's zero-division check in erf32 keeps the GELU loop scalar: 10 -> 0.7 ns an
    element); ``biasf`` is float32."""
    w = c1 - c0
    r = rowv[:w]
    a = acc[a0 + c0:a0 + c1]
    for n in range(w):
        r[n] = alpha * a[n]
    if has_bias:
        bsl = biasf[j0 + c0:j0 + c1]
        for n in range(w):
            r[n] += beta * bsl[n]
    if act == 1:
        for n in range(w):
            r[n] = max(r[n], np.float32(0.0))
    elif act == 2:
        for n in range(w):
            r[n] = _gelu_erf(r[n])
    elif act == 3:
        for n in range(w):
            r[n] = _gelu_tanh(r[n])
    base = row + c0 * c_ns
    if c_ns == 1:
        out = C[base:base + w]
        if code == 0:
            for n in range(w):
                out[n] = r[n]
        elif code == 1:
            for n in range(w):
                out[n] = f2h_cvt(r[n])
        else:
            for n in range(w):
                out[n] = enc16(code, r[n])
        return
    for n in range(w):
        if code == 0:
            C[base + n * c_ns] = r[n]
        else:
            C[base + n * c_ns] = enc16(code, r[n])


# long: one thread's slice of a C tile: packing, micro-kernel and epilogue share its buffers and hot loops (see _tile)
@opt_level(1)   # hot loop: the LLVM-IR micro-kernel; BERT's GEMMs as fast, same bits, compile -2.2 s CPU
@njit(cache=True)
def _tile_task(ch, nch, split_n, A, rows, a_ks, B, b_base, b_ks, b_ns, j0, tm, tn, K, TK, code, esa, esc, esb,
               has_ln, mean, rstd, g, bb, has_g, has_b, pres, use_res, pre, pbase,
               acc, ldc, C, crows, c_ns, alpha, beta, bias, has_bias, act, cnt, epi_row):
    """Thread ``ch`` of ``nch`` of :func:`_tile`: its slice of C (its NR panels when ``split_n``,
    else its MR panels), the B panels and A blocks it needs packed (the tile loads), the
    micro-kernel, its slice stored. cnt[ch] = (bytes read, bytes written, ops) as the chip
    counts them: every tile element loaded once, however many CPU threads packed a copy."""
    npa = (tm + MR - 1) // MR
    npb = (tn + NR - 1) // NR
    whole_b = use_res or pre
    epi = int(has_bias) + int(act > 0)
    if split_n:
        jp0, jp1 = ch * npb // nch, (ch + 1) * npb // nch
        ip0, ip1 = 0, npa
    else:
        jp0, jp1 = 0, npb
        ip0, ip1 = ch * npa // nch, (ch + 1) * npa // nch
    c0, c1 = jp0 * NR, min(tn, jp1 * NR)
    r0, r1 = ip0 * MR, min(tm, ip1 * MR)
    if K == 0:      # else the first K block's micro-kernel calls write every acc element
        for r in range(r0, ip1 * MR):
            for c in range(jp0 * NR, jp1 * NR):
                acc[r * ldc + c] = 0.0
    nj = jp1 - jp0
    pbl = aligned_f32(np.int64(1 if (use_res or pre) else nj * min(TK, K) * NR))
    pal = aligned_f32(np.int64(MCP * MR * KC))
    rd = 0
    for k0 in range(0, K, TK):
        tk = min(TK, K - k0)
        # --- tile loads (counted once per chip tile) ---
        if split_n:
            if ch == 0:
                rd += tm * tk * esa
            if not use_res:
                rd += tk * (c1 - c0) * esa
        else:
            rd += tk * (r1 - r0) * esa
            if ch == 0 and not use_res:
                rd += tk * tn * esa
    # --- compute: per chip K tile when B is packed per tile; with B's panels whole (resident
    # or kept), the CPU's KC blocks run across the chip's K tiles (TK 256 capped KC at 256)
    for seg in range(1 if whole_b else (K + TK - 1) // TK):
        k0 = 0 if whole_b else seg * TK
        tk = K if whole_b else min(TK, K - k0)
        if not whole_b:
            for jq in range(nj):
                jp = jp0 + jq
                full = (jp + 1) * NR <= tn
                for k in range(tk):
                    o = (jq * tk + k) * NR
                    src = b_base + (k0 + k) * b_ks + (j0 + jp * NR) * b_ns
                    for c in range(NR):
                        if full or jp * NR + c < tn:
                            v = B[src + c * b_ns]
                            pbl[o + c] = np.float32(v) if code == 0 else decode(code, v)
                        else:
                            pbl[o + c] = 0.0
        for kc0 in range(0, tk, KC):
            kc = min(KC, tk - kc0)
            for p0 in range(ip0, ip1, MCP):
                p1 = min(ip1, p0 + MCP)
                # pack the A block [p0, p1) x [k0+kc0, +kc), row m at (m - p0*MR)*kc: each row
                # decoded contiguously (vectorised), layer-normalised; the kernel reads rows
                for m in range(p0 * MR, p1 * MR):
                    av = pal[(m - p0 * MR) * kc:(m - p0 * MR + 1) * kc]
                    if m >= tm:
                        for k in range(kc):
                            av[k] = 0.0
                        continue
                    off = rows[m] + (k0 + kc0) * a_ks
                    if a_ks == 1:
                        src = A[off:off + kc]
                        if code == 1:
                            for k in range(kc):
                                av[k] = h2f_cvt(src[k])
                        else:
                            for k in range(kc):
                                av[k] = np.float32(src[k]) if code == 0 else decode(code, src[k])
                    else:
                        for k in range(kc):
                            av[k] = decode(code, A[off + k * a_ks])
                    if has_ln:
                        mu = mean[m]
                        rs = rstd[m]
                        for k in range(kc):
                            av[k] = (av[k] - mu) * rs
                        if has_g:
                            gs = g[k0 + kc0:k0 + kc0 + kc]
                            for k in range(kc):
                                av[k] = av[k] * gs[k]
                        if has_b:
                            bs = bb[k0 + kc0:k0 + kc0 + kc]
                            for k in range(kc):
                                av[k] = av[k] + bs[k]
                bsrc = pres if whole_b else pbl
                # each call prefetches its share of the next B panel (none after the last)
                lines = kc * NR // 16
                share = (lines + p1 - p0 - 1) // (p1 - p0)
                for jp in range(jp0, jp1):
                    boff = ((pbase + jp) * K + k0 + kc0) * NR if whole_b else ((jp - jp0) * tk + kc0) * NR
                    nxt = boff + (K if whole_b else tk) * NR
                    more = lines if jp + 1 < jp1 else 0
                    for ip in range(p0, p1):
                        q = (ip - p0) * share
                        ukernel_gemm(kc, pal, (ip - p0) * MR * kc, kc, bsrc, boff, acc, ip * MR * ldc + jp * NR,
                                     ldc, seg > 0 or kc0 > 0, bsrc, nxt + q * 16, max(0, min(share, more - q)))
    # --- epilogue and store of this thread's slice ---
    if has_bias and not use_res and ch == 0:
        rd += tn * esb
    rowv = np.empty(max(c1 - c0, 1), np.float32)
    for m in range(r0, r1):
        taskcall.call(epi_row, (C, np.int64(crows[m] + j0 * c_ns), c_ns, acc, np.int64(m * ldc), np.int64(c0),
                                np.int64(c1), alpha, beta, bias, j0, has_bias, act, code, rowv))
    cnt[ch, 0] = rd
    cnt[ch, 1] = (r1 - r0) * (c1 - c0) * esc
    cnt[ch, 2] = (r1 - r0) * (c1 - c0) * (2 * K + epi)


@opt_level(1)   # its gufunc only calls the task: the IR level buys no speed here (compile -0.1-0.2 s CPU)
@njit(cache=True, parallel=True)
def _tile(task, nthreads, A, rows, a_ks, B, b_base, b_ks, b_ns, j0, tm, tn, K, TK, code, esa, esc, esb,
          has_ln, mean, rstd, g, bb, has_g, has_b, pres, use_res, pre, pbase,
          acc, ldc, C, crows, c_ns, alpha, beta, bias, has_bias, act, cnt, epi_row):
    """One C tile (all its K tiles) in ONE parallel region: each thread owns a slice of C
    (its NR panels, or its MR panels when N is narrow or B is whole) and runs
    :func:`_tile_task` on it; threads never wait for each other.
    Packing and the epilogue stay in the task's loops although a large body costs Numba
    compile time: moved into helper functions they compiled 2.4 s faster (9.1 vs 11.5 s cold) but
    ran 7-30 % slower (A/B in one process: 128x1024x4096 GELU 23.1 vs 21.6 ms, resident-B
    128x1024x1024 4.3 vs 3.8 ms, 784x256x64 1.46 vs 1.11 ms). The task is called through
    ``task``, its address (:mod:`taskcall`, see :func:`_task_addresses`), once per thread:
    inside the prange loop, its body cost the parallel passes and was optimised and
    code-generated twice (in the gufunc and in this function's library), as the
    epilogue's ``epi_row`` was before it was called so."""
    npa = (tm + MR - 1) // MR
    npb = (tn + NR - 1) // NR
    # a whole B (resident, or kept packed): threads own rows, each packs only its A rows (owning
    # columns, every thread packed all of A: 3-7 % more CPU at two threads on BERT-base's GEMMs),
    # unless whole rows split less evenly than columns (the busiest thread's micro-tiles)
    whole_b = use_res or pre
    even_m = (npa + nthreads - 1) // nthreads * npb <= (npb + nthreads - 1) // nthreads * npa
    split_n = npa < 2 * nthreads or (npb >= 2 * nthreads and not (whole_b and even_m))
    nch = max(1, min(npb if split_n else npa, nthreads))
    for ch in prange(nch):
        taskcall.call(task, (np.int64(ch), nch, split_n, A, rows, a_ks, B, b_base, b_ks, b_ns, j0, tm, tn, K, TK,
                             code, esa, esc, esb, has_ln, mean, rstd, g, bb, has_g, has_b, pres, use_res, pre, pbase,
                             acc, ldc, C, crows, c_ns, alpha, beta, bias, has_bias, act, cnt, epi_row))


def run_float(A, a_rows, a_ks, B, b_base, b_ks, b_ns, C, c_rows, c_ns, *, M, N, K, TM, TN, TK,
              b_res, code, esa, esc, bias=None, alpha=1.0, beta=1.0, act=0, ln=None, counter=None,
              packed_b=None):
    """Run the tiled float GEMM over batches (a_rows/c_rows: [batch, M] element offsets,
    b_base: [batch]); returns (bytes_read, bytes_written, ops) actually moved/computed.

    ``ln`` = (mean, rstd, gamma|None, beta|None) applies layer-norm while packing A.
    ``packed_b``: ``pack_b(..., TN)`` of a B shared by every batch, kept by the caller (a frozen
    weight, :mod:`torchfl.kernels.frozen`): the tiles read their panels from it instead of
    decoding and packing B again; the tile loads are counted as the plan says all the same.
    A few rows of A (``gemv.uses_gemv``: M <= 2, or <= 8 for a 16-bit B) with B's columns contiguous
    along K run :mod:`gemv` instead, streaming B as stored (no packed copy: a decode GEMV is memory-bound).
    """
    from .threads import threads_for

    if b_res and (TN < N or TK < K):   # the packed B buffer holds one TN x K panel set
        raise ValueError(f"run_float: a resident B needs TN >= N and TK >= K (got TN={TN}, N={N}, TK={TK}, K={K})")
    if packed_b is not None and not prepacked_ok(N, TN, b_base.shape[0]):
        packed_b = None
    with threads_for(2 * M * N * K * a_rows.shape[0]) as nthreads:
        return _run_float(A, a_rows, a_ks, B, b_base, b_ks, b_ns, C, c_rows, c_ns, M, N, K, TM, TN, TK, b_res,
                          code, esa, esc, bias, alpha, beta, act, ln, nthreads, packed_b)


@njit(cache=True)
def _decoded(x, code):
    out = np.empty(x.size, np.float32)
    for i in range(x.size):
        out[i] = np.float32(x[i]) if code == 0 else decode(code, x[i])
    return out


def prepacked_ok(N, TN, nbase=1) -> bool:
    """Whether the tiles can read a whole-B panel set (``pack_b``): one B for all batches."""
    return nbase == 1


def _tile_panels(N, TN):
    """NR-column panels per C tile of TN columns (each tile's panels start afresh)."""
    return (min(TN, N) + NR - 1) // NR


def pack_b(B, base, ks, ns, K, N, code, TN=None):
    """All of B (K x N at ``base``, strides ks/ns, storage ``code``) decoded to float32 and
    packed into NR-column panels, tile by tile of TN columns (default: one tile): the panel
    p of the tile starting at column j0 sits at panel index ``(j0 // TN) * _tile_panels(N, TN)
    + p``, row k of panel P at ``(P * K + k) * NR``."""
    TN = N if TN is None or TN >= N else TN
    ppt = _tile_panels(N, TN)
    ntiles = (N + TN - 1) // TN
    pb = aligned_f32(np.int64(ntiles * ppt * NR * K))
    for t in range(ntiles):
        j0 = t * TN
        _pack_b(B, base, ks, ns, 0, K, j0, min(TN, N - j0), code, pb[t * ppt * NR * K:])
    return pb


def _run_float(A, a_rows, a_ks, B, b_base, b_ks, b_ns, C, c_rows, c_ns, M, N, K, TM, TN, TK, b_res, code, esa,
               esc, bias, alpha, beta, act, ln, nthreads, packed_b=None):
    batch = a_rows.shape[0]
    tm_pad = (min(TM, M) + MR - 1) // MR * MR
    ldc = (min(TN, N) + NR - 1) // NR * NR
    ppt = _tile_panels(N, TN)
    if packed_b is not None and packed_b.size != (N + TN - 1) // TN * ppt * NR * K:
        packed_b = None             # packed for another tiling
    pre = packed_b is not None
    pb = packed_b if pre else aligned_f32(np.int64(ldc * K if b_res else 1))
    acc = aligned_f32(np.int64(tm_pad * ldc))
    has_bias = bias is not None
    bias_arr = bias if has_bias else np.zeros(1, np.float32 if code == 0 else np.uint16)
    biasf = _decoded(bias_arr, code) if has_bias else np.zeros(1, np.float32)
    esb = esa
    has_ln = ln is not None
    e32 = np.zeros(1, np.float32)
    mean, rstd, g, bb = (ln if has_ln else (e32, e32, None, None))
    has_g, has_b = g is not None, bb is not None
    g = e32 if g is None else g
    bb = e32 if bb is None else bb
    rd = wr = ops = 0
    ln_ops = 4 if has_ln else 0
    cnt = np.zeros((max(nthreads, 1), 3), np.int64)
    b_loaded = -1
    task = epi_row = None
    if uses_gemv(M, K, code, b_ks, has_ln):
        return run_gemv(A, a_rows, a_ks, B, b_base, b_ns, C, c_rows, c_ns, M, N, K, TM, TN, b_res, code, esa, esc,
                        esb, biasf, has_bias, alpha, beta, act, nthreads)
    for bt in range(batch):
        rows_b = a_rows[bt]
        crow_b = c_rows[bt]
        bkey = 0 if b_base.shape[0] == 1 else bt
        if b_res and b_loaded != bkey:
            if not pre:
                _pack_b(B, b_base[bkey], b_ks, b_ns, 0, K, 0, N, code, pb)   # B loaded once, kept
            rd += K * N * esa + (N * esb if has_bias else 0)
            b_loaded = bkey
        for i0 in range(0, M, TM):
            tm = min(TM, M - i0)
            for j0 in range(0, N, TN):
                tn = min(TN, N - j0)
                cnt[:] = 0
                args = (A, rows_b[i0:i0 + tm], a_ks, B, b_base[bkey], b_ks, b_ns, j0, tm, tn, K, TK, code, esa, esc,
                        esb, has_ln, mean[i0:i0 + tm] if has_ln else e32, rstd[i0:i0 + tm] if has_ln else e32, g, bb,
                        has_g, has_b, pb, b_res, pre, (j0 // TN) * ppt if pre else 0, acc, ldc, C, crow_b[i0:i0 + tm],
                        c_ns, np.float32(alpha), np.float32(beta), biasf, has_bias, act, cnt)
                if task is None:
                    epi_row = _epilogue_address(C, c_ns, acc, alpha, beta, biasf, j0, has_bias, act, code)
                    task = taskcall.address(_tile_task, (np.int64(0), np.int64(1), False) + args + (epi_row,))
                _tile(task, nthreads, *args, epi_row)
                for r_, w_, o_ in cnt.tolist():   # a row a thread: summed in Python (numpy's sum: ~15 us)
                    rd += r_
                    wr += w_
                    ops += o_
                ops += ln_ops * tm * K
    return rd, wr, ops


def _epilogue_address(C, c_ns, acc, alpha, beta, biasf, j0, has_bias, act, code):
    """``_epilogue_row``'s address for ``_tile``'s arguments (the row offsets it computes are int64)."""
    z = np.int64(0)
    return taskcall.address(_epilogue_row, (C, z, c_ns, acc, z, z, z, np.float32(alpha), np.float32(beta), biasf, j0,
                                            has_bias, act, code, np.empty(1, np.float32)))


def _int8_block(A, rows, ks, k0, tk, za, B, base, bks, bns, j0, tn, zb, acc, ldc):
    """acc[m, n] += sum_k (A - za)(B - zb[n]) for one loaded A and B tile, exact: the
    integers (|products| < 2**16, K of them) are multiplied in float64 by the host BLAS, whose
    every partial sum is an integer far below 2**53."""
    kk = (k0 + np.arange(tk, dtype=np.int64))
    a = A[rows[:, None] + kk[None, :] * ks].astype(np.float64) - za
    nn = j0 + np.arange(tn, dtype=np.int64)
    b = B[base + kk[:, None] * bks + nn[None, :] * bns].astype(np.float64) - zb[j0:j0 + tn]
    view = acc[:rows.shape[0] * ldc].reshape(rows.shape[0], ldc)
    view[:, :tn] += a @ b


@njit(cache=True)
def _int8_store(acc, ldc, tm, tn, j0, C, crows, cns, scales, bias, has_bias, act, ocode, oinv, ozero, qmin, qmax):
    """v = acc * scales[n] (+ bias[n]) (act); int8 out (ocode 4): clamp(rne(v * oinv) + ozero,
    qmin, qmax), PT2E's quantize_per_tensor rounding with oinv = float32(1 / out_scale);
    float out: v as float32 (ocode 0) or 16-bit float bits."""
    for m in range(tm):
        row = crows[m]
        for n in range(tn):
            v = np.float32(acc[m * ldc + n]) * scales[j0 + n]
            if has_bias:
                v += bias[j0 + n]
            if act == 1:
                v = max(v, np.float32(0.0))
            elif act >= 2:
                v = gelu32(v, act == 3)
            if ocode == 4:
                q = np.rint(v * oinv) + ozero
                C[row + (j0 + n) * cns] = min(qmax, max(qmin, q))
            elif ocode == 0:
                C[row + (j0 + n) * cns] = v
            else:
                C[row + (j0 + n) * cns] = encode16(ocode, v)


def run_int8(A, a_rows, a_ks, B, b_base, b_ks, b_ns, C, c_rows, c_ns, *, M, N, K, TM, TN, TK, b_res,
             esc, za, zb, scales, bias=None, esvec=0, act=0, ocode=0, oinv=1.0, ozero=0, qmin=-128, qmax=127):
    """int8 GEMM with exact integer (int32-equivalent) accumulation over the same tiling; returns the counts.

    ``zb`` (int32) and ``scales`` (float32, a_scale * b_scale) are per output column;
    ``esvec``: bytes per column of the epilogue vectors the plan streams beside B (bias,
    weight scales and zero points), read with each B tile (or once with a resident B)."""
    batch = a_rows.shape[0]
    ldc = min(TN, N)
    acc = np.empty(min(TM, M) * ldc, np.float64)
    has_bias = bias is not None
    bias_arr = bias if has_bias else np.zeros(1, np.float32)
    rd = wr = ops = 0
    epi = int(esvec > 0) + int(act > 0)
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
                            rd += K * N + N * esvec
                            b_loaded = bkey
                    else:
                        rd += tk * tn
                    _int8_block(A, rows, a_ks, k0, tk, za, B, b_base[bkey], b_ks, b_ns, j0, tn, zb, acc, ldc)
                    ops += 2 * tm * tn * tk
                if not b_res:
                    rd += tn * esvec
                _int8_store(acc, ldc, tm, tn, j0, C, c_rows[bt][i0:i0 + tm], c_ns, scales, bias_arr,
                            has_bias, act, np.int64(ocode), np.float32(oinv), np.float32(ozero),
                            np.float32(qmin), np.float32(qmax))
                wr += tm * tn * esc
                ops += tm * tn * epi
    return rd, wr, ops
