"""``plan compare`` and ``plan impact --models`` as sweeps: one unit per chip, one per model.

A unit loads its model on the worker (a zoo name, or ``path/to/file.py:factory`` at the same
absolute path on every node), resolves its chip(s) in the sweep's registry and plans;
its result is the row ``plan compare`` prints (``whatif.row``) or a model's
``ModelImpact.to_dict()``. The driver turns the rows back into what the commands print.
Each unit captures the model itself (a local ``compare`` captures once for every chip): on a
cluster the capture is paid per unit, in parallel.
"""

from __future__ import annotations

import time
from pathlib import Path

from torchfl.cluster.sweep import run_sweep as run_units
from torchfl.cluster.units import Unit


def model_spec(model: str) -> str:
    """A model file's path made absolute (workers do not share the driver's working directory)."""
    if ":" in model and model.rsplit(":", 1)[0].endswith(".py"):
        path, name = model.rsplit(":", 1)
        return f"{Path(path).resolve()}:{name}"
    return model


def _load(model: str, size: dict):
    from torchfl.planner.zoo import load_model

    return load_model(model, batch=size.get("batch"), seq_len=size.get("seq_len"), num_heads=size.get("heads"),
                      layers=size.get("layers"))


def compare_unit(model: str, size: dict, chip: str, registry: str | None, precision, training: bool) -> dict:
    """One chip's row of ``plan compare`` (runs on a worker)."""
    from torchfl.planner import whatif

    module, inputs = _load(model, size)
    target = whatif.chip_of(chip, registry)
    (planned,) = whatif.plan_everywhere(module, inputs, [target], precision, training)
    from torchfl.planner.confidence import fidelity_evidence

    # the chip's out-of-sample check read from the same registry as the local compare reads it
    return whatif.row(planned, target, fidelity_evidence(registry, [chip]))


def impact_unit(chip: str, v1: str, v2: str, model: str, registry: str | None, precision, training: bool) -> dict:
    """One model of ``plan impact`` re-planned on both versions (runs on a worker)."""
    from torchfl.planner import whatif

    module, inputs = _load(model, {})
    c1, c2 = whatif.chip_of(chip, registry, v1), whatif.chip_of(chip, registry, v2)
    before, after = whatif.plan_everywhere(module, inputs, [c1, c2], precision, training)
    from torchfl.planner.confidence import fidelity_evidence

    return whatif.diff_plans(before, after, model, c1, c2, fidelity_evidence(registry, [chip])).to_dict()


def _chip_hashes(reg, names, versions=None) -> dict:
    out = {}
    for name in names:
        for version in versions or (None,):
            rec = reg.record(name, version)
            out[f"{name}@{rec.version}"] = rec.content_hash
    return out


def sweep_compare(model: str, size: dict, names: list[str], registry, precision, training: bool, *, runner, resume,
                  echo, state: dict) -> dict:
    """``whatif.compare``'s answer, each chip planned as a unit."""
    t0 = time.perf_counter()
    model = model_spec(model)
    spec = dict(model=model, size=size, precision=precision, training=training,
                chips=_chip_hashes(registry, names), tool="plan compare")
    units = [Unit(name, "torchfl.cluster.whatif:compare_unit", (model, size, name, registry.url, precision, training))
             for name in names]
    got = run_units(runner, "compare", f"compare {Path(model).name[:60]} on {len(names)} chips", spec, units,
                    registry=registry, resume=resume, echo=echo, state=state)
    from torchfl.planner.whatif import rank_compare_rows

    rows = rank_compare_rows([got[name] for name in names])
    return {"rows": rows, "training": training, "planning_s": round(time.perf_counter() - t0, 3)}


def sweep_impact(chip: str, v1: str, v2: str, models: list[str], registry, precision, training: bool, *, runner,
                 resume, echo, state: dict):
    """``whatif.impact``'s answer, each model re-planned as a unit."""
    from torchfl.planner.whatif import Impact, ModelImpact

    models = [model_spec(m) for m in models]
    changes = [c.as_dict() for c in registry.diff(chip, v1, v2)]
    spec = dict(chip=chip, versions=_chip_hashes(registry, [chip], [v1, v2]), models=models, precision=precision,
                training=training, tool="plan impact")
    units = [Unit(m, "torchfl.cluster.whatif:impact_unit", (chip, v1, v2, m, registry.url, precision, training))
             for m in models]
    got = run_units(runner, "impact", f"impact {chip} {v1}->{v2} on {len(models)} models", spec, units,
                    registry=registry, resume=resume, echo=echo, state=state)
    return Impact(chip, v1, v2, changes, [ModelImpact(**got[m]) for m in models])


def check_model(model: str) -> None:
    """Refuse an unknown model on the driver, before any unit is sent (ModelError)."""
    from torchfl.planner.zoo import ZOO, ModelError

    if model in ZOO:
        return
    if ":" in model and model.rsplit(":", 1)[0].endswith(".py"):
        path = Path(model.rsplit(":", 1)[0])
        if not path.is_file():
            raise ModelError(f"model file {path} does not exist (MODEL is a zoo name or path/to/file.py:factory)")
        return
    raise ModelError(f"unknown model {model!r}; the zoo has {', '.join(ZOO)}, or give path/to/file.py:factory")
