"""Explain analyze: execute a plan and set what was measured beside what was predicted.

Per step: off-chip bytes the kernel counted (a fallback: the device->host->device round
trip of its tensors, as the planner prices it; a fold likewise), simulated time from those counts, and
the kernel's wall time on this CPU. Simulated time uses the executed tile plan's tiles
(per tile the larger of compute and memory time, as ``torchfl.kernels.tiling``) with
each tile's bytes and operations scaled by counted / planned, so it equals the
prediction exactly when the kernel moved what its tiling said. Route accounting counts,
per ATen op, the nodes that ran on each kernel or on the CPU during the run.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from torchfl.planner.plan import HOST_STEPS

HOST_LABEL = {"fallback": "CPU (torch)", "fold": "host (torch, folded)"}

__all__ = ["StepAnalysis", "AnalyzedPlan", "analyze", "from_record"]


@dataclass(frozen=True)
class StepAnalysis:
    index: int
    kind: str
    kernel: str
    label: str
    tile: str
    predicted_bytes: int
    measured_bytes: int
    predicted_time_s: float
    simulated_time_s: float
    wall_s: float

    @property
    def time_error(self) -> float:
        """(predicted - simulated) / simulated (0 when both are 0)."""
        if self.simulated_time_s == 0:
            return 0.0 if self.predicted_time_s == 0 else float("inf")
        return (self.predicted_time_s - self.simulated_time_s) / self.simulated_time_s

    @property
    def bytes_match(self) -> bool:
        return int(round(self.predicted_bytes)) == int(self.measured_bytes)


@dataclass
class AnalyzedPlan:
    """A plan with one measured run; :meth:`render` gives the text, :meth:`to_dict` JSON."""

    plan: object
    steps: list
    routes: dict
    wall_s: float
    kernel_s: float
    peak_bytes: int
    title: str = ""
    extra: dict = field(default_factory=dict)
    predicted_peak_bytes: int | None = None   # the executor's memory plan (plan.memory, or with static inputs)

    # -- totals --
    @property
    def predicted_bytes(self) -> int:
        return int(sum(round(s.predicted_bytes) for s in self.steps))

    @property
    def measured_bytes(self) -> int:
        return int(sum(s.measured_bytes for s in self.steps))

    @property
    def predicted_time_s(self) -> float:
        return float(sum(s.predicted_time_s for s in self.steps))

    @property
    def simulated_time_s(self) -> float:
        return float(sum(s.simulated_time_s for s in self.steps))

    @property
    def overhead_per_step_s(self) -> float:
        return max(0.0, self.wall_s - self.kernel_s) / max(1, len(self.steps))

    @property
    def worst(self):
        """The step with the largest |predicted - simulated| time error (None: no steps)."""
        if not self.steps:
            return None
        return max(self.steps, key=lambda s: (abs(s.time_error), -s.index))

    @property
    def mismatched(self) -> list:
        return [s for s in self.steps if not s.bytes_match]

    def peak_line(self) -> str:
        """The allocator's measured peak beside the memory plan's (equal, or why not)."""
        text = f"peak device memory measured {self.peak_bytes:,} B"
        if self.predicted_peak_bytes is None:
            return text
        text += f" / predicted {self.predicted_peak_bytes:,} B"
        if self.peak_bytes == self.predicted_peak_bytes:
            return text + " (equal)"
        return (text + f" (DIFFER by {self.peak_bytes - self.predicted_peak_bytes:+,} B: the run allocated "
                "what the memory plan does not model; torchfl.planner.memory describes what it does)")

    def route_lines(self) -> list:
        out = []
        for op in sorted(self.routes):
            parts = ", ".join(f"{n} x {k}" for k, n in sorted(self.routes[op].items(), key=lambda kv: (-kv[1], kv[0])))
            out.append((op, parts))
        return out

    def to_dict(self) -> dict:
        w = self.worst
        return {
            "title": self.title, "chip": self.plan.chip, "precision": self.plan.precision,
            "steps": [{"index": s.index, "kind": s.kind, "kernel": s.kernel, "ops": s.label, "tile": s.tile,
                       "predicted_bytes": int(round(s.predicted_bytes)), "measured_bytes": s.measured_bytes,
                       "predicted_time_s": s.predicted_time_s, "simulated_time_s": s.simulated_time_s,
                       "time_error": s.time_error if s.time_error != float("inf") else None,
                       "wall_s": s.wall_s} for s in self.steps],
            "totals": {"predicted_bytes": self.predicted_bytes, "measured_bytes": self.measured_bytes,
                       "predicted_time_s": self.predicted_time_s, "simulated_time_s": self.simulated_time_s,
                       "wall_s": self.wall_s, "kernel_wall_s": self.kernel_s,
                       "overhead_per_step_s": self.overhead_per_step_s, "peak_device_bytes": self.peak_bytes,
                       "predicted_peak_device_bytes": self.predicted_peak_bytes},
            "largest_time_error": None if w is None else {
                "step": w.index, "kernel": w.kernel, "error": w.time_error if w.time_error != float("inf") else None},
            "routes": {op: dict(c) for op, c in sorted(self.routes.items())},
        }

    def static(self, step) -> bool:
        """Whether ``step`` (a StepAnalysis) reads only parameters: it runs once, then cached."""
        return bool(self.plan.steps[step.index].static)

    def render(self, only=None, omitted_note: str = "") -> str:
        """The text of explain analyze, within the terminal's width (100 columns in a pipe).
        ``only``: the step indices to list (totals stay those of every step; ``omitted_note``
        says what was left out). The table's times have 3 significant digits (``427 us``, not
        ``426.584 us``: numbers never wrap, and the BERT layer's table reached 107 columns with
        them); the err column gives their difference, --json the full figures."""
        from torchfl.kernels.units import fmt_bytes
        from torchfl.planner.texttable import paragraph, table

        def _b(n) -> str:
            return fmt_bytes(n, compact=True)

        plan = self.plan
        head = self.title or f"EXPLAIN ANALYZE on {plan.chip}"
        lines = paragraph(f"{head}  (chip {plan.chip} {plan.chip_version}, precision "
                          f"{plan.precision or 'as captured'})")
        hdr = ("step", "kernel", "ops", "tile", "bytes", "measured", "pred time", "sim time", "err", "wall")
        rows = []
        for s in self.steps:
            if only is not None and s.index not in only:
                continue
            err = "inf" if s.time_error == float("inf") else f"{s.time_error * 100:+.1f}%"
            measured = "=" if s.bytes_match else f"{s.measured_bytes:,} !"
            rows.append((f"{s.index}{'*' if self.static(s) else ''}", s.kernel, s.label, s.tile or "-",
                         _b(s.predicted_bytes), measured, _cell_t(s.predicted_time_s),
                         _cell_t(s.simulated_time_s), err, _cell_t(s.wall_s)))
        lines += table(hdr, rows, right={0, 4, 5, 6, 7, 8, 9}, shrink_first=(2, 3))
        if omitted_note:
            lines.append(omitted_note)
        eq = "equal on every step" if not self.mismatched else \
            f"DIFFER on {len(self.mismatched)} step(s): " + ", ".join(str(s.index) for s in self.mismatched)
        lines.append("")
        lines += paragraph(f"Totals: off-chip bytes predicted {self.predicted_bytes:,} / measured "
                           f"{self.measured_bytes:,} ({eq})", subsequent="        ")
        once = [s for s in self.steps if self.static(s)]
        call = [s for s in self.steps if not self.static(s)]
        lines += paragraph(
            f"Per call ({len(call)} steps): time predicted {_t(sum(s.predicted_time_s for s in call))} / simulated "
            f"from counts {_t(sum(s.simulated_time_s for s in call))}, {_b(sum(s.predicted_bytes for s in call))} "
            f"off-chip" + (f"; run once ({len(once)} static steps*, cached on the chip after the first call): "
                           f"{_t(sum(s.predicted_time_s for s in once))} / "
                           f"{_t(sum(s.simulated_time_s for s in once))}, "
                           f"{_b(sum(s.predicted_bytes for s in once))}" if once else ""),
            indent="        ", subsequent="          ")
        lines += paragraph(f"Wall {_t(self.wall_s)} (kernels {_t(self.kernel_s)}; outside kernels, with this run's "
                           f"weight uploads: {self.overhead_per_step_s * 1e6:.1f} us/step over {len(self.steps)} "
                           f"steps); {self.peak_line()}", indent="        ",
                           subsequent="          ")
        w = self.worst
        if w is not None and abs(w.time_error) >= 5e-4:
            err = "inf" if w.time_error == float("inf") else f"{w.time_error * 100:+.2f}%"
            lines += paragraph(f"Largest predicted-vs-simulated time error: step {w.index} ({w.kernel}, "
                               f"{w.label}): {err}")
        elif w is not None:
            lines.append("Predicted time equals the time simulated from the counts on every step (within 0.05 %).")
        lines += _legend(rows)
        lines.append("Routes (per ATen op, counted during the run):")
        rl = self.route_lines()
        wop = max((len(op) for op, _ in rl), default=0)
        for op, parts in rl:
            lines += paragraph(f"{op.ljust(wop)}  {parts}", indent="  ", subsequent=" " * (wop + 4))
        if not rl:
            lines.append("  (no ops)")
        return "\n".join(lines)


def _legend(rows) -> list[str]:
    """The analyze table's markers, those that appear in it."""
    from torchfl.planner.texttable import paragraph

    items = ["bytes = predicted off-chip bytes; measured: = when the kernel counted exactly that many, else the "
             "count and !", "err = (predicted - simulated) / simulated time; sim time comes from the counted bytes "
             "and operations at the chip's rates; wall = this CPU's time to emulate the step (a warm run, with the "
             "weights kept as between calls; the first run loads or compiles the kernels)"]
    if any(r[0].endswith("*") for r in rows):
        items.insert(0, "* after the step = static: reads only parameters, runs once (analyze runs it to measure it)")
    out = ["Legend:"]
    for it in items:
        out += paragraph(it, indent="  ", subsequent="    ")
    return out


