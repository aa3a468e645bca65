"""Attention execution (Numba): the plan's Q-tile x K-tile schedule, flash-style.

Per task (head, Q tile) in parallel: the Q tile is loaded (packed, scaled, decoded), then
every needed K/V tile; scores and P @ V go through the LLVM-IR micro-kernel in CPU
sub-blocks (48 queries x 128 keys) inside the loaded tiles, with the online softmax
(running max m, sum l, rescaled fp32 accumulator) across them. K and V are converted to
the micro-kernel's panel format once per head (a CPU format, not a chip transfer); each
task counts the chip tiles it loads and stores.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .. import dtypes as dt
from .. import taskcall
from ..codecs import decode, enc16, h2f
from ..mathfn import exp32
from ..ukernel import ukernel_6x16
from . import SOFTMAX_OPS, _schedule, dims, kv_heads
from .decode import DECODE_LQ, decode_attend
from ..dtypes import ITEMSIZE

MR, NR = 6, 16    # the 6x16 micro-kernel's panel shape

MQ = 48     # queries per CPU sub-block (multiple of MR)
NK = 128    # keys per CPU sub-block (multiple of NR)


@njit(cache=True, parallel=True)
def _prepack(task, K, kst, V, vst, code, H, heads, Lk, D, Dv, npk, npv, Lkp, kp, vp):
    """K and V of each of the ``heads`` key/value heads (H per batch) into panels, the heads
    in parallel (one head on one thread, 0.8 ms of BERT-base's s512 attention, was 7 % of its
    CPU on the calling thread alone while the other waited). Each head is a call of ``task``,
    :func:`_prepack_head`'s address (:mod:`..taskcall`): linked in, the head's body and its
    row decoder were optimised and code-generated again in the gufunc's library and in this
    function's (1.7 s more compile CPU on a BERT layer's first call than the serial loop)."""
    for bh in prange(heads):
        taskcall.call(task, (np.int64(bh), K, kst, V, vst, code, H, Lk, D, Dv, npk, npv, Lkp, kp, vp))


def _prepack_call(K, kst, V, vst, code, H, heads, Lk, D, Dv, npk, npv, Lkp, kp, vp):
    """``_prepack`` with its task's address (the task's argument types as ``_prepack`` passes them)."""
    task = taskcall.address(_prepack_head, (np.int64(0), K, kst, V, vst, code, H, Lk, D, Dv, npk, npv, Lkp, kp, vp))
    _prepack(task, K, kst, V, vst, code, H, heads, Lk, D, Dv, npk, npv, Lkp, kp, vp)


@njit(cache=True)
def _prepack_head(bh, K, kst, V, vst, code, H, Lk, D, Dv, npk, npv, Lkp, kp, vp):
    """One head of :func:`_prepack`. Each source row (one key: its D features, or its Dv
    values) is decoded in one vectorised pass (``_decode_row``), then placed: 0.48 -> 0.1 ms
    for GPT-2's 12 fp16 heads of 128."""
    row = np.empty(max(D, Dv), np.float32)
    b, h = bh // H, bh % H
    kb = b * kst[0] + h * kst[1]
    vb = b * vst[0] + h * vst[1]
    ko = bh * npk * D * NR
    kpp = kp[ko:ko + npk * D * NR]
    for j in range(npk * NR):
        pnl, c = j // NR, j % NR
        o = pnl * D * NR + c
        if j < Lk:
            _decode_row(K, kb + j * kst[2], kst[3], D, code, row)
            for d in range(D):
                kpp[o + d * NR] = row[d]
        else:
            for d in range(D):
                kpp[o + d * NR] = 0.0
    vo = bh * npv * Lkp * NR
    vpp = vp[vo:vo + npv * Lkp * NR]
    for j in range(Lkp):
        if j < Lk:
            _decode_row(V, vb + j * vst[2], vst[3], Dv, code, row)
        for pnl in range(npv):
            o = (pnl * Lkp + j) * NR
            for c in range(NR):
                e = pnl * NR + c
                vpp[o + c] = row[e] if (j < Lk and e < Dv) else np.float32(0.0)


@njit(cache=True)
def _decode_row(X, off, step, n, code, row):
    """row[:n] = decoded X[off + i * step]; contiguous fp16 in one vectorised pass (h2f)."""
    if step == 1 and code == 1:
        src = X[off:off + n]
        for i in range(n):
            row[i] = h2f(src[i])
    else:
        for i in range(n):
            row[i] = decode(code, X[off + i * step])


# reassociation (vectorised max/sum) and FMA contraction only: with fastmath=True's no-inf
# flag LLVM dropped the `== -inf` tests, and a row with no visible key became NaN; without
# no-NaN a NaN score (NaN in q, k or the mask) reaches the output row as in torch
_FM = {"reassoc", "contract"}


