"""Every op on ``npu`` tensors (other than the adapter's factories, copies and views): a
one-op plan of the SME, cached per signature on the device's :class:`~.device.NpuDevice`,
run by the plan executor on the chip.

* The op is traced alone into a core-ATen FX graph (``make_fx`` with the planner's
  decomposition table, :mod:`.trace`) and planned like any captured graph: the same rules,
  costs, hard constraints (the same errors as the compile path) and precision policy
  (``TORCHFL_PRECISION``). Plans are cached per signature (:mod:`.calls`): op, device, each
  argument's shape, dtype and layout, and the values of its non-tensor arguments.
* Inputs are read in place: the executor sees each npu tensor's own device buffer, in the
  layout its strides describe. Outputs are the kernels' buffers, handed to torch as npu
  tensors (no copy). A strided view, a misaligned offset or a dtype/layout the plan does
  not take is copied first (counted in ``STATS["converted_inputs"]``). A view is storage
  strides, not a chip layout: a permutation the chip does not compute in is planned as a
  row-major input (``trace.planning_examples``) and converted on upload, never refused.
* One tensor passed twice (``t + t``, ``cat([t, t])``) is one plan input: device memory
  counts storages, not arguments (``calls.alias_pattern``, part of the route's key).
* Mixed devices follow torch's rule: only 0-dim CPU tensors (and indexing ops' CPU
  indices) mix with npu tensors (``calls.device_of``).
* In-place and ``out=`` overloads run their functional overload and copy the result in.
* Ops with no rule run as the plan's explicit host fallbacks (logged once per signature,
  counted per call); ops that cannot even be traced, whose output shape depends on the
  data (``a[a > 0]``, nonzero, unique) or that compute a float64 scalar run on the host
  whole (:mod:`.host`). All are refused by ``TORCHFL_STRICT=1``. Random draws, constant
  fills and factories (``arange``, ``full``) write host-made data into the tensor (like a
  copy from the host): counted apart, allowed by strict mode; random ones draw from the
  device's generator (``rng.rng_scope``), as do plans whose graph draws (dropout).
* GradScaler's bookkeeping ops are compositions of planned ops (``_COMPOSED``).

Lazy mode and the entry from the dispatcher are :mod:`.lazy` and :mod:`.dispatch`, above this.
"""
from __future__ import annotations

import functools
import math
import threading

import torch
from torch.utils._pytree import tree_flatten

from . import device as _dev
from .calls import (OPTIMIZER, alias_pattern, arg_key, device_of, eager_precision, env_flags,
                    in_optimizer_step, install_optimizer_hooks, label, strict)
from .host import (HOST_WRITES, functional_arguments, functional_of, host_args, host_route, host_write,
                   is_factory, on_host_result, write_back, written)
from .routes import build_route
from .stats import ROUTES, STATS

__all__ = ["run_eager", "run_functional", "fast_key", "op_kind", "STATS", "ROUTES", "reset_stats",
           "eager_precision", "clear_cache", "ensure_functional_routes", "routes", "fast_routes"]

_LOCK = threading.RLock()


def reset_stats() -> None:
    STATS.clear()
    ROUTES.clear()


def clear_cache() -> None:
    """Forget every device's routes (their plans and executors)."""
    with _LOCK:
        for h in list(_dev.DEVICES.handles.values()):
            h.clear_routes()


def routes() -> list:
    """Every route built so far, of every device (tests, tools/bench_eager.py)."""
    return [r for h in list(_dev.DEVICES.handles.values()) for r in list(h.routes.values())]


def fast_routes() -> dict:
    """Every device's fast-key routes in one dict (tests)."""
    return {k: r for h in list(_dev.DEVICES.handles.values()) for k, r in list(h.fast_routes.items())}


def run_eager(op, args, kwargs):
    """Run ``op`` now (not recorded), by its kind."""
    ensure_functional_routes()
    kind = op_kind(op)
    if kind == "functional":
        return run_functional(op, args, kwargs)
    if kind == "write":
        return host_write(op, args, kwargs)
    if kind == "composed":
        return _COMPOSED[op._schema.name.split("::")[-1]](*args, **kwargs)
    return _mutating(op, args, kwargs)


