"""The plan executor: runs a :class:`~torchfl.planner.plan.Plan` on the emulated chip.

What it does, per the Plan contract (``torchfl/planner/plan.py``):

* user inputs are copied once into the chip's aligned device memory, in the plan's layout
  and dtype; lifted parameters/buffers/constants are uploaded once, at construction;
* every kernel, fused, cast and layout step calls its kernel with the tile plan that the
  kernel's one tiling function gives for the step's problem on this chip, checked once
  against the plan's ``step.tile`` (a plan made for another chip or another tiler is
  refused, never silently re-tiled);
* ``static`` steps (weight casts and layout transforms) run once and the results that
  per-call steps read stay on the device (a float32 parameter only cast is freed after
  its cast); inputs that are parameters (what Dynamo passes) are cached too, keyed by
  the tensor's version counter, so an optimizer step invalidates them;
* a ``fallback`` step runs its FX node with torch on the CPU (logged when the plan is
  made; ``strict`` refuses the plan before anything runs); a ``fold`` step runs the same
  way, but is static: once, and again only when a weight or buffer it reads changes;
* buffers are freed as the plan's memory plan says (``plan.memory``, made by the planner:
  a value's buffer after its last reader; a metadata-only reshape shares its input's
  buffer, so the two are one buffer whose last reader is the last reader of either), so
  the allocator's peak is the planned one;
* outputs come back as ordinary torch tensors in the identity layout and the caller's dtype.

How (the way tinygrad or ONNX Runtime run a graph): the plan is compiled once into a flat
program. Values live in integer slots of a list (not name-keyed dicts); each step holds its
input and output slots, its bound kernel call (``KernelSpec.bind``: problem validated and
impl resolved on the first run, a signature check after that) and the slots whose buffers
die after it. Buffer lifetimes come from the plan's memory plan
(:mod:`torchfl.planner.memory`, recomputed here only when the caller makes some user inputs
static), so a call does no reference counting. Two programs are built:
the full one (first call, after a weight changed, and measuring runs) and the dynamic one
(static results already on the device).

``run(args, record=...)`` also measures: per step the Traffic the kernel counted and the
kernel's wall time, plus route accounting per ATen op (what ran where, as executed).
``last_kernel_s`` is the time inside kernel calls (the kernel's ``run`` including its own
Python wrapper, and host steps' torch calls); ``last_total_s`` the executor's whole call.
"""
from __future__ import annotations

import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from torchfl.kernels.spec import numel as _numel
from torchfl.planner.memory import is_alias, is_link_cast, on_host
from torchfl.planner.plan import HOST_STEPS, identity_layout

from .errors import FallbackNotAllowed, PlanMismatch
from .logs import log_plan

__all__ = ["Executor", "Record", "StepRecord", "DirectForm"]

_CHIP_STEPS = ("kernel", "fused", "cast", "layout")
HOST_ROUTES = {"fallback": "CPU fallback", "fold": "host fold (once)"}  # route accounting labels


@dataclass
class StepRecord:
    """What one step did in one run: counted traffic (None for a fallback) and wall time."""

    index: int
    kind: str
    kernel: str | None
    bytes_read: int = 0
    bytes_written: int = 0
    flops: int = 0
    wall_s: float = 0.0
    counted: bool = False


@dataclass
class Record:
    """Measurements of one run (``run(args, record=Record())``)."""

    steps: list = field(default_factory=list)
    routes: dict = field(default_factory=lambda: defaultdict(Counter))
    total_s: float = 0.0
    kernel_s: float = 0.0
    peak_bytes: int = 0        # the allocator's peak during the run, above base_bytes
    base_bytes: int = 0        # allocated on the chip when the run began (other plans' weights)
    on_step: object = None     # callable(done, total, step) after each step (progress bars)
    # per-call steps read the static values the executor keeps (frozen: packed GEMM weights)
    # where it keeps them, as a real call does; the static steps still run and are counted
    kept_static: bool = False


def _kernel_layout(layout: str | None, rank: int):
    """Plan layout string -> DeviceTensor layout (None for the identity)."""
    if not layout or layout == identity_layout(rank):
        return None
    return layout


