"""Every op on ``npu`` tensors (other than the adapter's factories, copies and views): a
one-op plan of the SME, cached per signature, run by the plan executor on the chip.

* The op is traced alone into a core-ATen FX graph (``make_fx`` with the planner's
  decomposition table) and planned like any captured graph: the same rules, costs, hard
  constraints (the same errors as the compile path) and precision policy
  (``TORCHFL_PRECISION``). Plans are cached per signature: op, device, each argument's
  shape, dtype and layout, and the values of its non-tensor arguments.
* Inputs are read in place: the executor sees each npu tensor's own device buffer, in the
  layout its strides describe. Outputs are the kernels' buffers, handed to torch as npu
  tensors (no copy). A strided view, a misaligned offset or a dtype/layout the plan does
  not take is copied first (counted in ``STATS["converted_inputs"]``). A view is storage
  strides, not a chip layout: a permutation the chip does not compute in is planned as a
  row-major input (:func:`planning_examples`) and converted on upload, never refused.
* One tensor passed twice (``t + t``, ``cat([t, t])``) is one plan input: device memory
  counts storages, not arguments (:func:`alias_pattern`, part of the route's key).
* Mixed devices follow torch's rule: only 0-dim CPU tensors (and indexing ops' CPU
  indices) mix with npu tensors (:func:`_device_of`).
* In-place and ``out=`` overloads run their functional overload and copy the result in.
* Ops with no rule run as the plan's explicit host fallbacks (logged once per signature,
  counted per call); ops that cannot even be traced, whose output shape depends on the
  data (``a[a > 0]``, nonzero, unique) or that compute a float64 scalar run on the host
  whole. All are refused by ``TORCHFL_STRICT=1``. Random draws, constant fills and factories
  (``arange``, ``full``) write host-made data into the tensor (like a copy from the host):
  counted apart, allowed by strict mode; random ones draw from the device's generator
  (``module.rng_scope``), as do plans whose graph draws (dropout).
* GradScaler's bookkeeping ops are compositions of planned ops (``_COMPOSED``).
"""
from __future__ import annotations

import os
import threading
from collections import Counter

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from . import device as _dev
from . import direct as _direct
from . import lazy as _lazy

__all__ = ["dispatch", "STATS", "reset_stats", "eager_precision", "clear_cache"]

STATS: Counter = Counter()      # chip_ops, host_fallback_ops, host_writes, converted_inputs, plans
ROUTES: Counter = Counter()     # (aten op, route) -> calls
_CACHE: dict = {}
_TABLES: dict = {}
_LOCK = threading.RLock()

# ops that write host-made data into their tensor: random draws and constant fills
HOST_WRITES = frozenset({
    "normal_", "uniform_", "bernoulli_", "random_", "exponential_", "geometric_", "cauchy_",
    "log_normal_", "fill_", "zero_", "randperm", "normal", "bernoulli", "multinomial",
})


def reset_stats() -> None:
    STATS.clear()
    ROUTES.clear()


def clear_cache() -> None:
    with _LOCK:
        _CACHE.clear()
        _FAST.clear()


def eager_precision() -> str | None:
    """``TORCHFL_PRECISION`` (float16 / bfloat16): the policy for float32 ops on chips
    without a float32 unit, as ``options={"precision": ...}`` is for torch.compile."""
    return _env_flags()[1]


def _strict() -> bool:
    return _env_flags()[0]


# TORCHFL_STRICT and TORCHFL_PRECISION are read at every op (a program or a test may set
# them between two ops), which through ``os.environ`` costs ~1 us each (key encoding, value
# decoding): the hot path reads the environment's own mapping with pre-encoded keys and
# parses the values again only when they changed.
_ENV = getattr(os.environ, "_data", None)
_ENV_KEYS = tuple(os.environ.encodekey(k) for k in ("TORCHFL_STRICT", "TORCHFL_PRECISION")) \
    if _ENV is not None and hasattr(os.environ, "encodekey") else None
_ENV_MEMO: list = [object(), (False, None)]


def _env_flags() -> tuple:
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


# ---------------------------------------------------------------- entry point

def dispatch(op, args, kwargs):
    if _lazy.active():
        return _lazy.record(op, args, kwargs)
    if not kwargs and _KINDS.get(op) == "functional":      # the warm path: a known signature
        fast = _fast_key(op, args)
        if fast is not None:
            route = _FAST.get(fast[0])
            if route is not None:
                return route.call(args, kwargs, fast[1])
    return run_eager(op, args, kwargs)


