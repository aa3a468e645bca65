"""``torchfl fidelity`` as a sweep: one unit per chip, its rows planned on the worker.

A unit loads the tables (the same files at the same absolute paths on every node: the
sweep's spec pins their hashes), plans the rows of its chip (``fidelity.run.score_tables``
with ``chip=``) and returns each row's prediction as plain data; the driver puts them back in
table order as ``Prediction`` objects and scores them, so the command prints and records what a
local run would.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from torchfl.cluster.sweep import run_sweep
from torchfl.cluster.units import Unit


def _resolver(registry):
    from torchfl.planner.errors import ChoiceError
    from torchfl.planner.target import resolve_target
    from torchfl.registry import NotFound

    def resolve(name):
        try:
            return resolve_target(name, registry)
        except (NotFound, ChoiceError) as exc:      # the row's chip is not in the registry
            raise LookupError(str(exc)) from None

    return resolve


def fidelity_unit(paths: list, chip: str, registry: str | None) -> list[dict]:
    """Every row of ``chip`` in the tables, planned here: predictions in table order (a worker's unit)."""
    from torchfl.fidelity.run import score_tables
    from torchfl.fidelity.tables import load_tables

    result = score_tables(load_tables(paths), _resolver(registry), chip=chip)
    return [dict(predicted_s=p.predicted_s, reason=p.reason, steps=p.steps, fallbacks=p.fallbacks,
                 notes=list(p.notes)) for p in result.predictions]


def sweep_fidelity(tables, chip: str | None, worst: int, *, registry, runner, resume, echo, state):
    """The FidelityResult of ``tables`` (only ``chip``'s rows when given), one unit per chip."""
    from torchfl.fidelity.oneop import Prediction
    from torchfl.fidelity.run import FidelityResult

    chips = sorted({r.chip for t in tables for r in t.rows if chip is None or r.chip == chip})
    paths = [str(Path(t.path).resolve()) for t in tables]
    known = {s.name for s in registry.chips()}
    spec = dict(tool="fidelity", chip=chip, worst=worst,
                tables=[[p, hashlib.sha256(Path(p).read_bytes()).hexdigest()] for p in paths],
                chips={c: registry.record(c).content_hash if c in known else None for c in chips})
    units = [Unit(c, "torchfl.cluster.fidelity:fidelity_unit", (paths, c, registry.url)) for c in chips]
    got = run_sweep(runner, "fidelity", f"fidelity {len(paths)} tables, {len(chips)} chips", spec, units,
                    registry=registry, resume=resume, echo=echo, state=state)
    result = FidelityResult(tables=list(tables))
    left = {c: iter(got[c]) for c in chips}
    for t in tables:
        for row in t.rows:
            if chip is None or row.chip == chip:
                d = next(left[row.chip])
                result.predictions.append(Prediction(row, row.chip, d["predicted_s"], d["reason"], d["steps"],
                                                     d["fallbacks"], tuple(d["notes"])))
    resolve = _resolver(registry.url)
    for c in chips:
        try:
            result.targets[c] = resolve(c)
        except LookupError:
            pass
    return result.finish(worst)      # in-sample rows scored apart (fidelity.sample)
