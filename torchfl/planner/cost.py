"""Prices, all from the kernels' own tiling functions and the HCD's numbers.

A kernel option costs ``simulated_time(TilePlan, chip, dtype)``: per tile the larger of
compute (ops / the unit's peak for the dtype) and memory (off-chip bytes / off-chip
bandwidth). A layout conversion is priced with the ``layout_transform`` kernel's tiling,
a cast with the ``cast`` kernel's, each on that value's shape. No second formula for what
a tiling already counts. A CPU fallback is priced as the round trip of its tensors over
the off-chip link (device -> host -> device); the CPU's own compute is not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass


from torchfl.kernels.tiling import TilePlan, Traffic, simulated_time, stream_plan

ELEM = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1, "int32": 4, "int64": 8, "bool": 1, "float64": 8,
        "uint8": 1, "int16": 2}


def numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


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
    return Priced(plan, simulated_time(plan, chip, dtype), plan.traffic.bytes, plan.traffic.flops,
                  plan.config.as_dict())


def _catalog():
    from torchfl.kernels.catalog import CATALOG

    return CATALOG


def _kernel_price(kernel, shapes, attrs, dtype, layouts, dtypes, chip):
    spec = _catalog().get(kernel)
    if spec is None:
        return None
    problem = spec.problem(shapes, attrs, dtype, layouts, dtypes)
    return price_plan(spec.tile(problem, chip), chip, dtype), problem


_PRICERS: dict = {}


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
        from torchfl.planner.plan import identity_layout

        ident = identity_layout(len(shape))
        spec = _catalog().get("layout_transform")
        if spec is not None:
            attrs = {}
            if "layout" in spec.attrs:
                attrs["layout"] = dst
            elif "to" in spec.attrs:
                attrs["to"] = dst
            elif "out_layout" in spec.attrs:
                attrs["out_layout"] = dst
            name = spec.input_names[0]
            res = _kernel_price("layout_transform", {name: shape}, attrs, dtype,
                                {name: None if src == ident else src}, {name: dtype}, self.chip)
            if res is not None:
                return res[0]
        es = ELEM.get(dtype, 4)
        plan = stream_plan("layout_transform", (shape, dtype, src, dst), numel(shape), es, es, 0, self.chip,
                           unit_name="elements", notes=f"permute {src} -> {dst}")
        return price_plan(plan, self.chip, dtype) if plan else Priced(None, float("inf"), 0, 0, {})

    def cast(self, shape, src, dst) -> Priced:
        key = (tuple(shape), src, dst)
        hit = self._cast.get(key)
        if hit is None:
            hit = self._cast[key] = self._cast_price(tuple(shape), src, dst)
        return hit

    def _cast_price(self, shape, src, dst):
        spec = _catalog().get("cast")
        if spec is not None:
            name = spec.input_names[0]
            attrs = {k: dst for k in ("dtype", "to") if k in spec.attrs}
            try:
                res = _kernel_price("cast", {name: shape}, attrs, src, {}, {name: src}, self.chip)
            except Exception:  # noqa: BLE001 - fall through to the shared streaming tiler
                res = None
            if res is not None:
                return res[0]
        n = numel(shape)
        plan = stream_plan("cast", (shape, src, dst), n, ELEM.get(src, 4), ELEM.get(dst, 4), 1, self.chip,
                           unit_name="elements", notes=f"{src} -> {dst}")
        return price_plan(plan, self.chip, dst) if plan else Priced(None, float("inf"), 0, 0, {})

    def fallback(self, in_bytes: int, out_bytes: int) -> Priced:
        t = Traffic(in_bytes, out_bytes, 0)
        return Priced(None, (in_bytes + out_bytes) * 2 / self.chip.offchip_bw, in_bytes + out_bytes, 0,
                      {"strategy": "cpu", "notes": "device->host->device round trip of its tensors"},
                      "runs on the CPU")


