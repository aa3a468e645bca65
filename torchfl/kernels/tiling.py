"""Tiling vocabulary shared by every kernel family, and the simulated-time roofline.

A family's one tiling function returns a :class:`TilePlan`: the chosen
:class:`TileConfig`, the exact off-chip traffic (:class:`Traffic`) its kernel will
count when it executes that plan, and the traffic per tile, grouped (``groups``:
``(count, Traffic)`` pairs: tiles with equal shape share one entry, so a plan stays
small however many tiles it has).

Strategy names used across families:

- ``resident``: every operand and the result fit in the on-chip cache at once; each is
  loaded (or stored) exactly once, one tile. Cache-reuse tiling.
- ``streamed``: tiles are moved by double-buffered DMA (two buffers per streamed
  operand, so loading tile i+1 overlaps computing tile i); operands that fit may stay
  resident beside the stream (named in ``notes``).
- families may add others (e.g. ``row_split`` softmax, ``metadata`` for reshape).

Simulated time is a roofline per tile: a tile costs the larger of its compute time
(ops / the unit's peak for the dtype) and its memory time (off-chip bytes / off-chip
bandwidth), and a plan costs the sum over its tiles. Double buffering is what makes the
"larger of" honest for streamed tiles; a resident plan is one tile. On-chip cache
bandwidth is not a term: tiles are sized to the cache, and the chips we model feed their
units from it faster than the units consume (cache_bw >= offchip_bw in every HCD).
"""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["TileConfig", "Traffic", "TilePlan", "simulated_time", "stream_plan", "ZERO"]


@dataclass(frozen=True)
class Traffic:
    """Off-chip -> on-chip bytes, on-chip -> off-chip bytes, and operations."""

    bytes_read: int = 0
    bytes_written: int = 0
    flops: int = 0

    def __add__(self, other: "Traffic") -> "Traffic":
        return Traffic(self.bytes_read + other.bytes_read, self.bytes_written + other.bytes_written,
                       self.flops + other.flops)

    def __mul__(self, k: int) -> "Traffic":
        return Traffic(self.bytes_read * k, self.bytes_written * k, self.flops * k)

    __rmul__ = __mul__

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written

    def as_dict(self) -> dict:
        return {"bytes_read": self.bytes_read, "bytes_written": self.bytes_written, "flops": self.flops}


ZERO = Traffic()


@dataclass(frozen=True)
class TileConfig:
    """What the plan shows: strategy, tile sizes per axis, double buffering, why."""

    strategy: str
    tiles: tuple = ()
    double_buffered: bool = False
    notes: str = ""

    def as_dict(self) -> dict:
        return {"strategy": self.strategy, "tiles": {a: s for a, s in self.tiles},
                "double_buffered": self.double_buffered, "notes": self.notes}

    def tile(self, axis: str, default=None):
        """Size of ``axis`` (None/default if the config does not tile it)."""
        for a, s in self.tiles:
            if a == axis:
                return s
        return default


@dataclass(frozen=True)
class TilePlan:
    """A tiling decision and its exact cost inputs.

    ``traffic`` is the total, equal to the sum of ``count * per_tile`` over ``groups``;
    ``on_chip_bytes`` is the cache footprint the plan needs (<= chip.cache_bytes);
    ``kernel`` names the kernel and ``key`` identifies the problem it was made for (a run
    with another problem is refused).
    """

    config: TileConfig
    traffic: Traffic
    groups: tuple = ()
    on_chip_bytes: int = 0
    kernel: str = ""
    key: tuple = field(default=(), compare=True)

    @property
    def n_tiles(self) -> int:
        return sum(c for c, _ in self.groups)

    def as_dict(self) -> dict:
        return {"kernel": self.kernel, **self.config.as_dict(), "traffic": self.traffic.as_dict(),
                "n_tiles": self.n_tiles, "on_chip_bytes": self.on_chip_bytes}