@functools.cache
def op_kind(op) -> str:
    """How ``op`` runs (once per op): a host write, GradScaler's composed bookkeeping, a
    mutating op or a functional one."""
    schema = op._schema
    base = schema.name.split("::")[-1]
    return ("write" if base in HOST_WRITES or base + "_" in HOST_WRITES or is_factory(schema)
            else "composed" if base in _COMPOSED
            else "mutating" if schema.is_mutable else "functional")


# ---------------------------------------------------------------- AMP's bookkeeping ops

def _amp_unscale_(grads, found_inf, inv_scale):
    """``torch._amp_foreach_non_finite_check_and_unscale_`` (GradScaler.unscale_): each
    gradient times ``inv_scale`` on the chip (a planned ``mul``), ``found_inf`` set to 1
    when one holds an inf or NaN (its float32 sum is then not finite: read back as a scalar)."""
    bad = False
    with torch.no_grad():
        for g in grads:
            if not bad and not math.isfinite(float(g.float().sum())):
                bad = True
            g.mul_(inv_scale)
        if bad:
            found_inf.fill_(1.0)


def _amp_update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval):
    """``torch._amp_update_scale_`` (GradScaler.update) on three scalars, as CUDA's kernel:
    back off after an inf, grow after ``growth_interval`` clean steps."""
    with torch.no_grad():
        if float(found_inf) != 0.0:
            scale.fill_(float(scale) * backoff_factor)
            growth_tracker.fill_(0)
        else:
            successful = int(growth_tracker) + 1
            if successful == growth_interval:
                grown = float(scale) * growth_factor
                if math.isfinite(grown):
                    scale.fill_(grown)
                growth_tracker.fill_(0)
            else:
                growth_tracker.fill_(successful)
    return scale


_COMPOSED = {"_amp_foreach_non_finite_check_and_unscale_": _amp_unscale_,
             "_amp_update_scale_": _amp_update_scale_}


_ROUTES_READY = threading.Event()
_ROUTES_STARTED: list = []        # the thread registering them (its own ops inside go on)


def ensure_functional_routes() -> None:
    """Once: register the functional overloads the bundled rule packs name (see routing).
    Other threads wait until it is done (they went on with half the overloads registered)."""
    if _ROUTES_READY.is_set():
        return
    with _LOCK:
        if _ROUTES_READY.is_set() or _ROUTES_STARTED:
            return
        _ROUTES_STARTED.append(threading.get_ident())
        from torchfl.planner.target import bundled_packs

        from . import _STATE
        from .routing import register_functional

        names = sorted({r.op for pack in bundled_packs() for r in pack.rules})
        try:
            register_functional(names, _STATE["adapter"])
            install_optimizer_hooks()
        except BaseException:
            _ROUTES_STARTED.clear()
            raise
        _ROUTES_READY.set()


# ---------------------------------------------------------------- functional ops

def run_functional(op, args, kwargs):
    """A functional op through its route: found by the fast key (positional arguments),
    else by the general key (built on first use)."""
    if not kwargs:
        fast = fast_key(op, args)
        if fast is not None:
            key, tensors, dev = fast
            try:
                route = dev.fast_routes.get(key)
            except TypeError:           # an unhashable argument: the general key below
                route = False
            if route is None:
                route, tensors = _route(op, args, kwargs)
                dev.fast_routes[key] = route
            if route is not False:
                return route.call(args, kwargs, tensors)
    route, tensors = _route(op, args, kwargs)
    return route.call(args, kwargs, tensors)


_PARAM = torch.nn.Parameter
_TENSOR = torch.Tensor
_grad_enabled = torch.is_grad_enabled
_autograd_node = torch._C._current_autograd_node
_of_torch_device = _dev.of_torch_device
_BY_TORCH = _dev.DEVICES.by_torch


