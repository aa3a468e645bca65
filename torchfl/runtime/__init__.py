"""UBA runtime: the ``torchfl`` torch.compile backend, the plan executor, device memory of
the emulated chips, explain / explain analyze and the debug log.

Importing this package is cheap (no torch, no numba); the pieces load on first use:

    torch.compile(model, backend="torchfl", options={"chip": "NPU-V3", "precision": "float16"})
    torchfl.runtime.memory_allocated("NPU-V3")
"""
from __future__ import annotations

__all__ = ["torchfl_backend", "Executor", "explain", "analyze", "AnalyzedPlan",
           "memory_allocated", "max_memory_allocated", "reset_peak_memory_stats", "device_memory",
           "memory_reserved", "empty_cache", "FallbackNotAllowed"]

_LAZY = {
    "torchfl_backend": "torchfl.runtime.backend",
    "Executor": "torchfl.runtime.executor",
    "explain": "torchfl.runtime.explain",
    "analyze": "torchfl.runtime.analyze",
    "AnalyzedPlan": "torchfl.runtime.analyze",
    "memory_allocated": "torchfl.runtime.device",
    "max_memory_allocated": "torchfl.runtime.device",
    "reset_peak_memory_stats": "torchfl.runtime.device",
    "device_memory": "torchfl.runtime.device",
    "memory_reserved": "torchfl.runtime.device",
    "empty_cache": "torchfl.runtime.device",
    "FallbackNotAllowed": "torchfl.runtime.errors",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'torchfl.runtime' has no attribute {name!r}")
