"""index_put: the scatter ``out = x.clone(); out[i0, i1, ...] = values`` (``+=`` when
``accumulate``), pure Python part.

A mixture-of-experts layer restores its tokens' order after the experts with a scatter
(transformers' ``inv_perm[perm] = arange(S)``: ``aten.index_put`` compiled,
``aten._index_put_impl`` on the eager device). The addressed elements are exactly those
``x[i0, i1, ...]`` reads (the index family's broadcasting, negative indices, out-of-range
errors); ``values`` broadcasts to their shape and must have x's dtype, as torch requires.
Without ``accumulate`` a repeated address keeps the last value in row-major order (torch's
CPU kernel, serial); with it every value is added in that order, each sum rounded to x's
dtype (torch's CPU accumulation of float16 / bfloat16 rounds each add too).

Tiling (``put_tiling``): two streamed phases in one kernel. 1. the copy of x into the
output, in double-buffered tiles of whole elements (read + write of x once). 2. the scatter:
the addressed elements stream in tiles; per element, its indices and its value are read
(an index or ``values`` tensor smaller than the addressed shape -- broadcast -- stays resident
when all of them fit half the cache, read once), the old element is read when accumulating,
and the element is written. The bytes do not depend on the indices' values.
"""
from __future__ import annotations

from ..dtypes import DTYPES, ITEMSIZE
from ..errors import KernelError
from ..spec import KernelSpec, TensorMeta
from ..spec import numel as _n
from ..tiling import TileConfig, stream_plan, make_plan

VALUES_BIT = 1 << 6          # resident_mask bit of ``values`` (bits 0..5: the index inputs)


def _check(p):
    from ..elementwise import broadcast_shape
    from . import _check as index_check, out_shape

    index_check(p)
    if p.dtype_of("values") != p.dtype_of("x"):
        raise KernelError(f"index_put: values ({p.dtype_of('values')}) must have the dtype of x "
                          f"({p.dtype_of('x')}), as torch requires; cast values first")
    addressed = tuple(out_shape(p))
    try:
        ok = tuple(broadcast_shape([p.shapes["values"], addressed], "index_put")) == addressed
    except KernelError:
        ok = False
    if not ok:
        raise KernelError(f"index_put: values of shape {list(p.shapes['values'])} cannot be broadcast to the "
                          f"indexed shape {list(addressed)}")


def _meta(p):
    return [TensorMeta(tuple(p.shapes["x"]), p.dtype_of("x"), None)]


def put_tiling(p, chip):
    """THE tiling function of index_put (see the module docstring)."""
    from . import index_names, out_shape

    es = ITEMSIZE[p.dtype_of("x")]
    nx, nv = _n(p.shapes["x"]), _n(out_shape(p))
    acc = bool(p.attrs["accumulate"])
    names = index_names(p)
    small = [(i, nm) for i, nm in enumerate(names) if _n(p.shapes[nm]) < nv]
    small_bytes = sum(_n(p.shapes[nm]) * ITEMSIZE[p.dtype_of(nm)] for _, nm in small)
    vsmall = _n(p.shapes["values"]) < nv
    vbytes = _n(p.shapes["values"]) * es
    keep = (bool(small) or vsmall) and small_bytes + (vbytes if vsmall else 0) <= chip.cache_bytes // 2
    mask, resident, per_in = 0, 0, es * acc
    for i, nm in enumerate(names):
        if keep and (i, nm) in small:
            mask |= 1 << i
            resident += _n(p.shapes[nm]) * ITEMSIZE[p.dtype_of(nm)]
        else:
            per_in += ITEMSIZE[p.dtype_of(nm)]
    if keep and vsmall:
        mask |= VALUES_BIT
        resident += vbytes
    else:
        per_in += es
    copy = stream_plan(p.kernel, p.key, nx, es, es, 0, chip, unit_name="copy")
    scat = stream_plan(p.kernel, p.key, nv, per_in, es, len(names) + acc, chip, resident_bytes=resident,
                       unit_name="elements")
    if copy is None or scat is None:
        raise KernelError(f"index_put: not even one element fits the {chip.cache_bytes} B cache of {chip.name}")
    streamed = "streamed" in (copy.config.strategy, scat.config.strategy)
    tiles = copy.config.tiles + scat.config.tiles + (("resident_mask", mask),)
    cfg = TileConfig("streamed" if streamed else "resident", tiles, streamed,
                     f"x copied in tiles of {copy.config.tile('copy')} elements, then {nv} addressed element(s) "
                     f"{'accumulated' if acc else 'written'} in tiles of {scat.config.tile('elements')}"
                     f" ({len(names)} index input(s){', values resident' if mask & VALUES_BIT else ''})")
    return make_plan(p.kernel, p.key, cfg, copy.groups + scat.groups,
                     max(copy.on_chip_bytes, scat.on_chip_bytes))


def _spec():
    from . import ALL, IDX

    return KernelSpec(name="index_put", family="index", inputs=("x", "values") + IDX, attrs={"accumulate": False},
                      dtypes=ALL, layouts="any", check=_check, meta=_meta, tiler=put_tiling,
                      impl="run_index_put", mixed_dtypes=True, dtype_input="x",
                      doc="x[i0, i1, ...] = values (accumulate: +=, in row-major order, each sum rounded to "
                          "x's dtype) on a copy of x; values broadcast to the indexed shape")


PUT_SPEC = _spec()
