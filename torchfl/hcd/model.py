"""The HCD data model, format 1.0 and 1.1 (pydantic v2): one field, one meaning, one unit.

Format 1.1 adds optional numbers a roofline lacks and real accelerators need (each absent
field leaves the 1.0 prediction exactly as it was, and an absent field is not part of the
canonical form, so a 1.0 file keeps its content hash): the sustained share of each compute
peak and of the off-chip bandwidth, and an ``execution`` section with the fixed cost of a
kernel launch and the grain of parallel work (tiles run at once, output elements per tile,
so that a kernel whose tiles fill 1.1 waves costs two).

The model holds the *canonical* form: legacy unit keys (``peak_gflops``/``peak_gops``,
which the source article uses with TFLOPS/TOPS values) are renamed before validation by
:mod:`torchfl.hcd.validate`, which also reports where they were. Cross-field consistency
rules live there too, because they must be located and reported all at once.
"""

from __future__ import annotations

import re
from functools import cached_property
from typing import Annotated, Optional

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, WithJsonSchema

from torchfl.hcd.dtypes import MATRIX_UNITS, UNIT_OF_DTYPE, short_dtype
from torchfl.hcd.provenance import MAX_SOURCES, ProvenanceView, Source

SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)
CHIP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
DEVICE_TYPE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
LAYOUT = re.compile(r"^[A-Z]{1,8}$")


def _semver(value: str) -> str:
    if not SEMVER.fullmatch(value):
        raise ValueError(f"{value!r} is not a semantic version; write MAJOR.MINOR.PATCH such as \"1.0.0\"")
    return value


def _chip_name(value: str) -> str:
    if not CHIP_NAME.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a valid chip name; use letters, digits, '.', '_' or '-' "
            "(at most 64, starting with a letter or digit), e.g. \"NPU-V3\""
        )
    return value


def _device_type(value: str) -> str:
    if not DEVICE_TYPE.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a valid device type; use lower-case letters, digits and '_', "
            "starting with a letter, e.g. \"npu_v3\""
        )
    return value


def _layout(value: str) -> str:
    if not LAYOUT.fullmatch(value) or len(set(value)) != len(value):
        raise ValueError(
            f"{value!r} is not a layout: a layout is a permutation of distinct upper-case dimension "
            "letters, e.g. NCHW, NHWC, NHCW or NCWH"
        )
    return value


def _dtype(value: str) -> str:
    short = short_dtype(value)
    if not value.startswith("torch.") or short not in UNIT_OF_DTYPE:
        known = ", ".join(f"torch.{d}" for d in UNIT_OF_DTYPE)
        raise ValueError(f"{value!r} is not a dtype an HCD can list; write one of {known}")
    return value


def _power_of_two(value: int) -> int:
    if value & (value - 1):
        raise ValueError(f"{value} is not a power of two; DMA alignment is 1, 2, 4, ... bytes (e.g. 128 or 256)")
    return value


def _string(pattern: str, description: str) -> WithJsonSchema:
    return WithJsonSchema({"type": "string", "pattern": pattern, "description": description})


Semver = Annotated[str, AfterValidator(_semver), _string(SEMVER.pattern, "Semantic version MAJOR.MINOR.PATCH.")]
Layout = Annotated[str, AfterValidator(_layout), _string(
    LAYOUT.pattern, "Permutation of distinct upper-case dimension letters, e.g. NCHW, NHWC, NHCW, NCWH.")]
Dtype = Annotated[str, AfterValidator(_dtype), _string(
    r"^torch\.(" + "|".join(UNIT_OF_DTYPE) + r")$", "A torch dtype name such as torch.float16.")]


#: Longest list any HCD field may hold: a chip has a handful of layouts, dtypes or head counts.
MAX_LIST = 64
MAX_HEADS = 4096  # attention heads per layer; the largest models use 128


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


class Chip(_Model):
    """Identity of the chip and of this descriptor."""

    name: Annotated[str, AfterValidator(_chip_name), _string(CHIP_NAME.pattern, "Chip identifier.")] = Field(
        description="Unique chip identifier, e.g. NPU-V3 (the name users pass as options={'chip': ...}).")
    vendor: str = Field(min_length=1, max_length=200, description="Vendor or certifying body.")
    version: Semver = Field(description="Semantic version of this descriptor (MAJOR.MINOR.PATCH). "
                                        "A published version is immutable: change the file, bump the version.")
    device_type: Annotated[str, AfterValidator(_device_type), _string(DEVICE_TYPE.pattern, "Device string.")] = Field(
        description="The device string users write for this chip, e.g. npu_v3.")


