"""Scores of predicted against measured times, per chip and op family.

For each group of :class:`~torchfl.fidelity.oneop.Prediction` rows: the mean, median and
largest absolute relative error of the per-call time, the signed mean (a model that is
always fast shows a negative bias), Spearman's rank correlation (does the model order
the rows as the chip does) and the worst rows. Rows that could not be planned are
counted apart, never scored as zero. No torch, no numpy: plain arithmetic.

In-sample and out-of-sample rows (:mod:`torchfl.fidelity.sample`) are scored apart, never
mixed: a row a chip number was fitted on says nothing about how the model generalises.
``by="source"`` groups by each row's ``source`` id instead of its op family (cross-validation
between independent publications).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

__all__ = ["Score", "score", "ranks", "spearman", "overall", "IN_SAMPLE", "OUT_OF_SAMPLE"]

IN_SAMPLE, OUT_OF_SAMPLE = "in-sample", "out-of-sample"


@dataclass(frozen=True)
class Score:
    """One chip x sample x family, or x source with ``by="source"`` (``family == "all"``:
    every scored row of the chip in that sample)."""

    chip: str
    family: str
    rows: int                     # scored rows (planned)
    unplanned: int
    mean_abs_error: float | None
    median_abs_error: float | None
    max_abs_error: float | None
    mean_error: float | None      # signed: < 0 means predictions are fast
    spearman: float | None
    worst: tuple = field(default=())    # Predictions, largest |error| first
    tables: tuple = ()
    sample: str = OUT_OF_SAMPLE         # IN_SAMPLE: rows a number of the chip was fitted on
    by: str = "family"                  # what ``family`` holds: an op family, or a row source id

    def as_dict(self) -> dict:
        return dict(chip=self.chip, family=self.family, sample=self.sample, by=self.by, rows=self.rows,
                    unplanned=self.unplanned,
                    mean_abs_error=self.mean_abs_error, median_abs_error=self.median_abs_error,
                    max_abs_error=self.max_abs_error, mean_error=self.mean_error, spearman=self.spearman,
                    tables=list(self.tables), worst=[p.as_dict() for p in self.worst])


def ranks(values: list[float]) -> list[float]:
    """1-based ranks, ties sharing their mean rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(xs: list[float], ys: list[float], min_pairs: int = 3) -> float | None:
    """Spearman's rank correlation (Pearson's on the ranks); None for fewer than ``min_pairs``
    pairs or a constant side."""
    if len(xs) != len(ys):
        raise ValueError(f"spearman needs pairs: {len(xs)} and {len(ys)} values")
    if len(xs) < min_pairs:
        return None
    rx, ry = ranks(list(xs)), ranks(list(ys))
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return None
    return sxy / (sxx * syy) ** 0.5


def _group(chip: str, family: str, preds: list, worst: int, sample: str, by: str) -> Score:
    done = [p for p in preds if p.predicted_s is not None]
    tables = tuple(sorted({p.row.file for p in preds}))
    if not done:
        return Score(chip, family, 0, len(preds), None, None, None, None, None, (), tables, sample, by)
    errs = [p.error for p in done]
    abs_errs = [abs(e) for e in errs]
    ranked = sorted(done, key=lambda p: -abs(p.error))
    return Score(chip, family, len(done), len(preds) - len(done), sum(abs_errs) / len(abs_errs),
                 statistics.median(abs_errs), max(abs_errs), sum(errs) / len(errs),
                 spearman([p.row.seconds for p in done], [p.predicted_s for p in done]),
                 tuple(ranked[:worst]), tables, sample, by)


_KEYS = {"family": lambda p: p.row.family, "source": lambda p: p.row.source}


def score(predictions, worst: int = 3, *, in_sample=None, by: str = "family") -> list[Score]:
    """Scores per (chip, sample, family or source), sorted: each chip's out-of-sample groups
    and their ``all`` row, then its in-sample ones. ``in_sample(prediction) -> bool`` (None:
    every row out of sample); ``by``: ``"family"`` or ``"source"``."""
    if by not in _KEYS:
        raise ValueError(f"score by {by!r}: write one of {', '.join(_KEYS)}")
    key = _KEYS[by]
    groups: dict = {}
    for p in predictions:
        sample = IN_SAMPLE if in_sample is not None and in_sample(p) else OUT_OF_SAMPLE
        groups.setdefault(p.chip, {}).setdefault(sample, {}).setdefault(key(p), []).append(p)
    out = []
    for chip in sorted(groups):
        for sample in (OUT_OF_SAMPLE, IN_SAMPLE):
            fams = groups[chip].get(sample)
            if not fams:
                continue
            for family in sorted(fams):
                out.append(_group(chip, family, fams[family], worst, sample, by))
            if len(fams) > 1:
                out.append(_group(chip, "all", [p for f in fams.values() for p in f], worst, sample, by))
    return out


def overall(scores: list[Score], chip: str, sample: str = OUT_OF_SAMPLE) -> Score | None:
    """The chip's ``all`` row of ``sample`` (or its only group's row)."""
    mine = [s for s in scores if s.chip == chip and s.sample == sample]
    if not mine:
        return None
    return next((s for s in mine if s.family == "all"), mine[0] if len(mine) == 1 else None)
