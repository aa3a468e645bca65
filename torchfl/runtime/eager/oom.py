"""Out of device memory on the eager device is one type users can catch: ``torch.OutOfMemoryError``.

Three places run out (issue 52 case 14): a factory (the adapter raises torch.OutOfMemoryError),
an op's kernel allocating (``kernels.errors.DeviceOutOfMemoryError``: a DeviceOOMError and a
torch.OutOfMemoryError) and an op's plan refused before it runs because its peak would not
fit (the planner's :class:`~torchfl.planner.memory.MemoryLimitError`). The last is raised here
as :class:`PlanOutOfMemoryError`, a MemoryLimitError (``except MemoryLimitError`` /
``HardConstraintError`` / ``PlanError`` still catch it, ``.memory`` still holds the plan's
breakdown) and a torch.OutOfMemoryError.
"""
from __future__ import annotations

import contextlib

import torch

from torchfl.planner.memory import MemoryLimitError

__all__ = ["PlanOutOfMemoryError", "out_of_memory_as_torch"]


class PlanOutOfMemoryError(MemoryLimitError, torch.OutOfMemoryError):
    """An op on an npu device whose planned peak device memory exceeds the chip's."""


@contextlib.contextmanager
def out_of_memory_as_torch():
    """Raise a planner's MemoryLimitError inside the block as :class:`PlanOutOfMemoryError`
    (same message and attributes; the original chained as its cause)."""
    try:
        yield
    except MemoryLimitError as exc:
        if isinstance(exc, torch.OutOfMemoryError):
            raise
        err = PlanOutOfMemoryError.__new__(PlanOutOfMemoryError)
        err.args = exc.args
        err.__dict__.update(exc.__dict__)
        raise err from exc
