"""Errors the runtime raises itself (planner errors pass through unchanged)."""
from __future__ import annotations


class RuntimeFLError(RuntimeError):
    """Base of the runtime's own errors; messages say what, where and how to fix."""


class FallbackNotAllowed(RuntimeFLError):
    """strict mode: the plan would run ops on the CPU. Raised before anything executes."""

    def __init__(self, chip: str, fallbacks):
        self.chip = chip
        self.fallbacks = tuple(fallbacks)
        lines = [f"  {aten_name(f.op)} (node {f.node}): {f.reason}" for f in self.fallbacks]
        super().__init__(
            f"strict mode: {len(self.fallbacks)} op(s) have no kernel on {chip} and would fall "
            "back to the CPU:\n" + "\n".join(lines) + "\nAdd a rule for them to a rule pack, "
            "pick a chip that supports them, or run with strict=False (and TORCHFL_STRICT unset) "
            "to allow logged CPU fallbacks")


class PlanMismatch(RuntimeFLError):
    """A plan step does not match what the kernel would execute (plan from another chip or
    another torchfl); re-plan."""


def aten_name(op: str) -> str:
    """``aten.convolution.default`` -> ``aten::convolution`` (the seed's spelling)."""
    parts = str(op).split(".")
    if len(parts) >= 2 and parts[0] in ("aten", "prims", "quantized", "torchfl"):
        return f"{parts[0]}::{parts[1]}"
    return str(op)
