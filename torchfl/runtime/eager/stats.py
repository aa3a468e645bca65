"""The eager device's counters (process-wide; ``ops.STATS`` and ``lazy.STATS`` are these).

``STATS``: chip_ops, host_fallback_ops, host_writes, converted_inputs, plans,
lazy_graph_ops, lazy_fallback_nodes. ``ROUTES``: (aten op, route) -> calls. ``LAZY``:
lazy mode's flushes, graphs_planned, ops_recorded, and the last flush's plan.
"""
from __future__ import annotations

from collections import Counter

__all__ = ["STATS", "ROUTES", "LAZY", "reset"]

STATS: Counter = Counter()
ROUTES: Counter = Counter()
LAZY: dict = {"flushes": 0, "graphs_planned": 0, "ops_recorded": 0}


def reset() -> None:
    STATS.clear()
    ROUTES.clear()
