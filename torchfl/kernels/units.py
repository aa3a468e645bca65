"""How a number of bytes is written, everywhere (explain, errors, reports, the CLI).

Binary units, as the HCD states sizes (``size_kb`` in KiB, ``size_gb`` in GiB) and as the
device memory accounts them; two decimals (``1.22 MiB``, ``512 B``), or three significant
digits where a table column is narrow (``compact``: ``177 MiB``). Rates keep the HCD's own
decimal ``GB/s``. Pure Python: every layer from the kernels up imports it.
"""
from __future__ import annotations

__all__ = ["fmt_bytes"]


def fmt_bytes(n: float, compact: bool = False) -> str:
    """``1.22 MiB``, ``98.88 KiB``, ``512 B``; ``compact``: ``1.22 MiB``, ``98.9 KiB``, ``177 MiB``."""
    n = int(round(n))
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}" if compact else f"{n / size:.2f} {unit}"
    return f"{n} B"
