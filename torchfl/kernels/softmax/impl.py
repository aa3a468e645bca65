"""Softmax execution: rows walked with ``dim`` innermost (in the tensor's own layout),
whole-row tiles (parallel over rows) or two-pass row_split chunks."""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from .. import dtypes as dt
from ..codecs import decode, encode16
from ..mathfn import exp32
from ..stream import Access
from ..threads import ELEMENT_WORK, threads_for
from . import COST, _dim, ins
from ..dtypes import ITEMSIZE

KIND = {"softmax": 0, "log_softmax": 1, "softmax_backward": 2, "log_softmax_backward": 3}
# fast math without nnan/ninf: a row holding NaN or +inf must come out NaN as in torch, and
# LLVM folds the NaN tests away under nnan
_FM = {"reassoc", "contract", "nsz", "arcp"}


@njit(cache=True, fastmath=_FM, inline="always")
def row_fwd(x, out, o, L, kind):
    """Softmax (kind 0) or log-softmax (1) of the row ``x[o:o + L]`` into ``out``."""
    mx = np.float32(-np.inf)
    for j in range(L):                   # vectorised max; a NaN reaches the row via exp32(NaN)
        mx = max(mx, x[o + j])
    if mx == -np.inf:
        mx = np.float32(0.0)
    s = np.float32(0.0)
    if kind == 0:
        for j in range(L):
            e = exp32(x[o + j] - mx)
            out[o + j] = e
            s += e
        inv = np.float32(1.0) / s
        for j in range(L):
            out[o + j] *= inv
    else:
        for j in range(L):
            s += exp32(x[o + j] - mx)
        lse = mx + np.float32(math.log(s))
        for j in range(L):
            out[o + j] = x[o + j] - lse


@njit(cache=True, parallel=True, fastmath=_FM)
def rows_fwd(x, out, m, L, kind):
    for r in prange(m):
        row_fwd(x, out, r * L, L, kind)


@njit(cache=True, fastmath=_FM)
def rows_fwd_serial(x, out, m, L, kind):
    for r in range(m):
        row_fwd(x, out, r * L, L, kind)


@njit(cache=True, parallel=True, fastmath=_FM)
def tiles_fwd(x, out, rows, L, T, kind, es, cost, cnt):
    """All streamed tiles of a contiguous fp32 softmax in one parallel call: the tiles are
    the parallel units (one wake-up of the worker threads, not one per tile); each tile
    counts its own load, store and ops in cnt[tile]."""
    nt = (rows + T - 1) // T
    for t in prange(nt):
        r0 = t * T
        m = min(T, rows - r0)
        o = r0 * L
        rows_fwd_serial(x[o:o + m * L], out[o:o + m * L], m, L, kind)
        cnt[t, 0] = m * L * es
        cnt[t, 1] = m * L * es
        cnt[t, 2] = m * L * cost


@njit(cache=True, parallel=True, fastmath=_FM)
def rows_bwd(g, y, out, m, L, kind):
    for r in prange(m):
        o = r * L
        s = np.float32(0.0)
        if kind == 2:
            for j in range(L):
                s += g[o + j] * y[o + j]
            for j in range(L):
                out[o + j] = y[o + j] * (g[o + j] - s)
        else:
            for j in range(L):
                s += g[o + j]
            for j in range(L):
                out[o + j] = g[o + j] - exp32(y[o + j]) * s


@njit(cache=True)
def dec(code, src, dst):
    for i in range(src.shape[0]):
        dst[i] = decode(code, src[i])


@njit(cache=True)
def enc(code, src, dst):
    for i in range(src.shape[0]):
        dst[i] = encode16(code, src[i])


def _order(t, d):
    perm = list(t.perm) if t.ndim else [0]
    return [a for a in perm if a != d] + [d]


