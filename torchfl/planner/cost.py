"""Prices, all from the kernels' own tiling functions and the HCD's numbers.

A kernel option costs ``simulated_time(TilePlan, chip, dtype)``: per tile the larger of
compute (ops / the unit's peak for the dtype) and memory (off-chip bytes / off-chip
bandwidth); on a format-1.1 chip, plus its launch cost, at its sustained rates and waves. A layout conversion is priced with the ``layout_transform`` kernel's tiling,
a cast with the ``cast`` kernel's, each on that value's shape. No second formula for what
a tiling already counts. A CPU fallback is priced as the round trip of its tensors over
the off-chip link (device -> host -> device); the CPU's own compute is not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchfl.hcd.dtypes import ITEMSIZE
from torchfl.kernels.spec import numel
from torchfl.kernels.tiling import TilePlan, round_trip_time, stream_plan, time_terms


@dataclass(frozen=True)
class Priced:
    """A tile plan and what it costs."""

    plan: TilePlan | None
    time_s: float
    bytes: int
    flops: int
    tile: dict
    note: str = ""


def price_plan(plan: TilePlan, chip, dtype: str) -> Priced:
    """The plan's price by the one formula; where a format-1.1 number moved it (launch,
    sustained rate, waves), the tiling's notes say so, which explain prints under the step."""
    terms = time_terms(plan, chip, dtype)
    tile = plan.config.as_dict()
    extra = terms.notes()
    if extra:
        tile["notes"] = "; ".join([n for n in (tile.get("notes", ""),) if n] + extra)
    return Priced(plan, terms.total_s, plan.traffic.bytes, plan.traffic.flops, tile)


def _catalog():
    from torchfl.kernels.catalog import CATALOG

    return CATALOG


def _kernel_price(kernel, shapes, attrs, dtype, layouts, dtypes, chip) -> Priced:
    spec = _catalog()[kernel]
    problem = spec.problem(shapes, attrs, dtype, layouts, dtypes)
    return price_plan(spec.tile(problem, chip), chip, dtype)


_PRICERS: dict = {}


def clear_cache() -> None:
    """Forget the shared pricers (a cold-planning benchmark starts from none)."""
    _PRICERS.clear()


class Pricer:
    """Caches conversion and cast prices per (shape, dtype, layouts) on one chip.

    ``Pricer.for_chip(chip)`` shares one per chip model in the process (prices are pure
    functions of the chip's numbers and the shape)."""

    @classmethod
    def for_chip(cls, chip) -> "Pricer":
        key = (hash(chip), chip.cache_bytes, chip.offchip_bw, tuple(sorted(chip.peak.items())))
        pricer = _PRICERS.get(key)
        if pricer is None:
            if len(_PRICERS) >= 16:
                _PRICERS.pop(next(iter(_PRICERS)))
            pricer = _PRICERS[key] = cls(chip)
        return pricer

    def __init__(self, chip):
        self.chip = chip
        self._layout: dict = {}
        self._cast: dict = {}

    def layout(self, shape, dtype, src, dst) -> Priced:
        key = (tuple(shape), dtype, src, dst)
        hit = self._layout.get(key)
        if hit is None:
            hit = self._layout[key] = self._layout_price(tuple(shape), dtype, src, dst)
        return hit

    def _layout_price(self, shape, dtype, src, dst):
        """The ``layout_transform`` kernel's own tiling of this permutation."""
        from torchfl.planner.records import identity_layout

        ident = identity_layout(len(shape))
        return _kernel_price("layout_transform", {"x": shape}, {"layout": dst}, dtype,
                             {"x": None if src == ident else src}, {"x": dtype}, self.chip)

    def cast(self, shape, src, dst) -> Priced:
        key = (tuple(shape), src, dst)
        hit = self._cast.get(key)
        if hit is None:
            hit = self._cast[key] = self._cast_price(tuple(shape), src, dst)
        return hit

    def _cast_price(self, shape, src, dst):
        """The ``cast`` kernel's tiling where both sides are storage dtypes of the chip;
        a host dtype (float64, uint8, ...) converts at the boundary, priced as a stream of
        its bytes. A cast that fits no tile costs infinity (the planner then avoids it)."""
        from torchfl.kernels.dtypes import DTYPES
        from torchfl.kernels.errors import KernelError

        if src in DTYPES and dst in DTYPES:
            try:
                return _kernel_price("cast", {"x": shape}, {"to": dst}, src, {}, {"x": src}, self.chip)
            except KernelError as e:
                return Priced(None, float("inf"), 0, 0, {}, str(e))
        if src in DTYPES or dst in DTYPES:
            # a link cast (float64 under the precision policy): converted on the host as it is
            # uploaded or downloaded; the chip moves only its own side's bytes, one way
            nbytes = numel(shape) * ITEMSIZE[src if src in DTYPES else dst]
            return Priced(None, round_trip_time(nbytes, self.chip) / 2, nbytes, 0,
                          {"strategy": "link", "notes": f"{src} -> {dst} converted on the host link"},
                          "converted on upload/download")
        plan = stream_plan("cast", (shape, src, dst), numel(shape), ITEMSIZE.get(src, 4), ITEMSIZE.get(dst, 4), 1, self.chip,
                           unit_name="elements", notes=f"{src} -> {dst}")
        return price_plan(plan, self.chip, dst) if plan else Priced(None, float("inf"), 0, 0, {})

    def fallback(self, in_bytes: int, out_bytes: int) -> Priced:
        return Priced(None, round_trip_time(in_bytes + out_bytes, self.chip), in_bytes + out_bytes, 0,
                      {"strategy": "cpu", "notes": "device->host->device round trip of its tensors"},
                      "runs on the CPU")


