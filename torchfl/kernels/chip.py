"""The emulated chip's numbers: what tiling and simulated time are computed from.

Pure Python (no numba, no torch). ``ChipModel.from_hcd`` reads an HCD; the plain
constructor (or :func:`reference_chip`) builds one for tests and benchmarks.
"""
from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields

__all__ = ["ChipModel", "MATRIX_FAMILIES", "SUBMISSIONS", "reference_chip"]

#: kernel families that run on the matrix units and are launched as a library call
MATRIX_FAMILIES = frozenset({"matmul", "conv", "conv1d", "attention", "grouped"})
#: how a plan's kernels reach the chip: one host call (and sync) per kernel, or the whole plan
#: enqueued at once as a graph (CUDA Graphs, an engine's fused C++ loop)
SUBMISSIONS = ("eager", "graph")

@dataclass(frozen=True)
class ChipModel:
    """Memory hierarchy and peak rates of one chip.

    ``peak`` maps storage dtype short names to aggregate ops/s (all ``count`` units);
    ``units`` maps the same names to unit counts. ``cache_bytes`` is the on-chip cache
    (scratchpad) that tiles must fit in; ``offchip_bw``/``cache_bw`` are bytes per second.
    ``memory_bytes`` is the off-chip capacity (None: unbounded). ``hcd_hash`` is the
    content hash of the HCD it was built from (its identity: plans record it, device
    memory is kept per hash); empty for a chip built by hand.
    """

    name: str = "EMU-REF"
    cache_bytes: int = 8 << 20
    cache_bw: float = 256e9
    offchip_bw: float = 128e9
    peak: dict = field(default_factory=lambda: {"float32": 12.8e12, "float16": 25.6e12,
                                                "bfloat16": 25.6e12, "int8": 51.2e12})
    units: dict = field(default_factory=lambda: {"float32": 128, "float16": 256,
                                                 "bfloat16": 256, "int8": 512})
    alignment: int = 256
    memory_bytes: int | None = None
    bf16_emulation: bool = False
    hcd_hash: str = ""
    # -- HCD format 1.1 (defaults: the 1.0 roofline, bit for bit) --
    #: fixed seconds every kernel launch costs (``execution.launch_overhead_us`` / 1e6)
    launch_s: float = 0.0
    #: the same for a kernel of the matrix families (``execution.matrix_launch_overhead_us``; None: launch_s)
    matrix_launch_s: float | None = None
    #: seconds a kernel node costs when the plan is submitted as one graph
    #: (``execution.graph_launch_overhead_us`` / 1e6; None: the chip states none, eager costs apply)
    graph_launch_s: float | None = None
    #: how the prediction submits the plan (:data:`SUBMISSIONS`); "graph" prices every launch at
    #: ``graph_launch_s`` where the chip states it. Set with :meth:`submitted`, never by the HCD.
    submission: str = "eager"
    #: dtype -> share of ``peak[dtype]`` a large GEMM sustains (absent: 1)
    sustained: dict = field(default_factory=dict)
    #: share of ``offchip_bw`` a streaming kernel sustains
    offchip_sustained: float = 1.0
    #: the cache keeps a kernel's data for the next (``on_chip_cache.retains_between_kernels``): a
    #: kernel whose traffic fits ``cache_bytes`` moves it at ``cache_bw``
    cache_retains: bool = False
    #: tiles run at once and output elements per tile (0: no wave quantisation)
    concurrent_tiles: int = 0
    tile_elements: int = 0
    #: longest row a row-wise reduction keeps on one core across its passes
    #: (``execution.row_resident_elements``; 0: no per-core limit, a row may fill ``cache_bytes``)
    row_elements: int = 0

    def __post_init__(self):
        if self.cache_bytes <= 0:
            raise ValueError(f"ChipModel {self.name!r}: cache_bytes must be positive, got {self.cache_bytes}")
        if self.alignment <= 0 or self.alignment & (self.alignment - 1):
            raise ValueError(f"ChipModel {self.name!r}: alignment must be a power of two, got {self.alignment}")
        if self.cache_bw <= 0 or self.offchip_bw <= 0:
            raise ValueError(f"ChipModel {self.name!r}: bandwidths must be positive")
        if self.launch_s < 0 or (self.matrix_launch_s or 0.0) < 0 or (self.graph_launch_s or 0.0) < 0:
            raise ValueError(f"ChipModel {self.name!r}: launch_s, matrix_launch_s and graph_launch_s must be >= 0, "
                             f"got {self.launch_s}, {self.matrix_launch_s}, {self.graph_launch_s}")
        if self.submission not in SUBMISSIONS:
            raise ValueError(f"ChipModel {self.name!r}: submission must be one of {', '.join(SUBMISSIONS)}, "
                             f"got {self.submission!r}")
        for what, f in [("offchip_sustained", self.offchip_sustained), *self.sustained.items()]:
            if not 0.0 < f <= 1.0:
                raise ValueError(f"ChipModel {self.name!r}: sustained fraction {what} must lie in (0, 1], got {f}")
        if (self.concurrent_tiles > 0) != (self.tile_elements > 0) or min(self.concurrent_tiles,
                                                                          self.tile_elements) < 0:
            raise ValueError(f"ChipModel {self.name!r}: concurrent_tiles and tile_elements are set together "
                             f"(both > 0) or not at all, got {self.concurrent_tiles} and {self.tile_elements}")
        if self.row_elements < 0:
            raise ValueError(f"ChipModel {self.name!r}: row_elements must be >= 0 (0: no limit), got {self.row_elements}")

    def __hash__(self):
        # the price caches' key (planner/cost.py, candidates.py): every field, read from the
        # dataclass's own list, so a field added later cannot leave two chips sharing a hash (the
        # hand-written tuple this replaces had left ``units`` out). Not cached on the instance: a
        # pickled chip (Ray, worker processes) would carry a hash of another process's str hashing.
        d = self.__dict__
        return hash((tuple(map(d.__getitem__, _PLAIN)), *(tuple(sorted(d[k].items())) for k in _DICTS)))

    @property
    def waves_modelled(self) -> bool:
        return self.concurrent_tiles > 0

    @classmethod
    def from_hcd(cls, hcd) -> "ChipModel":
        """Build from a validated ``torchfl.hcd.HCD``. Units: KiB, GB/s (10^9), GiB."""
        mem = hcd.memory
        peak, units = {}, {}
        for dt in hcd.stored_dtypes:
            p = hcd.peak_ops_per_s(dt)
            if p is None:
                continue
            peak[dt] = float(p)
            unit = getattr(hcd.compute_units, hcd.unit_for(dt))
            units[dt] = int(unit.count)
        size_gb = mem.off_chip_memory.size_gb
        # format 1.1: only the fields the file states (absent ones keep the 1.0 defaults)
        sustained = {dt: hcd.sustained_fraction(dt) for dt in peak
                     if getattr(getattr(hcd.compute_units, hcd.unit_for(dt)), "sustained_fraction", None)}
        ex = hcd.execution
        grain = ex is not None and ex.concurrent_tiles and ex.tile_elements
        return cls(
            name=hcd.chip.name,
            cache_bytes=int(mem.on_chip_cache.size_kb) * 1024,
            cache_bw=float(mem.on_chip_cache.bandwidth_gb_per_s) * 1e9,
            offchip_bw=float(mem.off_chip_memory.bandwidth_gb_per_s) * 1e9,
            peak=peak,
            units=units,
            alignment=int(hcd.constraints.memory_alignment_bytes),
            memory_bytes=None if size_gb is None else int(size_gb * (1 << 30)),
            bf16_emulation=bool(hcd.constraints.bfloat16_emulation),
            hcd_hash=hcd.content_hash(),
            launch_s=float(ex.launch_overhead_us) * 1e-6 if ex is not None and ex.launch_overhead_us else 0.0,
            matrix_launch_s=(float(ex.matrix_launch_overhead_us) * 1e-6
                             if ex is not None and ex.matrix_launch_overhead_us is not None else None),
            graph_launch_s=(float(ex.graph_launch_overhead_us) * 1e-6
                            if ex is not None and ex.graph_launch_overhead_us is not None else None),
            sustained=sustained,
            offchip_sustained=float(mem.off_chip_memory.sustained_fraction or 1.0),
            cache_retains=bool(mem.on_chip_cache.retains_between_kernels),
            concurrent_tiles=int(ex.concurrent_tiles) if grain else 0,
            tile_elements=int(ex.tile_elements) if grain else 0,
            row_elements=int(ex.row_resident_elements) if ex is not None and ex.row_resident_elements else 0,
        )

    def peak_for(self, dtype: str) -> float:
        """Ops/s for ``dtype``. bfloat16 under emulation runs at the fp16 rate; integer
        and bool elementwise work runs on the int8 unit; a dtype with no unit is priced at
        the slowest unit (conservative; the planner rejects such dtypes before pricing)."""
        if dtype in self.peak:
            return self.peak[dtype]
        if dtype == "bfloat16" and "float16" in self.peak:
            return self.peak["float16"]
        if dtype in ("int32", "int64", "bool") and "int8" in self.peak:
            return self.peak["int8"]
        if not self.peak:
            raise ValueError(f"chip {self.name!r} has no compute unit (peak is empty)")
        return min(self.peak.values())

    def submitted(self, submission: str) -> "ChipModel":
        """The same chip priced for ``submission`` ("eager" or "graph", :data:`SUBMISSIONS`): under
        "graph" every kernel pays ``graph_launch_s`` instead of its eager launch, where the HCD
        states ``execution.graph_launch_overhead_us`` (else the eager costs stay: nothing is
        invented). Same ``hcd_hash`` (same chip), another ``hash`` (the planner's price caches
        keep the two apart)."""
        from dataclasses import replace

        if submission not in SUBMISSIONS:
            raise ValueError(f"chip {self.name!r}: unknown submission {submission!r}; use one of "
                             f"{', '.join(SUBMISSIONS)}")
        return self if submission == self.submission else replace(self, submission=submission)

    @property
    def graph_priced(self) -> bool:
        """Launches are priced at the graph cost (graph submission on a chip that states one)."""
        return self.submission == "graph" and self.graph_launch_s is not None

    def launch_for(self, kernel: str = "") -> float:
        """Seconds one launch of ``kernel`` costs: under graph submission ``graph_launch_s``
        (where the HCD states it); else ``matrix_launch_s`` for the matrix families
        (:data:`MATRIX_FAMILIES`) where the HCD states it, else ``launch_s``."""
        if self.graph_priced:
            return self.graph_launch_s
        if self.matrix_launch_s is None or not kernel:
            return self.launch_s
        from torchfl.kernels.catalog import CATALOG

        spec = CATALOG.get(kernel)
        return self.matrix_launch_s if spec is not None and spec.family in MATRIX_FAMILIES else self.launch_s

    def sustained_for(self, dtype: str) -> float:
        """Share of ``peak_for(dtype)`` sustained: the fraction of the unit that runs ``dtype``
        (bfloat16 on the fp16 unit and integers on the int8 unit take that unit's), else 1."""
        if dtype in self.sustained:
            return self.sustained[dtype]
        if dtype == "bfloat16" and "bfloat16" not in self.peak and "float16" in self.sustained:
            return self.sustained["float16"]
        if dtype in ("int32", "int64", "bool") and "int8" in self.sustained and dtype not in self.peak:
            return self.sustained["int8"]
        return 1.0

    def with_cache(self, cache_bytes: int) -> "ChipModel":
        """The same chip with another cache size (tests: bigger cache, fewer bytes); no longer
        the HCD's chip, so without its ``hcd_hash``."""
        from dataclasses import replace

        return replace(self, cache_bytes=int(cache_bytes), hcd_hash="")


def reference_chip(**overrides) -> ChipModel:
    """A chip with every dtype (fp32 included) and NPU-V3's memory numbers, for tests
    and benchmarks that must run before or without an HCD."""
    return ChipModel(**overrides)


#: ChipModel's fields (``__hash__`` reads every one): those holding a dict, and the rest
_DICTS = tuple(f.name for f in fields(ChipModel) if f.default_factory is not MISSING
               and isinstance(f.default_factory(), dict))
_PLAIN = tuple(f.name for f in fields(ChipModel) if f.name not in _DICTS)
