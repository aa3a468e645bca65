"""Order execution: each line of the ``outer x L x inner`` view, tile by tile; a stable
bottom-up merge sort of int64 indices (``sort``, ``topk``) or one pass keeping the best
(``argmax``, ``argmin``)."""
from __future__ import annotations

import numpy as np
from numba import njit

from .. import dtypes as _dt
from ..codecs import decode
from ..dtypes import FLOATS, ITEMSIZE
from . import IDX, comparisons, geometry, kept


@njit(cache=True, nogil=True, inline="always")
def _before(a, b, desc):
    """Whether key ``a`` sorts strictly before ``b``: NaN is the largest value."""
    if desc:
        if a != a:
            return b == b
        if b != b:
            return False
        return a > b
    if a != a:
        return False
    if b != b:
        return True
    return a < b


@njit(cache=True, nogil=True, inline="always")
def _merge_sort(keys, idx, tmp, L, desc):
    """Stable sort of ``idx[:L]`` by ``keys``; returns the array holding the result."""
    for t in range(L):
        idx[t] = t
    width = np.int64(1)
    src, dst = idx, tmp
    while width < L:
        lo = np.int64(0)
        while lo < L:
            mid = min(lo + width, L)
            hi = min(lo + 2 * width, L)
            i, j, t = lo, mid, lo
            while i < mid and j < hi:
                if _before(keys[src[j]], keys[src[i]], desc):     # equal keys: the left one first
                    dst[t] = src[j]
                    j += 1
                else:
                    dst[t] = src[i]
                    i += 1
                t += 1
            while i < mid:
                dst[t] = src[i]
                i += 1
                t += 1
            while j < hi:
                dst[t] = src[j]
                j += 1
                t += 1
            lo += 2 * width
        src, dst = dst, src
        width *= 2
    return src


@njit(cache=True, nogil=True)
def sort_float(src, vals, inds, l0, l1, inner, code, desc, k):
    """Lines [l0, l1) of src (outer, L, inner): the first k of the stable sort."""
    L = src.shape[1]
    keys = np.empty(L, np.float32)
    idx = np.empty(L, np.int64)
    tmp = np.empty(L, np.int64)
    for line in range(l0, l1):
        o = line // inner
        i = line - o * inner
        for t in range(L):
            keys[t] = decode(code, src[o, t, i])
        order = _merge_sort(keys, idx, tmp, L, desc)
        for t in range(k):
            vals[o, t, i] = src[o, order[t], i]
            inds[o, t, i] = order[t]


@njit(cache=True, nogil=True)
def sort_int(src, vals, inds, l0, l1, inner, desc, k):
    """Lines [l0, l1) of an integer src: the first k of the stable sort, exact in int64."""
    L = src.shape[1]
    keys = np.empty(L, np.int64)
    idx = np.empty(L, np.int64)
    tmp = np.empty(L, np.int64)
    for line in range(l0, l1):
        o = line // inner
        i = line - o * inner
        for t in range(L):
            keys[t] = np.int64(src[o, t, i])
        order = _merge_sort(keys, idx, tmp, L, desc)
        for t in range(k):
            vals[o, t, i] = src[o, order[t], i]
            inds[o, t, i] = order[t]


@njit(cache=True, nogil=True, inline="always")
def _better(v, best, smallest):
    if v != v:
        return best == best          # the first NaN wins, nothing beats it
    if smallest:
        return v < best
    return v > best


@njit(cache=True, nogil=True)
def arg_float(src, dst, l0, l1, inner, code, smallest):
    L = src.shape[1]
    for line in range(l0, l1):
        o = line // inner
        i = line - o * inner
        best = decode(code, src[o, 0, i])
        bi = np.int64(0)
        for t in range(1, L):
            v = decode(code, src[o, t, i])
            if _better(v, best, smallest):
                best = v
                bi = t
        dst[o, i] = bi


@njit(cache=True, nogil=True)
def arg_int(src, dst, l0, l1, inner, smallest):
    L = src.shape[1]
    for line in range(l0, l1):
        o = line // inner
        i = line - o * inner
        best = np.int64(src[o, 0, i])
        bi = np.int64(0)
        for t in range(1, L):
            v = np.int64(src[o, t, i])
            if _better(v, best, smallest):
                best = v
                bi = t
        dst[o, i] = bi


def _tiles(cfg, lines):
    T = cfg.tile("lines") if cfg.strategy != "line_split" else 1
    return [(l0, min(lines, l0 + T)) for l0 in range(0, lines, max(T, 1))]


def _source(ctx, outer, L, inner):
    return np.ascontiguousarray(ctx.inputs["x"].logical()).reshape(outer, L, inner)  # a view when row-major


def run_arg(ctx):
    p = ctx.problem
    (out,) = ctx.outputs()
    outer, L, inner = geometry(p)
    if out.numel == 0:
        return [out]
    src = _source(ctx, outer, L, inner)
    dst = out.physical().reshape(outer, inner)
    smallest = np.int64(p.kernel == "argmin")
    ei = ITEMSIZE[p.dtype]
    for l0, l1 in _tiles(ctx.plan.config, outer * inner):
        if p.dtype in FLOATS:
            arg_float(src, dst, np.int64(l0), np.int64(l1), np.int64(inner),
                      _dt.code(p.dtype, ctx.chip.bf16_emulation), smallest)
        else:
            arg_int(src, dst, np.int64(l0), np.int64(l1), np.int64(inner), smallest)
        m = l1 - l0
        ctx.read(m * L * ei)
        ctx.write(m * IDX)
        ctx.ops(m * comparisons(p, L))
    return [out]


def run_sort(ctx):
    p = ctx.problem
    vals, inds = ctx.outputs()
    outer, L, inner = geometry(p)
    k = kept(p)
    if vals.numel == 0:
        return [vals, inds]
    src = _source(ctx, outer, L, inner)
    v = vals.physical().reshape(outer, k, inner)
    ix = inds.physical().reshape(outer, k, inner)
    desc = np.int64(p.attrs["largest"] if p.kernel == "topk" else p.attrs["descending"])
    ei = ITEMSIZE[p.dtype]
    for l0, l1 in _tiles(ctx.plan.config, outer * inner):
        if p.dtype in FLOATS:
            sort_float(src, v, ix, np.int64(l0), np.int64(l1), np.int64(inner),
                       _dt.code(p.dtype, ctx.chip.bf16_emulation), desc, np.int64(k))
        else:
            sort_int(src, v, ix, np.int64(l0), np.int64(l1), np.int64(inner), desc, np.int64(k))
        m = l1 - l0
        ctx.read(m * L * ei)
        ctx.write(m * k * (ei + IDX))
        ctx.ops(m * comparisons(p, L))
    return [vals, inds]