def fast_key(op, args):
    """(a cheap signature of a call with positional arguments only, its tensor arguments, the
    NpuDevice of its first npu tensor), or None (the general key of :func:`_route` applies).
    Finer than that key -- strides instead of layouts, the device of each tensor -- so each
    fast key names one route. None for tensors or nested containers inside lists (``cat``)
    and calls with no npu tensor. A key may be unhashable (an unhashable argument): its
    lookup raises TypeError, and the caller takes the general key (hashing it here first
    would cost every call a second hash)."""
    strict_, precision = env_flags()
    grad = _grad_enabled()
    key = [op, strict_, precision, _autograd_node() is not None, grad,
           not grad and getattr(OPTIMIZER, "depth", 0) > 0]      # in_optimizer_step()
    dev = None
    tensor = _TENSOR
    tensors = []
    by_torch = _BY_TORCH
    for a in args:
        if isinstance(a, tensor):
            tensors.append(a)
            d = a.device
            h = by_torch.get(d, False)
            if h is False:
                h = _of_torch_device(d)
            if dev is None:
                dev = h
            base = a._base
            key.append((d, a.dtype, a.shape, a.stride(), a.requires_grad,
                        (a.__class__ is not tensor and isinstance(a, _PARAM))
                        or (base is not None and base.__class__ is not tensor and isinstance(base, _PARAM))))
        elif isinstance(a, (list, tuple)):
            for x in a:
                if isinstance(x, (torch.Tensor, list, tuple)):
                    return None
            key.append((a.__class__, tuple([x.hex() if isinstance(x, float) else x for x in a]),
                        tuple([x.__class__ for x in a])))
        elif isinstance(a, float):
            key.append(("float", a.hex()))      # NaN equals itself, -0.0 is not 0.0
        else:
            key.append((a.__class__, a))
    if dev is None:
        return None
    if len(tensors) > 1:
        ids = [id(t) for t in tensors]
        if len(set(ids)) != len(ids):
            key.append(("alias", tuple(ids.index(i) for i in ids)))
    return tuple(key), tensors, dev


def _route(op, args, kwargs):
    """The route for this call (built on first use) and its flat tensor arguments."""
    flat, spec = tree_flatten((args, kwargs))
    index = device_of(flat, kwargs, op)
    tensors = [a for a in flat if isinstance(a, torch.Tensor)]
    alias = alias_pattern(tensors)
    key = (op, index, strict(), eager_precision(), torch._C._current_autograd_node() is not None,
           in_optimizer_step(), str(spec), tuple(arg_key(a) for a in flat), alias)
    cache = _dev.get(index).routes
    route = cache.get(key)
    if route is None:
        with _LOCK:
            route = cache.get(key)
            if route is None:
                route = cache[key] = build_route(op, index, flat, spec, tensors, alias)
    return route, tensors


# ---------------------------------------------------------------- mutating ops

def _mutating(op, args, kwargs):
    functional = functional_of(op)
    targets = written(op, args, kwargs)
    if functional is None or not targets:
        return _mutating_on_host(op, args, kwargs, targets)
    f_args, f_kwargs = functional_arguments(op, functional, args, kwargs)
    result = run_functional(functional, f_args, f_kwargs)
    results = list(result) if isinstance(result, (tuple, list)) else [result]
    with torch.no_grad():
        write_back(targets, results[:len(targets)])
    return targets[0] if len(targets) == 1 else tuple(targets)


def _mutating_on_host(op, args, kwargs, targets):
    """A mutating op with no functional form to plan: run on the host, written back."""
    flat = tree_flatten((args, kwargs))[0]
    index = device_of(flat, kwargs, op)
    name = label(op)
    key = (op, index, strict(), "host")
    cache = _dev.get(index).routes
    if cache.get(key) is None:
        cache[key] = host_route(op, index, name, "no functional form to plan")
    h_args, h_kwargs = host_args(args, kwargs)
    host_targets = written(op, h_args, h_kwargs)
    STATS["host_fallback_ops"] += 1
    ROUTES[(name, "host fallback")] += 1
    with torch.no_grad():
        out = op(*h_args, **h_kwargs)
    write_back(targets, host_targets)
    if targets:
        return targets[0] if len(targets) == 1 else tuple(targets)
    return on_host_result(out, index)