def run_softmax(ctx):
    p, plan = ctx.problem, ctx.plan
    (out,) = ctx.outputs()
    if out.numel == 0:
        return [out]
    names = ins(p)
    d = _dim(p)
    shape = out.shape or (1,)
    L = shape[d]
    rows = out.numel // L
    code = dt.code(p.dtype, ctx.chip.bf16_emulation)
    es = ITEMSIZE[p.dtype]
    kind = KIND[p.kernel]
    cost = COST[p.kernel]
    if not out.shape:      # 0-d: treat as one row of one
        order = [0]
    else:
        order = _order(out, d)
    accs = [Access(ctx.inputs[n], order) if out.shape else None for n in names]
    oacc = Access(out, order) if out.shape else None
    if plan.config.strategy == "row_split":
        return _row_split(ctx, accs, oacc, out, rows, L, code, es, kind, cost)
    T = plan.config.tile("rows")
    ntiles = -(-rows // T)
    if kind <= 1 and code == 0 and accs[0].contiguous and oacc.contiguous and ntiles >= 2:
        cnt = np.zeros((ntiles, 3), np.int64)
        tiles_fwd(accs[0].flat, oacc.flat, rows, L, T, kind, es, cost, cnt)
        tot = cnt.sum(axis=0)
        ctx.read(int(tot[0]))
        ctx.write(int(tot[1]))
        ctx.ops(int(tot[2]))
        return [out]
    f32 = [np.empty(min(T, rows) * L, np.float32) for _ in names]
    res = np.empty(min(T, rows) * L, np.float32)
    for r0 in range(0, rows, T):
        r1 = min(rows, r0 + T)
        m = r1 - r0
        s, e = r0 * L, r1 * L
        tiles = []
        for i, a in enumerate(accs):
            raw = a.load(s, e)
            ctx.read((e - s) * es)
            if code == 0:
                tiles.append(raw)
            else:
                dec(code, raw, f32[i][:e - s])
                tiles.append(f32[i][:e - s])
        direct = code == 0 and oacc.contiguous
        r = oacc.flat[s:e] if direct else res[:e - s]
        with threads_for(m * L * ELEMENT_WORK):   # memory-bound: >= 256K elements go parallel
            if kind <= 1:
                rows_fwd(tiles[0], r, m, L, kind)
            else:
                rows_bwd(tiles[0], tiles[1], r, m, L, kind)
        if not direct:
            if code == 0:
                oacc.store(s, e, r)
            else:
                ob = np.empty(e - s, np.uint16)
                enc(code, r, ob)
                oacc.store(s, e, ob)
        ctx.write((e - s) * es)
        ctx.ops(m * L * cost)
    return [out]


def _row_split(ctx, accs, oacc, out, rows, L, code, es, kind, cost):
    """Two passes per row over chunks of C: statistics, then normalise and store. NaN and
    inf rows compute NaN/inf as torch does: numpy's warnings about them are not errors."""
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        return _row_split_passes(ctx, accs, oacc, out, rows, L, code, es, kind, cost)


def _row_split_passes(ctx, accs, oacc, out, rows, L, code, es, kind, cost):
    C = ctx.plan.config.tile("chunk")

    def chunk(a, s, e):
        raw = a.load(s, e)
        ctx.read((e - s) * es)
        if code == 0:
            return raw.astype(np.float32, copy=True)
        f = np.empty(e - s, np.float32)
        dec(code, raw, f)
        return f

    for r in range(rows):
        base = r * L
        # pass 1: running max and sum (online), or the backward's dot product
        mx, s1 = np.float32(-np.inf), np.float32(0.0)
        for c0 in range(0, L, C):
            c1 = min(L, c0 + C)
            tiles = [chunk(a, base + c0, base + c1) for a in accs]
            if kind <= 1:
                cm = max(mx, tiles[0].max())
                if cm != -np.inf:
                    s1 = s1 * np.float32(np.exp(mx - cm)) + np.exp(tiles[0] - cm).sum(dtype=np.float32)
                mx = cm
            elif kind == 2:
                s1 += (tiles[0] * tiles[1]).sum(dtype=np.float32)
            else:
                s1 += tiles[0].sum(dtype=np.float32)
        # pass 2
        for c0 in range(0, L, C):
            c1 = min(L, c0 + C)
            tiles = [chunk(a, base + c0, base + c1) for a in accs]
            if kind == 0:
                y = np.exp(tiles[0] - mx) / s1
            elif kind == 1:
                y = tiles[0] - (mx + np.log(s1))
            elif kind == 2:
                y = tiles[1] * (tiles[0] - s1)
            else:
                y = tiles[0] - np.exp(tiles[1]) * s1
            y = y.astype(np.float32)
            if code == 0:
                oacc.store(base + c0, base + c1, y)
            else:
                ob = np.empty(c1 - c0, np.uint16)
                enc(code, y, ob)
                oacc.store(base + c0, base + c1, ob)
            ctx.write((c1 - c0) * es)
            ctx.ops((c1 - c0) * cost)
    return [out]
