"""Chip numbers from microbenchmark tables, never from the op tables they are scored on.

``calibrate(hcd, tables)`` reads the rows of ``hcd``'s chip in microbenchmark tables
(``measurements/microbench/*.csv``: a ``# microbenchmark: gemm-sweep | copy-bandwidth |
launch-latency`` header, rows ``matmul`` / ``copy`` / ``launch``) and derives:

- ``execution.launch_overhead_us``: the median ``launch`` row (a one-element op's call);
- ``compute_units.<unit>.sustained_fraction``: per unit, the best GEMM row's achieved rate
  over the unit's peak (``2*M*N*K / (seconds - launch) / peak``);
- ``execution.matrix_launch_overhead_us``: from the smallest GEMM row of a call-timed table
  when it is latency-bound (its roofline time at the derived rates under half the measured
  time): the rest of its time; the sustained rates are then derived again with it (one pass);
- ``memory.off_chip_memory.sustained_fraction``: the best ``copy`` row's bytes
  (``2 * numel * itemsize``: read and write) per second over the off-chip bandwidth.

Which launch is taken off depends on how the table's harness timed a row, stated in a header
line ``# timing: kernel | call``. ``kernel`` (the default: GEMM sweeps and bandwidth tests time
back-to-back calls between device events, the launch hidden behind the previous kernel): a row
is the kernel's time and nothing is taken off. ``call`` (one call timed from the host around a
synchronise, as LLMCompass's tables are): a row holds one launch, which is taken off (the
matrix launch from GEMM rows, the launch from copy rows). Taking a launch off a kernel-timed row
would overstate the rate (MAMF's H100 bf16 row, 141 us: 0.80 of peak, 0.94 with 21 us off).

Each number is rounded to 4 significant digits (what a file states). A share above 1 (a row
faster than the stated peak) is capped at 1 with a warning: the peak is the wrong number.
``Calibration.apply(hcd)`` returns the chip with those numbers and ``microbenchmark``
provenance naming each table, so a calibrated chip predicts its own best rows and its
fidelity on other tables is out of sample. No torch here.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field

from torchfl.fidelity.sample import stem
from torchfl.fidelity.tables import stated_timing
from torchfl.hcd.dtypes import ITEMSIZE

__all__ = ["Derived", "Calibration", "calibrate", "calibrated_resolver", "benchmark_of", "timing_of"]

GEMM_OPS = {"aten.mm.default"}
COPY_OPS = {"aten.clone.default", "aten.copy.default"}
LAUNCH_ALIAS = "launch"
LATENCY_BOUND = 0.5       # roofline time under this share of the measured time: the launch dominates
BENCHMARK_OF_KIND = {"gemm": "gemm-sweep", "copy": "copy-bandwidth", "launch": "launch-latency"}


def _sig(x: float, digits: int = 4) -> float:
    return float(f"{x:.{digits}g}")


@dataclass(frozen=True)
class Derived:
    """One derived number: where it goes, its value, the table (stem) and row it came from."""

    path: str
    value: float
    table: str
    row: str              # file:line
    note: str = ""        # how: "fp16 8192x8192x8192: 70.0% of 100 TFLOPS"


@dataclass
class Calibration:
    """The numbers ``calibrate`` derived for one chip (path -> :class:`Derived`)."""

    chip: str
    numbers: dict = field(default_factory=dict)
    warnings: list = field(default_factory=list)
    benchmarks: dict = field(default_factory=dict)      # table stem -> (benchmark, reference)

    def __bool__(self) -> bool:
        return bool(self.numbers)

    def apply(self, hcd):
        """``hcd`` with the derived numbers, each with ``microbenchmark`` provenance naming its
        table (source id ``mb-<table stem>``); the rest of the file as it was."""
        from torchfl.hcd import HCD

        data = hcd.canonical()
        sources = dict(data.get("sources", {}))
        provenance = dict(data.get("provenance", {}))
        for path, d in self.numbers.items():
            node = data
            *parents, leaf = path.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = int(round(d.value)) if leaf in _INTEGER_FIELDS else d.value
            sid = f"mb-{d.table}"
            benchmark, ref = self.benchmarks.get(d.table, ("other", d.table))
            sources[sid] = {"kind": "microbenchmark", "benchmark": benchmark, "ref": ref or d.table,
                            "table": d.table}
            provenance[path] = sid
        data["sources"], data["provenance"] = sources, provenance
        return HCD.model_validate_json(json.dumps(data))

    def as_dict(self, hcd=None) -> dict:
        out = {}
        for path, d in self.numbers.items():
            old = hcd.performance_numbers().get(path) if hcd is not None else None
            out[path] = dict(value=d.value, previous=old, table=d.table, row=d.row, note=d.note)
        return dict(chip=self.chip, numbers=out, warnings=list(self.warnings))


_INTEGER_FIELDS = {"concurrent_tiles", "tile_elements", "row_resident_elements", "count", "size_kb"}


def benchmark_of(table) -> str | None:
    """The ``# microbenchmark: NAME`` header of a table, or None."""
    for c in table.comments:
        if c.lower().startswith("microbenchmark:"):
            words = c.split(":", 1)[1].split()
            return words[0] if words else None
    return None


