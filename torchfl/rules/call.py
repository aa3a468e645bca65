"""What a rule is matched against: one op call, described by plain metadata (no torch).

The planner builds a :class:`Call` per graph node: positional ``args`` and ``kwargs``
exactly as the ATen call has them, with every tensor replaced by its
:class:`TensorMeta` (shape, short dtype name, layout letters or None) and dtypes written
as short names; plus the candidate ``dtype`` and ``layout`` it is considering for the
kernel. (The tests build calls from FX nodes with ``tests/rules/calls.call_from_node``.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from torchfl.kernels.spec import TensorMeta  # noqa: F401 - the one tensor description, re-exported


@dataclass(frozen=True)
class Call:
    """One op call: ATen ``args``/``kwargs`` (tensors as TensorMeta) and the candidate dtype/layout."""

    args: tuple = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    dtype: str | None = None  # compute dtype being considered; default: the primary tensor's
    layout: str | None = None  # physical layout being considered (None: layout does not apply)
    out: Any = None  # output TensorMeta (or tuple of them) when known