# the smallest sustained share a file may state: a chip that sustains under 0.1% of its peak has
# a wrong peak, and a share of 5e-324 (a denormal) made every time infinite (issue 52)
SUSTAINED_MIN = 1e-3
SUSTAINED_UNIT = (f"Dimensionless, {SUSTAINED_MIN:g} <= f <= 1 (under {SUSTAINED_MIN:g} the peak itself is wrong); "
                  "format 1.1, absent means 1.")


class _Unit(_Model):
    """What every compute unit states: how many, and the layouts it computes in."""

    count: int = Field(gt=0, le=1_000_000, description="Number of units of this kind (cores).")
    supported_layouts: Optional[list[Layout]] = Field(
        default=None, min_length=1, max_length=MAX_LIST,
        description="Tensor layouts this unit computes in (permutations of dimension letters).")
    sustained_fraction: Optional[float] = Field(
        default=None, ge=SUSTAINED_MIN, le=1,
        description="Share of this unit's peak a large GEMM sustains, as measured. " + SUSTAINED_UNIT)


class FloatUnit(_Unit):
    """A floating-point matrix/vector unit (fp16, bf16 or fp32)."""

    peak_tflops: float = Field(ge=1e-6, le=100_000, description="Aggregate peak of all `count` units, in TFLOPS "
                                                             "(10^12 floating-point operations per second).")


class IntUnit(_Unit):
    """An integer unit (int8 with int32 accumulation)."""

    peak_tops: float = Field(ge=1e-6, le=1_000_000, description="Aggregate peak of all `count` units, in TOPS "
                                                             "(10^12 integer operations per second).")


class AttentionUnit(_Model):
    """A dedicated attention accelerator (scaled-dot-product attention)."""

    enabled: bool = Field(description="Whether the attention unit is present and usable.")
    max_sequence_length: Optional[int] = Field(default=None, gt=0, le=1 << 24,
                                               description="Longest sequence the unit accepts, in tokens.")
    supported_heads: Optional[list[Annotated[int, Field(ge=1, le=MAX_HEADS)]]] = Field(
        default=None, min_length=1, max_length=MAX_LIST,
        description=f"Head counts the unit runs (unique, each 1 to {MAX_HEADS}).")


class ComputeUnits(_Model):
    """Compute units by kind. At least one of fp16, bf16, fp32, int8."""

    fp16: Optional[FloatUnit] = None
    bf16: Optional[FloatUnit] = None
    fp32: Optional[FloatUnit] = None
    int8: Optional[IntUnit] = None
    attention: Optional[AttentionUnit] = None


class OnChipCache(_Model):
    size_kb: int = Field(gt=0, le=1 << 26, description="On-chip cache (scratchpad) size in KiB (1024 bytes).")
    bandwidth_gb_per_s: float = Field(ge=1e-6, le=1_000_000, description="On-chip cache bandwidth in GB/s (10^9 B/s).")
    retains_between_kernels: Optional[bool] = Field(
        default=None,
        description="Format 1.1: the cache is hardware-managed and keeps what one kernel wrote for the next "
                    "(a CPU's last-level cache, a GPU's L2), so a kernel whose whole traffic fits the cache "
                    "moves it at bandwidth_gb_per_s, not off-chip. Absent or false: a scratchpad, filled "
                    "from off-chip memory by every kernel.")


class OffChipMemory(_Model):
    bandwidth_gb_per_s: float = Field(ge=1e-6, le=1_000_000, description="Off-chip memory bandwidth in GB/s (10^9 B/s).")
    size_gb: Optional[float] = Field(default=None, ge=1e-6, le=1_000_000,
                                     description="Off-chip memory capacity in GiB (2^30 bytes); unbounded if absent.")
    sustained_fraction: Optional[float] = Field(
        default=None, ge=SUSTAINED_MIN, le=1,
        description="Share of bandwidth_gb_per_s a streaming kernel sustains, as measured. " + SUSTAINED_UNIT)


class Memory(_Model):
    on_chip_cache: OnChipCache
    off_chip_memory: OffChipMemory


