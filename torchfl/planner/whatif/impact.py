"""The impact of a new version of a chip: one model set planned on both versions, what
changed per model (assignments, fallbacks, fusions) and which models it breaks."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from torchfl.planner.whatif.compare import row
from torchfl.planner.whatif.planning import Planned, chip_of, plan_everywhere

if TYPE_CHECKING:
    from torchfl.planner.target import Target


@dataclass
class ModelImpact:
    model: str
    before: dict
    after: dict
    changed_steps: list
    new_fallbacks: list
    fusions_lost: list
    fusions_gained: list
    broke: bool

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Impact:
    chip: str
    v1: str
    v2: str
    changes: list
    models: list

    @property
    def broken(self) -> list:
        return [m.model for m in self.models if m.broke]

    def to_dict(self) -> dict:
        return {"chip": self.chip, "from": self.v1, "to": self.v2, "changes": self.changes,
                "models": [m.to_dict() for m in self.models], "broken": self.broken}


def _assignments(plan) -> dict:
    """FX node group -> how the plan runs it (kernel, layouts, dtype, tiling)."""
    out = {}
    for s in plan.steps:
        if s.kind in ("cast", "layout") or not s.nodes:
            continue
        tile = s.tile or {}
        tiles = tile.get("tiles") or {}
        tiling = tile.get("strategy", "") + ("(" + ",".join(f"{k}={v}" for k, v in
                                                             (tiles.items() if isinstance(tiles, dict) else tiles))
                                             + ")" if tiles else "")
        out["+".join(s.nodes)] = {"kind": s.kind, "kernel": s.kernel or ("cpu" if s.kind == "fallback" else "host"),
                                 "layout": s.layout_out, "layouts_in": ",".join(dict.fromkeys(s.layouts_in)),
                                 "dtype": s.dtype, "tiling": tiling}
    return out


def _summary(p: Planned, chip, evidence: dict | None = None) -> dict:
    r = row(p, chip, evidence)
    r.pop("planning_s", None)
    return r


def diff_plans(before: Planned, after: Planned, model: str, chip1: Target, chip2: Target,
               evidence: dict | None = None) -> ModelImpact:
    """What changed for one model between two chips' plans (each summary with its confidence;
    ``evidence``: chip name -> fidelity summary)."""
    b, a = _summary(before, chip1, evidence), _summary(after, chip2, evidence)
    if not (before.ok and after.ok):
        return ModelImpact(model, b, a, [], [], [], [], broke=before.ok and not after.ok)
    x, y = _assignments(before.plan), _assignments(after.plan)
    node_of = {}
    for groups in (x, y):
        for g in groups:
            for n in g.split("+"):
                node_of.setdefault(n, set()).add(g)
    changed = []
    for g in sorted(set(x) | set(y)):
        if g in x and g in y:
            diff = {k: [x[g][k], y[g][k]] for k in x[g] if x[g][k] != y[g][k]}
            if diff:
                changed.append({"nodes": g, "changed": diff, "before": x[g], "after": y[g]})
        elif g in y:
            changed.append({"nodes": g, "changed": {"grouping": ["-", "new group"]}, "before": None, "after": y[g]})
        else:
            changed.append({"nodes": g, "changed": {"grouping": ["group", "split or merged"]}, "before": x[g],
                            "after": None})
    fb1 = {f.node for f in before.plan.fallbacks}
    new_fb = [{"node": f.node, "op": f.op, "reason": f.reason} for f in after.plan.fallbacks if f.node not in fb1]
    fused = lambda groups: {g for g, v in groups.items() if v["kind"] == "fused"}  # noqa: E731
    return ModelImpact(model, b, a, changed, new_fb, sorted(fused(x) - fused(y)), sorted(fused(y) - fused(x)),
                       broke=False)


def impact(chip_name: str, v1: str, v2: str, models, registry=None, precision="auto", training=False,
           progress=None) -> Impact:
    """``models``: (label, module, inputs). Each is captured once and planned on both versions."""
    from torchfl.planner.confidence import fidelity_evidence
    from torchfl.registry import open_registry

    reg = open_registry(registry)
    evidence = fidelity_evidence(reg, [chip_name])
    changes = [c.as_dict() for c in reg.diff(chip_name, v1, v2)]
    c1, c2 = chip_of(chip_name, reg, v1), chip_of(chip_name, reg, v2)
    out = []
    for label, module, inputs in models:
        before, after = plan_everywhere(module, inputs, [c1, c2], precision, training)
        out.append(diff_plans(before, after, label, c1, c2, evidence))
        if progress is not None:
            progress(out[-1])
    return Impact(chip_name, v1, v2, changes, out)