def timing_of(table) -> str:
    """``kernel`` or ``call``: the ``# timing:`` header of a microbenchmark table, default kernel
    (parsed, and a word other than these refused, by :func:`torchfl.fidelity.tables.parse_table`)."""
    return stated_timing(table.comments)[0] or "kernel"


def _reference(table) -> str:
    for c in table.comments:
        if c.lower().startswith(("source:", "sources:")):
            return c.split(":", 1)[1].strip()[:400]
    return table.name


def _kind(row) -> str | None:
    if row.alias == LAUNCH_ALIAS:
        return "launch"
    if row.op in GEMM_OPS and len(row.shapes) == 2 and all(len(s) == 2 for s in row.shapes):
        return "gemm"
    if row.op in COPY_OPS:
        return "copy"
    return None


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def calibrate(hcd, tables) -> Calibration:
    """The numbers the rows of ``hcd``'s chip in the microbenchmark ``tables`` give (see the
    module docstring); rows of other chips and other ops are left out."""
    chip = hcd.chip.name
    cal = Calibration(chip)
    rows = {"gemm": [], "copy": [], "launch": []}
    for t in tables:
        kinds = []
        for r in (r for r in t.rows if r.chip == chip):
            kind = _kind(r)
            if kind is None:
                cal.warnings.append(f"{r.where}: {r.label()} is not a microbenchmark row (matmul MxK;KxN, copy, "
                                    "launch): left out")
            else:
                rows[kind].append((t, r))
                kinds.append(kind)
        if kinds:   # the header's benchmark, else the one its rows are
            cal.benchmarks[stem(t.path)] = (benchmark_of(t) or BENCHMARK_OF_KIND[kinds[0]], _reference(t))
    ex = hcd.execution
    launch_s = (ex.launch_overhead_us or 0.0) * 1e-6 if ex is not None else 0.0
    if rows["launch"]:
        launch_s = _launch(cal, rows["launch"])
    # the matrix launch until the smallest GEMM row says otherwise: the file's, else the launch
    stated = ex.matrix_launch_overhead_us if ex is not None else None
    matrix_s = launch_s if stated is None else stated * 1e-6
    mem_share = hcd.memory.off_chip_memory.sustained_fraction or 1.0
    if rows["copy"]:
        mem_share = _copy(cal, hcd, rows["copy"], launch_s)
    if rows["gemm"]:
        shares = _gemm(cal, hcd, rows["gemm"], matrix_s, record=False)
        derived = _matrix_launch(cal, hcd, rows["gemm"], shares, mem_share)
        _gemm(cal, hcd, rows["gemm"], derived if derived is not None else matrix_s, record=True)
    return cal


def _launch(cal: Calibration, rows) -> float:
    times = sorted(r.seconds for _t, r in rows)
    median = statistics.median(times)
    t, r = min(rows, key=lambda tr: abs(tr[1].seconds - median))
    value = _sig(median * 1e6)
    cal.numbers["execution.launch_overhead_us"] = Derived(
        "execution.launch_overhead_us", value, stem(t.path), r.where,
        f"median of {len(rows)} launch row{'s' if len(rows) != 1 else ''}: {value:g} us")
    return value * 1e-6


def _copy(cal: Calibration, hcd, rows, launch_s: float) -> float:
    bw = hcd.memory.off_chip_memory.bandwidth_gb_per_s * 1e9
    best = None
    for t, r in rows:
        nbytes = 2 * sum(_numel(s) for s in r.shapes[:1]) * ITEMSIZE.get(r.dtype, 4)
        kernel = r.seconds - (launch_s if timing_of(t) == "call" else 0.0)
        if kernel <= 0:
            cal.warnings.append(f"{r.where}: copy row faster than the launch ({r.seconds * 1e6:g} us): left out")
            continue
        rate = nbytes / kernel
        if best is None or rate > best[0]:
            best = (rate, t, r, nbytes)
    if best is None:
        return hcd.memory.off_chip_memory.sustained_fraction or 1.0
    rate, t, r, nbytes = best
    share = _capped(cal, r, rate / bw, f"{rate / 1e9:.1f} GB/s over the stated {bw / 1e9:g} GB/s")
    if share is None:
        return hcd.memory.off_chip_memory.sustained_fraction or 1.0
    cal.numbers["memory.off_chip_memory.sustained_fraction"] = Derived(
        "memory.off_chip_memory.sustained_fraction", share, stem(t.path), r.where,
        f"copy of {nbytes / 2 ** 30:.2f} GiB read+write: {rate / 1e9:.1f} GB/s, {share:.1%} of {bw / 1e9:g} GB/s")
    return share


