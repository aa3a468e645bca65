"""The emulated chip's numbers: what tiling and simulated time are computed from.

Pure Python (no numba, no torch). ``ChipModel.from_hcd`` reads an HCD; the plain
constructor (or :func:`reference_chip`) builds one for tests and benchmarks.
"""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ChipModel", "reference_chip"]

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

    def __post_init__(self):
        if self.cache_bytes <= 0:
            raise ValueError(f"ChipModel {self.name!r}: cache_bytes must be positive, got {self.cache_bytes}")
        if self.alignment <= 0 or self.alignment & (self.alignment - 1):
            raise ValueError(f"ChipModel {self.name!r}: alignment must be a power of two, got {self.alignment}")
        if self.cache_bw <= 0 or self.offchip_bw <= 0:
            raise ValueError(f"ChipModel {self.name!r}: bandwidths must be positive")

    def __hash__(self):  # dict fields: hash the immutable identity
        return hash((self.name, self.cache_bytes, self.cache_bw, self.offchip_bw,
                     tuple(sorted(self.peak.items())), self.alignment, self.memory_bytes,
                     self.bf16_emulation, self.hcd_hash))

    @classmethod
    def from_hcd(cls, hcd) -> "ChipModel":
        """Build from a validated ``torchfl.hcd.HCD``. Units: KiB, GB/s (10^9), GiB."""
        mem = hcd.memory
        peak, units = {}, {}
        names = list(hcd.dtypes)
        if hcd.constraints.bfloat16_emulation and "bfloat16" not in names:
            names.append("bfloat16")
        for dt in names:
            p = hcd.peak_ops_per_s(dt)
            if p is None:
                continue
            peak[dt] = float(p)
            unit = getattr(hcd.compute_units, hcd.unit_for(dt))
            units[dt] = int(unit.count)
        size_gb = mem.off_chip_memory.size_gb
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

    def with_cache(self, cache_bytes: int) -> "ChipModel":
        """The same chip with another cache size (tests: bigger cache, fewer bytes); no longer
        the HCD's chip, so without its ``hcd_hash``."""
        from dataclasses import replace

        return replace(self, cache_bytes=int(cache_bytes), hcd_hash="")


def reference_chip(**overrides) -> ChipModel:
    """A chip with every dtype (fp32 included) and NPU-V3's memory numbers, for tests
    and benchmarks that must run before or without an HCD."""
    return ChipModel(**overrides)
