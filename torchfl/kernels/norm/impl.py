"""Numba bodies of the normalisation family (imported lazily by the specs' ``run``).

Addressing is layout-free: a tensor is read as ``base[segment] + element offset`` where
the two offset tables come from its logical strides (any permutation, any rank), with a
fast path when the element offsets are an arithmetic progression. Each segment (or
chunk of one) is loaded into an on-chip buffer, computed there, and stored.
"""
from __future__ import annotations

import math

import numpy as np
from numba import get_num_threads, njit, prange

from .. import taskcall
from ..codecs import decode, encode16, f16_to_f32, f32_to_f16
from ..staging import _code, _flat
from ..threads import sized_by


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


@njit(cache=True, nogil=True, inline="always")
def _load(x, base, el, est, code, e0, e1, buf):
    if est == 1 and code == 0:        # contiguous float32: a plain copy
        for e in range(e0, e1):
            buf[e - e0] = x[base + e]
    elif est >= 0:
        for e in range(e0, e1):
            buf[e - e0] = decode(code, x[base + e * est])
    else:
        for e in range(e0, e1):
            buf[e - e0] = decode(code, x[base + el[e]])


@njit(cache=True, nogil=True, inline="always")
def _store(y, base, el, est, code, e0, e1, buf):
    if code == 0:
        if est == 1:
            for e in range(e0, e1):
                y[base + e] = buf[e - e0]
        elif est >= 0:
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


@njit(cache=True, nogil=True, fastmath=_FM)
def _normalize_task(t, x, xseg, xel, xest, code, y, yseg, yel, yest, ycode, bounds, L, eps, w, b, wstride,
                    mean_out, rstd_out, fast):
    """``seg_normalize``'s segments ``bounds[t]..bounds[t + 1]``: a plain function its prange
    loop calls, so Numba's parallel passes see a small body (the prange-body rule in
    docs/ARCHITECTURE.md): its cold compile 5.3 -> 3.85 s CPU, warm 128 x 768 fp16 unchanged
    (84 us, 1 thread)."""
    buf = np.empty(L, np.float32)
    for s in range(bounds[t], bounds[t + 1]):
        if fast:   # contiguous fp32 / fp16 rows (layer-norm): load+sum, squares, normalise+store
            xb, yb = xseg[s], yseg[s]
            a32 = np.float32(0.0)
            if code == 0:
                for i in range(L):
                    v = np.float32(x[xb + i])
                    buf[i] = v
                    a32 += v
            else:   # one decode loop, then the sum: each vectorises (0.65 -> ~0.1 ms at 128 x 768)
                xr = x[xb:xb + L]
                for i in range(L):
                    buf[i] = f16_to_f32(xr[i])
                for i in range(L):
                    a32 += buf[i]
            mu = a32 / np.float32(L)
            q32 = np.float32(0.0)
            for i in range(L):
                d = buf[i] - mu
                q32 += d * d
            r32 = np.float32(1.0 / math.sqrt(q32 / L + eps))
            mean_out[s] = mu
            rstd_out[s] = r32
            if code == 0:
                for i in range(L):
                    y[yb + i] = (buf[i] - mu) * r32 * w[i] + b[i]
            else:
                yr = y[yb:yb + L]
                for i in range(L):
                    yr[i] = f32_to_f16((buf[i] - mu) * r32 * w[i] + b[i])
            continue
        _load(x, xseg[s], xel, xest, code, 0, L, buf)
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
        _store(y, yseg[s], yel, yest, ycode, 0, L, buf)


@njit(cache=True, nogil=True, parallel=True)
def _seg_normalize(task, x, xseg, xel, xest, code, y, yseg, yel, yest, ycode, bounds, L, eps, w, b, wstride,
                   mean_out, rstd_out):
    """:func:`seg_normalize`'s parallel loop; ``task`` is ``_normalize_task``'s address
    (:mod:`..taskcall`: called, not linked in and compiled again here). The index is cast to
    int64 (a uint64 prange index would be a second task signature)."""
    fast = xest == 1 and yest == 1 and code == ycode and (code == 0 or code == 1) and wstride == 1
    for t in prange(bounds.size - 1):
        taskcall.call(task, (np.int64(t), x, xseg, xel, xest, code, y, yseg, yel, yest, ycode, bounds, L, eps, w, b,
                             wstride, mean_out, rstd_out, fast))


