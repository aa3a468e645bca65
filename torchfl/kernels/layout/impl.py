"""Layout execution: gather each output tile from the input walk, store contiguously."""
from __future__ import annotations

import numpy as np

from ..stream import Access, out_order
from ..tensor import DeviceTensor
from . import MAXCAT, split
from ..dtypes import ITEMSIZE


def _copy_tiles(ctx, src_accs, out, T):
    """src_accs: list of (Access, count_bytes_per_elem). All walks are in out's physical order.
    A large single-source copy gathers in one parallel region of equal parts (``split.py``)."""
    n = out.numel
    oflat = out.physical().reshape(-1)
    es = ITEMSIZE[out.dtype]
    if len(src_accs) == 1 and n * es >= split.PAR_BYTES and split.gather_parts(src_accs[0][0], oflat, n):
        ctx.read(n * src_accs[0][1])        # the plan's tiles' sums, as the loop below counts them
        ctx.write(n * es)
        return
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
        # each input's region of the output, written by one strided copy (every output element
        # comes from exactly one input): the chip reads each input once and writes the output once,
        # tile by tile. (Per tile, numpy index arithmetic over every element cost ~1 ms per 256K
        # elements: a decode step's KV-cache concats were ~40 % of its kernel time.)
        ov = out.logical()
        o0 = 0
        for t in xs:
            o1 = o0 + t.shape[d]
            ov[(slice(None),) * d + (slice(o0, o1),)] = t.logical()
            o0 = o1
        for s0 in range(0, out.numel, T):
            ctx.read((min(out.numel, s0 + T) - s0) * es)
            ctx.write((min(out.numel, s0 + T) - s0) * es)
        return [out]
    raise AssertionError(k)
