"""``torchfl.explain``: the plan of a model on a chip, as text (or JSON), optionally analysed.

    torchfl.explain(compiled_model, x)                      # a torch.compile(..., backend="torchfl") model
    torchfl.explain(model, x, chip="NPU-V3", precision="float16", analyze=True)

A compiled model is run once on the inputs (under ``torch.no_grad``) and every graph
Dynamo sends to the backend reports its plan; graph breaks give one section per graph.
A plain module is captured whole with ``torch.export`` and planned directly.
"""
from __future__ import annotations

import json

__all__ = ["explain", "explain_plans"]


def _is_compiled(model) -> bool:
    import torch

    return isinstance(model, torch._dynamo.eval_frame.OptimizedModule) or \
        hasattr(model, "_torchdynamo_orig_callable")


def explain_plans(entries, *, analyze: bool, format: str = "text") -> str:  # noqa: A002
    """Render ``[(title, plan, AnalyzedPlan | None)]``."""
    if format == "json":
        out = []
        for title, plan, an in entries:
            item = {"title": title, "plan": json.loads(plan.to_json())}
            if an is not None:
                item["analyze"] = an.to_dict()
            out.append(item)
        return json.dumps(out[0] if len(out) == 1 else out, indent=2, sort_keys=True)
    if format == "dot":
        return "\n".join(plan.explain("dot") for _t, plan, _a in entries)
    parts = []
    for title, plan, an in entries:
        block = [f"== {title} ==", plan.explain("text")] if len(entries) > 1 else [plan.explain("text")]
        if an is not None:
            block += ["", an.render()]
        parts.append("\n".join(block))
    return "\n\n".join(parts)


def explain(model, *inputs, chip=None, precision=None, analyze: bool = False, strict: bool = False,
            registry=None, format: str = "text", return_analysis: bool = False):  # noqa: A002
    """The plan of ``model`` on ``inputs`` (see the module docstring).

    ``return_analysis=True`` returns ``(text, [AnalyzedPlan, ...])`` (tests, benchmarks)."""
    import torch

    from .analyze import from_record

    if format not in ("text", "json", "dot"):
        raise ValueError(f"format must be text, json or dot, got {format!r}")
    if not inputs:
        raise TypeError("torchfl.explain needs the model's example inputs: explain(model, *inputs)")
    entries = []
    analyses = []
    if _is_compiled(model) and chip is None:
        from .recording import recording

        with recording(analyze) as rec, torch.no_grad():
            model(*inputs)
        if not rec.entries:
            raise ValueError("torchfl.explain: the model ran no torchfl graph; compile it with "
                             "torch.compile(model, backend=\"torchfl\", options={\"chip\": ...}), or pass "
                             "chip= to plan the plain module")
        n = len(rec.entries)
        for i, (cg, plan, record) in enumerate(rec.entries):
            title = f"graph {i + 1} of {n} ({cg.kind})"
            an = None
            if record is not None:
                entry = next(e for e in cg.entries.values() if e.plan is plan)
                an = from_record(plan, record, entry.executor, f"EXPLAIN ANALYZE {title}")
                analyses.append(an)
            entries.append((title, plan, an))
    else:
        from torchfl.planner import plan_module

        if chip is None:
            raise ValueError("torchfl.explain: pass chip= (e.g. chip=\"NPU-V3\") for a model not compiled "
                             "with backend=\"torchfl\"")
        module = getattr(model, "_orig_mod", model)
        plan = plan_module(module, inputs, chip=chip, precision=precision, strict=strict, registry=registry)
        an = None
        if analyze:
            from .analyze import analyze as run_analyze
            from .executor import Executor

            flat = [x for x in torch.utils._pytree.tree_leaves(list(inputs))]
            ex = Executor(plan, strict=strict)
            an = run_analyze(plan, flat, executor=ex, title="EXPLAIN ANALYZE")
            analyses.append(an)
        entries.append(("graph 1 of 1 (exported)", plan, an))
    text = explain_plans(entries, analyze=analyze, format=format)
    return (text, analyses) if return_analysis else text