def run_eager(op, args, kwargs):
    if not _ROUTES_READY:
        _ensure_functional_routes()
    kind = _KINDS.get(op) or _kind(op)
    if kind == "functional":
        return _functional(op, args, kwargs)
    if kind == "write":
        return _host_write(op, args, kwargs)
    if kind == "composed":
        return _COMPOSED[op._schema.name.split("::")[-1]](*args, **kwargs)
    return _mutating(op, args, kwargs)


_KINDS: dict = {}


def _kind(op) -> str:
    """How ``op`` runs (once per op): a host write, a mutating op or a functional one."""
    schema = op._schema
    base = schema.name.split("::")[-1]
    kind = ("write" if base in HOST_WRITES or base + "_" in HOST_WRITES or _is_factory(schema)
            else "composed" if base in _COMPOSED
            else "mutating" if schema.is_mutable else "functional")
    _KINDS[op] = kind
    return kind


def _is_factory(schema) -> bool:
    """An op that reads no tensor (``arange``, ``full``, ``linspace``): its values are made
    on the host and written to the device, like a fill (the compile path folds them). Its
    ``out=`` tensor (structured factories reach the device as ``arange.start_out``) is
    where it writes, not what it reads."""
    return not any("Tensor" in str(a.type) and not (a.alias_info is not None and a.alias_info.is_write)
                   for a in schema.arguments)


_ROUTES_READY = False


# ---------------------------------------------------------------- AMP's bookkeeping ops

def _amp_unscale_(grads, found_inf, inv_scale):
    """``torch._amp_foreach_non_finite_check_and_unscale_`` (GradScaler.unscale_): each
    gradient times ``inv_scale`` on the chip (a planned ``mul``), ``found_inf`` set to 1
    when one holds an inf or NaN (its float32 sum is then not finite: read back as a scalar)."""
    import math

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
    import math

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


def _ensure_functional_routes():
    """Once: register the functional overloads the bundled rule packs name (see routing)."""
    global _ROUTES_READY
    if _ROUTES_READY:
        return
    _ROUTES_READY = True
    from torchfl.planner.target import bundled_packs

    from .routing import register_functional

    names = sorted({r.op for pack in bundled_packs() for r in pack.rules})
    register_functional(names)
    _install_optimizer_hooks()


_OPTIMIZER = threading.local()


def in_optimizer_step() -> bool:
    """Inside ``optimizer.step()`` (which runs with gradients off): the tensors there are
    parameters, gradients and optimizer state, none with a batch dimension, so none is held
    to ``max_batch_size`` (a 1000-class layer's gradient and momentum are 1000 rows)."""
    return getattr(_OPTIMIZER, "depth", 0) > 0 and not torch.is_grad_enabled()


def _install_optimizer_hooks() -> None:
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    def pre(_opt, _args, _kwargs):
        _OPTIMIZER.depth = getattr(_OPTIMIZER, "depth", 0) + 1

    def post(_opt, _args, _kwargs):
        _OPTIMIZER.depth = max(getattr(_OPTIMIZER, "depth", 1) - 1, 0)

    register_optimizer_step_pre_hook(pre)
    register_optimizer_step_post_hook(post)


# ---------------------------------------------------------------- signatures

def _device_of(flat, kwargs, op=None) -> int:
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
                f"{a.device}! ({_label(op) if op is not None else 'this op'} got a {a.device} tensor of shape "
                f"{tuple(a.shape)}: move it with .to('npu:{index}'); only 0-dim CPU tensors mix with npu ones)")


def _arg_key(a):
    if isinstance(a, torch.Tensor):
        from torchfl.planner.constraints import tensor_layout

        dense = a.is_contiguous() or tensor_layout(a) is not None
        weight = isinstance(a, torch.nn.Parameter) or isinstance(getattr(a, "_base", None), torch.nn.Parameter)
        return ("T", a.device.type, tuple(a.shape), a.dtype, tensor_layout(a) if dense else tuple(a.stride()),
                a.requires_grad and torch.is_grad_enabled(), weight)
    if isinstance(a, float):
        return ("float", a.hex())          # NaN equals itself, -0.0 is not 0.0
    return (type(a).__name__, a)


