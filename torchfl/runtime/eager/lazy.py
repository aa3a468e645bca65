"""Lazy mode: ops on npu tensors are recorded, and run as one planned graph (with fusion)
when the host needs a value.

    with torch.npu.lazy():            # or TORCHFL_LAZY=1 for the whole process
        y = model(x)                  # recorded: y is allocated, not computed
    print(y.cpu())                    # a sync point: the graph is planned and run

Each recorded op gets its output tensors at once (shapes from the op's meta kernel), so
Python code, autograd and views work as usual. A sync point -- a copy to the host or
between tensors (``.cpu()``, ``copy_``, an in-place op's write), ``.item()``, an op that
runs on the host whole, leaving the ``with`` block, ``torch.npu.synchronize()`` -- replays
the recorded ops into one FX graph whose outputs are the recorded tensors still alive
(intermediates that died are fused away), plans it with the SME and runs it; results are
written into the tensors handed out. Graphs are cached per recorded sequence, so a model
run twice is planned once, and its parameters (static inputs) stay on the chip in the
plan's dtype and layout until an optimizer step changes them.
"""
from __future__ import annotations

import functools
import threading
import weakref

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from . import _STATE, set_fast_bypass
from . import device as _dev
from . import ops as _ops
from .calls import device_of, eager_precision, strict, tensor_layout_of
from .host import functional_arguments, functional_of
from .rng import rng_scope
from .stats import LAZY as STATS
from .stats import STATS as _EAGER_STATS
from .trace import (KEPT_WHOLE, TRACE_AS, decompositions, drop_dead, functionalize_input_writes, is_random_graph,
                    planning_examples, python_dispatch_enabled, unbatched_inputs)

__all__ = ["active", "record", "flush_all", "lazy_mode", "STATS", "last_plan"]

_TLS = threading.local()          # per thread: the lazy depth, the recorder, whether a flush runs


def _env_lazy() -> bool:
    from torchfl.kernels.envvars import flag

    return flag("TORCHFL_LAZY")


def _autograd_engine_thread() -> bool:
    """Is this a thread of torch's autograd engine (a device's backward runs on one)? A thread
    Python did not start (threading's ``_DummyThread``) inside a backward pass. Its recording
    would wait for a sync point of its own, which never comes (the caller's sync flushes the
    caller's recording): its ops run as they come instead (as the forward's steps that build
    the autograd graph do: :func:`_builds_autograd_graph`)."""
    return isinstance(threading.current_thread(), threading._DummyThread) and torch._C._current_graph_task_id() != -1


def active() -> bool:
    depth = getattr(_TLS, "depth", None)
    if depth is None:
        depth = _TLS.depth = 1 if _env_lazy() and not _autograd_engine_thread() else 0
        set_fast_bypass(0, depth)       # the adapter's fast path leaves a lazy thread's ops to the router
    return depth > 0 and not getattr(_TLS, "flushing", False)


def last_plan():
    """The plan of the most recent flush (tests, explain)."""
    return _dev.DEVICES.last_plan


