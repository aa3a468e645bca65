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
(ops / the unit's peak for the dtype, at the plan's ``compute_util``) and its memory time
(off-chip bytes / off-chip bandwidth), and a plan costs the sum over its tiles plus what
its pipeline cannot overlap. Double buffering is what makes the "larger of" honest for
streamed tiles, but it cannot hide the first tile's load nor the last tile's compute: n
equal tiles take ``m + (n-1) max(c, m) + c = n max(c, m) + min(c, m)``. A tiler whose
tiles are its pipeline's stages says so (``TileConfig.pipelined_tiles``: weight-stationary
conv's output tiles, ``stream_plan``'s) and the plan adds ``min(compute, memory)`` of its
mean tile; a double-buffered plan that streams inside its tiles (GEMM k-chunks, split_c
conv's channel blocks) adds nothing, its stages being finer than its groups. A plan without double buffering overlaps nothing:
each tile costs ``c + m`` (a resident plan: load, compute, store). The fill/drain term
also separates options whose binding term ties (a conv with or without a batch-norm
epilogue, memory-bound alike: the one with fewer operations is cheaper),
deterministically and from counts, not noise.

``compute_util`` (0 < u <= 1) is the fraction of the unit's peak a kernel's inner loop can
reach because of its shape: a unit works on vectors of ``chip.alignment`` bytes (the HCD's
``memory_alignment_bytes``: the DMA and vector granule), and a loop whose vectorised run
is shorter, or not a multiple, leaves lanes idle (:func:`vector_utilisation`; a conv
whose reduction run is 7 taps x 3 input channels fills 42 of 256 bytes). Each family's
tiler states it from its own loop structure; the default is 1. On-chip cache bandwidth is
not a term: tiles are sized to the cache, and the chips we model feed their units from
it faster than the units consume (cache_bw >= offchip_bw in every HCD).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from torchfl.hcd.dtypes import ITEMSIZE

__all__ = ["TileConfig", "Traffic", "TilePlan", "TimeTerms", "simulated_time", "time_terms", "waves",
           "stream_plan", "vector_utilisation", "ZERO"]


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
    """What the plan shows: strategy, tile sizes per axis, double buffering, why, and the
    fraction of the unit's peak its loops reach (``compute_util``, see the module's
    docstring; shown only when below 1)."""

    strategy: str
    tiles: tuple = ()
    double_buffered: bool = False
    notes: str = ""
    compute_util: float = 1.0
    pipelined_tiles: bool = False   # the tiles are the double-buffered pipeline's stages
    #: independent units (rows of a row-wise reduction) that a many-core chip runs one per core;
    #: fewer than its ``concurrent_tiles`` leave cores idle (0: not stated, no effect)
    parallel_units: int = 0
    #: a matrix kernel's output grid ``(batch, M, N, K)``: a many-core chip cuts it into
    #: ``tile_elements`` tiles per (M, N) plane (edges padded), see :func:`waves` (() : not stated)
    grid: tuple = ()

    def as_dict(self) -> dict:
        d = {"strategy": self.strategy, "tiles": {a: s for a, s in self.tiles},
             "double_buffered": self.double_buffered, "notes": self.notes}
        if self.compute_util != 1.0:
            d["compute_util"] = self.compute_util
        if self.parallel_units:
            d["parallel_units"] = self.parallel_units
        return d

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
    def compute_util(self) -> float:
        return self.config.compute_util

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
    if not 0.0 < config.compute_util <= 1.0:
        raise ValueError(f"kernel {kernel}: compute_util must lie in (0, 1], got {config.compute_util}")
    return TilePlan(config=config, traffic=total, groups=groups, on_chip_bytes=int(on_chip_bytes),
                    kernel=kernel, key=key)


def vector_utilisation(n: int, itemsize: int, chip) -> float:
    """Fraction of the unit's lanes a vectorised run of ``n`` elements of ``itemsize`` bytes
    fills: the unit works on vectors of ``chip.alignment`` bytes, so the run occupies
    ceil(n * itemsize / alignment) of them. 1 for an empty run (no work, nothing wasted)."""
    nbytes = int(n) * int(itemsize)
    if nbytes <= 0:
        return 1.0
    vec = int(chip.alignment)
    return nbytes / (-(-nbytes // vec) * vec)


@dataclass(frozen=True)
class TimeTerms:
    """What :func:`simulated_time` added up, for explain: ``total_s`` is the price;
    ``launch_s`` the fixed launch cost (format 1.1), ``compute_s`` / ``memory_s`` the summed
    terms, ``bound`` which one binds (``"compute"`` or ``"off-chip"``), ``sustained`` /
    ``offchip_sustained`` the fractions applied, ``waves`` / ``wave_efficiency`` the wave
    quantisation (0 / 1 where the chip states no grain)."""

    total_s: float
    launch_s: float = 0.0
    compute_s: float = 0.0
    memory_s: float = 0.0
    bound: str = ""
    sustained: float = 1.0
    offchip_sustained: float = 1.0
    waves: int = 0
    wave_efficiency: float = 1.0
    busy_cores: int = 0             # cores a row-wise kernel with fewer rows than cores keeps busy (0: all)

    def notes(self) -> list[str]:
        """Where a format-1.1 number moved this time, in explain's words ("+4.5 us launch",
        "off-chip bound at 82% sustained", "3 waves of 108 tiles, 79% full")."""
        out = []
        if self.launch_s:
            out.append(f"+{self.launch_s * 1e6:.3g} us launch")
        if self.bound == "off-chip" and self.offchip_sustained != 1.0:
            out.append(f"off-chip bound at {self.offchip_sustained:.0%} sustained")
        elif self.bound == "on-chip cache":
            out.append("cache bound: its data stay in the on-chip cache between kernels")
        elif self.bound == "compute" and self.sustained != 1.0:
            out.append(f"compute bound at {self.sustained:.0%} sustained")
        if self.waves and self.wave_efficiency < 1.0 and self.bound == "compute":
            out.append(f"{self.waves} wave{'s' if self.waves != 1 else ''}, {self.wave_efficiency:.0%} full")
        if self.busy_cores and self.bound != "compute":
            out.append(f"{self.busy_cores} busy core{'s' if self.busy_cores != 1 else ''} (one row each) stream "
                       "their share of the bandwidth")
        return out


def waves(outputs: int, chip, grid: tuple = ()) -> tuple[int, float]:
    """Wave quantisation of a kernel with ``outputs`` output elements (format 1.1): its tiles
    are ceil(outputs / chip.tile_elements), run ``chip.concurrent_tiles`` at once, so it takes
    ceil(tiles / concurrent_tiles) waves and the units are busy tiles / (waves x
    concurrent_tiles) of that time: 109 tiles on 108 units take two waves at 50%.

    A matrix kernel that states its output ``grid`` ``(batch, M, N, K)`` is cut as a GPU
    library cuts it: every (M, N) plane of the batch into square tiles of ``tile_elements``
    (side ``isqrt``), the edge tiles padded (M = 196 on 128-row tiles computes 256 rows: 77 %
    of the work is useful). Fewer tiles than one wave leave units idle unless the library
    splits the reduction (split-K): each tile's K is cut into at most ``concurrent_tiles //
    tiles`` slices of at least one tile side, so a GEMM with 8 tiles and K = 4096 fills
    the chip while one with K = 64 runs on 8 units.

    A kernel that states no grid and has fewer tiles than one wave is not charged for the idle
    units (a streaming kernel spreads its elements over every unit). ``(0, 1.0)`` where the
    chip states no grain."""
    cores = getattr(chip, "concurrent_tiles", 0)
    if not cores or outputs <= 0:
        return 0, 1.0
    if grid:
        return _grid_waves(grid, cores, chip.tile_elements)
    tiles = -(-int(outputs) // chip.tile_elements)
    if tiles <= cores:
        return 1, 1.0
    n = -(-tiles // cores)
    return n, tiles / (n * cores)


def _grid_waves(grid: tuple, cores: int, tile_elements: int) -> tuple[int, float]:
    """:func:`waves` of a matrix kernel's ``(batch, M, N, K)`` output grid, cut into square
    tiles of ``tile_elements`` (the tile the HCD states; edges padded); a grid under one wave
    splits K over the idle units in slices at least one tile side deep.

    A narrow side (M or N at most half the tile's side: a decode step's one token, a GEMV, a
    head dim of 64 as an output side) is not padded to a full tile: libraries keep narrower tiles and skinny or
    GEMV kernels for such products, so its tile side is the next power of two of that
    dimension. (Chosen among three variants, an eighth, a half, and free rectangles of the
    tile's area, with the NeuSight GEMM tables in view: BENCHMARKS.md, "Out of sample".)"""
    from math import isqrt

    batch, m, n, k = (int(v) for v in grid)
    if min(batch, m, n) <= 0:
        return 0, 1.0
    side = max(1, isqrt(tile_elements))
    tm = _skinny(m, side)
    tn = _skinny(n, max(1, tile_elements // side))
    tiles = batch * -(-m // tm) * -(-n // tn)
    fill = batch * m * n / (tiles * tm * tn)
    if tiles < cores:
        split = max(1, min(cores // tiles, -(-k // side)))
        return 1, fill * min(1.0, tiles * split / cores)
    w = -(-tiles // cores)
    return w, fill * tiles / (w * cores)


def _skinny(dim: int, side: int) -> int:
    """The tile side along a dimension: ``side``, or the next power of two of a dimension at
    most ``side / 2`` long (see :func:`_grid_waves`)."""
    if dim * 2 > side:
        return side
    return 1 << max(0, (dim - 1).bit_length())


def simulated_time(plan_or_traffic, chip, dtype: str, *, flops_scale: float = 1.0,
                   bytes_scale: float = 1.0) -> float:
    """Seconds on ``chip``: sum over tiles of max(ops / (peak[dtype] * compute_util),
    bytes / offchip_bw), plus what the pipeline cannot overlap (see the module's
    docstring): the pipelined tiles' fill and drain, min(total compute, total memory) /
    tiles, or without double buffering every tile's smaller term. The one roofline formula
    (the planner prices with it, explain analyze replays it).

    HCD format 1.1 (each term is exactly absent for a 1.0 chip): the peak is the sustained
    one (``chip.sustained_for(dtype)``) and the compute rate is further scaled by the wave
    efficiency of the kernel's output (:func:`waves`; output elements = bytes written over
    the dtype's size), the bandwidth is ``offchip_bw * offchip_sustained``, and a kernel
    that moves or computes anything pays its launch once (``chip.launch_for(kernel)``: the
    matrix families' launch where the chip states one, else ``chip.launch_s``).

    A bare :class:`Traffic` is priced as one tile (compute + memory: nothing overlaps).
    ``flops_scale`` / ``bytes_scale`` scale every tile's counts (analyze: the counted
    totals over the planned ones)."""
    return time_terms(plan_or_traffic, chip, dtype, flops_scale=flops_scale, bytes_scale=bytes_scale).total_s


def time_terms(plan_or_traffic, chip, dtype: str, *, flops_scale: float = 1.0,
               bytes_scale: float = 1.0) -> TimeTerms:
    """:func:`simulated_time` with its terms (see :class:`TimeTerms`).

    On a chip whose cache keeps data between kernels (format 1.1
    ``on_chip_cache.retains_between_kernels``: ``chip.cache_retains``), a kernel whose whole
    traffic fits the cache moves it at ``chip.cache_bw``, not off-chip: its operands are where
    the previous kernel (or the previous call) left them.

    On a chip with a parallel grain (``chip.concurrent_tiles``), a plan that states its
    independent units (``TileConfig.parallel_units``: the rows of softmax and layer norm, one
    row per core) and has fewer than the chip's cores moves its bytes at ``units /
    concurrent_tiles`` of the bandwidth: the cores without a row pull nothing."""
    if isinstance(plan_or_traffic, Traffic):
        groups, util, cfg = ((1, plan_or_traffic),), 1.0, None
        written = plan_or_traffic.bytes_written
    else:
        groups, cfg = plan_or_traffic.groups, plan_or_traffic.config
        util = cfg.compute_util
        written = plan_or_traffic.traffic.bytes_written
    sustained = chip.sustained_for(dtype) if hasattr(chip, "sustained_for") else 1.0
    n_waves, wave_eff = waves(written // ITEMSIZE.get(dtype, 1), chip, cfg.grid if cfg is not None else ())
    rate = chip.peak_for(dtype)
    if sustained != 1.0:
        rate = rate * sustained
    if wave_eff != 1.0:
        rate = rate * wave_eff
    peak = rate * util / flops_scale if flops_scale else float("inf")
    off = getattr(chip, "offchip_sustained", 1.0)
    bw = (chip.offchip_bw if off == 1.0 else chip.offchip_bw * off) / bytes_scale if bytes_scale else float("inf")
    warm = (getattr(chip, "cache_retains", False) and cfg is not None
            and plan_or_traffic.traffic.bytes <= chip.cache_bytes)
    if warm:        # format 1.1: the data stay in a cache that keeps them between kernels
        bw = chip.cache_bw / bytes_scale if bytes_scale else float("inf")
    # format 1.1: a row-wise kernel puts one row on one core; with fewer rows than the chip's
    # cores, the idle cores pull no data and the busy ones stream their share of the bandwidth
    cores = getattr(chip, "concurrent_tiles", 0)
    units = cfg.parallel_units if cfg is not None else 0
    busy = units if cores and 0 < units < cores else 0
    if busy:
        bw = bw * busy / cores
    # a matrix kernel on a many-core chip (its grid cut into tiles, :func:`waves`) stores each
    # output tile after the tile's reduction: the loads overlap the math, the store does not
    store_after = bool(cfg is not None and cfg.grid and cores)
    steady = comp = mem = serial = 0.0
    n = 0
    for c, t in groups:
        tc, tm = t.flops / peak, t.bytes / bw
        if store_after:
            tr = t.bytes_read / bw
            steady += c * (max(tc, tr) + (tm - tr))
            serial += c * min(tc, tr)
        else:
            steady += c * max(tc, tm)
            serial += c * min(tc, tm)
        comp += c * tc
        mem += c * tm
        n += c
    if not n:
        return TimeTerms(0.0)
    if cfg is None or not cfg.double_buffered:
        body = float(steady + serial)
    else:
        body = float(steady + (min(comp, mem) / n if cfg.pipelined_tiles else 0.0))
    kernel = "" if isinstance(plan_or_traffic, Traffic) else plan_or_traffic.kernel
    launch = float(chip.launch_for(kernel)) if hasattr(chip, "launch_for") else 0.0
    return TimeTerms(body + launch if launch else body, launch, comp, mem,
                     "compute" if comp >= mem else "on-chip cache" if warm else "off-chip", sustained, off,
                     n_waves, wave_eff, busy)


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
                     + (f"; {resident_bytes} B resident" if resident_bytes else ""), pipelined_tiles=True)
    return make_plan(kernel, key, cfg, groups, resident_bytes + t * per_tile_unit)