# ---------------------------------------------------------------- routes

class _ChipRoute:
    """A planned one-op graph and its executor (zero-copy inputs and outputs)."""

    kind = "chip"
    direct = None                      # a DirectRun once prepared (False: the plan needs the executor)
    last_kernel_s = 0.0                # the last call's time in the kernel (tools/bench_eager.py)

    def __init__(self, plan, executor, out_spec, label, fallback: bool, writes=(), keep=None, random=False,
                 empty_tail=0):
        self.plan, self.executor, self.out_spec, self.label = plan, executor, out_spec, label
        self.fallback = fallback
        self.writes = tuple(writes)    # input positions the op updates in place (extra outputs)
        self.single = out_spec.is_leaf()
        self.keep = keep               # positions of the distinct tensors when one is passed twice
        self.random = random           # draws random numbers (on the host): from the device's generator
        self._chip_key = (label, "chip")
        self.plain = keep is None and not random
        self.empty_tail = empty_tail   # empty outputs the op returns after the planned one (eval batch-norm)

    def call(self, args, kwargs, tensors):
        direct = self.direct
        if direct and self.plain:       # the warm path, inline: run()'s first branch
            out = direct.run(tensors)
            if out is not None:
                self.last_kernel_s = direct.last_kernel_s
                STATS["chip_ops"] += 1
                ROUTES[self._chip_key] += 1
                result = out[0] if self.single else tree_unflatten(list(out), self.out_spec)
                return self._with_tail(result) if self.empty_tail else result
        if self.keep is not None:
            tensors = [tensors[i] for i in self.keep]
        if self.random:
            from .module import rng_scope

            with rng_scope(self.executor.index):
                result = self.run(tensors)
        else:
            result = self.run(tensors)
        return self._with_tail(result) if self.empty_tail else result

    def _with_tail(self, result):
        empty = torch.empty
        return (result,) + tuple(empty((0,), dtype=result.dtype, device=result.device)
                                 for _ in range(self.empty_tail))

    def run(self, tensors):
        direct = self.direct
        if direct:
            out = direct.run(tensors)
            if out is not None:
                self.last_kernel_s = direct.last_kernel_s
                STATS["chip_ops"] += 1
                ROUTES[self._chip_key] += 1
                return out[0] if self.single else tree_unflatten(list(out), self.out_spec)
        flat = list(self.executor.run(tensors))
        self.last_kernel_s = self.executor.last_kernel_s
        if direct is None:
            self.direct = (not self.writes and not self.fallback and _direct.prepare(self.executor, tensors)) or False
        STATS["host_fallback_ops" if self.fallback else "chip_ops"] += 1
        ROUTES[(self.label, "host fallback" if self.fallback else "chip")] += 1
        if self.writes:
            n = len(flat) - len(self.writes)
            with torch.no_grad():
                for i, value in zip(self.writes, flat[n:]):
                    tensors[i].copy_(value)
            flat = flat[:n]
        return tree_unflatten(flat, self.out_spec)


class _HostRoute:
    """The op on the host, whole (it could not be traced or planned alone)."""

    kind = "host"

    def __init__(self, op, index, label, reason):
        self.op, self.index, self.label, self.reason = op, index, label, reason

    def call(self, args, kwargs, tensors):
        return self.run_args(args, kwargs)

    def run_args(self, args, kwargs):
        STATS["host_fallback_ops"] += 1
        ROUTES[(self.label, "host fallback")] += 1
        if _is_random_op(self.op):
            from .module import rng_scope

            with rng_scope(self.index):
                return _on_host(self.op, args, kwargs, self.index)
        return _on_host(self.op, args, kwargs, self.index)