class lazy_mode:
    """``with lazy_mode():`` records ops; leaving the block (or any sync point) runs them."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled

    def __enter__(self):
        active()
        _TLS.depth += 1 if self.enabled else 0
        set_fast_bypass(0, _TLS.depth)
        return self

    def __exit__(self, *exc):
        _TLS.depth -= 1 if self.enabled else 0
        set_fast_bypass(0, _TLS.depth)
        flush_all()


class _Recorder:
    """The ops recorded on one device since the last flush."""

    def __init__(self, index: int):
        self.index = index
        self.nodes = []          # (op, flat args with refs, spec)
        self.inputs = []         # external tensors, in first-use order
        self.input_ids = {}      # id(tensor) -> position
        self.produced = {}       # storage address -> (node, output position, tensor weakref)
        self.outputs = []        # (node, output position, weakref) of every recorded output
        self.key = []


def _recorder(index: int):
    rec = getattr(_TLS, "recorder", None)
    if rec is not None and rec.index != index:
        flush_all()
        rec = None
    if rec is None:
        rec = _TLS.recorder = _Recorder(index)
    return rec


def _meta(t):
    return torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device="meta")


@functools.lru_cache(maxsize=None)
def _arg_spec(n: int):
    """The TreeSpec of ``(args, {})`` for ``n`` positional leaves."""
    return tree_flatten((tuple(range(n)), {}))[1]


def _flatten(args, kwargs):
    """``tree_flatten((args, kwargs))`` and a cheap hashable name of its structure. A call
    with positional arguments only and no tensor (or nested container) inside a list (every
    op of a model but ``cat``/``stack``) keeps its arguments as the leaves: a list of ints
    is one leaf."""
    if not kwargs and not any(isinstance(a, (list, tuple)) and any(isinstance(x, (torch.Tensor, list, tuple, dict))
                                                                   for x in a) or isinstance(a, dict)
                              for a in args):
        n = len(args)
        return list(args), _arg_spec(n), n
    flat, spec = tree_flatten((args, kwargs))
    return flat, spec, str(spec)


def _outputs_meta(op, flat, spec):
    """The outputs ``op`` gives for these arguments, from its meta kernel: (out spec, per
    output (shape, stride, dtype) or the non-tensor value, how to rebuild it: "single" tensor,
    "tuple" of leaves, else "tree")."""
    m_args, m_kwargs = tree_unflatten([_meta(a) if isinstance(a, torch.Tensor) else a for a in flat], spec)
    out_flat, out_spec = tree_flatten(op(*m_args, **m_kwargs))
    metas = tuple((tuple(m.shape), tuple(m.stride()), m.dtype) if isinstance(m, torch.Tensor) else ("value", m)
                  for m in out_flat)
    if out_spec.is_leaf():
        form = "single" if len(metas[0]) == 3 else "tree"
    else:          # batch_norm's (out, mean, invstd): a plain tuple of leaves
        form = "tuple" if out_spec.type is tuple and out_spec.num_leaves == out_spec.num_children else "tree"
    return out_spec, metas, form


def _index_of(flat, kwargs, op) -> int:
    """The device index of the call (``calls.device_of``, which also names mixed devices
    and applies torch's rule for host operands, when the first npu tensor does not settle
    it)."""
    index = None
    for a in flat:
        if isinstance(a, torch.Tensor):
            dev = a.device
            if dev.type == "npu":
                if index is None:
                    index = dev.index or 0
                elif (dev.index or 0) != index:
                    index = None
                    break
            elif a.dim() != 0:       # a host operand: the rule decides (usually an error)
                index = None
                break
    return device_of(flat, kwargs, op) if index is None else index


def record(op, args, kwargs):
    """Record ``op`` (returns its outputs, allocated, to be computed at the next flush).
    The outputs' shapes come from the op's meta kernel, run once per signature."""
    kind = _ops.op_kind(op)
    if kind != "functional" or _builds_autograd_graph(args, kwargs):   # writes: run now, in order
        fresh = _out_form(op, args, kwargs) if kind == "mutating" else None
        if fresh is not None:    # ``mul.out`` into a tensor a composite just made: its functional form
            functional, f_args, f_kwargs, out = fresh
            return _record(functional, f_args, f_kwargs, out)
        flush_all()
        return _ops.run_eager(op, args, kwargs)
    return _record(op, args, kwargs)


def _builds_autograd_graph(args, kwargs) -> bool:
    """Does this call record a step of an autograd graph (grad mode on, an input that requires
    grad)? Such an op runs now: its backward runs on the autograd engine's own thread
    (:func:`_autograd_engine_thread`), which reads the saved values at once and cannot flush
    this thread's recording; lazy mode fuses inference (``torch.no_grad()``)."""
    if not torch.is_grad_enabled():
        return False
    flat, _spec = tree_flatten((args, kwargs))
    return any(isinstance(t, torch.Tensor) and t.requires_grad for t in flat)


