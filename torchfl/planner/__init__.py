"""SME planner: capture a graph, price the chip's kernels on it, pick the cheapest cover.

``plan_module(module, example_inputs, chip=...)`` and ``plan_graph(gm, example_inputs,
chip=...)`` return a :class:`~torchfl.planner.plan.Plan`. Importing this package does not
import torch; capture does, when called.
"""

from __future__ import annotations

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

__all__ = [
    "Capture", "Cast", "Conversion", "Fallback", "Plan", "PlanInput", "Rejected", "Step",
    "Summary", "Value", "identity_layout", "plan_module", "plan_graph",
]


def plan_module(module, example_inputs, chip, precision=None, strict=False, registry=None, training=False):
    """Capture ``module`` on ``example_inputs`` and plan it for ``chip`` (see ``api``)."""
    from torchfl.planner.api import plan_module as _plan_module

    return _plan_module(module, example_inputs, chip=chip, precision=precision, strict=strict,
                        registry=registry, training=training)


def plan_graph(gm, example_inputs, chip, precision=None, strict=False, registry=None):
    """Plan a Dynamo ``GraphModule`` (what a torch.compile backend receives) for ``chip``."""
    from torchfl.planner.api import plan_graph as _plan_graph

    return _plan_graph(gm, example_inputs, chip=chip, precision=precision, strict=strict,
                       registry=registry)