def _capped(cal: Calibration, r, share: float, what: str) -> float | None:
    """The share as a file states it; capped at 1 (warned), None under the format's floor."""
    from torchfl.hcd.model import SUSTAINED_MIN

    if share < SUSTAINED_MIN:
        cal.warnings.append(f"{r.where}: {r.label()} reaches {share:.3%} of the HCD's figure ({what}), under the "
                            f"format's floor {SUSTAINED_MIN:g}: the stated figure or the row is wrong; left out")
        return None
    if share > 1.0:
        cal.warnings.append(f"{r.where}: {r.label()} reaches {share:.1%} of the HCD's figure ({what}): the stated "
                            "peak is too low; the share is capped at 1")
        return 1.0
    return _sig(share)


def _gemm_work(r) -> tuple[float, float]:
    (m, k), (k2, n) = r.shapes
    ops = 2.0 * m * k * n
    nbytes = float(m * k + k2 * n + m * n) * ITEMSIZE.get(r.dtype, 4)
    return ops, nbytes


def _gemm(cal: Calibration, hcd, rows, matrix_s: float, *, record: bool) -> dict:
    """unit -> sustained share of its best row (recorded in ``cal`` when ``record``)."""
    best: dict = {}
    for t, r in rows:
        unit = hcd.unit_for(r.dtype)
        if unit is None:
            if record:
                cal.warnings.append(f"{r.where}: no compute unit of {hcd.chip.name} runs {r.dtype}: left out")
            continue
        ops, _ = _gemm_work(r)
        kernel = r.seconds - (matrix_s if timing_of(t) == "call" else 0.0)
        if kernel <= 0:
            continue
        rate = ops / kernel
        if unit not in best or rate > best[unit][0]:
            best[unit] = (rate, t, r)
    shares = {}
    for unit, (rate, t, r) in sorted(best.items()):
        peak = hcd.peak_ops_per_s(r.dtype)
        word = "TOPS" if unit == "int8" else "TFLOPS"
        if record:
            share = _capped(cal, r, rate / peak, f"{rate / 1e12:.1f} {word} over the stated {peak / 1e12:g}")
            if share is None:
                continue
            (m, k), (_k, n) = r.shapes
            path = f"compute_units.{unit}.sustained_fraction"
            cal.numbers[path] = Derived(path, share, stem(t.path), r.where,
                                        f"{r.dtype} {m}x{k}x{n}: {rate / 1e12:.1f} {word}, {share:.1%} of "
                                        f"{peak / 1e12:g}")
            shares[unit] = share
        elif rate / peak >= 1e-3:
            shares[unit] = min(rate / peak, 1.0)
    return shares


def _matrix_launch(cal: Calibration, hcd, rows, shares: dict, mem_share: float) -> float | None:
    """Seconds of the matrix launch from the smallest GEMM row, when it is latency-bound."""
    usable = [(t, r) for t, r in rows if hcd.unit_for(r.dtype) in shares and timing_of(t) == "call"]
    if not usable:
        return None
    t, r = min(usable, key=lambda tr: (_gemm_work(tr[1])[0], tr[1].seconds))
    ops, nbytes = _gemm_work(r)
    unit = hcd.unit_for(r.dtype)
    compute = ops / (hcd.peak_ops_per_s(r.dtype) * shares[unit])
    memory = nbytes / (hcd.memory.off_chip_memory.bandwidth_gb_per_s * 1e9 * mem_share)
    roofline = max(compute, memory)
    if roofline >= LATENCY_BOUND * r.seconds:
        return None
    value = _sig((r.seconds - roofline) * 1e6)
    (m, k), (_k, n) = r.shapes
    cal.numbers["execution.matrix_launch_overhead_us"] = Derived(
        "execution.matrix_launch_overhead_us", value, stem(t.path), r.where,
        f"{r.dtype} {m}x{k}x{n}: {r.seconds * 1e6:g} us measured, {roofline * 1e6:.2f} us of roofline")
    return value * 1e-6


def calibrated_resolver(resolve, tables):
    """``resolve`` (chip name -> Target) with each chip calibrated on ``tables`` where they
    hold its rows; returns ``(resolver, calibrations)``, ``calibrations`` filled per chip as
    chips are resolved (``{chip: (Calibration, the registry's HCD)}``)."""
    from torchfl.planner.target import Target

    calibrations: dict = {}

    def resolver(name):
        target = resolve(name)
        cal = calibrate(target.hcd, tables)
        calibrations[name] = (cal, target.hcd)
        return Target.of(cal.apply(target.hcd), target.packs) if cal else target

    return resolver, calibrations
