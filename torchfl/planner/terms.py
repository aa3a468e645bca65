"""What each step of a priced plan paid for: its launch and the term that bound its body.

A plan records each step's predicted time, not the terms :func:`~torchfl.kernels.tiling.time_terms`
added up to get it. Confidence (which numbers priced a prediction) and the bound a what-if answer
names (launch-bound vs memory-bound) need those terms, so this module reads them again: a chip
step's tile plan is rebuilt from the step (its kernel, the values' shapes, dtypes and layouts, its
attributes, as the runtime rebuilds it) and priced by the same ``time_terms`` on the same chip. The
rebuilt total must equal the step's predicted time; where it does not (a price the planner adjusted
after tiling), the step is split from its own counts instead and marked ``exact=False``. Nothing here
changes a price.

Terms (``StepTerms.bound`` and the keys of :func:`term_times`):

- ``launch``: the fixed cost of launching the kernel (HCD ``execution.*launch_overhead_us``);
- ``compute``: operations on the dtype's unit (peak x sustained fraction);
- ``off-chip``: bytes over the off-chip memory (bandwidth x sustained fraction);
- ``on-chip cache``: bytes a cache that keeps data between kernels serves (its bandwidth);
- ``host link``: a CPU fallback's or a host dtype's round trip over the off-chip link.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TERMS", "StepTerms", "step_terms", "plan_terms", "term_times", "dominant_term"]

TERMS = ("launch", "compute", "off-chip", "on-chip cache", "host link")


@dataclass(frozen=True)
class StepTerms:
    """One step's predicted time split: ``launch_s`` + ``body_s`` (= ``time_s``), the body bound
    by ``bound`` (one of :data:`TERMS` but ``launch``); ``kernel`` for the launch's numbers."""

    index: int
    time_s: float
    launch_s: float
    body_s: float
    bound: str
    dtype: str
    kernel: str
    exact: bool = True


def _kernel_layout(layout, rank: int):
    from torchfl.planner.records import identity_layout

    return None if not layout or layout == identity_layout(rank) else layout


def _rebuilt(step, plan, chip):
    """``time_terms`` of the step's tile plan rebuilt on ``chip``, or None where it cannot be."""
    from torchfl.kernels.catalog import CATALOG
    from torchfl.kernels.tiling import time_terms

    spec = CATALOG.get(step.kernel or "")
    if spec is None:
        return None
    bound = [(n, plan.values.get(v), lay) for n, v, lay in zip(spec.input_names, step.inputs, step.layouts_in) if v]
    if any(val is None for _n, val, _l in bound):
        return None
    shapes = {n: tuple(v.shape) for n, v, _l in bound}
    dtypes = {n: v.dtype for n, v, _l in bound}
    layouts = {n: _kernel_layout(lay, len(v.shape)) for n, v, lay in bound}
    first = next((dtypes[n] for n in spec.input_names if n in dtypes), None)
    attrs = {k: v for k, v in (step.attrs or {}).items() if k in spec.attrs}
    for dtype in dict.fromkeys((step.dtype, first)):
        try:
            problem = spec.problem(shapes, attrs, None if spec.mixed_dtypes else dtype, layouts, dtypes)
            terms = time_terms(spec.tile(problem, chip), chip, problem.dtype)
        except Exception:  # noqa: BLE001 - a step this reading cannot rebuild is split from its counts
            continue
        if _same(terms.total_s, step.predicted_time_s):
            return terms
    return None


def _same(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(abs(a), abs(b), 1e-15)


def _estimated(step, chip) -> StepTerms:
    """A step whose tile plan could not be rebuilt: its launch as the chip prices that kernel's,
    the rest bound by the larger of its operations and its bytes at the chip's sustained rates."""
    t = float(step.predicted_time_s)
    launch = min(t, float(chip.launch_for(step.kernel or ""))) if t > 0 else 0.0
    rate = chip.peak_for(step.dtype) * chip.sustained_for(step.dtype)
    comp = step.predicted_flops / rate if step.predicted_flops else 0.0
    mem = step.predicted_bytes / (chip.offchip_bw * chip.offchip_sustained)
    return StepTerms(step.index, t, launch, t - launch, "compute" if comp > mem else "off-chip", step.dtype,
                     step.kernel or "", exact=False)


def step_terms(step, plan, chip) -> StepTerms:
    """The terms of one step of ``plan`` priced on ``chip`` (a ChipModel)."""
    t = float(step.predicted_time_s)
    if step.kind in ("fallback", "fold") or (step.tile or {}).get("strategy") in ("cpu", "link"):
        return StepTerms(step.index, t, 0.0, t, "host link", step.dtype, step.kernel or "")
    terms = _rebuilt(step, plan, chip) if t > 0 else None
    if terms is None:
        return _estimated(step, chip) if t > 0 else StepTerms(step.index, 0.0, 0.0, 0.0, "off-chip", step.dtype,
                                                            step.kernel or "")
    return StepTerms(step.index, t, terms.launch_s, t - terms.launch_s, terms.bound, step.dtype, step.kernel or "")


def plan_terms(plan, chip, *, per_call: bool = True) -> list[StepTerms]:
    """Every step's terms (``per_call``: the steps every call pays, run-once steps left out)."""
    return [step_terms(s, plan, chip) for s in plan.steps if not (per_call and s.static)]


def term_times(terms) -> dict[str, float]:
    """Seconds per term over ``terms`` (every key of :data:`TERMS`, zeros kept)."""
    out = dict.fromkeys(TERMS, 0.0)
    for t in terms:
        out["launch"] += t.launch_s
        out[t.bound] += t.body_s
    return out


def dominant_term(terms) -> tuple[str, float]:
    """(the term that takes the largest share of the time, that share); ("-", 0.0) for no time."""
    times = term_times(terms)
    total = sum(times.values())
    if total <= 0:
        return "-", 0.0
    name = max(TERMS, key=lambda k: times[k])
    return name, times[name] / total
