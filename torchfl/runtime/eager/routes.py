"""The route of one op signature on the chip: its one-op plan and executor (:class:`ChipRoute`),
built by :func:`build_route` (traced alone, planned like any captured graph: the same rules,
costs, hard constraints and precision policy as the compile path), or a host route when the
op cannot be traced or planned alone. The executor and the direct path load on first build
(they import the planner; registration must not).
"""
from __future__ import annotations

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from . import device as _dev
from .calls import distinct_positions, eager_precision, label as _label, strict as _strict
from .kept import forget
from .host import host_route
from .rng import rng_scope
from .stats import ROUTES, STATS
from .trace import (decompositions, eval_batch_norm, functionalize_input_writes, is_random_graph,
                    planning_examples, trace_op, transposed_operands, unbatched_inputs)

__all__ = ["ChipRoute", "build_route"]


class ChipRoute:
    """A planned one-op graph and its executor (zero-copy inputs and outputs)."""

    kind = "chip"
    direct = None                      # a DirectRun once prepared (False: the plan needs the executor)
    last_kernel_s = 0.0                # the last call's time in the kernel (tools/bench_eager.py)

    def __init__(self, plan, executor, out_spec, label, fallback: bool, writes=(), keep=None, random=False,
                 empty_tail=0, transposed=()):
        self.plan, self.executor, self.out_spec, self.label = plan, executor, out_spec, label
        self.fallback = fallback
        self.writes = tuple(writes)    # input positions the op updates in place (extra outputs)
        self.single = out_spec.is_leaf()
        self.keep = keep               # positions of the distinct tensors when one is passed twice
        self.random = random           # draws random numbers (on the host): from the device's generator
        self._chip_key = (label, "chip")
        self.transposed = transposed  # inputs the plan takes as their transpose (trace.transposed_operands)
        self.plain = keep is None and not random and not transposed
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
        if self.transposed:
            tensors = [t.t() if i in self.transposed else t for i, t in enumerate(tensors)]
        if self.random:
            with rng_scope(self.executor.index):
                result = self.run(tensors)
        else:
            result = self.run(tensors)
        return self._with_tail(result) if self.empty_tail else result

    def fast_runner(self):
        """The adapter's runner for this route (:meth:`fast`), or None while it has no direct
        form of one output called plainly (not prepared yet, several outputs, an aliased or
        random call, eval batch-norm's empty statistics)."""
        direct = self.direct
        if direct and self.plain and self.single and not self.empty_tail and direct.n_out == 1:
            return self.fast
        return None

    def fast(self, *tensors):
        """The direct kernel on the call's tensor arguments, for the adapter's C++ fast path:
        ``DirectRun.run_raw``'s answer (None: the adapter sends the call through the router)."""
        direct = self.direct
        out = direct.run_raw(tensors)
        if out is not None:
            self.last_kernel_s = direct.last_kernel_s
            STATS["chip_ops"] += 1
            ROUTES[self._chip_key] += 1
        return out

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
            self.direct = (not self.writes and not self.fallback and _prepare_direct(self.executor, tensors)) or False
        STATS["host_fallback_ops" if self.fallback else "chip_ops"] += 1
        ROUTES[(self.label, "host fallback" if self.fallback else "chip")] += 1
        if self.writes:
            n = len(flat) - len(self.writes)
            with torch.no_grad():
                for i, value in zip(self.writes, flat[n:]):
                    forget(tensors[i])
                    tensors[i].copy_(value)
            flat = flat[:n]
        return tree_unflatten(flat, self.out_spec)


def build_route(op, index, flat, spec, tensors, alias=None):
    from torchfl.planner.api import plan_captured
    from torchfl.planner.capture import Captured, CaptureError
    from torchfl.planner.errors import PlanError
    from torchfl.planner.graph import check_static_shapes

    from .executor import EagerExecutor
    from .oom import out_of_memory_as_torch

    label = _label(op)
    dev = _dev.get(index)
    target = dev.target
    table = decompositions(dev)
    stats_empty = eval_batch_norm(op, flat, spec)
    transposed = transposed_operands(op, flat, spec, tensors, alias)
    try:
        gm = trace_op(op, flat, spec, tensors, table, alias, first_only=stats_empty, transposed=transposed)
    except RuntimeError as exc:
        # what tracing an op alone refuses: no fake kernel (NotImplementedError), data it
        # would need (DataDependentOutputException, DynamicOutputShapeException,
        # UnsupportedOperatorException: RuntimeErrors) -- the op runs on the host, logged and
        # refused by strict. A bug (TypeError, AttributeError, KeyError...) and torch's own
        # refusal of the arguments (IndexError: dim out of range, ValueError) propagate.
        return host_route(op, index, label, f"cannot be traced alone ({type(exc).__name__}: "
                                       f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''})")
    try:
        check_static_shapes(gm)
    except CaptureError:       # boolean masks, nonzero, unique: sizes known only from the data
        return host_route(op, index, label, "its output shape depends on the data (boolean mask, nonzero, unique)")
    keep = None
    if alias is not None:
        keep = distinct_positions(alias)
        tensors = [tensors[p] for p in keep]
    as_called = tensors     # (``t.t()`` made here is no tracked view: a fallback runs below autograd)
    if transposed:      # the plan's inputs: those operands in their storage order
        tensors = [t.t() if i in transposed else t for i, t in enumerate(tensors)]
    if eager_precision() is None and tensors and all(t.dim() == 0 for t in tensors) \
            and any(t.dtype == torch.float64 for t in tensors):
        # no chip stores float64; a float64 scalar is bookkeeping (GradScaler's
        # ``scale.double().reciprocal()``): computed on the host, logged, refused by strict
        return host_route(op, index, label, "a float64 scalar (no chip stores float64; TORCHFL_PRECISION plans "
                                       "it on the chip)")
    placeholders = [(n.name, "input", i) for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")]
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    out_spec = tree_flatten(out_node.args[0])[1]
    writes = functionalize_input_writes(gm)
    out_flat = tree_flatten(out_node.args[0])[0]
    outputs = [a.name if isinstance(a, torch.fx.Node) else None for a in out_flat]
    captured = Captured(gm, placeholders, {}, outputs, training=False,
                        extra={"unbatched": unbatched_inputs(placeholders, as_called, gm)})
    strict = _strict()
    try:
        with out_of_memory_as_torch():      # one type for out of memory (issue 52 case 14)
            plan = plan_captured(captured, planning_examples(tensors, target.hcd), target,
                                 precision=eager_precision(), strict=strict)
    except (PlanError, CaptureError):
        raise          # hard constraints, precision, strict: the compile path's own errors
    # a decomposed op's parts live in the plan's rewritten graph: its host steps (a factory part
    # folded on the host: arange) look their FX nodes up there, not in the op's own trace
    run_gm = plan.capture.graph_module if plan.decomposed and plan.capture is not None else gm
    executor = EagerExecutor(plan, target, index, graph_module=run_gm, strict=strict)
    STATS["plans"] += 1
    return ChipRoute(plan, executor, out_spec, label, fallback=bool(plan.fallbacks), writes=writes, keep=keep,
                      random=is_random_graph(gm), empty_tail=2 if stats_empty else 0, transposed=transposed)


def _prepare_direct(executor, tensors):
    from .direct import prepare

    return prepare(executor, tensors)
