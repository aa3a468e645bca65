"""One model on several chips, side by side: a row per chip, ranked the one way every caller
shows them (``torchfl plan compare``, a sweep on a cluster)."""

from __future__ import annotations

import time

from torchfl.planner.whatif.planning import Planned, plan_everywhere


#: what a term is called where a time's bound is named ("launch-bound", "memory-bound")
BOUND_WORDS = {"launch": "launch", "compute": "compute", "off-chip": "memory", "on-chip cache": "cache",
               "host link": "host"}


def bound_resource(plan, chip_model) -> tuple[str, float]:
    """(the term that takes the largest share of the plan's per-call time, that share): one of
    ``launch`` (kernel launch costs), ``compute``, ``memory`` (off-chip bytes), ``cache`` (bytes
    an on-chip cache keeps between kernels), ``host`` (CPU fallbacks' round trips). Each step's
    time is split into its launch and the term that bound its body (:mod:`torchfl.planner.terms`),
    so a step of small kernels is launch-bound, not memory-bound at 100%."""
    from torchfl.planner.terms import dominant_term, plan_terms

    term, share = dominant_term(plan_terms(plan, chip_model))
    return BOUND_WORDS.get(term, term), share


def row(p: Planned, chip, evidence: dict | None = None) -> dict:
    """What compare prints per chip (JSON-able); ``evidence``: chip name -> fidelity summary
    (:func:`~torchfl.planner.confidence.fidelity_evidence`) for the confidence's check."""
    from torchfl.planner.confidence import confidence

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
        bound=bound, bound_share=round(share, 3),
        confidence=confidence(plans, chip, (evidence or {}).get(p.chip) if evidence is not None else None).to_dict())
    return out


def compare(module, inputs, chips, precision="auto", training=False, registry=None) -> dict:
    """Rows per chip, fastest first (by :func:`~torchfl.planner.confidence.rank_time`: a chip is
    never first only because its file leaves a number out), chips whose plan failed last (with
    the error). ``registry``: where each chip's fidelity evidence is read (None: the default)."""
    from torchfl.planner.confidence import RANK_RULE, fidelity_evidence

    t0 = time.perf_counter()
    results = plan_everywhere(module, inputs, chips, precision, training)
    by_name = {c.name: c for c in chips}
    evidence = fidelity_evidence(registry, list(by_name))
    rows = [row(p, by_name[p.chip], evidence) for p in results]
    ranked_by_rule(rows, results, chips)
    rank_compare_rows(rows)
    return {"rows": rows, "training": training, "planning_s": round(time.perf_counter() - t0, 3),
            "rank_rule": RANK_RULE}


def ranked_by_rule(rows: list, results: list, chips) -> None:
    """Set ``rank_time_s`` on each planned row whose chip leaves out a number another compared
    chip states (:func:`~torchfl.planner.confidence.rank_time`)."""
    from torchfl.planner.confidence import rank_time

    by_name = {c.name: c for c in chips}
    for r, p in zip(rows, results):
        if r["ok"] and r["confidence"]["missing"]:
            t = rank_time(r["per_call_time_s"], [x for x in (p.plan, p.backward) if x is not None],
                          by_name[p.chip], chips)
            if t != r["per_call_time_s"]:
                r["rank_time_s"] = t


def rank_compare_rows(rows: list) -> list:
    """Sort ``compare``'s rows in place the one way every caller shows them (a sweep on a
    cluster too): plans that fit first, then the fastest per call (``rank_time_s`` where the rank
    rule priced a chip's missing numbers, :func:`ranked_by_rule`), then by chip name."""
    rows.sort(key=lambda r: (not r["ok"], r.get("rank_time_s") or r.get("per_call_time_s") or 0.0, r["chip"]))
    return rows
