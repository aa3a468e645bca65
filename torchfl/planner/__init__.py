"""SME planner: capture a graph, price the chip's kernels on it, pick the cheapest cover.

``plan_module(module, example_inputs, chip=...)``, ``plan_graph(gm, example_inputs,
chip=...)`` and ``plan_training`` return :class:`~torchfl.planner.plan.Plan` objects;
``plan_dynamo`` plans any graph a torch.compile backend receives and ``plan_captured`` a
graph already captured;
``resolve_target(chip, registry)`` resolves a chip once into the
:class:`~torchfl.planner.target.Target` that planning and execution share. Importing this
package does not import torch; capture does, when called.
"""

from __future__ import annotations

from torchfl.planner.api import plan_captured, plan_dynamo, plan_graph, plan_module, plan_training
from torchfl.planner.plan import (
    Capture,
    Cast,
    Conversion,
    Fallback,
    Plan,
    PlanInput,
    Rejected,
    Step,
    Summary,
    Value,
    identity_layout,
)
from torchfl.planner.target import ChipMismatch, Target, resolve_target

__all__ = [
    "Capture", "Cast", "ChipMismatch", "Conversion", "Fallback", "Plan", "PlanInput", "Rejected", "Step",
    "Summary", "Target", "Value", "identity_layout", "plan_captured", "plan_dynamo", "plan_graph", "plan_module",
    "plan_training", "resolve_target",
]