def _t(seconds: float) -> str:
    if seconds == 0:
        return "0"
    a = abs(seconds)
    if a >= 1:
        return f"{seconds:.3f} s"
    if a >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    if a >= 1e-6:
        return f"{seconds * 1e6:.3f} us"
    return f"{seconds * 1e9:.1f} ns"


def _cell_t(seconds: float) -> str:
    """A time in a table cell: 3 significant digits (``0`` stays ``0``)."""
    from torchfl.planner.texttable import human_time

    return "0" if seconds == 0 else human_time(seconds)


def _label(step) -> str:
    from .errors import aten_name

    if step.kind in ("cast", "layout"):
        return f"{','.join(step.inputs)} -> {','.join(o for o in step.outputs if o)}"
    return " + ".join(aten_name(o) for o in step.ops) or ",".join(step.nodes)


def _tile_text(step) -> str:
    from torchfl.planner.explain import tiling_text

    return tiling_text(step.tile or {})


def _simulated(step, rec, prep, chip) -> float:
    """Per-tile roofline of the executed tile plan, scaled to the counted totals."""
    from torchfl.kernels.tiling import Traffic, round_trip_time, simulated_time

    bytes_ = rec.bytes_read + rec.bytes_written
    if prep is not None and prep.link is not None:   # a link cast: one way over the off-chip link
        return round_trip_time(bytes_, chip) / 2
    if step.kind in HOST_STEPS or prep is None or prep.tile_plan is None:
        return round_trip_time(bytes_, chip) if step.kind in HOST_STEPS else 0.0
    tp = prep.tile_plan
    if not tp.groups:
        return simulated_time(Traffic(rec.bytes_read, rec.bytes_written, rec.flops), chip, step.dtype)
    planned_b, planned_f = tp.traffic.bytes, tp.traffic.flops
    return simulated_time(tp, chip, step.dtype, bytes_scale=bytes_ / planned_b if planned_b else 1.0,
                          flops_scale=rec.flops / planned_f if planned_f else 1.0)