class _Prep:
    """One step, compiled once: resolved spec, input/output slots, bound kernel call."""

    __slots__ = ("step", "kind", "host", "spec", "names", "ins", "outs", "attrs", "tile_plan", "call",
                 "static", "node", "base", "n_out", "relabel", "alias", "ops", "kernel", "label", "squeeze",
                 "link")

    def __init__(self, step):
        self.step = step
        self.kind = step.kind
        self.host = step.kind in HOST_STEPS
        self.spec = None
        self.names = ()           # kernel input names (chip steps) / step input values (host steps)
        self.ins = ()             # their slots
        self.outs = ()            # output slots, -1 for an unnamed output
        self.attrs = dict(step.attrs)
        self.tile_plan = None
        self.call = None          # KernelSpec.bind(...) once the first run saw the inputs
        self.static = False
        self.node = None
        self.base = {}
        self.n_out = sum(1 for o in step.outputs if o)
        # permute/transpose/t as layout_transform: the stored buffer, read row-major, is the
        # node's permuted tensor (plan.py): relabel the output as that, in identity layout
        self.relabel = step.kernel == "layout_transform" and bool(step.nodes)
        self.alias = False        # output 0 shares input 0's buffer (metadata reshape)
        self.squeeze = None       # select as a one-wide slice: the node's shape, without the dim
        self.ops = tuple(step.ops)
        self.kernel = step.kernel
        self.label = step.kernel or step.kind
        self.link = None          # a link cast: the dtype a host value is uploaded in, or downloaded to


@dataclass(frozen=True)
class DirectForm:
    """A one-step plan as its bound kernel call (:meth:`Executor.direct_form`): ``inputs``
    per kernel input (kernel input name, user input position, layout, dtype); the call's
    first ``n_out`` outputs are the plan's outputs, the rest unnamed side outputs."""

    call: object
    inputs: tuple
    n_out: int


class _Program:
    """A list of steps to run in order, with the buffer frees decided for that list.

    ``uploads``: (slot, position, layout, dtype, name) of the user inputs its steps or the
    outputs read; ``steps``: per step (prep, host step?, kernel input names, input slots,
    the output slot when it has exactly one else -1, slots whose buffers die after it);
    ``free_at_end``: slots of output buffers, freed after their download."""

    __slots__ = ("uploads", "steps", "free_at_end")

    def __init__(self, uploads, steps, free_at_end):
        self.uploads, self.steps, self.free_at_end = uploads, steps, free_at_end


def _memory_plan(plan, chip, static_positions):
    """The plan's memory plan, or the same computation with ``static_positions`` resident."""
    from torchfl.planner.memory import plan_memory

    mp = plan.memory
    if mp is None or static_positions or mp.alignment != chip.alignment:
        mp = plan_memory(plan, chip.alignment, chip.memory_bytes, static_positions)
    return mp


def _static(plan, static_positions):
    from torchfl.planner.memory import static_steps

    return static_steps(plan, static_positions)


def _relabel(t):
    from torchfl.kernels.tensor import DeviceTensor

    return DeviceTensor(t.buffer, t.physical_shape, None, t.dtype, t.offset)


_VIEWED_GEMMS = frozenset({"linear_gelu", "linear_relu", "matmul_gelu"})
_VIEW_OPS = frozenset({"aten.view.default", "aten._unsafe_view.default"})


def _reshaped(t, shape):
    """``t`` (identity layout) seen with ``shape`` (same elements): select drops its dim."""
    from torchfl.kernels.tensor import DeviceTensor

    if tuple(t.shape) == shape:
        return t
    if t.layout is not None or t.numel != _numel(shape):
        raise PlanMismatch(f"select: a slice of shape {t.shape} cannot be seen as {shape}")
    return DeviceTensor(t.buffer, shape, None, t.dtype, t.offset)


def _same_tiling(planned: dict, config) -> bool:
    have = config.as_dict()
    for k in ("strategy", "tiles", "double_buffered"):
        if k in planned:
            a, b = planned[k], have[k]
            if k == "tiles":
                a = {str(x): int(y) for x, y in (a.items() if isinstance(a, dict) else a)}
                b = {str(x): int(y) for x, y in b.items()}
            if a != b:
                return False
    return True


