"""A table row as a one-op graph, planned on a chip: the row's predicted time per call.

The row's inputs are meta tensors (no storage), so ``32768x12288x12288`` captures and plans
without allocating 800 MB. The overload is called with the row's tensors in the schema's
tensor arguments, in order, and its ``args`` by schema name; a missing required argument,
an unknown name or a tensor count that does not fit is a :class:`RowError` naming the
row's ``file:line``. One capture serves every chip a row is planned on.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

from torchfl.fidelity.tables import Row

__all__ = ["RowError", "Prediction", "capture_row", "predict", "resolve_overload"]


class RowError(ValueError):
    """A row whose op cannot be built as given (the message names the row and the fix)."""


@dataclass(frozen=True)
class Prediction:
    """One row planned on one chip. ``predicted_s`` is the plan's per-call time (the run-once
    steps, casts of parameters, are left out) plus the table's harness overhead
    (``row.harness_s``), less every kernel's launch where the table times kernels alone
    (``row.timing == "kernel"``); None where the row could not be planned,
    ``reason`` says why. ``fallbacks`` counts steps that ran on the CPU, ``steps`` the
    per-call steps."""

    row: Row
    chip: str
    predicted_s: float | None
    reason: str = ""
    steps: int = 0
    fallbacks: int = 0
    notes: tuple = ()

    @property
    def error(self) -> float | None:
        """Signed relative error (predicted - measured) / measured."""
        return None if self.predicted_s is None else (self.predicted_s - self.row.seconds) / self.row.seconds

    def as_dict(self) -> dict:
        return dict(row=self.row.as_dict(), chip=self.chip, measured_s=self.row.seconds,
                    predicted_s=self.predicted_s, error=self.error, reason=self.reason, steps=self.steps,
                    fallbacks=self.fallbacks, notes=list(self.notes))


def resolve_overload(row: Row):
    """The ``torch.ops.aten`` overload a row names (RowError if torch has none)."""
    import torch

    _aten, name, overload = row.op.split(".")
    packet = getattr(torch.ops.aten, name, None)
    fn = getattr(packet, overload, None) if packet is not None else None
    if fn is None:
        raise RowError(f"{row.where}: op: torch {torch.__version__} has no ATen overload {row.op}; check the "
                       "spelling (aten.NAME.OVERLOAD, e.g. aten.mm.default)")
    return fn


def _is_tensor(arg) -> bool:
    t = str(arg.type)
    return t in ("Tensor", "Optional[Tensor]", "Tensor?")


def _call_plan(row: Row, fn):
    """(names of the tensor arguments filled by the row's shapes, positional args template,
    kwargs): the row's args checked against the schema."""
    schema = fn._schema
    tensor_args = [a for a in schema.arguments if _is_tensor(a)]
    if len(row.shapes) > len(tensor_args):
        raise RowError(f"{row.where}: shapes: {len(row.shapes)} tensors, but {row.op} takes "
                       f"{len(tensor_args)} ({', '.join(a.name for a in tensor_args)})")
    names = {a.name for a in schema.arguments}
    unknown = sorted(set(row.args) - names)
    if unknown:
        raise RowError(f"{row.where}: args: {row.op} has no argument {', '.join(unknown)}; its arguments are "
                       f"{', '.join(a.name for a in schema.arguments)}")
    given = [a.name for a in tensor_args[:len(row.shapes)]]
    args = dict(row.args)
    _check_dims(row, args)
    if row.alias == "layer_norm" and "normalized_shape" not in args and row.shapes:
        args["normalized_shape"] = [row.shapes[0][-1]] if row.shapes[0] else []
    plan = []
    for a in schema.arguments:
        if a.name in given:
            plan.append(("tensor", given.index(a.name)))
        elif a.name in args:
            if a.name in (t.name for t in tensor_args):
                raise RowError(f"{row.where}: args: {a.name} is a tensor of {row.op}; give its shape in shapes")
            plan.append(("value", args[a.name]))
        elif _is_tensor(a) and str(a.type) != "Tensor":
            plan.append(("value", None))
        elif a.has_default_value():
            plan.append(("default", a.name))
        else:
            if _is_tensor(a):
                raise RowError(f"{row.where}: shapes: {row.op} needs the tensor {a.name}; add its shape "
                               "(';' between tensors)")
            raise RowError(f"{row.where}: args: {row.op} needs the argument {a.name}; give it by schema name, "
                           f"e.g. {{\"{a.name}\": ...}}")
    return plan


#: arguments that index the first input's dimensions (checked against its rank: a meta kernel
#: does not, so softmax {"dim": 99} on a 2-D tensor was planned and scored)
DIM_ARGS = ("dim", "dims", "dim0", "dim1", "start_dim", "end_dim")