def _out_form(op, args, kwargs):
    """(functional op, its arguments, the ``out`` tensor) when ``op`` is an ``out=`` overload
    writing one whole, fresh npu tensor that none of its inputs shares (structured ops reach
    the device this way: ``x * 2`` arrives as ``mul.out``), else None. Recording the
    functional op with ``out`` as its output keeps the op in the graph."""
    written = [a for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    if len(written) != 1 or not written[0].kwarg_only or len(op._schema.returns) != 1:
        return None
    out = kwargs.get(written[0].name)
    if not isinstance(out, torch.Tensor) or out.device.type != "npu" or out.storage_offset() != 0 \
            or out.untyped_storage().nbytes() != out.numel() * out.element_size() \
            or not (out.is_contiguous() or tensor_layout_of(out) is not None):
        return None
    functional = functional_of(op)
    if functional is None or len(functional._schema.returns) != 1:
        return None
    f_args, f_kwargs = functional_arguments(op, functional, args, kwargs)
    ptr = out.untyped_storage().data_ptr()
    for a in tree_flatten((f_args, f_kwargs))[0]:
        if isinstance(a, torch.Tensor) and a.device.type == "npu" and a.untyped_storage().data_ptr() == ptr:
            return None
    return functional, f_args, f_kwargs, out


def _record(op, args, kwargs, out=None):
    """Record functional ``op``; its output is a new tensor, or ``out`` (resized to it)."""
    _ops.ensure_functional_routes()
    flat, spec, structure = _flatten(args, kwargs)
    index = _index_of(flat, kwargs, op)
    dev = _dev.get(index)
    sig = tuple([(a.shape, a.dtype, a.stride(), a.storage_offset()) if isinstance(a, torch.Tensor)
                 else ("v", repr(a)) for a in flat])
    mkey = (op, structure, sig, torch.get_default_dtype())
    meta = dev.metas.get(mkey, False)
    if meta is False:
        try:
            meta = _outputs_meta(op, flat, spec)
        except RuntimeError:
            # NotImplementedError (a RuntimeError): no meta kernel (nonzero, unique, bincount);
            # RuntimeError: a meta kernel that needs the data (``.item()``) or refuses the
            # arguments (the eager run then raises the op's own error). Run it now, eagerly,
            # after what was recorded. Anything else (TypeError, AttributeError...) is a bug
            # and propagates: it must not become an eager run.
            meta = None
        dev.metas[mkey] = meta
    if meta is None or (out is not None and (meta[2] != "single" or meta[1][0][2] != out.dtype)):
        flush_all()
        if out is not None:
            with torch.no_grad():
                r = _ops.run_eager(op, args, kwargs)
                if tuple(out.shape) != tuple(r.shape):
                    out.resize_(r.shape)
                out.copy_(r)
            return out
        return _ops.run_eager(op, args, kwargs)
    rec = _recorder(index)
    refs = [_ref(rec, a) if isinstance(a, torch.Tensor) else a for a in flat]
    node = len(rec.nodes)
    rec.nodes.append((op, refs, spec))
    rec.key.append((op, structure, sig, tuple([r for r, a in zip(refs, flat) if isinstance(a, torch.Tensor)])))
    STATS["ops_recorded"] += 1
    out_spec, metas, form = meta
    device = dev.name
    results = []
    for pos, m in enumerate(metas):
        if len(m) == 3:
            if out is not None:
                if tuple(out.shape) != tuple(m[0]):
                    out.resize_(m[0])
                t = out
            else:
                t = torch.empty_strided(m[0], m[1], dtype=m[2], device=device)
            rec.produced[t.untyped_storage().data_ptr()] = (node, pos, tuple(t.stride()))
            rec.outputs.append((node, pos, weakref.ref(t)))
            results.append(t)
        else:
            results.append(m[1])
    _STATE["adapter"].set_lazy_pending(True)     # the adapter's copies flush first
    if form == "single":
        return results[0]
    return tuple(results) if form == "tuple" else tree_unflatten(results, out_spec)


def _ref(rec, t):
    if t.device.type == "npu":
        hit = rec.produced.get(t.untyped_storage().data_ptr())
        if hit is not None:
            n, pos, base = hit
            return ("node", n, pos, (tuple(t.shape), tuple(t.stride()), t.storage_offset()), base)
    pos = rec.input_ids.get(id(t))
    if pos is None:
        pos = rec.input_ids[id(t)] = len(rec.inputs)
        rec.inputs.append(t)
    return ("in", pos)


def flush_all() -> None:
    """Run what was recorded (a sync point); nothing to do when nothing is pending."""
    rec = getattr(_TLS, "recorder", None)
    if rec is None:
        return
    _TLS.recorder = None
    if _STATE["adapter"] is not None:
        _STATE["adapter"].set_lazy_pending(False)
    if not rec.nodes:
        return
    _TLS.flushing = True
    try:
        with python_dispatch_enabled():
            _run(rec)
    finally:
        _TLS.flushing = False


def _replay(rec, alive):
    """The recorded ops as a function of the external inputs, returning the alive outputs."""
    trace_as = TRACE_AS
    aten = torch.ops.aten

    def program(*inputs):
        env = {}
        for i, (op, refs, spec) in enumerate(rec.nodes):
            vals = []
            for r in refs:
                if isinstance(r, tuple) and r and r[0] == "in":
                    vals.append(inputs[r[1]])
                elif isinstance(r, tuple) and r and r[0] == "node":
                    _tag, n, pos, (shape, stride, offset), base = r
                    src = env[(n, pos)]
                    if (shape, stride, offset) != (tuple(src.shape), base, 0):
                        src = _storage_view(aten, src, base, shape, stride, offset)
                    vals.append(src)
                else:
                    vals.append(r)
            a, k = tree_unflatten(vals, spec)
            out = (_leaf(op) or trace_as.get(op, op))(*a, **k)
            for pos, o in enumerate(tree_flatten(out)[0]):
                env[(i, pos)] = o
        return tuple(env[(n, pos)] for n, pos in alive)

    return program


def _leaf(op):
    """For a composite op the rules map whole (``trace.KEPT_WHOLE``: attention), a custom op
    standing in for it while the recorded ops are traced: make_fx would otherwise decompose
    it (into torch's CPU "math" attention, which upcasts float16 to float32). The stand-in
    is put back by :func:`_restore_leaves`. None for every other op."""
    return _sdpa_leaf() if op in KEPT_WHOLE else None


@functools.lru_cache(maxsize=None)
def _sdpa_leaf():
    """``torchfl_eager::sdpa``: attention's signature, outputs shaped by a fake kernel."""
    @torch.library.custom_op("torchfl_eager::sdpa", mutates_args=())
    def sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None = None,
             dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
             enable_gqa: bool = False) -> torch.Tensor:
        raise RuntimeError("torchfl_eager::sdpa only stands in for attention while lazy mode traces")

    @sdpa.register_fake
    def _(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        return query.new_empty(tuple(query.shape[:-1]) + (value.shape[-1],))

    def call(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False):
        return sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)

    call.stand_in = torch.ops.torchfl_eager.sdpa.default
    return call


