"""One fidelity run: tables -> rows per chip -> one-op plans -> scores (-> registry evidence).

``score_tables(tables, resolve)`` plans every row on the chip it names (``resolve(name)``
returns a planner Target, or raises to say the chip is unknown: those rows are unplanned
with the reason), then scores them per chip and family, in-sample rows apart from
out-of-sample ones (:mod:`torchfl.fidelity.sample`). ``record(result, registry)`` stores each
chip's rows as one append-only fidelity run, each row's ``in_sample`` by the same rule.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from torchfl.fidelity.oneop import Prediction, predict
from torchfl.fidelity.sample import in_sample, stem
from torchfl.fidelity.score import Score, score

__all__ = ["FidelityResult", "score_tables", "run_rows", "record"]


@dataclass
class FidelityResult:
    """Predictions (table order), their scores and the tables they came from."""

    predictions: list = field(default_factory=list)
    scores: list = field(default_factory=list)
    tables: list = field(default_factory=list)
    targets: dict = field(default_factory=dict)      # chip name -> Target (the chips that resolved)
    calibrated_on: frozenset = frozenset()           # table stems a chip number was derived from (in-sample)
    by: str = "family"                               # scores grouped by op family or by row source
    calibrations: dict = field(default_factory=dict)  # chip -> (Calibration, the registry's HCD): --calibrate-on

    def chips(self) -> list[str]:
        return sorted({p.chip for p in self.predictions})

    def marked(self) -> frozenset:
        """Table stems in-sample for every chip: ``# calibrates:`` tables and ``calibrated_on``."""
        return frozenset(stem(t.path) for t in self.tables if t.in_sample) | self.calibrated_on

    def is_in_sample(self, p) -> bool:
        """Whether prediction ``p``'s row is in-sample for its chip (:func:`sample.in_sample`)."""
        target = self.targets.get(p.chip)
        hcd = getattr(target, "hcd", None)
        fitted = hcd.fitted_rows() if hasattr(hcd, "fitted_rows") else frozenset()
        return in_sample(p.row, fitted, self.marked())

    def finish(self, worst: int = 3) -> "FidelityResult":
        """Score the predictions, in-sample rows apart from out-of-sample ones."""
        self.scores = score(self.predictions, worst=worst, in_sample=self.is_in_sample, by=self.by)
        return self

    def as_dict(self) -> dict:
        marked = self.marked()
        return dict(tables=[dict(path=t.path, rows=len(t.rows), harness_overhead_us=t.harness_s * 1e6,
                                 calibrates=list(t.calibrates), in_sample=stem(t.path) in marked)
                            for t in self.tables],
                    chips={name: dict(version=t.version, chip_hash=t.chip_hash,
                                      fitted_rows=sorted(getattr(t.hcd, "fitted_rows", frozenset)()))
                           for name, t in sorted(self.targets.items())},
                    by=self.by, scores=[s.as_dict() for s in self.scores],
                    predictions=[dict(p.as_dict(), in_sample=self.is_in_sample(p)) for p in self.predictions])


def score_tables(tables, resolve, *, chip: str | None = None, progress=None, worst: int = 3,
                 calibrated_on=frozenset(), by: str = "family") -> FidelityResult:
    """Plan and score every row of ``tables`` (only ``chip``'s rows when given); the rows of
    the tables whose stems are in ``calibrated_on`` are in-sample for every chip."""
    result = FidelityResult(tables=list(tables), calibrated_on=frozenset(calibrated_on), by=by)
    failed: dict = {}
    rows = [r for t in tables for r in t.rows if chip is None or r.chip == chip]
    for row in rows:
        target = result.targets.get(row.chip)
        if target is None and row.chip not in failed:
            try:
                target = result.targets[row.chip] = resolve(row.chip)
            except LookupError as exc:
                failed[row.chip] = str(exc).splitlines()[0]
        if target is None:
            result.predictions.append(Prediction(row, row.chip, None, failed[row.chip]))
        else:
            result.predictions.append(predict(row, target))
        if progress is not None:
            progress(row)
    return result.finish(worst)


def _table_hash(path: str) -> str:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return ""


def run_rows(result: FidelityResult, name: str) -> tuple[list, list[dict]]:
    """``(tables, rows)`` of chip ``name``'s run as the registry stores them: ``[[file name,
    sha256], ...]`` and one dict per row (:data:`torchfl.registry.fidelity.ROW_KEYS`)."""
    mine = [p for p in result.predictions if p.chip == name]
    tables = sorted({(Path(p.row.file).name, _table_hash(p.row.file)) for p in mine})
    rows = [dict(table_name=Path(p.row.file).name, line=p.row.line, op=p.row.op, family=p.row.family,
                 shapes=[list(s) for s in p.row.shapes], dtype=p.row.dtype, args=p.row.args,
                 source=p.row.source, measured_s=p.row.seconds, predicted_s=p.predicted_s,
                 reason=p.reason or None, in_sample=result.is_in_sample(p)) for p in mine]
    return [list(t) for t in tables], rows


def record(result: FidelityResult, registry) -> dict:
    """Store one fidelity run per chip that resolved (its rows, planned or not); returns
    ``{chip: run id}``. The chip's published version in ``registry`` must be the one scored."""
    from torchfl.registry.fidelity import record_fidelity

    runs = {}
    for name, target in sorted(result.targets.items()):
        identity = registry.identity(name, target.version)
        if identity.chip_hash != target.chip_hash:
            raise LookupError(f"{name} {target.version} in {registry.display_url} has other numbers than the chip "
                              "scored; record against the registry the chip was resolved from")
        tables, rows = run_rows(result, name)
        runs[name] = record_fidelity(registry, identity, tables=tables, rows=rows)
    return runs