def _is_random_op(op) -> bool:
    return isinstance(op, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in op.tags


def _is_random(gm) -> bool:
    """Whether a traced graph draws random numbers (dropout's ``rand``/``bernoulli``, sdpa
    with dropout...): such graphs run with the device's generator in place."""
    return any(n.op == "call_function" and _is_random_op(n.target) for n in gm.graph.nodes)


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


def planning_examples(tensors, hcd) -> list:
    """The tensors as the planner should see them. A view is storage strides, not a chip
    layout: a tensor stored in a permutation the chip does not compute in (attention's
    heads moved, ``NWCH``) is planned as a row-major input, and the executor converts it on
    upload (a counted conversion, ``STATS["converted_inputs"]``) instead of the planner
    refusing the layout."""
    from torchfl.planner.constraints import tensor_layout

    layouts = hcd.layouts
    out = []
    for t in tensors:
        lay = tensor_layout(t) if t.dim() == 4 else None
        if lay is not None and lay not in layouts:
            t = torch.empty(tuple(t.shape), dtype=t.dtype, device="meta")
        out.append(t)
    return out


def _label(op) -> str:
    from torchfl.runtime.errors import aten_name

    return aten_name(str(op))


def _native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """``native_batch_norm`` as the compile path captures it: in inference
    ``_native_batch_norm_legit_no_training`` (the fusion rules' spelling). In training it
    writes its running statistics although its schema does not say so: trace it as the
    functional form the rules map (which returns the new statistics) plus the writes (``functionalize_input_writes`` turns them into
    outputs copied back after the run)."""
    aten = torch.ops.aten
    if running_mean is None or running_var is None:
        return aten.native_batch_norm.default(input, weight, bias, running_mean, running_var, training,
                                              momentum, eps)
    if not training:    # the spelling torch.export gives, which the fusion rules match
        return aten._native_batch_norm_legit_no_training.default(input, weight, bias, running_mean,
                                                                 running_var, momentum, eps)
    out, mean, invstd, new_mean, new_var = aten._native_batch_norm_legit_functional.default(
        input, weight, bias, running_mean, running_var, True, momentum, eps)
    running_mean.copy_(new_mean)
    running_var.copy_(new_var)
    return out, mean, invstd


_TRACE_AS = {torch.ops.aten.native_batch_norm.default: _native_batch_norm}
# composite ops the adapter routes whole (routing.install) and the rules map as they are
_KEPT_WHOLE = frozenset({torch.ops.aten.scaled_dot_product_attention.default})


def python_dispatch_enabled():
    """Tracing (make_fx's fake tensors) needs the Python dispatch keys, which torch turns
    off inside some of its own constructions: ``torch.tensor([], device="npu")`` copies to
    the device under ``no_dispatch()``, and that copy is a lazy-mode sync point."""
    import contextlib

    keys = torch._C.DispatchKey
    stack = contextlib.ExitStack()
    for key in (keys.Python, keys.PythonTLSSnapshot):
        stack.enter_context(torch._C._SetExcludeDispatchKeyGuard(key, False))
    return stack


def _trace(op, flat, spec, tensors, table, alias=None, first_only=False):
    """The op alone as a core-ATen FX graph over its (distinct) tensor arguments
    (``first_only``: returning its first output alone)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    is_tensor = [isinstance(a, torch.Tensor) for a in flat]
    call = _TRACE_AS.get(op, op)
    if alias is not None:
        keep = distinct_positions(alias)
        slot = {p: i for i, p in enumerate(keep)}
        tensors = [tensors[p] for p in keep]

    def one_op(*ts):
        if alias is not None:
            ts = [ts[slot[first]] for first in alias]
        it = iter(ts)
        vals = [next(it) if t else a for a, t in zip(flat, is_tensor)]
        a, k = tree_unflatten(vals, spec)
        out = call(*a, **k)
        return out[0] if first_only else out

    examples = [torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype) for t in tensors]
    with torch.no_grad(), python_dispatch_enabled():
        if op in _KEPT_WHOLE:     # a composite the rules map whole: pre-dispatch keeps it one node
            gm = make_fx(one_op, tracing_mode="fake", pre_dispatch=True)(*examples)
        else:
            gm = make_fx(one_op, decomposition_table=table, tracing_mode="fake")(*examples)
    _drop_dead(gm)
    return gm


def functionalize_input_writes(gm) -> list:
    """Ops that write their inputs without saying so in their schema (a training-mode
    ``native_batch_norm`` updates its running statistics) trace as ``copy_`` into a
    placeholder. Each such write becomes an extra graph output, appended after the
    original output (which becomes element 0 of a tuple); returns the written
    placeholders' positions, in the order of the extra outputs."""
    aten = torch.ops.aten
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    writes = []
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is aten.copy_.default and node.args[0] in placeholders:
            dst, src = node.args[0], node.args[1]
            node.replace_all_uses_with(src)
            gm.graph.erase_node(node)
            writes.append((placeholders.index(dst), src))
    if writes:
        out = next(n for n in gm.graph.nodes if n.op == "output")
        out.args = ((out.args[0],) + tuple(src for _i, src in writes),)
        gm.recompile()
    return [i for i, _src in writes]


def _drop_dead(gm) -> None:
    """Remove the unread ``getitem`` nodes make_fx leaves behind (the planner folds a
    multi-output node's getitems into it and expects each to be read)."""
    if gm.graph.eliminate_dead_code():
        gm.recompile()


def decompositions(packs) -> dict:
    """The one-op decomposition table for ``packs`` (cached per pack tuple)."""
    table = _TABLES.get(id(packs))
    if table is None:
        table = _TABLES[id(packs)] = (packs, _decompositions(packs))   # packs kept: ids stay unique
    return table[1]


def _decompositions(packs) -> dict:
    """Core ATen, except what a rule maps whole (the compile path's training table) and
    the ops the inference capture keeps (linear, conv2d, attention...)."""
    from torchfl.planner.capture import KEEP_OPS, training_decompositions

    keep = {f"aten.{name}" for name in KEEP_OPS}
    return {op: fn for op, fn in training_decompositions(packs).items() if str(op) not in keep}


def _build(op, index, flat, spec, tensors, alias=None):
    from torchfl.planner.api import plan_captured
    from torchfl.planner.capture import Captured, CaptureError
    from torchfl.planner.errors import PlanError
    from torchfl.planner.graph import check_static_shapes

    from .executor import EagerExecutor

    label = _label(op)
    target = _dev.target_of(index)
    table = decompositions(target.packs)
    stats_empty = eval_batch_norm(op, flat, spec)
    try:
        gm = _trace(op, flat, spec, tensors, table, alias, first_only=stats_empty)
    except RuntimeError as exc:
        # what tracing an op alone refuses: no fake kernel (NotImplementedError), data it
        # would need (DataDependentOutputException, DynamicOutputShapeException,
        # UnsupportedOperatorException: RuntimeErrors) -- the op runs on the host, logged and
        # refused by strict. A bug (TypeError, AttributeError, KeyError...) and torch's own
        # refusal of the arguments (IndexError: dim out of range, ValueError) propagate.
        return _host(op, index, label, f"cannot be traced alone ({type(exc).__name__}: "
                                       f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''})")
    try:
        check_static_shapes(gm)
    except CaptureError:       # boolean masks, nonzero, unique: sizes known only from the data
        return _host(op, index, label, "its output shape depends on the data (boolean mask, nonzero, unique)")
    keep = None
    if alias is not None:
        keep = distinct_positions(alias)
        tensors = [tensors[p] for p in keep]
    if eager_precision() is None and tensors and all(t.dim() == 0 for t in tensors) \
            and any(t.dtype == torch.float64 for t in tensors):
        # no chip stores float64; a float64 scalar is bookkeeping (GradScaler's
        # ``scale.double().reciprocal()``): computed on the host, logged, refused by strict
        return _host(op, index, label, "a float64 scalar (no chip stores float64; TORCHFL_PRECISION plans "
                                       "it on the chip)")
    placeholders = [(n.name, "input", i) for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")]
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    out_spec = tree_flatten(out_node.args[0])[1]
    writes = functionalize_input_writes(gm)
    out_flat = tree_flatten(out_node.args[0])[0]
    outputs = [a.name if isinstance(a, torch.fx.Node) else None for a in out_flat]
    captured = Captured(gm, placeholders, {}, outputs, training=False,
                        extra={"unbatched": unbatched_inputs(placeholders, tensors)})
    strict = _strict()
    try:
        plan = plan_captured(captured, planning_examples(tensors, target.hcd), target, precision=eager_precision(),
                             strict=strict)
    except (PlanError, CaptureError):
        raise          # hard constraints, precision, strict: the compile path's own errors
    executor = EagerExecutor(plan, target, index, graph_module=gm, strict=strict)
    STATS["plans"] += 1
    return _ChipRoute(plan, executor, out_spec, label, fallback=bool(plan.fallbacks), writes=writes, keep=keep,
                      random=_is_random(gm), empty_tail=2 if stats_empty else 0)


def eval_batch_norm(op, flat, spec) -> bool:
    """Whether the call is an inference-mode ``native_batch_norm``, whose saved mean and
    inverse std torch returns empty (shape (0,), the input's dtype: nothing is saved). Its
    route plans the normalised output alone and hands two empty tensors beside it, as the
    CPU does: no cast steps for those empty values, so the op takes the direct path
    (ResNet-50 b1 has 53 batch-norms, each planned with two cast steps and run through the
    executor's general path because of them)."""
    if op is not torch.ops.aten.native_batch_norm.default:
        return False
    a, k = tree_unflatten(flat, spec)
    return (a[5] if len(a) > 5 else k.get("training")) is False


def unbatched_inputs(placeholders, tensors) -> list:
    """Placeholders exempt from ``max_batch_size``, as the compile path exempts its lifted
    weights and every input of a backward graph: parameters (and views of them: ``w.t()``
    of a linear layer), vectors (biases, a batch-norm's running statistics: an eager op
    cannot tell a module's buffer from an activation, and a batch is never 1-D here) and,
    inside the autograd engine, every input of a backward op."""
    if torch._C._current_autograd_node() is not None or in_optimizer_step():
        return [name for name, _k, _i in placeholders]
    return [name for (name, _k, _i), t in zip(placeholders, tensors)
            if t.dim() <= 1 or isinstance(t, torch.nn.Parameter)
            or isinstance(getattr(t, "_base", None), torch.nn.Parameter)]


def _host(op, index, label, reason):
    from torchfl.runtime.errors import FallbackNotAllowed
    from torchfl.runtime.logs import LOG

    chip = _dev.chip_names()[index]
    if _strict():
        raise FallbackNotAllowed(chip, [_Fallback(str(op), "eager", reason)])
    LOG.warning("[SME] Fallback to CPU: %s (%s)", label, reason)
    return _HostRoute(op, index, label, reason)


class _Fallback:
    def __init__(self, op, node, reason):
        self.op, self.node, self.reason = op, node, reason


def _functional(op, args, kwargs):
    if not kwargs:
        fast = _fast_key(op, args)
        if fast is not None:
            key, tensors = fast
            route = _FAST.get(key)
            if route is None:
                route, tensors = _route(op, args, kwargs)
                _FAST[key] = route
            return route.call(args, kwargs, tensors)
    route, tensors = _route(op, args, kwargs)
    return route.call(args, kwargs, tensors)


_PARAM = torch.nn.Parameter
_TENSOR = torch.Tensor
_FAST: dict = {}       # _fast_key -> route (the same routes as _CACHE, found without flattening)
_IS_NPU: dict = {}     # torch.device -> whether it is an npu device (``device.type`` costs ~0.5 us)
_grad_enabled = torch.is_grad_enabled
_autograd_node = torch._C._current_autograd_node


def _fast_key(op, args):
    """(a cheap signature of a call with positional arguments only, its tensor arguments),
    or None (the general key of :func:`_route` applies). Finer than that key -- strides
    instead of layouts, the device of each tensor -- so each fast key names one route. None
    for tensors or nested containers inside lists (``cat``), calls with no npu tensor and
    unhashable arguments."""
    strict, precision = _env_flags()
    grad = _grad_enabled()
    key = [op, strict, precision, _autograd_node() is not None, grad,
           not grad and getattr(_OPTIMIZER, "depth", 0) > 0]      # in_optimizer_step()
    npu = False
    tensor = _TENSOR
    tensors = []
    for a in args:
        if isinstance(a, tensor):
            tensors.append(a)
            dev = a.device
            is_npu = _IS_NPU.get(dev)
            if is_npu is None:
                is_npu = _IS_NPU[dev] = dev.type == "npu"
            npu = npu or is_npu
            base = a._base
            key.append((dev, a.dtype, a.shape, a.stride(), a.requires_grad,
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
    if not npu:
        return None
    if len(tensors) > 1:
        ids = [id(t) for t in tensors]
        if len(set(ids)) != len(ids):
            key.append(("alias", tuple(ids.index(i) for i in ids)))
    try:
        hash(key := tuple(key))
    except TypeError:
        return None
    return key, tensors


def _route(op, args, kwargs):
    """The route for this call (built on first use) and its flat tensor arguments."""
    flat, spec = tree_flatten((args, kwargs))
    index = _device_of(flat, kwargs, op)
    tensors = [a for a in flat if isinstance(a, torch.Tensor)]
    alias = alias_pattern(tensors)
    key = (op, index, _strict(), eager_precision(), torch._C._current_autograd_node() is not None,
           in_optimizer_step(), str(spec), tuple(_arg_key(a) for a in flat), alias)
    route = _CACHE.get(key)
    if route is None:
        with _LOCK:
            route = _CACHE.get(key)
            if route is None:
                route = _CACHE[key] = _build(op, index, flat, spec, tensors, alias)
    return route, tensors


# ---------------------------------------------------------------- host paths

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


def _on_host(op, args, kwargs, index):
    from torch.utils._pytree import tree_map

    h_args, h_kwargs = tree_map(_to_host, (args, kwargs))
    with torch.no_grad():
        out = op(*h_args, **h_kwargs)
    return tree_map(lambda x: _to_device(x, index), out)


def _write_back(targets, results):
    for t, r in zip(targets, results):
        if tuple(t.shape) != tuple(r.shape):
            t.resize_(r.shape)
        t.copy_(r)


def _written(op, args, kwargs):
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


def _host_write(op, args, kwargs):
    """A random or constant fill: made on the host, copied into the device tensor."""
    index = _device_of(tree_flatten((args, kwargs))[0], kwargs, op)
    STATS["host_writes"] += 1
    ROUTES[(_label(op), "host write")] += 1
    if _is_random_op(op):
        from .module import rng_scope

        with rng_scope(index):
            return _host_write_at(op, args, kwargs, index)
    return _host_write_at(op, args, kwargs, index)


def _host_write_at(op, args, kwargs, index):
    targets = _written(op, args, kwargs)
    if not targets:      # a functional random op (normal, bernoulli): its result, on the device
        return _on_host(op, args, kwargs, index)
    from torch.utils._pytree import tree_map

    h_args, h_kwargs = tree_map(_to_host, (args, kwargs))
    host_targets = _written(op, h_args, h_kwargs)
    with torch.no_grad():
        op(*h_args, **h_kwargs)
    _write_back(targets, host_targets)
    return targets[0] if len(targets) == 1 else tuple(targets)


_FUNCTIONAL: dict = {}


def _functional_of(op):
    if op in _FUNCTIONAL:
        return _FUNCTIONAL[op]
    schema = op._schema
    name = schema.name.split("::")[-1]
    base = name[:-1] if name.endswith("_") else name
    ins = [(a.name, str(a.type)) for a in schema.arguments
           if not (a.alias_info is not None and a.alias_info.is_write and a.kwarg_only)]
    found = None
    packet = getattr(torch.ops.aten, base, None)
    if packet is not None:
        for overload in packet.overloads():
            cand = getattr(packet, overload)
            cs = cand._schema
            if cs.is_mutable:
                continue
            if [(a.name, str(a.type)) for a in cs.arguments] == ins:     # clamp.Tensor, not clamp
                found = cand
                break
    _FUNCTIONAL[op] = found
    return found


def _mutating(op, args, kwargs):
    functional = _functional_of(op)
    targets = _written(op, args, kwargs)
    if functional is None or not targets:
        flat = tree_flatten((args, kwargs))[0]
        index = _device_of(flat, kwargs, op)
        label = _label(op)
        key = (op, index, _strict(), "host")
        route = _CACHE.get(key)
        if route is None:
            route = _CACHE[key] = _host(op, index, label, "no functional form to plan")
        h_args, h_kwargs = _host_args(args, kwargs)
        host_targets = _written(op, h_args, h_kwargs)
        STATS["host_fallback_ops"] += 1
        ROUTES[(label, "host fallback")] += 1
        with torch.no_grad():
            out = op(*h_args, **h_kwargs)
        _write_back(targets, host_targets)
        if targets:
            return targets[0] if len(targets) == 1 else tuple(targets)
        return _on_host_result(out, index)
    f_args, f_kwargs = functional_arguments(op, functional, args, kwargs)
    result = _functional(functional, f_args, f_kwargs)
    results = list(result) if isinstance(result, (tuple, list)) else [result]
    with torch.no_grad():
        _write_back(targets, results[:len(targets)])
    return targets[0] if len(targets) == 1 else tuple(targets)


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


def _host_args(args, kwargs):
    from torch.utils._pytree import tree_map

    return tree_map(_to_host, (args, kwargs))


def _on_host_result(out, index):
    from torch.utils._pytree import tree_map

    return tree_map(lambda x: _to_device(x, index), out)