def make_plan(kernel, key, config, groups, on_chip_bytes) -> TilePlan:
    """Build a TilePlan whose total is the sum of its groups (drops empty groups)."""
    groups = tuple((int(c), t) for c, t in groups if c > 0)
    total = ZERO
    for c, t in groups:
        total = total + t * c
    return TilePlan(config=config, traffic=total, groups=groups, on_chip_bytes=int(on_chip_bytes),
                    kernel=kernel, key=key)


def simulated_time(plan_or_traffic, chip, dtype: str, *, flops_scale: float = 1.0,
                   bytes_scale: float = 1.0) -> float:
    """Seconds on ``chip``: sum over tiles of max(ops / peak[dtype], bytes / offchip_bw),
    the one roofline formula (the planner prices with it, explain analyze replays it).

    A bare :class:`Traffic` is priced as one tile. ``flops_scale`` / ``bytes_scale`` scale
    every tile's counts (analyze: the counted totals over the planned ones)."""
    peak = chip.peak_for(dtype) / flops_scale if flops_scale else float("inf")
    bw = chip.offchip_bw / bytes_scale if bytes_scale else float("inf")
    if isinstance(plan_or_traffic, Traffic):
        groups = ((1, plan_or_traffic),)
    else:
        groups = plan_or_traffic.groups
    return float(sum(c * max(t.flops / peak, t.bytes / bw) for c, t in groups))


def round_trip_time(nbytes: int, chip) -> float:
    """Seconds to move ``nbytes`` device -> host -> device over the off-chip link (a CPU
    fallback; the host's own compute is not modelled)."""
    return nbytes * 2 / chip.offchip_bw


def stream_plan(kernel: str, key: tuple, n_units: int, in_bytes: int, out_bytes: int,
                ops_per_unit: int, chip, *, resident_bytes: int = 0, scratch_per_unit: int = 0,
                unit_name: str = "rows", notes: str = "") -> TilePlan | None:
    """The streaming tiler: ``n_units`` independent units (elements, rows), each reading
    ``in_bytes`` and writing ``out_bytes``; ``resident_bytes`` (broadcast operands,
    weights) are loaded once and stay on chip. Everything fits: ``resident``, one tile.
    Otherwise the largest tile of whole units that fits with double buffering (two
    buffers per streamed operand) is ``streamed``. None when not even one unit fits.
    """
    per_unit = in_bytes + out_bytes
    cache = chip.cache_bytes
    if n_units == 0:
        cfg = TileConfig("resident", ((unit_name, 0),), False, "empty tensor: nothing moves")
        return make_plan(kernel, key, cfg, (), 0)
    total_fp = n_units * (per_unit + scratch_per_unit) + resident_bytes
    if total_fp <= cache:
        cfg = TileConfig("resident", ((unit_name, n_units),), False,
                         notes or "whole tensors fit the on-chip cache: loaded once")
        t = Traffic(n_units * in_bytes + resident_bytes, n_units * out_bytes, n_units * ops_per_unit)
        return make_plan(kernel, key, cfg, ((1, t),), total_fp)
    budget = cache - resident_bytes
    per_tile_unit = 2 * per_unit + scratch_per_unit
    if budget <= 0 or per_tile_unit > budget:
        return None
    t = min(n_units, budget // per_tile_unit)
    full, rest = divmod(n_units, t)
    def tr(u, first=False):
        return Traffic(u * in_bytes + (resident_bytes if first else 0), u * out_bytes, u * ops_per_unit)
    groups = []
    # the first tile also loads the resident operands
    if full:
        groups.append((1, tr(t, True)))
        groups.append((full - 1, tr(t)))
        if rest:
            groups.append((1, tr(rest)))
    else:
        groups.append((1, tr(rest, True)))
    cfg = TileConfig("streamed", ((unit_name, int(t)),), True,
                     notes or f"double-buffered tiles of {t} {unit_name}"
                     + (f"; {resident_bytes} B resident" if resident_bytes else ""))
    return make_plan(kernel, key, cfg, groups, resident_bytes + t * per_tile_unit)
