"""Numba bodies of the convolution family, imported lazily by the specs' ``run``
(``KernelSpec.impl`` names a function here).

``forward.py`` drives the forward convolution over ``tiles.py`` (slab and weight loads,
the split-channel and int8 compute, the epilogue store) and ``fused.py`` (the float
weight-stationary micro-kernel path); ``backward.py`` holds both gradients.
"""
from __future__ import annotations

from .backward import run_conv2d_backward_input, run_conv2d_backward_weight
from .forward import run_conv2d

__all__ = ["run_conv2d", "run_conv2d_backward_input", "run_conv2d_backward_weight"]