def _restore_leaves(gm) -> None:
    """The stand-ins of :func:`_leaf` become the aten op again (its kwarg-only arguments
    by name)."""
    if not _sdpa_leaf.cache_info().currsize:     # no stand-in was made in this process
        return
    stand_ins = {_sdpa_leaf().stand_in: op for op in KEPT_WHOLE}
    changed = False
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in stand_ins:
            args = list(node.args) + [None, 0.0, False, None, False][len(node.args) - 3:]
            node.target = stand_ins[node.target]
            node.args = tuple(args[:6])
            node.kwargs = {"scale": args[6], "enable_gqa": args[7]}
            changed = True
    if changed:
        gm.recompile()


def _row_major(shape) -> tuple:
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= d
    return tuple(reversed(strides))


def _storage_view(aten, src, base, shape, stride, offset):
    """A view (``shape``, ``stride``, ``offset``) of the storage of a recorded tensor whose
    value is ``src`` and whose storage strides are ``base`` (a dense permutation), as graph
    ops: the storage as a 1-D row-major value (``src`` permuted into ``base``'s order), then
    a reshape or a strided window of it. The planner's ``as_strided`` reads the row-major
    elements of its input whatever the strides the trace gave it, so the window is always
    taken over that 1-D value."""
    if base == _row_major(tuple(src.shape)):
        storage = aten.reshape.default(src, [-1])
    else:
        perm = sorted(range(src.dim()), key=lambda d: (-base[d], d))
        storage = aten.reshape.default(aten.permute.default(src, perm), [-1])
    if offset == 0 and stride == _row_major(shape) and _numel(shape) == src.numel():
        return aten.view.default(storage, list(shape))
    return aten.as_strided.default(storage, list(shape), list(stride), offset)