def from_record(plan, record, executor, title: str = "") -> AnalyzedPlan:
    """Build the analysis of one measured run of ``executor`` (which ran ``plan``)."""
    preps = {p.step.index: p for p in executor.preps}
    steps = []
    for r in record.steps:
        step = plan.steps[r.index]
        steps.append(StepAnalysis(
            index=r.index, kind=step.kind, kernel=step.kernel or HOST_LABEL[step.kind], label=_label(step),
            tile=_tile_text(step), predicted_bytes=step.predicted_bytes,
            measured_bytes=r.bytes_read + r.bytes_written, predicted_time_s=step.predicted_time_s,
            simulated_time_s=_simulated(step, r, preps.get(r.index), executor.chip), wall_s=r.wall_s))
    mp = getattr(executor, "memory_plan", None)
    return AnalyzedPlan(plan, steps, {k: dict(v) for k, v in record.routes.items()}, record.total_s,
                        record.kernel_s, record.peak_bytes, title,
                        predicted_peak_bytes=None if mp is None else mp.peak_bytes)


def analyze(plan, inputs, *, chip=None, executor=None, title: str = "",
            progress=None, warm: bool = True) -> AnalyzedPlan:
    """Execute ``plan`` on ``inputs`` (flattened user inputs) and measure every step.

    ``progress(done, total, step)`` is called after each step of the first run (the first
    call of a kernel includes its Numba compile or cache load, tens of ms: a CLI shows a
    progress bar from it). ``warm`` (default): a second measured run gives the figures, so
    a step's wall time is what a call costs once its kernel is loaded, not that first
    call's compile (a ResNet-50 conv: ~1-2 ms, not 20-50), and its per-call steps read the
    static values the executor keeps between calls (frozen weights: a GEMM's packed B, as in a
    real call, not re-packed per call); counted bytes are the same in both runs. ``chip``:
    as for :class:`~torchfl.runtime.executor.Executor` (default: the plan's target). ``AnalyzedPlan.render()`` is the text of explain analyze; ``to_dict()``
    its JSON."""
    from .executor import Executor, Record

    ex = executor or Executor(plan, chip)
    rec = Record(on_step=progress)
    ex.run(tuple(inputs), rec)
    if warm:
        for _ in range(2):          # plain calls: the first keeps the static values, frozen; the
            ex.run(tuple(inputs))   # second derives from them what kernels keep (packed weights)
        rec = Record(kept_static=True)
        ex.run(tuple(inputs), rec)
    return from_record(plan, rec, ex, title)
