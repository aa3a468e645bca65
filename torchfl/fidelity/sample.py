"""In-sample or out-of-sample: may a fidelity row count as a check of its chip?

A row is **in-sample** for chip C when a number of C's HCD was set from it: C's HCD has a
number of kind ``fitted`` whose ``rows`` name the row's table (file stem) or the row's
``source`` id (:meth:`torchfl.hcd.HCD.fitted_rows`), or its table is marked as a whole (the
legacy ``# calibrates:`` header; the microbenchmark tables of ``fidelity --calibrate-on``).
Every other row is out-of-sample: only those say how the model does on data it never saw.
One rule, read by the scores, the CLI and the registry's evidence alike.
"""
from __future__ import annotations

from pathlib import Path

__all__ = ["stem", "in_sample"]


def stem(path: str) -> str:
    """A table's name as HCD ``rows`` and ``table`` write it: the file name without ``.csv``."""
    return Path(path).stem


def in_sample(row, fitted=frozenset(), marked=frozenset()) -> bool:
    """Whether ``row`` is in-sample, given its chip's ``fitted`` rows (``hcd.fitted_rows()``)
    and the table stems ``marked`` in-sample as a whole."""
    name = stem(row.file)
    return name in marked or name in fitted or (bool(row.source) and row.source in fitted)
