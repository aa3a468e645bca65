"""Count family: ``histc`` and ``offsets`` (pure Python part).

A mixture-of-experts router counts the tokens each expert receives (transformers' MoE
integration: ``torch.histc(expert_ids, bins=E, min=0, max=E - 1)``, then a ``cumsum`` of the
counts gives each expert's offset). Results follow torch's CPU kernel: an element ``v`` with
``lo <= v <= hi`` falls in bin ``int((v - lo) * bins / (hi - lo))`` (the last edge belongs to
the last bin); NaN and values outside are not counted; ``min == max`` (torch documents ``0, 0``; any
equal pair does it) takes the data's range (one more pass over the input), and a range still
empty is widened by 1 on each side. Counts
are exact (int64 on chip) and stored in the input's dtype, as torch returns them. Values are
compared in float32 (exact for float16 and bfloat16 inputs, and integers below 2^24: CUDA's
histc counts int32 expert ids, which transformers passes on any device but CPU).

``offsets`` is ``cumsum(counts, dtype=int32|int64)`` of float counts (the experts' offsets
from histc's float result): torch casts the input to ``dtype`` first (truncation toward zero),
then sums exactly; the scan family sums floats into floats only. Its lines are tiled by the
scan family's ``scan_tiling`` (the same lines, the same bytes).

Tiling (``count_tiling``): the ``bins`` int64 counters stay on chip the whole call; the
elements stream through in double-buffered tiles, once, or twice when the range comes from
the data (an input that fits on chip with the counters is read once either way); the counts are stored once at the end. Operations: one bin index
per element and pass.
"""
from __future__ import annotations

from ..dtypes import FLOATS, ITEMSIZE
from ..errors import KernelError
from ..spec import KernelSpec, TensorMeta
from ..spec import numel as _n
from ..tiling import TileConfig, Traffic, make_plan

COUNTER = 8        # int64 counters on chip


def passes(p) -> int:
    """Passes over the input: 2 when the range is the data's (``min == max``, as torch)."""
    return 2 if p.attrs["lo"] == p.attrs["hi"] else 1


def _check(p):
    if p.attrs["bins"] < 1:
        raise KernelError(f"histc: bins must be positive, got {p.attrs['bins']}")
    if p.attrs["lo"] > p.attrs["hi"]:
        raise KernelError(f"histc: max {p.attrs['hi']} must be larger than or equal to min {p.attrs['lo']}")


def _meta(p):
    return [TensorMeta((p.attrs["bins"],), p.dtype, None)]


def count_tiling(p, chip):
    """THE tiling function of the count family (see the module docstring)."""
    n = _n(p.shapes["x"])
    ei = ITEMSIZE[p.dtype]
    bins = p.attrs["bins"]
    counters = bins * COUNTER
    k = passes(p)
    store = Traffic(0, bins * ei, 0)                       # the counts, stored once at the end
    if counters + min(n, 1) * ei > chip.cache_bytes:
        raise KernelError(f"histc: {bins} int64 counters ({counters} B) and a tile of the input do not fit the "
                          f"{chip.cache_bytes} B cache of {chip.name}; use fewer bins")
    if n * ei + counters <= chip.cache_bytes:
        cfg = TileConfig("resident", (("elements", n),), False,
                         "the input and the counters fit on chip: the input is read once")
        return make_plan(p.kernel, p.key, cfg, [(1, Traffic(n * ei, bins * ei, n * k))], n * ei + counters)
    t = (chip.cache_bytes - counters) // (2 * ei)
    if t < 1:
        raise KernelError(f"histc: {bins} counters leave no room for a double-buffered tile on {chip.name}")
    full, rest = divmod(n, t)
    groups = [(full * k, Traffic(t * ei, 0, t)), (k if rest else 0, Traffic(rest * ei, 0, rest)), (1, store)]
    cfg = TileConfig("streamed", (("elements", t),), True,
                     f"double-buffered tiles of {t} elements, {k} pass(es); the counters stay on chip")
    return make_plan(p.kernel, p.key, cfg, groups, 2 * t * ei + counters)


def _offsets_check(p):
    from ..scan import geometry

    geometry(p)
    if p.attrs["to"] not in ("int32", "int64"):
        raise KernelError(f"offsets: sums into int32 or int64, not {p.attrs['to']}")


def _offsets_meta(p):
    return [TensorMeta(tuple(p.shapes["x"]), p.attrs["to"], None)]


def offsets_tiling(p, chip):
    """The scan family's tiling: whole lines streamed, long lines cut into carried chunks."""
    from ..scan import scan_tiling

    return scan_tiling(p, chip)


KERNELS = [
    KernelSpec("histc", "count", ("x",), {"bins": 100, "lo": 0.0, "hi": 0.0}, FLOATS + ("int32", "int64"),
               doc="histogram of bins equal-width bins over [lo, hi] (lo == hi: the data's range), counts in "
                   "the input's dtype; NaN and values outside not counted",
               check=_check, meta=_meta, tiler=count_tiling, impl="run_histc"),
    KernelSpec("offsets", "count", ("x",), {"dim": 0, "to": "int32"}, FLOATS,
               doc="running sum along dim of float counts cast to `to` (int32/int64) first, as torch's "
                   "cumsum(dtype=...): truncated toward zero, then exact",
               check=_offsets_check, meta=_offsets_meta, tiler=offsets_tiling, impl="run_offsets"),
]
