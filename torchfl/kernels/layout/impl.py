"""Layout execution: gather each output tile from the input walk, store contiguously."""
from __future__ import annotations

import numpy as np

from ..stream import Access, out_order
from ..tensor import DeviceTensor
from . import MAXCAT
from ..dtypes import ITEMSIZE


def _copy_tiles(ctx, src_accs, out, T):
    """src_accs: list of (Access, count_bytes_per_elem). All walks are in out's physical order."""
    n = out.numel
    oflat = out.physical().reshape(-1)
    es = ITEMSIZE[out.dtype]
    for s in range(0, n, T):
        e = min(n, s + T)
        dst = oflat[s:e]
        for acc, per in src_accs:
            tile = acc.load(s, e, dst)      # a strided walk gathers straight into the output
            if tile.ctypes.data != dst.ctypes.data:
                dst[:] = tile
            ctx.read((e - s) * per)
        ctx.write((e - s) * es)


def _slice_into(ctx, x, out, d, start, step, T):
    """out = x[start::step] along logical dim d (out's shape bounds the walk): a strided
    DMA gather of the region, tile by tile in out's physical order."""
    order = out_order(out.shape, out.layout)
    acc = Access(x, order, None)
    lv = x.logical()
    st = [s // lv.itemsize for s in lv.strides]
    acc.shape = np.array([out.shape[o] for o in order] or [1], np.int64)
    acc.strides = np.array([st[o] * (step if o == d else 1) for o in order] or [1], np.int64)
    base = start * st[d]
    acc.flat = acc.flat[base:] if base < acc.flat.shape[0] else acc.flat[:0]
    acc.contiguous = False
    _copy_tiles(ctx, [(acc, ITEMSIZE[out.dtype])], out, T)


def run_layout(ctx):
    p, plan = ctx.problem, ctx.plan
    k, a = p.kernel, p.attrs
    T = plan.config.tile("elements") if plan.config.strategy != "metadata" else 0
    if k == "split":
        x = ctx.inputs["x"]
        d = a["dim"] % x.ndim
        outs, start = [], 0
        for meta in ctx.output_metas():
            out = ctx.output(meta)
            if out.numel:
                _slice_into(ctx, x, out, d, start, 1, T)
            start += meta.shape[d]
            outs.append(out)
        return outs
    (meta,) = ctx.output_metas()
    if plan.config.strategy == "metadata":
        x = ctx.inputs["x"]
        return [DeviceTensor(x.buffer, meta.shape, None, x.dtype, x.offset)]
    out = ctx.output(meta)
    if out.numel == 0:
        return [out]
    order = out_order(out.shape, out.layout)
    es = ITEMSIZE[p.dtype]
    if k in ("layout_transform", "copy", "expand"):
        x = ctx.inputs["x"]
        acc = Access.kept(ctx.cache, "layout_walk", x, order, out.shape)
        per = es
        if k == "expand" and plan.traffic.bytes_read == x.nbytes and x.numel < out.numel:
            ctx.read(x.nbytes)   # resident: loaded once, expanded on chip
            per = 0
        _copy_tiles(ctx, [(acc, per)], out, T)
        return [out]
    if k == "reshape":
        # non-row-major input: walk it in logical (row-major) order, which is out's order
        x = ctx.inputs["x"]
        acc = Access.kept(ctx.cache, "layout_walk", x, list(range(x.ndim)))
        _copy_tiles(ctx, [(acc, es)], out, T)
        return [out]
    if k == "slice":
        x = ctx.inputs["x"]
        d = a["dim"] % x.ndim
        start, _end, step = slice(a["start"], a["end"], a["step"]).indices(x.shape[d])
        _slice_into(ctx, x, out, d, start, step, T)
        return [out]
    if k == "concat":
        xs = [ctx.inputs[f"x{i}"] for i in range(MAXCAT) if f"x{i}" in ctx.inputs]
        if any(tuple(t.shape) != (0,) for t in xs):
            xs = [t for t in xs if tuple(t.shape) != (0,)]   # torch skips 1-D empty inputs
        d = a["dim"] % max(out.ndim, 1)
        n = out.numel
        oflat = out.physical().reshape(-1)
        # walk the output: each element comes from exactly one input; gather per input region
        offs = np.cumsum([0] + [t.shape[d] for t in xs])
        for s in range(0, n, T):
            e = min(n, s + T)
            idx = np.unravel_index(np.arange(s, e), out.physical_shape)
            logical_d = idx[order.index(d)]
            tile = np.empty(e - s, oflat.dtype)
            for i, t in enumerate(xs):
                sel = (logical_d >= offs[i]) & (logical_d < offs[i + 1])
                if not sel.any():
                    continue
                li = [None] * out.ndim
                for pi, ax in enumerate(order):
                    li[ax] = idx[pi][sel]
                li[d] = li[d] - offs[i]
                tile[sel] = t.logical()[tuple(li)]     # strided DMA gather of the region
                ctx.read(int(sel.sum()) * es)
            oflat[s:e] = tile
            ctx.write((e - s) * es)
        return [out]
    raise AssertionError(k)
