"""What runs on the host: ops with no plan (untraceable, data-dependent shapes, float64
scalars, mutating ops with no functional form: logged once per signature, counted per
call, refused by ``TORCHFL_STRICT=1``) and host writes (random draws, constant fills,
factories: host-made data written into the tensor, like a copy; allowed by strict mode).
"""
from __future__ import annotations

import functools

import torch
from torch.utils._pytree import tree_flatten, tree_map

from . import device as _dev
from .calls import device_of, is_random_op, label, strict
from .kept import forget
from .rng import rng_scope
from .stats import ROUTES, STATS

__all__ = ["HOST_WRITES", "is_factory", "on_host", "write_back", "written", "host_write", "functional_of",
           "functional_arguments", "host_args", "on_host_result", "HostRoute", "host_route"]


# ops that write host-made data into their tensor: random draws and constant fills
HOST_WRITES = frozenset({
    "normal_", "uniform_", "bernoulli_", "random_", "exponential_", "geometric_", "cauchy_",
    "log_normal_", "fill_", "zero_", "randperm", "normal", "bernoulli", "multinomial",
})


def is_factory(schema) -> bool:
    """An op that reads no tensor (``arange``, ``full``, ``linspace``): its values are made
    on the host and written to the device, like a fill (the compile path folds them). Its
    ``out=`` tensor (structured factories reach the device as ``arange.start_out``) is
    where it writes, not what it reads."""
    return not any("Tensor" in str(a.type) and not (a.alias_info is not None and a.alias_info.is_write)
                   for a in schema.arguments)


def _to_host(x):
    if isinstance(x, torch.Tensor) and x.device.type == "npu":
        return x.detach().to("cpu")
    if isinstance(x, torch.Generator) and x.device.type == "npu":
        return None              # host draws use the CPU generator (torch.manual_seed seeds it)
    if isinstance(x, torch.device) and x.type == "npu":
        return torch.device("cpu")
    return x


def _to_device(x, index):
    if isinstance(x, torch.Tensor) and x.device.type == "cpu":
        return x.to(f"npu:{index}")
    return x


#: ops an accelerator's torch runs on integer tensors whose CPU kernel refuses them: the host
#: runs them on float64 copies (exact for every int32, and int64 below 2^53) and returns the
#: input's integer dtype, as CUDA does. transformers' MoE routing calls ``torch.histc`` on
#: ``expert_ids.int()`` on any device but CPU and MPS (CPU: "histogram_cpu" not implemented for 'Int').
INTEGERS_AS_FLOAT64 = frozenset({"aten.histc.default"})


def _widened(op, h_args, h_kwargs):
    """``op`` on the host where CPU torch refuses its integer inputs (:data:`INTEGERS_AS_FLOAT64`)."""
    ints = [t.dtype for t in tree_flatten((h_args, h_kwargs))[0]
            if isinstance(t, torch.Tensor) and not t.is_floating_point() and not t.is_complex()]
    if str(op) not in INTEGERS_AS_FLOAT64 or not ints:
        return None
    wide = tree_map(lambda t: t.double() if isinstance(t, torch.Tensor) and t.dtype in ints else t,
                    (h_args, h_kwargs))
    out = op(*wide[0], **wide[1])
    return tree_map(lambda t: t.to(ints[0]) if isinstance(t, torch.Tensor) else t, out)


def on_host(op, args, kwargs, index):
    h_args, h_kwargs = tree_map(_to_host, (args, kwargs))
    with torch.no_grad():
        out = _widened(op, h_args, h_kwargs)
        if out is None:
            out = op(*h_args, **h_kwargs)
    return tree_map(lambda x: _to_device(x, index), out)


def write_back(targets, results):
    """Copy each result into its target (an in-place or out= op's), which drops whatever
    kernels derived from the target's storage while it was a kept parameter (``direct.forget``)."""
    for t, r in zip(targets, results):
        if t.device.type == "npu":
            forget(t)
        if tuple(t.shape) != tuple(r.shape):
            t.resize_(r.shape)
        t.copy_(r)