# exp32 for _attend_task, inlined by LLVM (forceinline: compiled once) instead of by Numba
# (``inline="always"`` copied and re-typed it at both call sites). It keeps _attend_task's flags
# (fastmath=_FM, Numba's default error model): the flags Numba's inlining lowered it with, so the
# bits are the same (as gemm's _gelu_erf). Its encoder: codecs.enc16.
@njit(forceinline=True, cache=True, fastmath=_FM)
def _exp(x):
    return exp32(x)


# long: one Q tile's loads, scores, online softmax and store share its on-chip buffers; called through its address, so it compiles once, and jitted helpers would be linked and optimised again inside it
@njit(cache=True, fastmath=_FM)
def _attend_task(t, nq, Q, qst, kp, vp, O, ost, M, mst, mkind, code, H, G, Lq, Lk, D, Dv, npk, npv, Lkp,
                 Br, Bc, kv_once, causal, scale, es, esm, cnt):
    """One Q tile of one head: its loads counted, its output tile computed and stored.
    Query head h reads the panels of key/value head h // G (G = 1 without grouping)."""
    Dvp = npv * NR
    bh, qi = t // nq, t % nq
    b, h = bh // H, bh % H
    i0 = qi * Br
    tq = min(Br, Lq - i0)
    # ---- what the chip moves for this Q tile ----
    last = min(i0 + tq - 1, Lk - 1) if causal else Lk - 1
    nkt = last // Bc + 1 if last >= 0 else 0
    keys = 0
    for j in range(nkt):
        keys += min(Bc, Lk - j * Bc)
    rd = tq * D * es + keys * tq * esm
    if not kv_once:
        rd += keys * (D + Dv) * es
    elif qi == 0 and h % G == 0:      # resident K/V: once per key/value head (its group's first head)
        rd += Lk * (D + Dv) * es
    cnt[t, 0] = rd
    cnt[t, 1] = tq * Dv * es
    cnt[t, 2] = keys * tq * (2 * D + 2 * Dv + SOFTMAX_OPS)
    # ---- compute, CPU sub-blocks inside the loaded tiles ----
    qpack = np.zeros(MQ * D, np.float32)
    qrow = np.empty(D, np.float32)
    S = np.zeros(MQ * NK, np.float32)
    ppack = np.zeros(MQ * NK, np.float32)
    acc = np.zeros(MQ * Dvp, np.float32)
    mrow = np.empty(MQ, np.float32)
    lrow = np.empty(MQ, np.float32)
    qb = b * qst[0] + h * qst[1]
    kvh = b * (H // G) + h // G
    kpo = kvh * npk * D * NR
    vpo = kvh * npv * Lkp * NR
    mb = b * mst[0] + h * mst[1]
    for qs in range(i0, i0 + tq, MQ):
        mq = min(MQ, i0 + tq - qs)
        mqp = (mq + MR - 1) // MR
        for r in range(mqp * MR):
            base = (r // MR) * D * MR + r % MR
            if r < mq:
                _decode_row(Q, qb + (qs + r) * qst[2], qst[3], D, code, qrow)
                for d in range(D):
                    qpack[base + d * MR] = qrow[d] * scale
            else:
                for d in range(D):
                    qpack[base + d * MR] = 0.0
        for r in range(MQ):
            mrow[r] = -np.inf
            lrow[r] = 0.0
        acc[:] = 0.0
        for j in range(nkt):
            kj0 = j * Bc
            tk = min(Bc, Lk - kj0)
            for ks in range(kj0, kj0 + tk, NK):
                if causal and ks > qs + mq - 1:
                    break
                nk = min(NK, kj0 + tk - ks)
                npn = (nk + NR - 1) // NR
                S[:] = 0.0
                for ip in range(mqp):
                    for jp in range(npn):
                        ukernel_6x16(D, qpack, ip * D * MR, kp, kpo + (ks // NR + jp) * D * NR, S,
                                     ip * MR * NK + jp * NR, NK)
                if mkind == 1 and not causal and mst[3] == 1:    # a bool keep-mask row: one slice
                    for r in range(mq):
                        mrow_ = M[mb + (qs + r) * mst[2] + ks:mb + (qs + r) * mst[2] + ks + nk]
                        srow = S[r * NK:r * NK + nk]
                        for c in range(nk):
                            srow[c] = srow[c] if mrow_[c] != 0 else -np.inf
                elif mkind != 0 or causal:
                    for r in range(mq):
                        i = qs + r
                        so = r * NK
                        for c in range(nk):
                            s = S[so + c]
                            if mkind == 1:
                                if M[mb + i * mst[2] + (ks + c) * mst[3]] == 0:
                                    s = -np.inf
                            elif mkind == 2:
                                s += decode(code, M[mb + i * mst[2] + (ks + c) * mst[3]])
                            if causal and ks + c > i:
                                s = -np.inf
                            S[so + c] = s
                for r in range(mq):
                    so = r * NK
                    mx = mrow[r]
                    for c in range(nk):          # vectorised max (a NaN score reaches the row via exp32)
                        mx = max(mx, S[so + c])
                    alpha = np.float32(0.0) if mrow[r] == -np.inf else _exp(mrow[r] - mx)
                    ssum = np.float32(0.0)
                    if mx == -np.inf:            # no visible key so far; NaN scores stay NaN
                        for c in range(nk):
                            v = S[so + c]
                            S[so + c] = np.float32(0.0) if v == -np.inf else v
                    else:
                        for c in range(nk):      # vectorised exp and sum, in place
                            pv = _exp(S[so + c] - mx)
                            S[so + c] = pv
                            ssum += pv
                    lrow[r] = lrow[r] * alpha + ssum
                    mrow[r] = mx
                    ao = r * Dvp
                    for e in range(Dvp):
                        acc[ao + e] *= alpha
                for ip in range(mqp):           # P into MR-row panels (rows >= mq stay 0)
                    for rr in range(MR):
                        r = ip * MR + rr
                        pb = ip * NK * MR + rr
                        if r < mq:
                            so = r * NK
                            for c in range(nk):
                                ppack[pb + c * MR] = S[so + c]
                        else:
                            for c in range(nk):
                                ppack[pb + c * MR] = 0.0
                for ip in range(mqp):
                    for jp in range(npv):
                        ukernel_6x16(nk, ppack, ip * NK * MR, vp, vpo + (jp * Lkp + ks) * NR, acc,
                                     ip * MR * Dvp + jp * NR, Dvp)
        ob = b * ost[0] + h * ost[1]
        for r in range(mq):
            # no visible key (every score -inf: no weight at all): 0, as torch's CPU attention;
            # NaN scores leave lrow NaN and the row NaN, as torch
            lr = lrow[r]
            inv = np.float32(1.0) / lr if lr > 0 else (np.float32(0.0) if lr == 0 else np.float32(np.nan))
            off = ob + (qs + r) * ost[2]
            for e in range(Dv):
                v = acc[r * Dvp + e] * inv
                if code == 0:
                    O[off + e * ost[3]] = v
                else:
                    O[off + e * ost[3]] = enc16(code, v)


@njit(cache=True, parallel=True)
def _attend(task, Q, qst, kp, vp, O, ost, M, mst, mkind, code, H, G, heads, Lq, Lk, D, Dv, npk, npv, Lkp,
            Br, Bc, kv_once, causal, scale, es, esm, cnt):
    """Every (head, Q tile) task in parallel. The task is a separate function: Numba's
    parallel passes grow with the prange body. A/B against the task inline in the loop, one
    process: 2.6 s less compile per dtype (fp16 7.0 vs 9.6 s), 1-7 % slower (fp16 16x128x64
    1.57 vs 1.48 ms, causal 1.76 vs 1.64 ms, fp32 8x1024x64 19.5 vs 19.3 ms): under 0.5 % of
    a BERT layer. It is called through its address ``task`` (:mod:`..taskcall`): linked in,
    it was optimised and code-generated again inside this function's library."""
    nq = (Lq + Br - 1) // Br
    for t in prange(heads * nq):
        taskcall.call(task, (np.int64(t), nq, Q, qst, kp, vp, O, ost, M, mst, mkind, code, H, G, Lq, Lk, D, Dv,
                             npk, npv, Lkp, Br, Bc, kv_once, causal, scale, es, esm, cnt))


def _attend_call(Q, qst, kp, vp, O, ost, M, mst, mkind, code, H, G, heads, Lq, Lk, D, Dv, npk, npv, Lkp,
                 Br, Bc, kv_once, causal, scale, es, esm, cnt):
    """``_attend`` with its task's address (the task's argument types as ``_attend`` passes them)."""
    nq = (Lq + Br - 1) // Br
    task = taskcall.address(_attend_task, (np.int64(0), nq, Q, qst, kp, vp, O, ost, M, mst, mkind, code, H, G,
                                           Lq, Lk, D, Dv, npk, npv, Lkp, Br, Bc, kv_once, causal, scale, es, esm,
                                           cnt))
    _attend(task, Q, qst, kp, vp, O, ost, M, mst, mkind, code, H, G, heads, Lq, Lk, D, Dv, npk, npv, Lkp,
            Br, Bc, kv_once, causal, scale, es, esm, cnt)


def _acc(t, bshd=False):
    """A tensor's flat storage and its element strides in [B, H, L, D] order (a ``bshd`` tensor,
    stored [B, L, H, D], has its L and H strides swapped: the loops walk it in place)."""
    lv = t.logical()
    st = [s // lv.itemsize for s in lv.strides]
    if bshd:
        st[1], st[2] = st[2], st[1]
    return t.physical().reshape(-1), np.array(st, np.int64)


def run_attention(ctx):
    p, plan = ctx.problem, ctx.plan
    B, H, Lq, Lk, D, Dv = dims(p)
    (out,) = ctx.outputs()
    if out.numel == 0:
        return [out]
    heads = B * H
    code = dt.code(p.dtype, ctx.chip.bf16_emulation)
    q, k, v = (ctx.inputs[n] for n in ("q", "k", "v"))
    bshd = bool(p.attrs.get("bshd"))
    Qf, qst = _acc(q, bshd)
    Kf, kst = _acc(k, bshd)
    Vf, vst = _acc(v, bshd)
    Of, ost = _acc(out, bshd)
    mask = ctx.inputs.get("mask")
    if mask is None:
        Mf = np.zeros(1, Qf.dtype)
        mst = np.zeros(4, np.int64)
        mkind, esm = 0, 0
    else:
        lv = mask.logical()
        st = [s // lv.itemsize for s in lv.strides]
        shp = list(mask.shape)
        pad = 4 - len(shp)
        shp, st = [1] * pad + shp, [0] * pad + st
        mst = np.array([0 if shp[i] == 1 else st[i] for i in range(4)], np.int64)
        Mf = mask.physical().reshape(-1)
        if mask.dtype == "bool":
            Mf = Mf.view(np.uint8)
            mkind = 1
        else:
            mkind = 2
        esm = ITEMSIZE[mask.dtype]
    scale = p.attrs["scale"]
    scale = np.float32(1.0 / np.sqrt(D) if scale is None else scale)
    cfg = plan.config
    Br, Bc, kv_once = cfg.tile("q"), cfg.tile("k"), bool(cfg.tile("kv_once"))
    es = ITEMSIZE[p.dtype]
    if Lk == 0:   # no keys: torch 2.13's CPU attention gives zeros (as for a fully masked row)
        out.logical()[...] = dt.encode(np.zeros(out.shape, np.float32), out.dtype)
        nq = -(-Lq // Br)
        ctx.read(heads * Lq * D * es)
        ctx.write(out.nbytes)
        return [out]
    Hkv = kv_heads(p)
    G = H // Hkv
    if Lq <= DECODE_LQ:
        return _run_decode(ctx, Qf, qst, Kf, kst, Vf, vst, Of, ost, Mf, mst, mkind, code, B, H, G, Lq, Lk, D, Dv,
                           scale, es, esm, out)
    npk = -(-Lk // NR)
    npv = -(-Dv // NR)
    Lkp = npk * NR
    kp = np.empty(B * Hkv * npk * D * NR, np.float32)
    vp = np.empty(B * Hkv * npv * Lkp * NR, np.float32)
    nq = -(-Lq // Br)
    cnt = np.zeros((heads * nq, 3), np.int64)
    from ..threads import threads_for

    with threads_for(heads * Lq * Lk * (2 * D + 2 * Dv)):
        _prepack_call(Kf, kst, Vf, vst, code, Hkv, B * Hkv, Lk, D, Dv, npk, npv, Lkp, kp, vp)
        _attend_call(Qf, qst, kp, vp, Of, ost, Mf, mst, mkind, code, H, G, heads, Lq, Lk, D, Dv, npk, npv, Lkp,
                Br, Bc, kv_once, bool(p.attrs["causal"]), scale, es, esm, cnt)
    tot = cnt.sum(axis=0)
    ctx.read(int(tot[0]))
    ctx.write(int(tot[1]))
    ctx.ops(int(tot[2]))
    return [out]


def _run_decode(ctx, Qf, qst, Kf, kst, Vf, vst, Of, ost, Mf, mst, mkind, code, B, H, G, Lq, Lk, D, Dv, scale, es,
                esm, out):
    """A few queries per head (a decode step): :func:`decode.decode_attend`, no panels; the tile
    loads and stores counted from the plan's schedule (the tiles the chip runs)."""
    from ..threads import threads_for

    causal = bool(ctx.problem.attrs["causal"])
    cfg = ctx.plan.config
    with threads_for(B * H * Lq * Lk * (2 * D + 2 * Dv)):
        decode_attend(Qf, qst, Kf, kst, Vf, vst, Of, ost, Mf, mst, mkind, code, B, H, G, Lq, Lk, D, Dv, causal,
                      scale)
    for n, t in _schedule(Lq, Lk, D, Dv, es, esm, causal, B * H, B * (H // G), cfg.tile("q"), cfg.tile("k"),
                          bool(cfg.tile("kv_once"))):
        ctx.read(n * t.bytes_read)
        ctx.write(n * t.bytes_written)
        ctx.ops(n * t.flops)
    return [out]