def seg_normalize(x, xseg, xel, xest, code, y, yseg, yel, yest, ycode, bounds, L, eps, w, b, wstride,
                  mean_out, rstd_out):
    """Whole segments on chip: mean, biased variance (two passes over the on-chip copy),
    y = (x - mean) * rstd * w + b; w/b per segment (wstride 0) or per element (1)."""
    task = taskcall.address(_normalize_task, (np.int64(0), x, xseg, xel, xest, code, y, yseg, yel, yest, ycode,
                                              bounds, L, eps, w, b, wstride, mean_out, rstd_out, False))
    _seg_normalize(task, x, xseg, xel, xest, code, y, yseg, yel, yest, ycode, bounds, L, eps, w, b, wstride,
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
    _load(x, xseg[s], xel, xest, code, 0, 1, buf)
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
            _load(g, gseg[s], gel, gest, code, 0, L, gb)
            _load(x, xseg[s], xel, xest, code, 0, L, xb)
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
            _store(y, yseg[s], yel, yest, ycode, 0, L, gb)


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
            _load(g, gseg[r], gel, gest, code, 0, D, gb)
            _load(x, xseg[r], xel, xest, code, 0, D, xb)
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
            _store(y, yseg[r], yel, yest, ycode, 0, D, gb)


# ------------------------------------------------------------------ drivers

def _vec(ctx, name, n, default, lo=None, hi=None):
    """Load a parameter vector (or its slice [lo, hi)) on chip as float32; counted."""
    from .. import dtypes as _dt

    t = ctx.inputs.get(name)
    if t is None:
        return np.full(n, default, np.float32)
    if lo is None and hi is None:       # a kept weight (frozen buffer): decoded once (callers only read it)
        from .. import frozen

        kept = frozen.derived(t.buffer, ("norm_vec", t.offset, tuple(t.shape), t.dtype, t.layout),
                              lambda: _vec_decoded(t, n, default))
        if kept is not None:
            ctx.read(n * _dt.itemsize(t.dtype))
            return kept
    out = np.full(n, default, np.float32)
    lo = 0 if lo is None else lo
    hi = n if hi is None else hi
    out[lo:hi] = _dt.decode(np.ascontiguousarray(t.logical().reshape(-1)[lo:hi]), t.dtype)
    ctx.read((hi - lo) * _dt.itemsize(t.dtype))
    return out


def _vec_decoded(t, n, default):
    from .. import dtypes as _dt

    out = np.full(n, default, np.float32)
    out[:] = _dt.decode(np.ascontiguousarray(t.logical().reshape(-1)), t.dtype)
    return out


def _seg_tiles(ctx, S):
    from ..conv.geometry import tile_starts

    return tile_starts(S, ctx.plan.config.tile("segments") or 1)


def _interleaved(seg, est, S) -> bool:
    """Segments side by side inside each element row (segment s at base + s, elements
    ``est >= S`` apart): the layout :func:`interleaved_affine` walks row by row."""
    return S > 1 and est >= S and bool((np.diff(seg) == 1).all())


def _bounds(tiles):
    """Tile boundaries [s0, s1, s2, ...] for the one parallel call that runs all tiles (each
    tile is processed by one host thread, in order, as the chip streams them)."""
    return np.array([a for a, _ in tiles] + [tiles[-1][1]], np.int64)


def _elements(p) -> int:
    from . import segments

    S, L = segments(p)
    return S * L


@sized_by(_elements)
def run_batch_norm_infer(ctx):
    from . import _OPS, segments

    p, chip = ctx.problem, ctx.chip
    S, L = segments(p)
    outs = ctx.outputs()
    yt = outs[0]
    if S * L == 0:
        return outs
    x, xseg, xel, xest = _tables(ctx.inputs["x"], (1,))
    y, yseg, yel, yest = _tables(yt, (1,))
    code = _code(p.dtype, chip)
    eps = p.attrs["eps"]
    ope, ops_seg = _OPS[p.kernel]
    es = x.dtype.itemsize
    cfg = ctx.plan.config
    scale = np.zeros(S, np.float32)
    shift = np.zeros(S, np.float32)

    def fold(lo, hi):
        w = _vec(ctx, "weight", S, 1.0, lo, hi)
        b = _vec(ctx, "bias", S, 0.0, lo, hi)
        m = _vec(ctx, "running_mean", S, 0.0, lo, hi)
        v = _vec(ctx, "running_var", S, 1.0, lo, hi)
        inv = (1.0 / np.sqrt(v[lo:hi].astype(np.float64) + eps)).astype(np.float32)
        scale[lo:hi] = w[lo:hi] * inv
        shift[lo:hi] = b[lo:hi] - m[lo:hi] * scale[lo:hi]
        ctx.ops((hi - lo) * ops_seg)

    if cfg.strategy == "resident":
        tiles = _seg_tiles(ctx, S)
        for s0, s1 in tiles:
            fold(s0, s1)      # each tile's parameters, resident beside it
        if _interleaved(xseg, xest, S) and _interleaved(yseg, yest, S):
            interleaved_affine(x, xseg[0], xest, code, y, yseg[0], yest, code, S, L, scale, shift)
        else:
            seg_affine(x, xseg, xel, xest, code, y, yseg, yel, yest, code, _bounds(tiles), 0, L, scale, shift)
        for s0, s1 in tiles:
            ctx.read((s1 - s0) * L * es)
            ctx.write((s1 - s0) * L * es)
            ctx.ops((s1 - s0) * L * ope[0])
    else:
        from ..conv.geometry import tile_starts

        for s in range(S):
            fold(s, s + 1)
            for e0, e1 in tile_starts(L, cfg.tile("elements")):
                seg_affine(x, xseg, xel, xest, code, y, yseg, yel, yest, code, np.array([s, s + 1], np.int64), e0, e1, scale, shift)
                ctx.read((e1 - e0) * es)
                ctx.write((e1 - e0) * es)
                ctx.ops((e1 - e0) * ope[0])
    return outs


@sized_by(_elements)
def run_batch_norm_train(ctx):
    from . import _OPS, segments

    p, chip = ctx.problem, ctx.chip
    S, L = segments(p)
    outs = ctx.outputs()
    yt, mt, it = outs[0], outs[1], outs[2]
    if S * L == 0:
        return outs
    x, xseg, xel, xest = _tables(ctx.inputs["x"], (1,))
    y, yseg, yel, yest = _tables(yt, (1,))
    code = _code(p.dtype, chip)
    eps, mom = p.attrs["eps"], p.attrs["momentum"]
    ope, ops_seg = _OPS[p.kernel]
    es = x.dtype.itemsize
    cfg = ctx.plan.config
    mean = np.zeros(S, np.float64)
    rstd = np.zeros(S, np.float64)
    w_all = np.ones(S, np.float32)
    b_all = np.zeros(S, np.float32)
    rm = np.zeros(S, np.float32)
    rv = np.zeros(S, np.float32)
    from .. import dtypes as _dt

    def params(lo, hi):
        w_all[lo:hi] = _vec(ctx, "weight", S, 1.0, lo, hi)[lo:hi]
        b_all[lo:hi] = _vec(ctx, "bias", S, 0.0, lo, hi)[lo:hi]
        if p.has("running_mean"):
            rm[lo:hi] = _vec(ctx, "running_mean", S, 0.0, lo, hi)[lo:hi]
        if p.has("running_var"):
            rv[lo:hi] = _vec(ctx, "running_var", S, 1.0, lo, hi)[lo:hi]
        ctx.ops((hi - lo) * ops_seg)

    stat_bytes = 4 * (2 + p.has("running_mean") + p.has("running_var"))   # all four statistics in float32
    if cfg.strategy == "resident":
        tiles = _seg_tiles(ctx, S)
        for s0, s1 in tiles:
            params(s0, s1)
        seg_normalize(x, xseg, xel, xest, code, y, yseg, yel, yest, code, _bounds(tiles), L, eps, w_all, b_all,
                      0, mean, rstd)
        for s0, s1 in tiles:
            ctx.read((s1 - s0) * L * es)
            ctx.write((s1 - s0) * (L * es + stat_bytes))
            ctx.ops((s1 - s0) * L * sum(ope))
    else:
        from ..conv.geometry import tile_starts

        chunks = tile_starts(L, cfg.tile("elements"))
        sa = np.zeros(S, np.float64)
        sq = np.zeros(S, np.float64)
        first = np.zeros(S, np.float32)
        scale = np.zeros(S, np.float32)
        shift = np.zeros(S, np.float32)
        for s in range(S):
            params(s, s + 1)
            for i, (e0, e1) in enumerate(chunks):
                if i == 0:
                    seg_first(x, xseg, xel, xest, code, s, first)   # shift from the first chunk
                seg_sums(x, xseg, xel, xest, code, s, s + 1, e0, e1, first, sa, sq)
                ctx.read((e1 - e0) * es)
                ctx.ops((e1 - e0) * ope[0])
            d = sa[s] / L
            mean[s] = first[s] + d
            var = max(sq[s] / L - d * d, 0.0)
            rstd[s] = 1.0 / np.sqrt(var + eps)
            scale[s] = np.float32(w_all[s] * rstd[s])
            shift[s] = np.float32(b_all[s] - mean[s] * w_all[s] * rstd[s])
            for e0, e1 in chunks:
                seg_affine(x, xseg, xel, xest, code, y, yseg, yel, yest, code, np.array([s, s + 1], np.int64), e0, e1, scale, shift)
                ctx.read((e1 - e0) * es)
                ctx.write((e1 - e0) * es)
                ctx.ops((e1 - e0) * ope[1])
            ctx.write(stat_bytes)
    # saved statistics and running statistics (the writes were counted per segment above)
    mt.logical()[...] = mean.astype(np.float32)
    it.logical()[...] = rstd.astype(np.float32)
    var_b = 1.0 / rstd ** 2 - eps
    k = 4
    if p.has("running_mean"):
        outs[k - 1].logical()[...] = _dt.encode(((1 - mom) * rm + mom * mean).astype(np.float32), outs[k - 1].dtype)
        k += 1
    if p.has("running_var"):
        unb = var_b * L / (L - 1) if L > 1 else np.full(S, np.inf)
        outs[k - 1].logical()[...] = _dt.encode(((1 - mom) * rv + mom * unb).astype(np.float32), outs[k - 1].dtype)
    return outs


@sized_by(_elements)
def run_batch_norm_backward(ctx):
    from . import _OPS, segments

    p, chip = ctx.problem, ctx.chip
    S, L = segments(p)
    outs = ctx.outputs()
    if S * L == 0:
        return outs
    g, gseg, gel, gest = _tables(ctx.inputs["grad_out"], (1,))
    x, xseg, xel, xest = _tables(ctx.inputs["x"], (1,))
    y, yseg, yel, yest = _tables(outs[0], (1,))
    code = _code(p.dtype, chip)
    ope, ops_seg = _OPS[p.kernel]
    es = x.dtype.itemsize
    cfg = ctx.plan.config
    train = bool(p.attrs["train"])
    w = np.ones(S, np.float32)
    mean = np.zeros(S, np.float32)
    inv = np.zeros(S, np.float32)
    sdy = np.zeros(S, np.float64)
    sdyx = np.zeros(S, np.float64)
    wg = bool(p.attrs["weight_grad"])
    from .. import dtypes as _dt

    def params(lo, hi):
        w[lo:hi] = _vec(ctx, "weight", S, 1.0, lo, hi)[lo:hi]
        mean[lo:hi] = _vec(ctx, "save_mean", S, 0.0, lo, hi)[lo:hi]
        inv[lo:hi] = _vec(ctx, "save_invstd", S, 0.0, lo, hi)[lo:hi]
        ctx.ops((hi - lo) * ops_seg)

    gbytes = 2 * es if wg else 0
    if cfg.strategy == "resident":
        tiles = _seg_tiles(ctx, S)
        for s0, s1 in tiles:
            params(s0, s1)
        bn_bwd_resident(g, gseg, gel, gest, x, xseg, xel, xest, code, y, yseg, yel, yest, code, _bounds(tiles), L,
                        mean, inv, w, train, sdy, sdyx)
        for s0, s1 in tiles:
            ctx.read((s1 - s0) * L * 2 * es)
            ctx.write((s1 - s0) * (L * es + gbytes))
            ctx.ops((s1 - s0) * L * sum(ope))
    else:
        from ..conv.geometry import tile_starts

        chunks = tile_starts(L, cfg.tile("elements"))
        k1, k2, k3 = (np.zeros(S, np.float32) for _ in range(3))
        for s in range(S):
            params(s, s + 1)
            for e0, e1 in chunks:
                bn_bwd_sums(g, gseg, gel, gest, x, xseg, xel, xest, code, s, s + 1, e0, e1, mean, sdy, sdyx)
                ctx.read((e1 - e0) * 2 * es)
                ctx.ops((e1 - e0) * ope[0])
            k1[s] = w[s] * inv[s]
            if train:
                k2[s] = w[s] * inv[s] * sdy[s] / L
                k3[s] = w[s] * inv[s] ** 3 * sdyx[s] / L
            for e0, e1 in chunks:
                bn_bwd_apply(g, gseg, gel, gest, x, xseg, xel, xest, code, y, yseg, yel, yest, code, s, s + 1,
                             e0, e1, mean, k1, k2, k3)
                ctx.read((e1 - e0) * 2 * es)
                ctx.write((e1 - e0) * es)
                ctx.ops((e1 - e0) * ope[1])
            ctx.write(gbytes)
    if wg:
        outs[1].logical()[...] = _dt.encode((sdyx * inv).astype(np.float32), outs[1].dtype)
        outs[2].logical()[...] = _dt.encode(sdy.astype(np.float32), outs[2].dtype)
    return outs


def _ln_dims(p):
    from . import _norm_shape

    nd = len(p.shapes["x"])
    k = len(_norm_shape(p))
    return tuple(range(nd - k))


@sized_by(_elements)
def run_layer_norm(ctx):
    from . import _OPS, segments

    p, chip = ctx.problem, ctx.chip
    M, D = segments(p)
    yt, mt, rt = ctx.outputs()
    if M * D == 0:
        return [yt, mt, rt]
    sd = _ln_dims(p)
    x, xseg, xel, xest = _tables_of(ctx, ctx.inputs["x"], sd)
    y, yseg, yel, yest = _tables_of(ctx, yt, sd)
    code = _code(p.dtype, chip)
    ope, ops_seg = _OPS[p.kernel]
    es = x.dtype.itemsize
    cfg = ctx.plan.config
    eps = p.attrs["eps"]
    mean = np.zeros(M, np.float64)
    rstd = np.zeros(M, np.float64)
    if cfg.strategy == "resident":
        w = _vec(ctx, "weight", D, 1.0)
        b = _vec(ctx, "bias", D, 0.0)
        tiles = _seg_tiles(ctx, M)
        seg_normalize(x, xseg, xel, xest, code, y, yseg, yel, yest, code, _bounds(tiles), D, eps, w, b, 1,
                      mean, rstd)
        for s0, s1 in tiles:
            ctx.read((s1 - s0) * D * es)
            ctx.write((s1 - s0) * (D * es + 8))
            ctx.ops((s1 - s0) * (D * sum(ope) + ops_seg))
    else:
        from ..conv.geometry import tile_starts

        chunks = tile_starts(D, cfg.tile("elements"))
        sa = np.zeros(M, np.float64)
        sq = np.zeros(M, np.float64)
        first = np.zeros(M, np.float32)
        w = np.ones(D, np.float32)
        b = np.zeros(D, np.float32)
        for s in range(M):
            ctx.ops(ops_seg)
            for i, (e0, e1) in enumerate(chunks):
                if i == 0:
                    seg_first(x, xseg, xel, xest, code, s, first)
                seg_sums(x, xseg, xel, xest, code, s, s + 1, e0, e1, first, sa, sq)
                ctx.read((e1 - e0) * es)
                ctx.ops((e1 - e0) * ope[0])
            d = sa[s] / D
            mean[s] = first[s] + d
            rstd[s] = 1.0 / np.sqrt(max(sq[s] / D - d * d, 0.0) + eps)
            for e0, e1 in chunks:
                w[e0:e1] = _vec(ctx, "weight", D, 1.0, e0, e1)[e0:e1]
                b[e0:e1] = _vec(ctx, "bias", D, 0.0, e0, e1)[e0:e1]
                seg_affine_el(x, xseg, xel, xest, code, y, yseg, yel, yest, code, s, s + 1, e0, e1,
                              mean, rstd, w, b)
                ctx.read((e1 - e0) * es)
                ctx.write((e1 - e0) * es)
                ctx.ops((e1 - e0) * ope[1])
            ctx.write(8)
    mt.logical()[...] = mean.astype(np.float32).reshape(mt.shape)
    rt.logical()[...] = rstd.astype(np.float32).reshape(rt.shape)
    return [yt, mt, rt]


@sized_by(_elements)
def run_layer_norm_backward(ctx):
    from . import _OPS, segments
    from .. import dtypes as _dt

    p, chip = ctx.problem, ctx.chip
    M, D = segments(p)
    outs = ctx.outputs()
    if M * D == 0:
        for o in outs[1:]:
            o.logical()[...] = 0
        return outs
    sd = _ln_dims(p)
    g, gseg, gel, gest = _tables(ctx.inputs["grad_out"], sd)
    x, xseg, xel, xest = _tables(ctx.inputs["x"], sd)
    y, yseg, yel, yest = _tables(outs[0], sd)
    code = _code(p.dtype, chip)
    ope, ops_seg = _OPS[p.kernel]
    es = x.dtype.itemsize
    w = _vec(ctx, "weight", D, 1.0)
    mean = np.ascontiguousarray(ctx.inputs["mean"].logical()).reshape(-1).astype(np.float32)
    rstd = np.ascontiguousarray(ctx.inputs["rstd"].logical()).reshape(-1).astype(np.float32)
    nb = max(1, min(get_num_threads(), M))
    dw = np.zeros((nb, D), np.float32)
    db = np.zeros((nb, D), np.float32)
    for s0, s1 in _seg_tiles(ctx, M):
        ctx.read((s1 - s0) * 8)   # mean, rstd of the tile's rows
        ln_bwd_rows(g, gseg, gel, gest, x, xseg, xel, xest, code, y, yseg, yel, yest, code, s0, s1, D,
                    mean, rstd, w, dw, db)
        ctx.read((s1 - s0) * D * 2 * es)
        ctx.write((s1 - s0) * D * es)
        ctx.ops((s1 - s0) * (D * sum(ope) + ops_seg))
    k = 1
    for name, part in (("weight", dw), ("bias", db)):
        if p.has(name):
            t = outs[k]
            t.logical()[...] = _dt.encode(part.sum(axis=0).reshape(t.shape), t.dtype)
            ctx.write(t.numel * _dt.itemsize(t.dtype))
            k += 1
    return outs


from .group_impl import run_group_norm  # noqa: E402,F401  (group norm's body: norm/group_impl.py)
