"""One model on several chips, side by side: a row per chip, ranked the one way every caller
shows them (``torchfl plan compare``, a sweep on a cluster)."""

from __future__ import annotations

import time

from torchfl.planner.whatif.planning import Planned, plan_everywhere


def bound_resource(plan, chip_model) -> tuple[str, float]:
    """("compute" | "memory", share of the predicted time in steps bound by it): a step is
    memory-bound when its off-chip bytes take longer than its operations on the unit."""
    mem = comp = 0.0
    for s in plan.steps:
        if s.static:
            continue            # run once: not what a call is bound by
        t_mem = s.predicted_bytes / chip_model.offchip_bw
        t_comp = s.predicted_flops / chip_model.peak_for(s.dtype) if s.predicted_flops else 0.0
        if t_mem >= t_comp:
            mem += s.predicted_time_s
        else:
            comp += s.predicted_time_s
    total = mem + comp
    if total == 0:
        return "-", 0.0
    return ("memory", mem / total) if mem >= comp else ("compute", comp / total)


def row(p: Planned, chip) -> dict:
    """What compare prints per chip (JSON-able)."""
    out = {"chip": p.chip, "version": p.version, "precision": p.precision, "planning_s": round(p.planning_s, 3)}
    if not p.ok:
        out.update(ok=False, error_kind=p.error.kind, error=str(p.error),
                   field=getattr(p.error, "field", None))
        return out
    plans = [x for x in (p.plan, p.backward) if x is not None]
    bound, share = bound_resource(p.plan, chip.model)
    out.update(
        ok=True,
        per_call_time_s=sum(x.summary.per_call_time_s for x in plans),
        per_call_bytes=sum(int(x.summary.per_call_bytes) for x in plans),
        run_once_time_s=sum(x.summary.run_once_time_s for x in plans),
        run_once_bytes=sum(int(x.summary.run_once_bytes) for x in plans),
        peak_bytes=p.peak_bytes,
        capacity_bytes=chip.model.memory_bytes,
        kernels=sum(x.summary.kernels for x in plans),
        fused_groups=sum(x.summary.fused_groups for x in plans),
        conversions=sum(x.summary.conversions for x in plans),
        fallbacks=sum(x.summary.fallbacks for x in plans),
        bound=bound, bound_share=round(share, 3))
    return out


def compare(module, inputs, chips, precision="auto", training=False) -> dict:
    """Rows per chip, fastest first, chips whose plan failed last (with the error)."""
    t0 = time.perf_counter()
    results = plan_everywhere(module, inputs, chips, precision, training)
    by_name = {c.name: c for c in chips}
    rows = [row(p, by_name[p.chip]) for p in results]
    rank_compare_rows(rows)
    return {"rows": rows, "training": training, "planning_s": round(time.perf_counter() - t0, 3)}


def rank_compare_rows(rows: list) -> list:
    """Sort ``compare``'s rows in place the one way every caller shows them (a sweep on a
    cluster too): plans that fit first, then the fastest per call, then by chip name."""
    rows.sort(key=lambda r: (not r["ok"], r.get("per_call_time_s") or 0.0, r["chip"]))
    return rows