def _check_dims(row: Row, args: dict) -> None:
    if not row.shapes:
        return
    rank = len(row.shapes[0])
    bound = max(rank, 1)
    for name in DIM_ARGS:
        value = args.get(name)
        for d in (value if isinstance(value, (list, tuple)) else [value]):
            if isinstance(d, int) and not isinstance(d, bool) and not -bound <= d < bound:
                shape = "x".join(map(str, row.shapes[0])) or "a 0-d tensor"
                raise RowError(f"{row.where}: args: {name} {d} is out of range for the {rank}-D input {shape}; "
                               f"give a dim from {-bound} to {bound - 1}")


def _module(row: Row):
    import torch

    fn = resolve_overload(row)
    plan = _call_plan(row, fn)
    positional, kwargs = [], {}
    for a, (kind, value) in zip(fn._schema.arguments, plan):
        if kind == "default":
            continue
        if a.kwarg_only or kwargs:      # after a skipped default, the rest go by name
            kwargs[a.name] = (kind, value)
        else:
            positional.append((kind, value))

    class OneOp(torch.nn.Module):
        """``row.op`` applied to the inputs (what the table timed)."""

        def forward(self, *tensors):
            def value(kind, v):
                return tensors[v] if kind == "tensor" else v

            return fn(*(value(k, v) for k, v in positional), **{n: value(k, v) for n, (k, v) in kwargs.items()})

    return OneOp()


_CAPTURES: dict = {}


def capture_row(row: Row):
    """``(Captured, meta inputs)`` of the row's one-op graph, cached by :attr:`Row.key`."""
    hit = _CAPTURES.get(row.key)
    if hit is not None:
        return hit
    import torch

    from torchfl.planner.capture import CaptureError, capture_module

    module = _module(row)
    dtype = getattr(torch, row.dtype)
    try:
        inputs = tuple(torch.empty(s, dtype=dtype, device="meta") for s in row.shapes)
        with _quiet_torch():
            captured = capture_module(module, inputs)
    except (CaptureError, RuntimeError, TypeError, ValueError, OverflowError, IndexError) as exc:
        cause = exc.__cause__ if isinstance(exc, CaptureError) and exc.__cause__ is not None else exc
        first = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
        raise RowError(f"{row.where}: {row.label()} does not run as given ({first}); check "
                       "shapes, dtype and args against the op's schema") from None
    if len(_CAPTURES) >= 4096:
        _CAPTURES.pop(next(iter(_CAPTURES)))
    _CAPTURES[row.key] = hit = (captured, inputs)
    return hit


#: torch loggers that print a traceback (19 ``E...`` lines) for a row whose op does not run on
#: its shapes, before the exception the row's RowError reports in one line
_NOISY_LOGGERS = ("torch._subclasses.fake_tensor", "torch._dynamo", "torch.export", "torch._export")


@contextlib.contextmanager
def _quiet_torch():
    import logging

    loggers = [logging.getLogger(name) for name in _NOISY_LOGGERS]
    saved = [lg.disabled for lg in loggers]
    for lg in loggers:
        lg.disabled = True
    try:
        yield
    finally:
        for lg, was in zip(loggers, saved):
            lg.disabled = was


def predict(row: Row, target) -> Prediction:
    """Plan the row's graph on ``target`` (a planner Target) and return its per-call time. A
    hard constraint, an unsupported op or a row that does not build is a Prediction without
    a time, with the reason."""
    from torchfl.planner.api import plan_captured
    from torchfl.planner.errors import PlanError

    if row.family in ("prefill", "decode", "generate"):      # a language model's serving step
        from torchfl.fidelity.lm import predict_lm

        return predict_lm(row, target)
    try:
        captured, inputs = capture_row(row)
    except RowError as exc:
        return Prediction(row, target.name, None, str(exc))
    try:
        plan = plan_captured(captured, inputs, target)
    except PlanError as exc:
        return Prediction(row, target.name, None, str(exc).splitlines()[0])
    except Exception as exc:  # noqa: BLE001 - one row the planner cannot take is that row's reason (its
        # error's type and first line), not the end of the run and the loss of the table's other rows
        first = (str(exc).strip().splitlines() or [""])[0]
        return Prediction(row, target.name, None, f"{row.where}: the planner failed on this row "
                                                  f"({type(exc).__name__}: {first})")
    per_call = [s for s in plan.steps if not s.static]
    notes = tuple(s.note for s in per_call if s.note)
    if row.harness_s:
        notes += (f"+{row.harness_s * 1e6:.3g} us the table's harness",)
    total = float(sum(s.predicted_time_s for s in per_call)) + row.harness_s
    if row.timing == "kernel":           # the table timed the kernels alone: no launch in its rows
        from torchfl.planner.terms import plan_terms

        launches = sum(t.launch_s for t in plan_terms(plan, target.model))
        total -= launches
        notes += (f"-{launches * 1e6:.3g} us of launches (the table times kernels alone)",)
    if not math.isfinite(total) or total < 0:
        return Prediction(row, target.name, None, f"{row.where}: the plan's time is {total} s, not a finite "
                                                  f"time; check {target.name}'s HCD numbers")
    return Prediction(row, target.name, total, "", len(per_call), sum(s.kind == "fallback" for s in per_call), notes)