def written(op, args, kwargs):
    """The tensors ``op`` writes (``self`` of an in-place op, the ``out=`` tensors)."""
    written = []
    for i, arg in enumerate(op._schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            value = kwargs.get(arg.name, args[i] if i < len(args) and not arg.kwarg_only else None)
            if isinstance(value, torch.Tensor):
                written.append(value)
            elif isinstance(value, (list, tuple)):
                written.extend(v for v in value if isinstance(v, torch.Tensor))
    return written


def host_write(op, args, kwargs):
    """A random or constant fill: made on the host, copied into the device tensor."""
    index = device_of(tree_flatten((args, kwargs))[0], kwargs, op)
    STATS["host_writes"] += 1
    ROUTES[(label(op), "host write")] += 1
    if is_random_op(op):
        with rng_scope(index):
            return _host_write_at(op, args, kwargs, index)
    return _host_write_at(op, args, kwargs, index)


def _host_write_at(op, args, kwargs, index):
    targets = written(op, args, kwargs)
    if not targets:      # a functional random op (normal, bernoulli): its result, on the device
        return on_host(op, args, kwargs, index)

    h_args, h_kwargs = tree_map(_to_host, (args, kwargs))
    host_targets = written(op, h_args, h_kwargs)
    with torch.no_grad():
        op(*h_args, **h_kwargs)
    write_back(targets, host_targets)
    return targets[0] if len(targets) == 1 else tuple(targets)


@functools.cache
def functional_of(op):
    """The functional overload of mutating ``op`` with the same arguments (``mul_.Tensor`` ->
    ``mul.Tensor``, ``clamp_.Tensor`` -> ``clamp.Tensor``), or None."""
    schema = op._schema
    name = schema.name.split("::")[-1]
    base = name[:-1] if name.endswith("_") else name
    ins = [(a.name, str(a.type)) for a in schema.arguments
           if not (a.alias_info is not None and a.alias_info.is_write and a.kwarg_only)]
    packet = getattr(torch.ops.aten, base, None)
    if packet is not None:
        for overload in packet.overloads():
            cand = getattr(packet, overload)
            cs = cand._schema
            if cs.is_mutable:
                continue
            if [(a.name, str(a.type)) for a in cs.arguments] == ins:     # clamp.Tensor, not clamp
                return cand
    return None


def functional_arguments(op, functional, args, kwargs):
    """The arguments of mutating ``op``'s call bound to its functional form's schema."""
    f_args, f_kwargs = [], {}
    bound = {}
    for i, arg in enumerate(op._schema.arguments):
        if arg.name in kwargs:
            bound[arg.name] = kwargs[arg.name]
        elif i < len(args) and not arg.kwarg_only:
            bound[arg.name] = args[i]
    for arg in functional._schema.arguments:
        if arg.name not in bound:
            continue
        if arg.kwarg_only:
            f_kwargs[arg.name] = bound[arg.name]
        else:
            f_args.append(bound[arg.name])
    return tuple(f_args), f_kwargs


def host_args(args, kwargs):
    return tree_map(_to_host, (args, kwargs))


def on_host_result(out, index):
    return tree_map(lambda x: _to_device(x, index), out)


class HostRoute:
    """The op on the host, whole (it could not be traced or planned alone)."""

    kind = "host"

    def __init__(self, op, index, label, reason):
        self.op, self.index, self.label, self.reason = op, index, label, reason

    def call(self, args, kwargs, tensors):
        return self.run_args(args, kwargs)

    def run_args(self, args, kwargs):
        STATS["host_fallback_ops"] += 1
        ROUTES[(self.label, "host fallback")] += 1
        if is_random_op(self.op):
            with rng_scope(self.index):
                return on_host(self.op, args, kwargs, self.index)
        return on_host(self.op, args, kwargs, self.index)


def host_route(op, index, label, reason):
    from torchfl.runtime.errors import FallbackNotAllowed
    from torchfl.runtime.logs import LOG

    chip = _dev.chip_names()[index]
    if strict():
        raise FallbackNotAllowed(chip, [_Fallback(str(op), "eager", reason)])
    LOG.warning("[SME] Fallback to CPU: %s (%s)", label, reason)
    return HostRoute(op, index, label, reason)


class _Fallback:
    def __init__(self, op, node, reason):
        self.op, self.node, self.reason = op, node, reason