class TensorRules(_Model):
    max_rank: int = Field(ge=1, le=16, description="Highest tensor rank the chip accepts.")
    supported_dtypes: list[Dtype] = Field(min_length=1, max_length=MAX_LIST, description="dtypes the chip stores and computes, "
                                                                    "written torch.float16, torch.int8, ...")
    default_layout: Layout = Field(description="Layout used when the user does not choose one; "
                                               "must be among the units' supported_layouts.")


class Constraints(_Model):
    max_batch_size: int = Field(ge=1, le=1 << 31, description="Largest batch (dimension 0) accepted.")
    max_sequence_length: int = Field(ge=1, le=1 << 31, description="Longest sequence accepted, in tokens.")
    memory_alignment_bytes: Annotated[int, AfterValidator(_power_of_two)] = Field(
        ge=1, le=1 << 20, description="Required alignment of every tensor address, in bytes (a power of two).")
    bfloat16_emulation: bool = Field(default=False, description="bfloat16 is emulated through float16 "
                                                                "(then list torch.float16, not torch.bfloat16).")


class Execution(_Model):
    """Format 1.1: how the chip runs kernels. Every field optional; absent, the 1.0 model
    applies (no launch cost, no wave quantisation)."""

    launch_overhead_us: Optional[float] = Field(
        default=None, ge=0, le=1_000_000,
        description="Fixed cost of every kernel launch in microseconds (10^-6 s), as the host sees one "
                    "call of a tiny kernel; added once per kernel step.")
    matrix_launch_overhead_us: Optional[float] = Field(
        default=None, ge=0, le=1_000_000,
        description="Fixed cost of a kernel launch on the matrix units (GEMM, convolution, attention: a "
                    "library call that picks and launches its kernels) in microseconds; absent: "
                    "launch_overhead_us.")
    graph_launch_overhead_us: Optional[float] = Field(
        default=None, ge=0, le=1_000_000,
        description="Cost of one kernel node in microseconds when a whole plan is submitted as one "
                    "graph (CUDA Graphs and the like: every kernel enqueued ahead, no host "
                    "synchronisation between kernels); it replaces launch_overhead_us and "
                    "matrix_launch_overhead_us for predictions that ask for graph submission (an "
                    "engine's decode step). Absent: the eager launch costs apply to every prediction.")
    concurrent_tiles: Optional[int] = Field(
        default=None, ge=1, le=1 << 24,
        description="Tiles the chip runs at once (integer: streaming multiprocessors, compute units, "
                    "cores). With tile_elements it sets the waves a kernel's compute takes.")
    tile_elements: Optional[int] = Field(
        default=None, ge=1, le=1 << 30,
        description="Output elements one of the concurrent tiles computes (integer, elements; e.g. "
                    "16384 for a 128 x 128 GEMM thread block). A kernel's output over tile_elements is "
                    "its tile count; tiles / concurrent_tiles rounded up is its waves.")
    row_resident_elements: Optional[int] = Field(
        default=None, ge=1, le=1 << 30,
        description="Longest row (integer, elements along the reduced dimension) that a row-wise "
                    "reduction (softmax, log-softmax and their backward, layer norm) keeps on one core "
                    "across its passes: what the chip's kernels hold in one core's registers or local "
                    "memory. A longer row is streamed in chunks of at most this many elements and read "
                    "from off-chip memory once per pass (statistics, then normalise). Absent: a row may "
                    "fill the whole on_chip_cache (format 1.0).")


#: chip-to-chip link fabrics an ``interconnect`` section may name
FABRICS = ("nvlink", "nvswitch", "xgmi", "ici", "pcie", "hccs", "roce", "infiniband", "ethernet")


