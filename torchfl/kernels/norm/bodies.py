"""Numba bodies of the normalisation family: the addressing tables and the segment loops
(affine, normalise, sums, the backward passes) the drivers in ``norm/impl.py`` call.

Addressing is layout-free: a tensor is read as ``base[segment] + element offset`` where
the two offset tables come from its logical strides (any permutation, any rank), with a
fast path when the element offsets are an arithmetic progression. Each segment (or
chunk of one) is loaded into an on-chip buffer, computed there, and stored.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from .. import taskcall
from ..codecs import decode, encode16, f16_to_f32, f32_to_f16
from ..staging import _flat, load_row, store_row


# reassociation (vectorised sums) and FMA contraction only: NaN/inf semantics are kept
_FM = {"reassoc", "contract"}

# ------------------------------------------------------------------ addressing helpers

def _tables(t, seg_dims):
    """(flat storage, segment base offsets, element offsets, element stride or -1)."""
    flat, strides = _flat(t)
    shape = t.shape
    el_dims = [d for d in range(len(shape)) if d not in seg_dims]

    def offs(dims):
        o = np.zeros(1, np.int64)
        for d in dims:
            o = (o[:, None] + np.arange(shape[d], dtype=np.int64)[None, :] * strides[d]).ravel()
        return o

    seg, el = offs(seg_dims), offs(el_dims)
    est = -1
    if el.size <= 1:
        est = 1
    else:
        d = np.diff(el)
        if (d == d[0]).all() and el[0] == 0:
            est = int(d[0])
    return flat, seg, el, est


def _tables_of(ctx, t, seg_dims):
    """``_tables`` with the offset arrays kept in the bound call's cache (``ctx.cache``): they
    depend only on the shape and strides, the same on every call of a step (0.06 ms a call)."""
    flat, strides = _flat(t)
    key = ("norm_tables", tuple(t.shape), tuple(strides), tuple(seg_dims))
    hit = ctx.cache.get(key)
    if hit is None:
        hit = ctx.cache[key] = _tables(t, seg_dims)[1:]
    return (flat,) + hit


# forceinline: compiled once (with its callers' fastmath: it does not inherit theirs), inlined by LLVM
@njit(cache=True, nogil=True, forceinline=True, fastmath=_FM)
def _load(x, base, el, est, code, e0, e1, buf):
    if est >= 0:    # a strided row: the one row decoder (a vectorised loop per code when contiguous)
        load_row(x, base + e0 * est, est, e1 - e0, code, buf)
    else:
        for e in range(e0, e1):
            buf[e - e0] = decode(code, x[base + el[e]])


@njit(cache=True, nogil=True, forceinline=True, fastmath=_FM)
def _store(y, base, el, est, code, e0, e1, buf):
    if est == 1:        # a contiguous row: the one row encoder (a vectorised loop per code)
        store_row(y, base + e0, e1 - e0, code, buf)
    elif code == 0:
        if est >= 0:
            for e in range(e0, e1):
                y[base + e * est] = buf[e - e0]
        else:
            for e in range(e0, e1):
                y[base + el[e]] = buf[e - e0]
    else:
        for e in range(e0, e1):
            o = base + (e * est if est >= 0 else el[e])
            y[o] = encode16(code, buf[e - e0])


# ------------------------------------------------------------------ segment kernels

@njit(cache=True, nogil=True, parallel=True, fastmath=_FM)
def seg_affine(x, xseg, xel, xest, code, y, yseg, yel, yest, ycode, bounds, e0, e1, scale, shift):
    """y = x * scale[s] + shift[s] over segments [s0, s1), elements [e0, e1)."""
    for t in prange(bounds.size - 1):
        for s in range(bounds[t], bounds[t + 1]):
            buf = np.empty(e1 - e0, np.float32)
            _load(x, xseg[s], xel, xest, code, e0, e1, buf)
            a, b = scale[s], shift[s]
            for i in range(e1 - e0):
                buf[i] = buf[i] * a + b
            _store(y, yseg[s], yel, yest, ycode, e0, e1, buf)


@njit(cache=True, nogil=True, parallel=True, fastmath=_FM)
def interleaved_affine(x, x0, xest, code, y, y0, yest, ycode, S, L, scale, shift):
    """:func:`seg_affine` where the segments interleave (channel-innermost layouts: NHWC):
    element e of segment s at ``x0 + s + e * xest``. Walking the segments inside each
    element reads every row of S values once, contiguously; one segment at a time strides
    by ``xest`` and pulls the tensor through the cache S times (NHWC batch norm ran 2-4x
    slower than NCHW on the host, for the same bytes on the chip)."""
    nch = min(L, 64)
    for c in prange(nch):
        buf = np.empty(S, np.float32)
        for e in range(L * c // nch, L * (c + 1) // nch):
            xb, yb = x0 + e * xest, y0 + e * yest
            if code == 0:
                for s in range(S):
                    buf[s] = x[xb + s]
            else:
                for s in range(S):
                    buf[s] = decode(code, x[xb + s])
            for s in range(S):
                buf[s] = buf[s] * scale[s] + shift[s]
            if ycode == 0:
                for s in range(S):
                    y[yb + s] = buf[s]
            else:
                for s in range(S):
                    y[yb + s] = encode16(ycode, buf[s])


@njit(inline="always", cache=True)
def _row_stats(buf, L, a32, eps):
    """(mean, 1 / sqrt(biased variance + eps)) of a row's float32 copy ``buf[:L]`` whose sum is
    ``a32``: the rows tasks' statistics (inlined: each task's loops keep its fastmath flags)."""
    mu = a32 / np.float32(L)
    q32 = np.float32(0.0)
    for i in range(L):
        d = buf[i] - mu
        q32 += d * d
    return mu, np.float32(1.0 / math.sqrt(q32 / L + eps))


@njit(cache=True, nogil=True, fastmath=_FM)
def _normalize_rows16_task(t, x, xseg, xel, xest, code, y, yseg, yel, yest, ycode, bounds, L, eps, w, b, wstride,
                           mean_out, rstd_out):
    """``seg_normalize``'s segments ``bounds[t]..bounds[t + 1]`` where they are contiguous fp16 rows in
    and out, with per-element w/b (a transformer's layer norm): decode, sum, squares, normalise and
    encode, one loop each so that each vectorises. A task of its own, not a branch of
    :func:`_normalize_task`: a layer norm then compiles no general row load/store (``_load``,
    ``_store`` and their row codecs: ~1.6 s of compile CPU on a BERT layer's first call that never
    ran them), and no float32 loops (:func:`_normalize_rows32_task`: ~0.25 s). The arithmetic of
    the branch it was (bit-identical)."""
    buf = np.empty(L, np.float32)
    for s in range(bounds[t], bounds[t + 1]):
        xb, yb = xseg[s], yseg[s]
        a32 = np.float32(0.0)
        xr = x[xb:xb + L]
        for i in range(L):      # one decode loop, then the sum: each vectorises (0.65 -> ~0.1 ms at 128 x 768)
            buf[i] = f16_to_f32(xr[i])
        for i in range(L):
            a32 += buf[i]
        mu, r32 = _row_stats(buf, L, a32, eps)
        mean_out[s] = mu
        rstd_out[s] = r32
        yr = y[yb:yb + L]
        for i in range(L):
            yr[i] = f32_to_f16((buf[i] - mu) * r32 * w[i] + b[i])


@njit(cache=True, nogil=True, fastmath=_FM)
def _normalize_rows32_task(t, x, xseg, xel, xest, code, y, yseg, yel, yest, ycode, bounds, L, eps, w, b, wstride,
                           mean_out, rstd_out):
    """:func:`_normalize_rows16_task` for float32 rows: load and sum in one loop, squares,
    normalise and store."""
    buf = np.empty(L, np.float32)
    for s in range(bounds[t], bounds[t + 1]):
        xb, yb = xseg[s], yseg[s]
        a32 = np.float32(0.0)
        for i in range(L):
            v = np.float32(x[xb + i])
            buf[i] = v
            a32 += v
        mu, r32 = _row_stats(buf, L, a32, eps)
        mean_out[s] = mu
        rstd_out[s] = r32
        for i in range(L):
            y[yb + i] = (buf[i] - mu) * r32 * w[i] + b[i]


@njit(cache=True, nogil=True, fastmath=_FM)
def _normalize_task(t, x, xseg, xel, xest, code, y, yseg, yel, yest, ycode, bounds, L, eps, w, b, wstride,
                    mean_out, rstd_out):
    """``seg_normalize``'s segments ``bounds[t]..bounds[t + 1]``, any layout and code (contiguous
    rows take :func:`_normalize_rows16_task` / :func:`_normalize_rows32_task`): a plain function
    its prange loop calls, so Numba's parallel passes see a small body (the prange-body rule in
    docs/ARCHITECTURE.md): its cold compile 5.3 -> 3.85 s CPU, warm 128 x 768 fp16 unchanged
    (84 us, 1 thread)."""
    buf = np.empty(L, np.float32)
    e0 = np.int64(0)    # not a literal 0: _load/_store would compile a Literal[int](0) signature of their own
    for s in range(bounds[t], bounds[t + 1]):
        _load(x, xseg[s], xel, xest, code, e0, L, buf)
        acc = 0.0
        for i in range(L):
            acc += buf[i]
        mean = acc / L
        sq = 0.0
        for i in range(L):
            d = buf[i] - mean
            sq += d * d
        rstd = 1.0 / math.sqrt(sq / L + eps)
        mean_out[s] = mean
        rstd_out[s] = rstd
        m32, r32 = np.float32(mean), np.float32(rstd)
        if wstride == 0:
            a = r32 * w[s]
            for i in range(L):
                buf[i] = (buf[i] - m32) * a + b[s]
        else:
            for i in range(L):
                buf[i] = (buf[i] - m32) * r32 * w[i] + b[i]
        _store(y, yseg[s], yel, yest, ycode, e0, L, buf)


@njit(cache=True, nogil=True, parallel=True)
def _seg_normalize(task, x, xseg, xel, xest, code, y, yseg, yel, yest, ycode, bounds, L, eps, w, b, wstride,
                   mean_out, rstd_out):
    """:func:`seg_normalize`'s parallel loop; ``task`` is the address of a rows task or of
    ``_normalize_task`` (:mod:`..taskcall`: called, not linked in and compiled again here; both take
    the same argument types, so this loop compiles once for both). The index is cast to int64 (a
    uint64 prange index would be a second task signature)."""
    for t in prange(bounds.size - 1):
        taskcall.call(task, (np.int64(t), x, xseg, xel, xest, code, y, yseg, yel, yest, ycode, bounds, L, eps, w, b,
                             wstride, mean_out, rstd_out))


def rows_fast(xest, yest, code, ycode, wstride) -> bool:
    """Whether :func:`seg_normalize` takes a rows task (:func:`_normalize_rows16_task`,
    :func:`_normalize_rows32_task`): contiguous rows, one code (float32 or fp16) in and out,
    per-element w/b."""
    return xest == 1 and yest == 1 and code == ycode and (code == 0 or code == 1) and wstride == 1


def seg_normalize(x, xseg, xel, xest, code, y, yseg, yel, yest, ycode, bounds, L, eps, w, b, wstride,
                  mean_out, rstd_out):
    """Whole segments on chip: mean, biased variance (two passes over the on-chip copy),
    y = (x - mean) * rstd * w + b; w/b per segment (wstride 0) or per element (1)."""
    if rows_fast(xest, yest, code, ycode, wstride):
        task = _normalize_rows32_task if code == 0 else _normalize_rows16_task
    else:
        task = _normalize_task
    addr = taskcall.address(task, (np.int64(0), x, xseg, xel, xest, code, y, yseg, yel, yest, ycode,
                                   bounds, L, eps, w, b, wstride, mean_out, rstd_out))
    _seg_normalize(addr, x, xseg, xel, xest, code, y, yseg, yel, yest, ycode, bounds, L, eps, w, b, wstride,
                   mean_out, rstd_out)


@njit(cache=True, nogil=True, fastmath=_FM)
def seg_sums(x, xseg, xel, xest, code, s0, s1, e0, e1, shift, s1_acc, s2_acc):
    """Chunked statistics pass: shifted sums (float64) of elements [e0, e1)."""
    for s in prange(s0, s1):
        buf = np.empty(e1 - e0, np.float32)
        _load(x, xseg[s], xel, xest, code, e0, e1, buf)
        a = 0.0
        q = 0.0
        k = shift[s]
        for i in range(e1 - e0):
            d = buf[i] - k
            a += d
            q += d * d
        s1_acc[s] += a
        s2_acc[s] += q


@njit(cache=True, nogil=True)
def seg_first(x, xseg, xel, xest, code, s, out):
    buf = np.empty(1, np.float32)
    _load(x, xseg[s], xel, xest, code, np.int64(0), np.int64(1), buf)
    out[s] = buf[0]


@njit(cache=True, nogil=True, fastmath=_FM)
def seg_affine_el(x, xseg, xel, xest, code, y, yseg, yel, yest, ycode, s0, s1, e0, e1, mean, rstd, w, b):
    """Chunked layer-norm apply: y = (x - mean[s]) * rstd[s] * w[e] + b[e]."""
    for s in prange(s0, s1):
        buf = np.empty(e1 - e0, np.float32)
        _load(x, xseg[s], xel, xest, code, e0, e1, buf)
        m, r = np.float32(mean[s]), np.float32(rstd[s])
        for i in range(e1 - e0):
            buf[i] = (buf[i] - m) * r * w[e0 + i] + b[e0 + i]
        _store(y, yseg[s], yel, yest, ycode, e0, e1, buf)


@njit(cache=True, nogil=True, fastmath=_FM)
def bn_bwd_sums(g, gseg, gel, gest, x, xseg, xel, xest, code, s0, s1, e0, e1, mean, sdy, sdyx):
    for s in prange(s0, s1):
        gb = np.empty(e1 - e0, np.float32)
        xb = np.empty(e1 - e0, np.float32)
        _load(g, gseg[s], gel, gest, code, e0, e1, gb)
        _load(x, xseg[s], xel, xest, code, e0, e1, xb)
        a = 0.0
        q = 0.0
        m = mean[s]
        for i in range(e1 - e0):
            a += gb[i]
            q += gb[i] * (xb[i] - m)
        sdy[s] += a
        sdyx[s] += q


@njit(cache=True, nogil=True, fastmath=_FM)
def bn_bwd_apply(g, gseg, gel, gest, x, xseg, xel, xest, code, y, yseg, yel, yest, ycode, s0, s1, e0, e1,
                 mean, k1, k2, k3):
    """dx = k1[s] * dy - k2[s] - k3[s] * (x - mean[s])."""
    for s in prange(s0, s1):
        gb = np.empty(e1 - e0, np.float32)
        xb = np.empty(e1 - e0, np.float32)
        _load(g, gseg[s], gel, gest, code, e0, e1, gb)
        _load(x, xseg[s], xel, xest, code, e0, e1, xb)
        a, bb, c, m = np.float32(k1[s]), np.float32(k2[s]), np.float32(k3[s]), np.float32(mean[s])
        for i in range(e1 - e0):
            gb[i] = a * gb[i] - bb - c * (xb[i] - m)
        _store(y, yseg[s], yel, yest, ycode, e0, e1, gb)


@njit(cache=True, nogil=True, parallel=True, fastmath=_FM)
def bn_bwd_resident(g, gseg, gel, gest, x, xseg, xel, xest, code, y, yseg, yel, yest, ycode, bounds, L,
                    mean, invstd, w, train, sdy_out, sdyx_out):
    for t in prange(bounds.size - 1):
        for s in range(bounds[t], bounds[t + 1]):
            gb = np.empty(L, np.float32)
            xb = np.empty(L, np.float32)
            _load(g, gseg[s], gel, gest, code, np.int64(0), L, gb)
            _load(x, xseg[s], xel, xest, code, np.int64(0), L, xb)
            a = 0.0
            q = 0.0
            m = mean[s]
            for i in range(L):
                a += gb[i]
                q += gb[i] * (xb[i] - m)
            sdy_out[s] = a
            sdyx_out[s] = q
            inv = invstd[s]
            k1 = np.float32(w[s] * inv)
            if train:
                k2 = np.float32(w[s] * inv * a / L)
                k3 = np.float32(w[s] * inv * inv * inv * q / L)
            else:
                k2 = np.float32(0.0)
                k3 = np.float32(0.0)
            m32 = np.float32(m)
            for i in range(L):
                gb[i] = k1 * gb[i] - k2 - k3 * (xb[i] - m32)
            _store(y, yseg[s], yel, yest, ycode, np.int64(0), L, gb)


@njit(cache=True, nogil=True, parallel=True, fastmath=_FM)
def ln_bwd_rows(g, gseg, gel, gest, x, xseg, xel, xest, code, y, yseg, yel, yest, ycode, r0, r1, D,
                mean, rstd, w, dw_part, db_part):
    """Layer-norm backward over rows [r0, r1); grad_weight/bias partials per worker."""
    nb = dw_part.shape[0]
    n = r1 - r0
    for bi in prange(nb):
        a0 = r0 + (n * bi) // nb
        a1 = r0 + (n * (bi + 1)) // nb
        gb = np.empty(D, np.float32)
        xb = np.empty(D, np.float32)
        for r in range(a0, a1):
            _load(g, gseg[r], gel, gest, code, np.int64(0), D, gb)
            _load(x, xseg[r], xel, xest, code, np.int64(0), D, xb)
            m, rs = np.float32(mean[r]), np.float32(rstd[r])
            s1 = 0.0
            s2 = 0.0
            for i in range(D):
                xh = (xb[i] - m) * rs
                gw = gb[i] * w[i]
                s1 += gw
                s2 += gw * xh
                dw_part[bi, i] += gb[i] * xh
                db_part[bi, i] += gb[i]
                xb[i] = xh
            c1 = np.float32(s1 / D)
            c2 = np.float32(s2 / D)
            for i in range(D):
                gb[i] = rs * (gb[i] * w[i] - c1 - xb[i] * c2)
            _store(y, yseg[r], yel, yest, ycode, np.int64(0), D, gb)