def chip_for(plan, chip=None):
    """The ChipModel to run ``plan`` on: ``chip`` (a Target or a ChipModel) or the plan's own
    target, checked to be the chip the plan was made for (same name, same HCD hash)."""
    from torchfl.kernels.chip import ChipModel

    if chip is None:
        chip = plan.target
        if chip is None:
            raise PlanMismatch(
                f"plan for {plan.chip} {plan.chip_version} carries no target (it was not planned in this "
                "process); pass the chip: Executor(plan, torchfl.planner.resolve_target(plan.chip, registry))")
    model = chip if isinstance(chip, ChipModel) else chip.model
    if model.name != plan.chip or (plan.chip_hash and model.hcd_hash != plan.chip_hash):
        raise PlanMismatch(
            f"plan was made for chip {plan.chip} {plan.chip_version} (HCD hash {plan.chip_hash[:12] or '-'}) "
            f"but is run on {model.name} (HCD hash {model.hcd_hash[:12] or '-'}): another chip, or the same name "
            "with other numbers; re-plan on this chip, or run on the target the plan was made with")
    return model


class Executor:
    """Executes one plan; build once per plan (the backend caches it per input signature).

    ``chip``: the :class:`~torchfl.planner.target.Target` to run on (default ``plan.target``,
    the one it was planned on), or a ChipModel for a plan built by hand; the plan's
    ``chip_hash`` must be that chip's (:func:`chip_for`). The executor never opens a registry.
    ``static_inputs``: positions of user inputs that are parameters/buffers (cached on
    device by version). ``graph_module``/``tensors`` default to ``plan.capture``'s.
    """

    # what release() frees: set by a run; None on an executor whose __init__ raised
    _base = _lifted_vals = _static_key = None

    def __init__(self, plan, chip=None, *, strict: bool = False,
                 static_inputs=(), graph_module=None, tensors=None, log: bool = True):
        from torchfl.kernels.catalog import get

        from .device import device_memory

        self.plan = plan
        if strict and plan.fallbacks:
            raise FallbackNotAllowed(plan.chip, plan.fallbacks)
        self.chip = chip_for(plan, chip)
        self.memory = device_memory(self.chip)
        self._helper_started, self._helper = False, None     # see _compile_helper
        cap = plan.capture
        self.graph_module = graph_module if graph_module is not None else (cap.graph_module if cap else None)
        self.tensors = tensors if tensors is not None else (dict(cap.tensors) if cap else {})
        if log:
            log_plan(plan)

        slots: dict = {}

        def slot(name):
            s = slots.get(name)
            if s is None:
                s = slots[name] = len(slots)
            return s

        self.user_inputs = []     # (value name, position, layout, dtype)
        self.lifted = []          # (value name, tensor, layout, dtype)
        self.static_positions = frozenset(int(i) for i in static_inputs)
        self.memory_plan = _memory_plan(plan, self.chip, self.static_positions)
        static_steps, static_vals = _static(plan, self.static_positions)
        for pin in plan.inputs:
            lay = _kernel_layout(pin.layout, len(pin.shape))
            slot(pin.name)
            if pin.kind == "input":
                self.user_inputs.append((pin.name, int(pin.target), lay, pin.dtype))
            else:
                if pin.name not in self.tensors:
                    raise PlanMismatch(
                        f"plan input {pin.name} ({pin.kind} {pin.target!r}) has no tensor: the plan was "
                        "not made in this process (plan.capture is missing); re-plan the model here")
                self.lifted.append((pin.name, self.tensors[pin.name], lay, pin.dtype))

        nodes = {}
        if self.graph_module is not None:
            nodes = {n.name: n for n in self.graph_module.graph.nodes}
        self.preps = []
        for step in plan.steps:
            p = _Prep(step)
            # the kernel's result seen with the group output's shape (same elements): a select
            # drops its dim; a GEMM fused through a view (addmm -> view -> gelu) returns [M, N]
            if step.outputs[:1] and step.outputs[0] in plan.values and (
                    (step.kernel == "slice" and "aten.select.int" in step.ops)
                    or (step.kernel in _VIEWED_GEMMS and _VIEW_OPS & set(step.ops))):
                p.squeeze = tuple(plan.values[step.outputs[0]].shape)
            if is_link_cast(step, plan.values):
                p.host, p.link = True, step.attrs["to"]
                bound = [(v, v) for v in step.inputs if v]
            elif step.kind in _CHIP_STEPS:
                try:
                    p.spec = get(step.kernel)
                except KeyError as exc:
                    raise PlanMismatch(
                        f"step {step.index} of the plan for {plan.chip} needs kernel {step.kernel!r}, "
                        f"which this build's kernel catalog lacks ({exc.args[0]}); re-plan with this "
                        "build (the planner then routes the op elsewhere or falls back)") from None
                names = p.spec.input_names
                if len(step.inputs) > len(names):
                    raise PlanMismatch(f"step {step.index} ({step.kernel}) has {len(step.inputs)} inputs; "
                                       f"the kernel takes {', '.join(p.spec.inputs)}")
                bound = [(n, v) for n, v in zip(names, step.inputs) if v]
                p.alias = is_alias(step, plan.values)
            elif step.kind in HOST_STEPS:
                node = nodes.get(step.nodes[0]) if step.nodes else None
                if node is None:
                    raise PlanMismatch(f"{step.kind} step {step.index}: FX node {step.nodes[:1]} is not in the "
                                       "captured graph; re-plan the model in this process")
                p.node = node
                bound = [(v, v) for v in step.inputs if v]
                p.base = {v.split(".", 1)[0]: v for v in step.inputs if v}
            else:
                raise PlanMismatch(f"step {step.index} has unknown kind {step.kind!r}")
            p.names = tuple(n for n, _ in bound)
            p.ins = tuple(slot(v) for _, v in bound)
            p.outs = tuple(slot(o) if o else -1 for o in step.outputs)
            p.static = step.index in static_steps   # a fold is static even with no input (arange)
            self.preps.append(p)
        for name in plan.outputs:
            if name:
                slot(name)
        self.slots = slots
        self.static_vals = frozenset(static_vals)
        self.dynamic_preps = tuple(p for p in self.preps if not p.static)
        self.out_slots = tuple(slots[o] if o else -1 for o in plan.outputs)

        read = {s for p in self.preps for s in p.ins} | {s for s in self.out_slots if s >= 0}
        self.unread_inputs = frozenset(n for n, *_ in self.user_inputs if slots[n] not in read)
        self._lifted_slots = tuple((slots[n], t, lay, dt) for n, t, lay, dt in self.lifted)
        self._lifted_tensors = tuple(t for _n, t, _l, _d in self.lifted)
        self._static_pos = tuple(sorted(self.static_positions))
        resident = {slots[v] for v in static_vals}
        self._full = self._program(self.preps, ())
        # with the static values cached, static user inputs are on the device already
        self._dynamic = self._program(self.dynamic_preps, resident)

        self.out_spec = self._output_spec()
        self._base = None             # slot list holding the cached static values, valid for _static_key
        self._static_key = None
        self._lifted_vals = None      # lifted uploads: slot -> value
        self.calls = 0
        self.last_kernel_s = self.last_total_s = 0.0

    # ------------------------------------------------------------------ build

    def _program(self, preps, cached) -> _Program:
        """A run of ``preps``: the user inputs they or the outputs read are uploaded (except
        the ``cached`` slots), and buffers are freed after the steps the memory plan names
        (a static step frees only static buffers no per-call step reads, such as a float32
        parameter after its cast; a dynamic step frees no static buffer, so its frees are the
        same in both programs)."""
        slots = self.slots
        mp = self.memory_plan
        read = {s for p in preps for s in p.ins} | {s for s in self.out_slots if s >= 0}
        uploads = tuple((slots[n], pos, lay, dt, n) for n, pos, lay, dt in self.user_inputs
                        if slots[n] in read and slots[n] not in cached)
        steps = tuple((p, p.host, p.names, p.ins, p.outs[0] if len(p.outs) == 1 else -1,
                       tuple(slots[v] for v in mp.frees[p.step.index])) for p in preps)
        return _Program(uploads, steps, tuple(slots[v] for v in mp.at_end))

    def _output_spec(self):
        """Where each entry of the FX output comes from: ``("value", plan output index)`` for
        a node, ``("const", x)`` for None or a literal (AOT backward graphs return None for
        inputs without gradient). Without a graph: the plan's outputs in order."""
        n_out = len(self.plan.outputs)
        if self.graph_module is None:
            return tuple(("value", i) for i in range(n_out))
        import torch

        out_node = next(n for n in self.graph_module.graph.nodes if n.op == "output")
        spec, k = [], 0

        def walk(a):
            nonlocal k
            if isinstance(a, (list, tuple)):
                for x in a:
                    walk(x)
            elif isinstance(a, torch.fx.Node):
                spec.append(("value", k))
                k += 1
            else:
                spec.append(("const", a))

        walk(out_node.args[0])
        if k != n_out:
            raise PlanMismatch(f"the graph returns {k} values but the plan lists {n_out} outputs "
                               f"({', '.join(self.plan.outputs)}); re-plan")
        return tuple(spec)

    # ------------------------------------------------------------------ helpers

    keeps_outputs = False   # outputs' buffers are handed over by _download (eager device)
    freezes_static = True   # static values' buffers are the executor's own (see _keep_static)

    def _download(self, v):
        """An output value as the caller gets it: a CPU torch tensor (the buffer is freed
        after the run unless ``keeps_outputs``)."""
        return v.to_torch()

    def _upload(self, x, layout, dtype):
        from torchfl.kernels.tensor import DeviceTensor

        import torch

        if not isinstance(x, torch.Tensor) or on_host(dtype):
            return x        # a host dtype (float64, complex) stays a host tensor: see _link
        return DeviceTensor.from_torch(x, self.memory, layout=layout, dtype=dtype)

    def _link(self, p, vals):
        """A link cast: a host value uploaded in a chip dtype (``DeviceTensor.from_torch``
        rounds it), or a chip value downloaded into the caller's host dtype (float64)."""
        import torch

        from torchfl.kernels.tensor import DeviceTensor

        x = vals[p.ins[0]]
        if not on_host(p.link):
            return [DeviceTensor.from_torch(x, self.memory, layout=_kernel_layout(p.step.layout_out, x.dim()),
                                            dtype=p.link)]
        x = x.to_torch() if isinstance(x, DeviceTensor) else x
        return [x.to(getattr(torch, p.link))]

    def _compile_helper(self, p):
        """Around a step's first call: if it starts a Numba compile, a helper process compiles
        the kernels of the steps after it meanwhile (torchfl.kernels.precompile); once per
        executor."""
        import contextlib

        from torchfl.kernels import compilelock, compiling, precompile

        if self._helper_started or not precompile.enabled():
            return contextlib.nullcontext()
        compilelock.install("wait")     # claimed from the first compile on: the helper skips it
        stack = contextlib.ExitStack()

        def on_compile(ev):
            if ev.kind == "start" and not self._helper_started:
                self._helper_started = True
                now = self._call_of(p)
                self._helper = precompile.start(self.chip, self._calls_after(p.step.index),
                                                skip={now.ident} if now is not None else ())

        stack.callback(compiling.subscribe(on_compile))
        return stack

    def _calls_after(self, index: int) -> list:
        """The kernel calls of the chip steps after ``index`` not bound yet."""
        calls = [self._call_of(q) for q in self.preps
                 if not q.host and q.call is None and q.spec is not None and q.step.index > index]
        return [c for c in calls if c is not None]

    def _call_of(self, q):
        """A chip step's kernel call as the plan types it (a precompile.KernelCall), None if a
        value is not in the plan."""
        from torchfl.kernels.precompile import KernelCall

        pairs = [(n, self.plan.values.get(v)) for n, v in zip(q.spec.input_names, q.step.inputs) if v]
        if any(val is None for _n, val in pairs):
            return None
        dtypes = {n: val.dtype for n, val in pairs}
        first = next((dtypes[n] for n in q.spec.input_names if n in dtypes), None)
        frozen = tuple(n for n, v in zip(q.spec.input_names, q.step.inputs)
                       if v and self.freezes_static and v in self.static_vals)
        return KernelCall(q.kernel, f"{q.spec.family}.{q.spec.impl}", {n: tuple(val.shape) for n, val in pairs},
                          dtypes, {n: val.layout for n, val in pairs}, dict(q.attrs),
                          None if q.spec.mixed_dtypes else first, frozen)

    def _bind(self, p, inputs):
        """First run of a chip step: the kernel's tile plan for this problem on this chip,
        checked against the plan, and the kernel bound to it."""
        spec = p.spec
        dtypes = {k: t.dtype for k, t in inputs.items()}
        first = next((inputs[n].dtype for n in spec.input_names if n in inputs), None)
        problem = spec.problem({k: t.shape for k, t in inputs.items()}, p.attrs,
                               None if spec.mixed_dtypes else first,
                               {k: t.layout for k, t in inputs.items()}, dtypes)
        tp = spec.tile(problem, self.chip)
        if p.step.tile and not _same_tiling(p.step.tile, tp.config):
            raise PlanMismatch(
                f"step {p.step.index} ({p.step.kernel}): the plan tiles it as {p.step.tile}, but on "
                f"{self.chip.name} the kernel tiles this problem as {tp.config.as_dict()}; the plan was "
                "made for another chip or torchfl version: re-plan")
        if (tp.config.strategy == "metadata") != p.alias:
            raise PlanMismatch(
                f"step {p.step.index} ({p.step.kernel}): the executor expected it to "
                f"{'view' if p.alias else 'copy'} its input's buffer, but the kernel tiles it as "
                f"{tp.config.strategy!r}; the plan's value layouts disagree with its steps: re-plan")
        p.tile_plan = tp
        p.call = spec.bind(self.chip, problem, tp, self.memory)
        return p.call

    def _run_host(self, p, vals):
        import torch
        from torch.fx.node import map_arg

        from torchfl.kernels.tensor import DeviceTensor

        if p.link is not None:
            return self._link(p, vals)
        slots = self.slots

        def value_of(n):
            # in the graph's own dtype, as eager runs the node: the host has float32 and
            # float64 (an fft or linalg.inv refuses float16), and float32 saved statistics
            # beside float16 activations must meet in one dtype
            v = vals[slots[p.base.get(n.name, n.name)]]
            v = v.to_torch() if isinstance(v, DeviceTensor) else v
            want = getattr(n.meta.get("val"), "dtype", None)
            if isinstance(v, torch.Tensor) and v.is_floating_point() and want is not None \
                    and want.is_floating_point and want != v.dtype:
                v = v.to(want)
            return v

        node = p.node
        args = map_arg(node.args, value_of)
        kwargs = map_arg(node.kwargs, value_of)
        with torch.no_grad():
            result = node.target(*args, **kwargs)
        results = result if isinstance(result, (tuple, list)) else (result,)
        out = []
        for name, r in zip(p.step.outputs, results):
            if not name:
                out.append(None)
                continue
            val = self.plan.values.get(name)
            if isinstance(r, torch.Tensor) and not (val and on_host(val.dtype)):
                lay = _kernel_layout(val.layout, r.dim()) if val else None
                out.append(DeviceTensor.from_torch(r, self.memory, layout=lay,
                                                   dtype=val.dtype if val else None))
            else:
                out.append(r)
        return out

    def direct_form(self):
        """The plan as one bound kernel call on the caller's inputs as they are, for a caller
        that runs it without the executor (the eager device's warm path,
        ``runtime.eager.direct``), or None: several steps, host steps, lifted weights,
        fallbacks, a step not bound yet (before the first run), outputs that relabel, squeeze
        or view an input, outputs other than the plan's values in order."""
        if len(self.preps) != 1 or self.lifted or self.plan.fallbacks:
            return None
        p = self.preps[0]
        if p.host or p.call is None or p.relabel or p.squeeze is not None or p.alias or p.link is not None:
            return None
        n = len(self.out_slots)
        named, unnamed = tuple(p.outs[:n]), tuple(p.outs[n:])
        # outputs past the named ones must be unnamed (-1): the kernel's side outputs the plan
        # drops (an eval batch-norm's statistics), freed at once as _store does
        if named != self.out_slots or len(set(named)) != n or min(named, default=0) < 0 \
                or any(s != -1 for s in unnamed) or self.out_spec != tuple(("value", i) for i in range(n)):
            return None
        by_slot = {self.slots[name]: (pos, lay, dt) for name, pos, lay, dt in self.user_inputs}
        inputs = []
        for name, s in zip(p.names, p.ins):
            hit = by_slot.get(s)
            if hit is None:
                return None
            inputs.append((name,) + hit)
        return DirectForm(p.call, tuple(inputs), n)

    # ------------------------------------------------------------------ state

    def _static_inputs_key(self, args):
        """Identity and version of everything the cached device state was made from: an
        in-place update of a weight (optimizer step, load_state_dict) invalidates it."""
        n = len(args)
        return (tuple([(i, id(args[i]), getattr(args[i], "_version", 0)) for i in self._static_pos if i < n]),
                tuple([getattr(t, "_version", 0) for t in self._lifted_tensors]))

    def release(self):
        """Free everything this executor keeps on the device (cached weights)."""
        from torchfl.kernels.tensor import DeviceTensor

        for env in (self._base or (), (self._lifted_vals or {}).values()):
            for v in env:
                if isinstance(v, DeviceTensor) and not v.buffer.freed:
                    v.buffer.free()
        self._base = self._lifted_vals = self._static_key = None

    def __del__(self, _finalizing=sys.is_finalizing):   # bound now: at shutdown the module's globals are None
        if _finalizing():   # interpreter shutdown: the device memory may be gone already
            return
        self.release()

    # ------------------------------------------------------------------ run

    def __call__(self, *args):
        return self.run(args)

    def run(self, args, record: Record | None = None):
        """Execute the plan on ``args`` (the flattened user inputs); returns a tuple.

        A run that fails (in any step, out of device memory included) returns every
        buffer it allocated; what earlier runs cached on the device stays."""
        try:
            with self.memory.returned_on_error():
                return self._run(args, record)
        except BaseException:
            if self._base is None:  # a first run: its weight uploads were freed with the rest
                self._lifted_vals = self._static_key = None
            raise

    def _run(self, args, record: Record | None):
        from torchfl.kernels.tensor import DeviceTensor

        perf = time.perf_counter
        t0 = perf()
        self.calls += 1
        measuring = record is not None
        mem = self.memory
        if measuring:
            mem.reset_peak_memory_stats()
            record.base_bytes = mem.memory_allocated()

        # cached state: lifted tensors and static values (not when measuring: analyze
        # executes and counts every step, static ones included, on fresh uploads)
        cached = False
        kept = self._base if measuring and record.kept_static else None
        kept_bufs = None if kept is None else {id(v.buffer) for v in kept if v.__class__ is DeviceTensor}
        if measuring:
            vals = [None] * len(self.slots)
            for s, t, lay, dt in self._lifted_slots:
                vals[s] = self._upload(t, lay, dt)
        else:
            key = self._static_inputs_key(args)
            if self._static_key is not None and key != self._static_key:
                self.release()          # weights changed: upload and cast them again
            if self._base is not None:
                cached = True
                vals = self._base[:]
            else:
                vals = [None] * len(self.slots)
                if self._lifted_vals is None:
                    self._lifted_vals = {s: self._upload(t, lay, dt) for s, t, lay, dt in self._lifted_slots}
                for s, v in self._lifted_vals.items():
                    vals[s] = v
        prog = self._dynamic if cached else self._full

        for s, pos, lay, dt, name in prog.uploads:
            try:
                x = args[pos]
            except IndexError:
                raise TypeError(f"the plan expects user input #{pos} ({name}); got {len(args)} inputs") from None
            vals[s] = self._upload(x, lay, dt)

        kernel_s = 0.0
        n_total = len(self.preps)
        vget = vals.__getitem__
        for p, host, names, ins, out1, frees in prog.steps:
            if host:
                k0 = perf()
                outs = self._run_host(p, vals)
                dt_s = perf() - k0
                if measuring:
                    # the round trip: inputs device -> host, results host -> device
                    rd = sum(vals[s].nbytes for s in ins if isinstance(vals[s], DeviceTensor))
                    wr = sum(o.nbytes for o in outs if isinstance(o, DeviceTensor))
                    record.steps.append(StepRecord(p.step.index, p.kind, None, rd, wr, 0, dt_s, True))
                    for op in p.ops:
                        record.routes[op][HOST_ROUTES[p.kind]] += 1
            else:
                if kept is None or p.static:
                    inputs = dict(zip(names, map(vget, ins)))
                else:
                    inputs = {n: vals[i] if kept[i] is None else kept[i] for n, i in zip(names, ins)}
                call = p.call
                if call is None:        # first run of this step: its kernel may JIT-compile
                    from torchfl.kernels.compiling import labelled

                    call = self._bind(p, inputs)
                    k0 = perf()
                    with labelled(f"{p.kernel} ({p.step.dtype})"), self._compile_helper(p):
                        outs, counted = call(inputs)
                else:
                    k0 = perf()
                    outs, counted = call(inputs)
                dt_s = perf() - k0
                if p.relabel:
                    outs = [_relabel(o) for o in outs]
                if p.squeeze is not None:
                    outs = [_reshaped(outs[0], p.squeeze), *outs[1:]]
                if measuring:
                    record.steps.append(StepRecord(p.step.index, p.kind, p.kernel, counted.bytes_read,
                                                   counted.bytes_written, counted.flops, dt_s, True))
                    for op in p.ops:
                        record.routes[op][p.kernel] += 1
            kernel_s += dt_s
            if out1 >= 0 and len(outs) == 1:
                vals[out1] = outs[0]
            else:
                self._store(p, vals, outs)
            for s in frees:
                v = vget(s)
                if v.__class__ is DeviceTensor and (kept_bufs is None or id(v.buffer) not in kept_bufs):
                    v.buffer.free()
            if measuring and record.on_step is not None:
                record.on_step(len(record.steps), n_total, p.step)

        if self._helper is not None:   # every step is bound now: what the helper has left is moot
            if self._helper.poll() is None and not self._helper.later:   # (unless for later calls)
                self._helper.terminate()
            self._helper = None
        if not measuring and not cached:
            self._keep_static(vals, key)

        values = []
        download = self._download
        for s in self.out_slots:
            v = vals[s] if s >= 0 else None
            values.append(download(v) if v.__class__ is DeviceTensor else v)
        results = tuple([values[x] if kind == "value" else x for kind, x in self.out_spec])
        if measuring:
            record.peak_bytes = mem.max_memory_allocated() - record.base_bytes
            for v in vals:          # everything of a measuring run is temporary (not what it read kept)
                if v.__class__ is DeviceTensor and not v.buffer.freed and (kept_bufs is None
                                                                         or id(v.buffer) not in kept_bufs):
                    v.buffer.free()
            record.kernel_s += kernel_s
            record.total_s += perf() - t0
        elif not self.keeps_outputs:
            for s in prog.free_at_end:
                v = vals[s]
                if v.__class__ is DeviceTensor and not v.buffer.freed:
                    v.buffer.free()
        self.last_kernel_s = kernel_s
        self.last_total_s = perf() - t0
        return results

    @staticmethod
    def _store(p, vals, outs):
        """A step's outputs into their slots; outputs the plan does not name (unnamed, or
        more than it lists) are freed at once unless they view the step's input."""
        from torchfl.kernels.tensor import DeviceTensor

        if len(outs) < p.n_out:
            raise PlanMismatch(f"step {p.step.index} ({p.label}) returned {len(outs)} "
                               f"outputs; the plan names {p.step.outputs}")
        for i, o in enumerate(outs):
            s = p.outs[i] if i < len(p.outs) else -1
            if s >= 0:
                vals[s] = o
            elif not p.alias and o.__class__ is DeviceTensor:
                o.buffer.free()

    def _keep_static(self, vals, key):
        """After a full run: the lifted uploads and static results become the base of every
        later call (until a weight's version changes). Their buffers are frozen: nothing
        writes them until ``release`` frees them, so kernels may keep host copies derived
        from them (packed GEMM weights, torchfl.kernels.frozen)."""
        from torchfl.kernels.frozen import freeze
        from torchfl.kernels.tensor import DeviceTensor

        base = [None] * len(vals)
        for v in self.static_vals:
            s = self.slots[v]
            base[s] = vals[s]
            if self.freezes_static and vals[s].__class__ is DeviceTensor:
                freeze(vals[s].buffer)
        self._base = base
        self._static_key = key