def _fabric(value: str) -> str:
    if value not in FABRICS:
        import difflib

        close = difflib.get_close_matches(value, FABRICS, n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else "."
        raise ValueError(f"unknown fabric {value!r}{hint} Write one of: {', '.join(FABRICS)}")
    return value


class Links(_Model):
    """The chip's links to its peers: how many, and each one's rate in one direction."""

    count: int = Field(ge=1, le=1024, description="Links from this chip to its peers (integer, e.g. 18 NVLink4 "
                                                  "links on an H100 SXM5).")
    bandwidth_gb_per_s: float = Field(ge=1e-3, le=100_000, description="One link's bandwidth in ONE direction, "
                                                                        "GB/s (10^9 B/s): 25 for an NVLink3/4 link.")


class Interconnect(_Model):
    """Format 1.2 (optional): the chip-to-chip fabric, read only by multi-chip plans
    (``torchfl.planner.parallel``); a single-chip prediction never reads it."""

    fabric: Annotated[str, AfterValidator(_fabric), WithJsonSchema({"type": "string", "enum": list(FABRICS)})] = Field(
        description="The link technology and topology: " + " | ".join(FABRICS) + ".")
    links: Links
    domain_chips: int = Field(ge=2, le=1 << 20, description="Chips one fabric domain connects (an NVSwitch "
                                                            "node: 8); a plan over more chips is refused.")
    sustained_fraction: Optional[float] = Field(
        default=None, ge=SUSTAINED_MIN, le=1,
        description="Share of links x bandwidth (one direction) a large ring all-reduce sustains as bus "
                    "bandwidth (nccl-tests busbw / line rate). " + SUSTAINED_UNIT)
    latency_us: Optional[float] = Field(
        default=None, ge=0, le=1_000_000,
        description="Latency of one ring step (a chunk to the next chip and its flag), microseconds; "
                    "a ring all-reduce over p chips takes 2(p-1) steps. Absent: 0.")
    collective_overhead_us: Optional[float] = Field(
        default=None, ge=0, le=1_000_000,
        description="Fixed cost of one collective call (launch and set-up), microseconds. Absent: 0.")

    @property
    def bus_bytes_per_s(self) -> float:
        """Sustained bus bandwidth of a ring collective, bytes/s: links x rate x share."""
        share = 1.0 if self.sustained_fraction is None else float(self.sustained_fraction)
        return self.links.count * self.links.bandwidth_gb_per_s * 1e9 * share


#: Format 1.1's optional fields, the one list of them: canonical dotted path (``{unit}``: each of
#: MATRIX_UNITS) -> (the unit of its value, how ``hcd show`` words it with the value as ``v``).
#: ``format_version``, the registry's diff (units beside a change) and ``hcd show`` read it.
FORMAT_11_FIELDS = {
    "compute_units.{unit}.sustained_fraction": ("fraction of peak", "{v:.1%} of peak sustained"),
    "memory.off_chip_memory.sustained_fraction": ("fraction of bandwidth", "{v:.1%} sustained"),
    "memory.on_chip_cache.retains_between_kernels": ("", "kept between kernels: {v}"),
    "execution.launch_overhead_us": ("us", "{v:g} us per kernel launch"),
    "execution.matrix_launch_overhead_us": ("us", "{v:g} us per matrix-unit launch"),
    "execution.graph_launch_overhead_us": ("us", "{v:g} us per kernel in a submitted graph"),
    "execution.concurrent_tiles": ("tiles", "{v} tiles at once"),
    "execution.tile_elements": ("elements", "{v} output elements per tile"),
    "execution.row_resident_elements": ("elements", "rows of up to {v} elements kept on one core"),
}


def format_11_field(path: str) -> str | None:
    """The :data:`FORMAT_11_FIELDS` key a canonical path is an instance of (None: not a 1.1 field)."""
    if path in FORMAT_11_FIELDS:
        return path
    parts = path.split(".")
    if len(parts) == 3 and parts[0] == "compute_units" and parts[1] in MATRIX_UNITS:
        key = f"compute_units.{{unit}}.{parts[2]}"
        return key if key in FORMAT_11_FIELDS else None
    return None


class HCD(ProvenanceView, _Model):
    """Hardware Capability Descriptor, format version 1.0, 1.1 (the optional sustained
    fractions and the ``execution`` section) or 1.2 (``sources`` and ``provenance``:
    :mod:`torchfl.hcd.provenance`)."""

    chip: Chip
    compute_units: ComputeUnits
    memory: Memory
    tensor: TensorRules
    constraints: Constraints
    execution: Optional[Execution] = Field(
        default=None, description="Format 1.1: launch cost and the grain of parallel work (optional).")
    interconnect: Optional[Interconnect] = Field(
        default=None, description="Format 1.2: the chip-to-chip links multi-chip plans price (optional).")
    sources: dict[str, Source] = Field(
        default_factory=dict, max_length=MAX_SOURCES,
        description="Format 1.2: named references of the numbers (id -> kind, ref, benchmark, table, rows).")
    provenance: dict[str, str] = Field(
        default_factory=dict, max_length=256,
        description="Format 1.2: dotted path of a number (compute_units.fp16.peak_tflops) -> source id.")

    _warnings: tuple = PrivateAttr(default=())

    @property
    def warnings(self) -> tuple:
        """Warning diagnostics found when this HCD was validated (e.g. legacy unit keys)."""
        return self._warnings

    # -- derived views (no new facts, only the ones above seen from the planner's side) --

    @cached_property
    def dtypes(self) -> tuple[str, ...]:
        """Supported dtypes as short names (``float16``), in the file's order."""
        return tuple(short_dtype(d) for d in self.tensor.supported_dtypes)

    @cached_property
    def stored_dtypes(self) -> tuple[str, ...]:
        """The dtypes the chip's memory holds: :attr:`dtypes`, plus bfloat16 (last) when
        ``constraints.bfloat16_emulation`` computes it through float16."""
        extra = ("bfloat16",) if self.constraints.bfloat16_emulation and "bfloat16" not in self.dtypes else ()
        return self.dtypes + extra

    @cached_property
    def layouts(self) -> tuple[str, ...]:
        """Union of the units' layouts, the default first; just the default if no unit lists any."""
        seen = [self.tensor.default_layout]
        for unit in MATRIX_UNITS:
            u = getattr(self.compute_units, unit)
            for layout in (u.supported_layouts or []) if u else []:
                if layout not in seen:
                    seen.append(layout)
        return tuple(seen)

    def unit_for(self, dtype: str) -> str | None:
        """The compute-unit key that runs ``dtype`` (short or ``torch.`` name), or None.

        bfloat16 without a bf16 unit runs on the fp16 unit (at its peak) when the chip lists
        bfloat16 or emulates it; validation warns about the former.
        """
        dtype = short_dtype(dtype)
        unit = UNIT_OF_DTYPE.get(dtype)
        if unit and getattr(self.compute_units, unit) is not None:
            return unit
        if dtype == "bfloat16" and self.compute_units.fp16 is not None and "bfloat16" in self.stored_dtypes:
            return "fp16"
        return None

    def peak_ops_per_s(self, dtype: str) -> float | None:
        """Aggregate peak rate (operations per second) of the unit that runs ``dtype``."""
        unit = self.unit_for(dtype)
        if unit is None:
            return None
        u = getattr(self.compute_units, unit)
        return (u.peak_tops if unit == "int8" else u.peak_tflops) * 1e12

    def unit_layouts(self, unit: str) -> tuple[str, ...]:
        """Layouts a unit computes in: its own list, else the chip's layouts."""
        u = getattr(self.compute_units, unit, None)
        if u is None:
            return ()
        return tuple(u.supported_layouts) if u.supported_layouts else self.layouts

    def sustained_fraction(self, dtype: str) -> float:
        """Share of the peak of the unit that runs ``dtype`` a large GEMM sustains (1.1;
        1.0 when the file does not say)."""
        unit = self.unit_for(dtype)
        u = getattr(self.compute_units, unit) if unit else None
        return 1.0 if u is None or u.sustained_fraction is None else float(u.sustained_fraction)

    @property
    def format_version(self) -> str:
        """``"1.2"`` with sources or provenance, ``"1.1"`` when any format-1.1 field is set,
        else ``"1.0"``."""
        if self.sources or self.provenance or self.interconnect is not None:
            return "1.2"
        return "1.1" if self.execution is not None or self.format_11_values() else "1.0"

    def format_11_values(self) -> dict:
        """The format-1.1 fields this file states (:data:`FORMAT_11_FIELDS`, ``{unit}`` expanded):
        canonical path -> value."""
        out = {}
        for pattern in FORMAT_11_FIELDS:
            paths = [pattern.format(unit=u) for u in MATRIX_UNITS] if "{unit}" in pattern else [pattern]
            for path in paths:
                obj = self
                for part in path.split("."):
                    obj = getattr(obj, part, None)
                    if obj is None:
                        break
                if obj is not None:
                    out[path] = obj
        return out

    @property
    def name(self) -> str:
        return self.chip.name

    @property
    def version(self) -> str:
        return self.chip.version

