"""Errors the runtime raises itself (planner errors pass through unchanged)."""
from __future__ import annotations

from torchfl.planner.errors import StrictFallbackError, aten_name  # noqa: F401 (re-exported)


class RuntimeFLError(RuntimeError):
    """Base of the runtime's own errors; messages say what, where and how to fix."""


# strict mode's one error, whoever refuses (planner, executor, eager device); the old name stays
FallbackNotAllowed = StrictFallbackError


class PlanMismatch(RuntimeFLError):
    """A plan step does not match what the kernel would execute (plan from another chip or
    another torchfl); re-plan."""
