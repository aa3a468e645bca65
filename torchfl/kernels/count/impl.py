"""Count execution: the input streamed tile by tile into int64 bin counters kept on chip."""
from __future__ import annotations

import numpy as np
from numba import njit

from .. import dtypes as _dt
from ..codecs import decode, enc16
from ..dtypes import FLOATS, ITEMSIZE
from . import passes


@njit(cache=True, nogil=True)
def data_range(src, s0, s1, code, lo_hi):
    """Fold the min and max of src[s0:s1] into lo_hi (NaN ignored, as comparisons skip it)."""
    for t in range(s0, s1):
        v = decode(code, src[t])
        if v < lo_hi[0]:
            lo_hi[0] = v
        if v > lo_hi[1]:
            lo_hi[1] = v


@njit(cache=True, nogil=True)
def count_bins(src, s0, s1, code, lo, hi, counts):
    """Count src[s0:s1] into counts: torch's bin of v, (v - lo) * bins / (hi - lo) in float32."""
    bins = counts.shape[0]
    width = hi - lo
    for t in range(s0, s1):
        v = decode(code, src[t])
        if not (v >= lo and v <= hi):
            continue
        pos = np.int64((v - lo) * np.float32(bins) / width)
        if pos >= bins:
            pos = bins - 1
        counts[pos] += 1


@njit(cache=True, nogil=True)
def int_range(src, s0, s1, lo_hi):
    for t in range(s0, s1):
        v = np.float32(src[t])
        if v < lo_hi[0]:
            lo_hi[0] = v
        if v > lo_hi[1]:
            lo_hi[1] = v


@njit(cache=True, nogil=True)
def count_ints(src, s0, s1, lo, hi, counts):
    """Integers (CUDA's histc counts them; transformers' MoE passes expert ids as int32):
    compared in float32, as the float path."""
    bins = counts.shape[0]
    width = hi - lo
    for t in range(s0, s1):
        v = np.float32(src[t])
        if not (v >= lo and v <= hi):
            continue
        pos = np.int64((v - lo) * np.float32(bins) / width)
        if pos >= bins:
            pos = bins - 1
        counts[pos] += 1


@njit(cache=True, nogil=True)
def store_counts(counts, dst, ocode):
    for b in range(counts.shape[0]):
        if ocode == 0:
            dst[b] = np.float32(counts[b])
        else:
            dst[b] = enc16(ocode, np.float32(counts[b]))


def _tiles(cfg, n):
    T = cfg.tile("elements") or n
    return [(s, min(n, s + T)) for s in range(0, n, max(T, 1))]


def run_histc(ctx):
    p = ctx.problem
    (out,) = ctx.outputs()
    x = ctx.inputs["x"]
    src = np.ascontiguousarray(x.logical()).reshape(-1)
    n = src.shape[0]
    floats = p.dtype in FLOATS
    code = _dt.code(p.dtype, ctx.chip.bf16_emulation) if floats else np.int64(0)
    ei = ITEMSIZE[p.dtype]
    tiles = _tiles(ctx.plan.config, n)
    resident = ctx.plan.config.strategy == "resident"
    lo, hi = np.float32(p.attrs["lo"]), np.float32(p.attrs["hi"])
    if passes(p) == 2:
        lo_hi = np.array([np.inf, -np.inf], np.float32)
        for s0, s1 in tiles:
            if floats:
                data_range(src, np.int64(s0), np.int64(s1), code, lo_hi)
            else:
                int_range(src, np.int64(s0), np.int64(s1), lo_hi)
            ctx.read(0 if resident else (s1 - s0) * ei)     # resident: read once, counted below
            ctx.ops(s1 - s0)
        lo, hi = (lo_hi[0], lo_hi[1]) if n else (np.float32(0), np.float32(0))
        if not (np.isfinite(lo) and np.isfinite(hi)):
            raise ValueError(f"histc: range of [{lo}, {hi}] is not finite")
    if lo == hi:
        lo, hi = np.float32(lo - 1), np.float32(hi + 1)
    counts = np.zeros(p.attrs["bins"], np.int64)
    for s0, s1 in tiles:
        if floats:
            count_bins(src, np.int64(s0), np.int64(s1), code, lo, hi, counts)
        else:
            count_ints(src, np.int64(s0), np.int64(s1), lo, hi, counts)
        ctx.read((s1 - s0) * ei)
        ctx.ops(s1 - s0)
    if floats:
        store_counts(counts, out.physical().reshape(-1), _dt.code(out.dtype, ctx.chip.bf16_emulation))
    else:
        out.physical().reshape(-1)[:] = counts.astype(out.physical().dtype)
    ctx.write(p.attrs["bins"] * ei)
    return [out]


@njit(cache=True, nogil=True)
def offsets_lines(src, dst, l0, l1, inner, code):
    """Lines [l0, l1) of src (outer, L, inner): each value truncated to int64, summed exactly."""
    L = src.shape[1]
    for line in range(l0, l1):
        o = line // inner
        i = line - o * inner
        acc = np.int64(0)
        for t in range(L):
            acc += np.int64(decode(code, src[o, t, i]))
            dst[o, t, i] = acc


def run_offsets(ctx):
    from ..scan import geometry

    p, cfg = ctx.problem, ctx.plan.config
    (out,) = ctx.outputs()
    outer, L, inner = geometry(p)
    if out.numel == 0:
        return [out]
    src = np.ascontiguousarray(ctx.inputs["x"].logical()).reshape(outer, L, inner)
    dst = out.physical().reshape(outer, L, inner)
    ei, eo = ITEMSIZE[p.dtype], ITEMSIZE[out.dtype]
    lines = outer * inner
    T = cfg.tile("lines") if cfg.strategy != "line_split" else 1
    code = _dt.code(p.dtype, ctx.chip.bf16_emulation)
    for l0 in range(0, lines, T):
        l1 = min(lines, l0 + T)
        offsets_lines(src, dst, np.int64(l0), np.int64(l1), np.int64(inner), code)
        m = (l1 - l0) * L
        ctx.read(m * ei)
        ctx.write(m * eo)
        ctx.ops(m)
    return [out]
