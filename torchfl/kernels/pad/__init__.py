"""Pad family: ``constant_pad`` (``aten.constant_pad_nd``), pure Python part.

``pad`` lists (before, after) pairs from the last dim backwards, as torch writes them;
negative amounts crop. The output keeps x's layout (MobileNetV2's TF-style padding runs
between NHCW convolutions without a layout change) and is written in physical order: a
row of the output is either wholly padding (filled, nothing read) or reads the in-range
part of one row of x.

Tiling (``pad_tiling``): rows of the output's physical last dim stream in double-buffered
tiles of whole rows (every row of x fits: ``resident`` when all of it fits at once). The
plan's groups are per row (rows that read x, rows of padding): the roofline has no
compute term here, so the time is the same as per tile.
"""
from __future__ import annotations

from ..dtypes import DTYPES, ITEMSIZE
from ..errors import KernelError
from ..spec import KernelSpec, TensorMeta
from ..spec import numel as _n
from ..tiling import TileConfig, Traffic, make_plan

ALL = tuple(DTYPES)


def amounts(p):
    """(before, after) per logical dim."""
    xs, pad = tuple(p.shapes["x"]), [int(v) for v in p.attrs["pad"]]
    r = len(xs)
    if len(pad) % 2 or len(pad) // 2 > r:
        raise KernelError(f"constant_pad: pad {pad} must hold (before, after) pairs for at most the {r} dims of x")
    before, after = [0] * r, [0] * r
    for k in range(len(pad) // 2):
        before[r - 1 - k], after[r - 1 - k] = pad[2 * k], pad[2 * k + 1]
    return before, after


def out_shape(p):
    before, after = amounts(p)
    out = tuple(s + b + a for s, b, a in zip(p.shapes["x"], before, after))
    if any(s < 0 for s in out):
        raise KernelError(f"constant_pad: pad {list(p.attrs['pad'])} crops x {list(p.shapes['x'])} below zero size")
    return out


def physical(p):
    """Physical (out shape, x shape, before) in x's layout order."""
    from ..tensor import layout_perm

    xs = tuple(p.shapes["x"])
    perm = layout_perm(p.layouts.get("x"), len(xs))
    before, _ = amounts(p)
    out = out_shape(p)
    return [out[a] for a in perm], [xs[a] for a in perm], [before[a] for a in perm]


def _valid(o, x, b):
    """How many of o output positions read x (x size x, pad before b)."""
    return max(0, min(o, x + b) - max(0, b))


def _meta(p):
    return [TensorMeta(out_shape(p), p.dtype, p.layouts.get("x"))]


def pad_tiling(p, chip):
    """THE tiling function of the pad family (see the module docstring)."""
    po, px, pb = physical(p)
    es = ITEMSIZE[p.dtype]
    if _n(po) == 0:
        return make_plan(p.kernel, p.key, TileConfig("resident", (("rows", 0),), False, "empty output"), (), 0)
    if not po:
        po, px, pb = [1], [1], [0]
    W = po[-1]
    rows = _n(po[:-1])
    vrows = _n(_valid(o, x, b) for o, x, b in zip(po[:-1], px[:-1], pb[:-1]))
    vc = _valid(W, px[-1], pb[-1])
    groups = [(vrows, Traffic(vc * es, W * es, 0)), (rows - vrows, Traffic(0, W * es, 0))]
    total = rows * W * es + vrows * vc * es
    per_row = 2 * (W + vc) * es
    if total <= chip.cache_bytes:
        cfg = TileConfig("resident", (("rows", rows),), False, "x and the padded output fit the cache at once")
        return make_plan(p.kernel, p.key, cfg, groups, total)
    if per_row > chip.cache_bytes:
        raise KernelError(f"{p.kernel}: one output row of {W} elements does not fit the {chip.cache_bytes} B "
                          f"cache of {chip.name} double-buffered")
    t = min(rows, chip.cache_bytes // per_row)
    cfg = TileConfig("streamed", (("rows", t),), True, f"double-buffered tiles of {t} output rows of {W}")
    return make_plan(p.kernel, p.key, cfg, groups, t * per_row)


KERNELS = [
    KernelSpec("constant_pad", "pad", ("x",), {"pad": (), "value": 0.0}, ALL, "any",
               doc="x padded with value (before/after pairs from the last dim, negative crops); "
                   "the output keeps x's layout",
               check=lambda p: physical(p), meta=_meta, tiler=pad_tiling, impl="run_pad"),
]
