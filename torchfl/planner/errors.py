"""The planner's errors. Hard constraints are raised before anything runs, in the words
the seed article uses; each is a subclass of the builtin it reads as, so callers may
catch ``RuntimeError`` / ``NotImplementedError`` and the CLI prints that name."""

from __future__ import annotations


class PlanError(Exception):
    """Base of planner errors; ``kind`` is the builtin name the CLI prints."""

    kind = "Error"


class HardConstraintError(PlanError, RuntimeError):
    """A limit of the chip's HCD is exceeded (layout, rank, batch, sequence, dtype)."""

    kind = "RuntimeError"

    def __init__(self, message: str, *, field: str | None = None, limit=None, value=None, node=None):
        super().__init__(message)
        self.field, self.limit, self.value, self.node = field, limit, value, node


class UnsupportedAttention(PlanError, NotImplementedError):
    """An attention op whose head count the chip's attention unit does not support."""

    kind = "NotImplementedError"

    def __init__(self, message: str, *, heads=None, supported=(), node=None):
        super().__init__(message)
        self.heads, self.supported, self.node = heads, tuple(supported), node


class StrictFallbackError(PlanError, RuntimeError):
    """Strict mode and some ops would run on the CPU: raised before anything runs, by the
    planner (``strict=True``), the executor and the eager device alike (one error, one message;
    ``torchfl.runtime.errors.FallbackNotAllowed`` is this class). ``fallbacks``: objects with
    ``node``, ``op`` and ``reason``."""

    kind = "RuntimeError"

    def __init__(self, chip: str, fallbacks=()):
        self.chip = chip
        self.fallbacks = tuple(fallbacks)
        lines = [f"  {aten_name(f.op)} (node {f.node}): {f.reason}" for f in self.fallbacks]
        super().__init__(
            f"strict mode: {len(lines)} op(s) have no kernel on {chip} and would fall back to the CPU:\n"
            + "\n".join(lines) + "\nadd a rule for them to a rule pack, pick a chip that supports them, or run "
            "without strict mode (strict=False, TORCHFL_STRICT unset) to allow logged CPU fallbacks")


def aten_name(op: str) -> str:
    """``aten.convolution.default`` -> ``aten::convolution`` (the seed's spelling)."""
    parts = str(op).split(".")
    if len(parts) >= 2 and parts[0] in ("aten", "prims", "quantized", "torchfl"):
        return f"{parts[0]}::{parts[1]}"
    return str(op)


class ChoiceError(PlanError, ValueError):
    """An unknown chip, model, precision or format; the message lists the choices."""

    kind = "Error"


class MutatesInputs(PlanError, RuntimeError):
    """An inference graph writes to its inputs (a train-mode batch-norm's running statistics
    under no_grad): it cannot be planned as one inference graph; AOTAutograd's
    functionalised forward can (the torch.compile backend falls back to it)."""

    kind = "RuntimeError"


class NoCoverError(PlanError, RuntimeError):
    """No choice of the options covers the graph: a node whose rules were refused, or whose
    options cannot be chained with its neighbours'. The message names the node, its op, shapes
    and dtypes, every rule tried with its refusal, and the fix (``planner/select_explain.py``);
    ``node``, ``op`` and ``tried`` carry the same for programs."""

    kind = "RuntimeError"

    def __init__(self, message: str, *, node=None, op=None, tried=()):
        super().__init__(message)
        self.node, self.op, self.tried = node, op, tuple(tried)