def _numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def _run(rec):
    targets, alive = [], []
    for n, pos, ref in rec.outputs:
        t = ref()
        if t is not None:
            targets.append(t)
            alive.append((n, pos))
    STATS["flushes"] += 1
    if not alive:
        return
    param = torch.nn.Parameter     # weights and their views (the ``w.t()`` of a linear layer)
    static = tuple(i for i, t in enumerate(rec.inputs) if isinstance(t, param) or isinstance(t._base, param))
    key = (tuple(rec.key), tuple(alive), static,
           tuple((tuple(t.shape), t.dtype, tuple(t.stride())) for t in rec.inputs))
    dev = _dev.get(rec.index)
    entry = dev.graphs.get(key)
    if entry is None:
        entry = dev.graphs[key] = _plan_graph(rec, alive, static, dev)
        STATS["graphs_planned"] += 1
    plan, executor, writes, random = entry
    _dev.DEVICES.last_plan = plan
    if random:
        with rng_scope(rec.index):
            results = executor.run(tuple(rec.inputs))
    else:
        results = executor.run(tuple(rec.inputs))
    with torch.no_grad():
        for t, r in zip(targets, results):
            if isinstance(r, torch.Tensor):
                if t.shape != r.shape:
                    # an op whose meta kernel and host kernel disagree on a shape (an eval-mode
                    # native_batch_norm's saved statistics: (C,) in meta, (0,) computed): the
                    # tensor takes the computed one, as the op run eagerly returns
                    t.resize_(r.shape)
                t.copy_(r)
        for i, r in zip(writes, results[len(results) - len(writes):] if writes else ()):
            rec.inputs[i].copy_(r)      # running statistics a training-mode batch-norm updates
    _EAGER_STATS["lazy_graph_ops"] += len(rec.nodes)
    _EAGER_STATS["lazy_fallback_nodes"] += len(plan.fallbacks)     # host steps inside the graphs
    del results


def _plan_graph(rec, alive, static, dev):
    """The recorded ops as one planned graph: (plan, executor, written input positions,
    whether it draws random numbers)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from torchfl.planner.api import plan_captured
    from torchfl.planner.capture import Captured

    from .executor import EagerExecutor
    from .oom import out_of_memory_as_torch

    target = dev.target
    examples = [torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype) for t in rec.inputs]
    with torch.no_grad():
        gm = make_fx(_replay(rec, alive), decomposition_table=decompositions(dev), tracing_mode="fake")(*examples)
    _restore_leaves(gm)
    drop_dead(gm)
    writes = functionalize_input_writes(gm)
    placeholders = [(p.name, "input", i) for i, p in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")]
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    outputs = [a.name if isinstance(a, torch.fx.Node) else None for a in tree_flatten(out_node.args[0])[0]]
    captured = Captured(gm, placeholders, {}, outputs, training=False,
                        extra={"unbatched": unbatched_inputs(placeholders, rec.inputs, gm)})
    strict_ = strict()
    with out_of_memory_as_torch():          # one type for out of memory (issue 52 case 14)
        plan = plan_captured(captured, planning_examples(rec.inputs, target.hcd), target,
                             precision=eager_precision(), strict=strict_)
    executor = EagerExecutor(plan, target, rec.index, graph_module=gm, strict=strict_, static_inputs=static)
    return plan, executor, writes, is_random_graph(gm)
