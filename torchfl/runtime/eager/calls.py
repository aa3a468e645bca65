"""What a call on ``npu`` tensors is: its device (torch's rule for mixed devices), its key
(argument shapes, dtypes, layouts, values), its aliasing, and the process flags that
choose its plan (``TORCHFL_STRICT``, ``TORCHFL_PRECISION``, inside an optimizer step).
"""
from __future__ import annotations

import os
import threading

import torch

from . import device as _dev

__all__ = ["env_flags", "eager_precision", "strict", "in_optimizer_step", "install_optimizer_hooks",
           "device_of", "arg_key", "alias_pattern", "distinct_positions", "tensor_layout_of", "label",
           "is_random_op", "OPTIMIZER", "promote_host_scalars"]


# TORCHFL_STRICT and TORCHFL_PRECISION are read at every op (a program or a test may set
# them between two ops), which through ``os.environ`` costs ~1 us each (key encoding, value
# decoding): the hot path reads the environment's own mapping with pre-encoded keys and
# parses the values again only when they changed.
_ENV = getattr(os.environ, "_data", None)


_ENV_KEYS = tuple(os.environ.encodekey(k) for k in ("TORCHFL_STRICT", "TORCHFL_PRECISION")) \
    if _ENV is not None and hasattr(os.environ, "encodekey") else None


_ENV_MEMO: list = [object(), (False, None)]


def env_flags() -> tuple:
    """(strict, precision) as :func:`torchfl.runtime.logs.strict_env` and the precision
    policy read them now."""
    if _ENV_KEYS is not None:
        raw = (_ENV.get(_ENV_KEYS[0]), _ENV.get(_ENV_KEYS[1]))
    else:
        raw = (os.environ.get("TORCHFL_STRICT"), os.environ.get("TORCHFL_PRECISION"))
    if raw != _ENV_MEMO[0]:
        from torchfl.runtime.logs import strict_env

        p = os.environ.get("TORCHFL_PRECISION", "").strip()
        _ENV_MEMO[1] = (strict_env(), p or None)
        _ENV_MEMO[0] = raw
    return _ENV_MEMO[1]


def eager_precision() -> str | None:
    """``TORCHFL_PRECISION`` (float16 / bfloat16): the policy for float32 ops on chips
    without a float32 unit, as ``options={"precision": ...}`` is for torch.compile."""
    return env_flags()[1]


def strict() -> bool:
    return env_flags()[0]


OPTIMIZER = threading.local()


def in_optimizer_step() -> bool:
    """Inside ``optimizer.step()`` (which runs with gradients off): the tensors there are
    parameters, gradients and optimizer state, none with a batch dimension, so none is held
    to ``max_batch_size`` (a 1000-class layer's gradient and momentum are 1000 rows)."""
    return getattr(OPTIMIZER, "depth", 0) > 0 and not torch.is_grad_enabled()


def install_optimizer_hooks() -> None:
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    from . import set_fast_bypass

    def pre(_opt, _args, _kwargs):
        OPTIMIZER.depth = getattr(OPTIMIZER, "depth", 0) + 1
        set_fast_bypass(1, OPTIMIZER.depth)     # the adapter's fast path leaves the step to the router

    def post(_opt, _args, _kwargs):
        OPTIMIZER.depth = max(getattr(OPTIMIZER, "depth", 1) - 1, 0)
        set_fast_bypass(1, OPTIMIZER.depth)

    register_optimizer_step_pre_hook(pre)
    register_optimizer_step_post_hook(post)


def device_of(flat, kwargs, op=None) -> int:
    """The npu index of a call. torch's rule for mixed devices, as on CUDA: every tensor
    argument is on that one device, except CPU tensors of zero dimensions (scalars,
    ``x * torch.tensor(2.)``) and, for indexing ops, CPU index tensors."""
    index = None
    for a in flat:
        if isinstance(a, torch.Tensor) and a.device.type == "npu":
            i = a.device.index or 0
            if index is None:
                index = i
            elif i != index:
                raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two "
                                   f"devices, npu:{index} and npu:{i}; move them with .to('npu:{index}')")
    if index is None:
        dev = kwargs.get("device")
        if dev is not None and torch.device(dev).type == "npu":
            index = torch.device(dev).index or 0
        else:
            index = _dev.adapter_current()
    else:
        _check_host_operands(flat, index, op)
    return index


