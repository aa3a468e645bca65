"""Index execution: per output tile, the address generator turns output coordinates into
element addresses of x (numpy, the chip's address arithmetic), and one Numba body gathers
those elements into the tile and stores it (row-major output); every tile is counted."""
from __future__ import annotations

import numpy as np
from numba import njit

from . import _dim, index_dims, index_names, out_shape
from .. import dtypes as _dt
from ..codecs import decode, enc16
from ..dtypes import FLOATS, ITEMSIZE


def _element_offsets(coords, strides, n: int):
    """Element offsets of ``n`` elements in a strided tensor, from their per-axis coordinates."""
    offs = np.zeros(n, np.int64)
    for c, st in zip(coords, strides):
        offs += c * st
    return offs


@njit(cache=True, nogil=True)
def gather_elems(src, offs, dst):
    """dst[i] = src[offs[i]]: the one body of the family (a gather of raw storage elements)."""
    for i in range(offs.shape[0]):
        dst[i] = src[offs[i]]


def _strides(t):
    """Element strides of x's logical axes over its flat physical storage."""
    lv = t.logical()
    return np.array([s // lv.itemsize for s in lv.strides], np.int64)


def _values(t, coords, shape):
    """Index tensor ``t`` (right-aligned, broadcast to ``shape``) read at ``coords``."""
    lv = t.logical()
    v = np.broadcast_to(lv.reshape((1,) * (len(shape) - lv.ndim) + lv.shape), shape)
    return v[tuple(coords)].astype(np.int64, copy=False)


def _wrap(kernel, name, vals, size, coords, negative_ok):
    """Negative indices (where torch allows them) from the end; out of range is an error."""
    if negative_ok:
        vals = np.where(vals < 0, vals + size, vals)
    bad = (vals < 0) | (vals >= size)
    if bad.any():
        from ..errors import KernelError

        j = int(np.nonzero(bad)[0][0])
        pos = tuple(int(c[j]) for c in coords)
        raise KernelError(f"kernel {kernel}: index {int(vals[j])} of {name} at output position {pos} is out of "
                          f"range for a dimension of size {size} (valid: {'-' + str(size) + '..' if negative_ok else '0..'}"
                          f"{size - 1}, as torch)")
    return vals


def _x_coords(ctx, p, coords, oshape):
    """The coordinates in x of the output elements at ``coords`` (one array per x dim)."""
    k, ins, xs = p.kernel, ctx.inputs, p.shapes["x"]
    if not xs and k in ("gather", "index_select"):   # a 0-d x: every index must address its element
        _wrap(k, "index", ins["index"].logical().reshape(-1).astype(np.int64), 1, [], False)
        return []
    if k == "gather":
        d = _dim(p)
        xc = list(coords)
        xc[d] = _wrap(k, "index", _values(ins["index"], coords, oshape), xs[d], coords, False)
        return xc
    if k == "index_select":
        d = _dim(p)
        xc = list(coords)
        ids = ins["index"].logical().reshape(-1).astype(np.int64, copy=False)
        xc[d] = _wrap(k, "index", ids[coords[d]], xs[d], coords, False)
        return xc
    if k == "as_strided":
        lin = np.full(coords[0].shape if coords else (1,), p.attrs["storage_offset"] or 0, np.int64)
        for c, s in zip(coords, p.attrs["stride"]):
            lin += c * s
        return list(np.unravel_index(lin, xs)) if xs else []
    dims = index_dims(p)
    first, last = dims[0], dims[-1]
    if dims == list(range(first, last + 1)):
        nb = len(oshape) - (len(xs) - (last - first + 1))
        bshape, bc = oshape[first:first + nb], coords[first:first + nb]
        rest = list(coords[:first]) + [None] * (last - first + 1) + list(coords[first + nb:])
    else:
        nb = len(oshape) - (len(xs) - len(dims))
        bshape, bc = oshape[:nb], coords[:nb]
        it = iter(coords[nb:])
        rest = [None if d in dims else next(it) for d in range(len(xs))]
    for d in dims:
        rest[d] = _wrap(k, f"i{d}", _values(ins[f"i{d}"], bc, bshape), xs[d], coords, True)
    return rest


def run_index(ctx):
    p, cfg = ctx.problem, ctx.plan.config
    (out,) = ctx.outputs()
    n = out.numel
    if n == 0:
        return [out]
    x = ctx.inputs["x"]
    es = ITEMSIZE[x.dtype]
    names = index_names(p)
    mask = cfg.tile("resident_mask", 0)
    per = es + sum(ITEMSIZE[p.dtype_of(nm)] for i, nm in enumerate(names) if not mask >> i & 1)
    for i, nm in enumerate(names):
        if mask >> i & 1:
            ctx.read(ctx.inputs[nm].nbytes)     # resident: loaded once
    oshape = out_shape(p)
    src = x.physical().reshape(-1)
    dst = out.physical().reshape(-1)
    xst = _strides(x)
    T = cfg.tile("elements")
    for s in range(0, n, T):
        e = min(n, s + T)
        coords = np.unravel_index(np.arange(s, e, dtype=np.int64), oshape) if oshape else ()
        xc = _x_coords(ctx, p, list(coords), oshape)
        offs = _element_offsets(xc, xst, e - s)
        gather_elems(src, offs, dst[s:e])
        ctx.read((e - s) * per)
        ctx.write((e - s) * es)
        ctx.ops((e - s) * len(names))
    return [out]


# ---------------------------------------------------------------- index_put (module put)

@njit(cache=True, nogil=True)
def scatter_elems(src, offs, dst):
    """dst[offs[i]] = src[i] in order: a repeated address keeps the last value (torch's CPU kernel)."""
    for i in range(offs.shape[0]):
        dst[offs[i]] = src[i]


@njit(cache=True, nogil=True)
def scatter_add_floats(src, offs, dst, code):
    """dst[offs[i]] += src[i] in order, each sum rounded to the storage dtype (code: codecs)."""
    for i in range(offs.shape[0]):
        o = offs[i]
        s = decode(code, dst[o]) + decode(code, src[i])
        if code == 0:
            dst[o] = s
        else:
            dst[o] = enc16(code, s)


@njit(cache=True, nogil=True)
def scatter_add_ints(src, offs, dst):
    for i in range(offs.shape[0]):
        dst[offs[i]] = dst[offs[i]] + src[i]


@njit(cache=True, nogil=True)
def scatter_or(src, offs, dst):
    """bool accumulate: torch adds booleans as a logical or."""
    for i in range(offs.shape[0]):
        dst[offs[i]] = dst[offs[i]] or src[i]


def run_index_put(ctx):
    from . import put

    p, cfg = ctx.problem, ctx.plan.config
    (out,) = ctx.outputs()
    x, values = ctx.inputs["x"], ctx.inputs["values"]
    es = ITEMSIZE[x.dtype]
    out.logical()[...] = x.logical()                 # phase 1: the copy, streamed tile by tile
    ctx.read(x.numel * es)
    ctx.write(x.numel * es)
    vshape = out_shape(p)
    nv = int(np.prod(vshape)) if vshape else 1
    if nv == 0:
        return [out]
    acc = bool(p.attrs["accumulate"])
    names = index_names(p)
    mask = cfg.tile("resident_mask", 0)
    per = es * acc + (0 if mask & put.VALUES_BIT else es)
    per += sum(ITEMSIZE[p.dtype_of(nm)] for i, nm in enumerate(names) if not mask >> i & 1)
    for i, nm in enumerate(names):
        if mask >> i & 1:
            ctx.read(ctx.inputs[nm].nbytes)          # resident: loaded once
    if mask & put.VALUES_BIT:
        ctx.read(values.nbytes)
    vl = values.logical()
    vb = np.broadcast_to(vl.reshape((1,) * (len(vshape) - vl.ndim) + vl.shape), vshape)
    dst = out.physical().reshape(-1)
    ost = _strides(out)
    floats = x.dtype in FLOATS
    code = _dt.code(x.dtype, ctx.chip.bf16_emulation) if floats else 0
    T = cfg.tile("elements")
    for s in range(0, nv, T):
        e = min(nv, s + T)
        coords = np.unravel_index(np.arange(s, e, dtype=np.int64), vshape) if vshape else ()
        xc = _x_coords(ctx, p, list(coords), vshape)
        offs = _element_offsets(xc, ost, e - s)
        src = np.ascontiguousarray(vb[tuple(coords)] if vshape else vb.reshape(1))
        if not acc:
            scatter_elems(src, offs, dst)
        elif floats:
            scatter_add_floats(src, offs, dst, code)
        elif x.dtype == "bool":
            scatter_or(src, offs, dst)
        else:
            scatter_add_ints(src, offs, dst)
        ctx.read((e - s) * per)
        ctx.write((e - s) * es)
        ctx.ops((e - s) * (len(names) + acc))
    return [out]
