"""Test helper: a rule-layer :class:`~torchfl.rules.Call` for an FX node (the oracle the zoo
coverage test matches rules with, independently of the planner's own conversion)."""
from __future__ import annotations

from torchfl.rules.call import Call, TensorMeta


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