# ops that take host index tensors beside device tensors (as CUDA's do)
_HOST_INDICES = frozenset({"index", "index_put", "index_put_", "_index_put_impl", "_index_put_impl_",
                           "_unsafe_index", "_unsafe_index_put"})


def _check_host_operands(flat, index, op) -> None:
    for a in flat:
        if isinstance(a, torch.Tensor) and a.device.type != "npu" and a.dim() != 0:
            if op is not None and op._schema.name.split("::")[-1] in _HOST_INDICES and a.device.type == "cpu":
                continue
            raise RuntimeError(
                f"Expected all tensors to be on the same device, but found at least two devices, npu:{index} and "
                f"{a.device}! ({label(op) if op is not None else 'this op'} got a {a.device} tensor of shape "
                f"{tuple(a.shape)}: move it with .to('npu:{index}'); only 0-dim CPU tensors mix with npu ones)")


def promote_host_scalars(op, args, kwargs):
    """``args``/``kwargs`` with each 0-dim CPU floating tensor the op reads cast to the floating
    dtype of its tensors with dimensions, when that differs: torch's type promotion (a 0-dim
    tensor of the same category does not widen the result, ``torch.result_type``) and what its
    TensorIterator does to such an operand (cast to the common dtype before the op). Issue 52
    case 13: ``half_npu + torch.tensor(2.0)`` was planned in float32 (refused by a float16-only
    chip); torch's result is float16. The same (args, kwargs) objects when nothing changes;
    written arguments and host index tensors are never touched."""
    tensor = torch.Tensor
    scalars = []
    wide = None
    for name, a in _read_arguments(op, args, kwargs):
        for t in (a if isinstance(a, (list, tuple)) else (a,)):
            if not isinstance(t, tensor) or not t.is_floating_point():
                continue
            if t.dim():
                wide = t.dtype if wide is None or wide == t.dtype else torch.promote_types(wide, t.dtype)
            elif t.device.type == "cpu":
                scalars.append(name)
    if wide is None or not scalars:
        return args, kwargs
    if op._schema.name.split("::")[-1] in _HOST_INDICES:
        return args, kwargs
    args, kwargs = list(args), dict(kwargs)
    for name in scalars:
        box, key = (args, name) if isinstance(name, int) else (kwargs, name)
        t = box[key]
        if t.dtype != wide:
            box[key] = t.to(wide)
    return tuple(args), kwargs


def _read_arguments(op, args, kwargs):
    """(position or name, value) of each argument ``op`` reads and does not write."""
    schema = op._schema.arguments
    for i, a in enumerate(args):
        if i < len(schema) and _written(schema[i]):
            continue
        yield i, a
    by_name = {s.name: s for s in schema}
    for name, a in kwargs.items():
        s = by_name.get(name)
        if s is not None and _written(s):
            continue
        yield name, a


def _written(arg) -> bool:
    info = arg.alias_info
    return info is not None and info.is_write


def arg_key(a):
    if isinstance(a, torch.Tensor):
        from torchfl.planner.constraints import tensor_layout

        dense = a.is_contiguous() or tensor_layout(a) is not None
        weight = isinstance(a, torch.nn.Parameter) or isinstance(getattr(a, "_base", None), torch.nn.Parameter)
        return ("T", a.device.type, tuple(a.shape), a.dtype, tensor_layout(a) if dense else tuple(a.stride()),
                a.requires_grad and torch.is_grad_enabled(), weight)
    if isinstance(a, float):
        return ("float", a.hex())          # NaN equals itself, -0.0 is not 0.0
    return (type(a).__name__, a)


def alias_pattern(tensors):
    """None when every tensor argument is a distinct object, else for each the position of
    its first occurrence (``t + t``: (0, 0)). One storage passed twice is one plan input:
    device memory counts storages, not arguments (issue 39)."""
    ids = [id(t) for t in tensors]
    if len(set(ids)) == len(ids):
        return None
    return tuple(ids.index(i) for i in ids)


def distinct_positions(pattern):
    """The positions of the distinct tensors of an :func:`alias_pattern`."""
    return tuple(i for i, first in enumerate(pattern) if first == i)


def tensor_layout_of(t):
    """Layout letters of a dense permuted 4-D tensor, else None (planner's rule)."""
    from torchfl.planner.constraints import tensor_layout

    return tensor_layout(t)


def label(op) -> str:
    from torchfl.runtime.errors import aten_name

    return aten_name(str(op))


def is_random_op(op) -> bool:
    return isinstance(op, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in op.tags


