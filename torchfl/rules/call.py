"""What a rule is matched against: one op call, described by plain metadata (no torch).

The planner builds a :class:`Call` per graph node: positional ``args`` and ``kwargs``
exactly as the ATen call has them, with every tensor replaced by its
:class:`TensorMeta` (shape, short dtype name, layout letters or None) and dtypes written
as short names; plus the candidate ``dtype`` and ``layout`` it is considering for the
kernel. :func:`call_from_node` does that for an FX node (it imports torch lazily).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from typing import Any, Mapping


@dataclass(frozen=True)
class TensorMeta:
    """A tensor as guards see it: ``shape``, ``dtype`` (``float16``), ``layout`` (``NCHW``...), ``rank``, ``numel``."""

    shape: tuple[int, ...]
    dtype: str
    layout: str | None = None

    FIELDS = ("shape", "dtype", "layout", "rank", "numel")

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        object.__setattr__(self, "dtype", str(self.dtype).removeprefix("torch."))

    def field(self, name: str):
        if name == "shape":
            return list(self.shape)
        if name == "dtype":
            return self.dtype
        if name == "layout":
            return self.layout
        if name == "rank":
            return len(self.shape)
        if name == "numel":
            return prod(self.shape)
        raise KeyError(name)

    def as_dict(self) -> dict:
        return {"shape": list(self.shape), "dtype": self.dtype, "layout": self.layout}


@dataclass(frozen=True)
class Call:
    """One op call: ATen ``args``/``kwargs`` (tensors as TensorMeta) and the candidate dtype/layout."""

    args: tuple = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    dtype: str | None = None  # compute dtype being considered; default: the primary tensor's
    layout: str | None = None  # physical layout being considered (None: layout does not apply)
    out: Any = None  # output TensorMeta (or tuple of them) when known


def _convert(value):
    """torch values -> guard values (lazy torch import only when a torch object is present)."""
    import torch

    if isinstance(value, torch.fx.Node):
        meta = value.meta.get("val", value.meta.get("tensor_meta"))
        return _convert(meta)
    if isinstance(value, torch.Tensor):
        return TensorMeta(tuple(value.shape), str(value.dtype))
    if hasattr(value, "shape") and hasattr(value, "dtype") and not isinstance(value, (list, tuple)):
        return TensorMeta(tuple(value.shape), str(value.dtype))
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, (torch.device, torch.layout, torch.memory_format)):
        return str(value).removeprefix("torch.")
    if isinstance(value, (list, tuple)):
        return [_convert(v) for v in value]
    if isinstance(value, torch.SymInt):
        return int(value)
    return value


def call_from_node(node, *, dtype: str | None = None, layout: str | None = None) -> Call:
    """A :class:`Call` for an FX ``call_function`` node whose args carry ``meta['val']``."""
    out = node.meta.get("val")
    return Call(
        args=tuple(_convert(a) for a in node.args),
        kwargs={k: _convert(v) for k, v in node.kwargs.items()},
        dtype=dtype,
        layout=layout,
        out=_convert(out) if out is not None else None,
    )
