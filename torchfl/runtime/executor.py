"""The plan executor: runs a :class:`~torchfl.planner.plan.Plan` on the emulated chip.

What it does, per the Plan contract (``torchfl/planner/plan.py``):

* user inputs are copied once into the chip's aligned device memory, in the plan's layout
  and dtype; lifted parameters/buffers/constants are uploaded once, at construction;
* every kernel, fused, cast and layout step calls ``CATALOG[kernel].run`` with the tile
  plan that the kernel's one tiling function gives for the step's problem on this chip,
  checked once against the plan's ``step.tile`` (a plan made for another chip or another
  tiler is refused, never silently re-tiled);
* ``static`` steps (weight casts and layout transforms) run once and their results stay
  on the device; inputs that are parameters (what Dynamo passes) are cached too, keyed by
  the tensor's version counter, so an optimizer step invalidates them;
* a ``fallback`` step runs its FX node with torch on the CPU (logged when the plan is
  made; ``strict`` refuses the plan before anything runs); a ``fold`` step runs the same
  way, but is static: once, and again only when a weight or buffer it reads changes;
* a value is freed after its last reader (buffers are reference counted, so a
  metadata-only reshape sharing its input's buffer keeps it alive);
* outputs come back as ordinary torch tensors in the identity layout and the caller's dtype.

``run(args, record=...)`` also measures: per step the Traffic the kernel counted and the
kernel's wall time, plus route accounting per ATen op (what ran where, as executed).
"""
from __future__ import annotations

import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from torchfl.planner.plan import HOST_STEPS, identity_layout

from .errors import FallbackNotAllowed, PlanMismatch
from .logs import log_plan

__all__ = ["Executor", "Record", "StepRecord"]

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
    peak_bytes: int = 0
    on_step: object = None     # callable(done, total, step) after each step (progress bars)


def _kernel_layout(layout: str | None, rank: int):
    """Plan layout string -> DeviceTensor layout (None for the identity)."""
    if not layout or layout == identity_layout(rank):
        return None
    return layout


class _Prep:
    """One step, prepared once: resolved spec, input binding, tile plan (lazily checked)."""

    __slots__ = ("step", "kind", "spec", "bind", "attrs", "outputs", "tile_plan", "free_after",
                 "static", "node", "base", "n_out", "relabel")

    def __init__(self, step):
        self.step = step
        self.kind = step.kind
        self.spec = None
        self.bind = ()
        self.attrs = dict(step.attrs)
        self.outputs = tuple(step.outputs)
        self.tile_plan = None
        self.free_after = ()
        self.static = False
        self.node = None
        self.base = {}
        # permute/transpose/t as layout_transform: the stored buffer, read row-major, is the
        # node's permuted tensor (plan.py): relabel the output as that, in identity layout
        self.relabel = step.kernel == "layout_transform" and bool(step.nodes)


def _relabel(t):
    from torchfl.kernels.tensor import DeviceTensor

    return DeviceTensor(t.buffer, t.physical_shape, None, t.dtype, t.offset)


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


class Executor:
    """Executes one plan; build once per plan (the backend caches it per input signature).

    ``chip``: a ChipModel, or None to resolve ``plan.chip`` through ``registry``.
    ``static_inputs``: positions of user inputs that are parameters/buffers (cached on
    device by version). ``graph_module``/``tensors`` default to ``plan.capture``'s.
    """

    def __init__(self, plan, chip=None, *, registry=None, strict: bool = False,
                 static_inputs=(), graph_module=None, tensors=None, log: bool = True):
        from torchfl.kernels.catalog import get

        from .device import chip_model, device_memory

        self.plan = plan
        if strict and plan.fallbacks:
            raise FallbackNotAllowed(plan.chip, plan.fallbacks)
        self.chip = chip_model(chip if chip is not None else plan.chip,
                               None if chip is not None else plan.chip_version, registry)
        self.memory = device_memory(self.chip)
        cap = plan.capture
        self.graph_module = graph_module if graph_module is not None else (cap.graph_module if cap else None)
        self.tensors = tensors if tensors is not None else (dict(cap.tensors) if cap else {})
        if log:
            log_plan(plan)

        self.user_inputs = []     # (value name, position, layout, dtype)
        self.lifted = []          # (value name, tensor, layout, dtype)
        self.static_positions = frozenset(int(i) for i in static_inputs)
        static_vals = set()
        for pin in plan.inputs:
            lay = _kernel_layout(pin.layout, len(pin.shape))
            if pin.kind == "input":
                self.user_inputs.append((pin.name, int(pin.target), lay, pin.dtype))
                if int(pin.target) in self.static_positions:
                    static_vals.add(pin.name)
            else:
                if pin.name not in self.tensors:
                    raise PlanMismatch(
                        f"plan input {pin.name} ({pin.kind} {pin.target!r}) has no tensor: the plan was "
                        "not made in this process (plan.capture is missing); re-plan the model here")
                self.lifted.append((pin.name, self.tensors[pin.name], lay, pin.dtype))
                static_vals.add(pin.name)

        nodes = {}
        if self.graph_module is not None:
            nodes = {n.name: n for n in self.graph_module.graph.nodes}
        self.preps = []
        for step in plan.steps:
            p = _Prep(step)
            if step.kind in _CHIP_STEPS:
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
                p.bind = tuple((n, v) for n, v in zip(names, step.inputs) if v)
            elif step.kind in HOST_STEPS:
                node = nodes.get(step.nodes[0]) if step.nodes else None
                if node is None:
                    raise PlanMismatch(f"{step.kind} step {step.index}: FX node {step.nodes[:1]} is not in the "
                                       "captured graph; re-plan the model in this process")
                p.node = node
                p.bind = tuple(("", v) for v in step.inputs if v)
                p.base = {v.split(".", 1)[0]: v for v in step.inputs if v}
            else:
                raise PlanMismatch(f"step {step.index} has unknown kind {step.kind!r}")
            ins = [v for _, v in p.bind]
            # a fold is static by definition, even with no input at all (arange, full)
            p.static = (step.kind == "fold" and step.static) or (
                bool(ins) and (step.static or all(v in static_vals for v in ins)))
            if p.static:
                static_vals.update(o for o in p.outputs if o)
            self.preps.append(p)
        self.static_vals = frozenset(static_vals)
        self.dynamic_preps = tuple(p for p in self.preps if not p.static)
        for p in self.preps:
            p.n_out = sum(1 for o in p.outputs if o)

        # liveness: free each non-static value after its last reader (outputs: at the end)
        last = {}
        for i, p in enumerate(self.preps):
            for _, v in p.bind:
                last[v] = i
        outs = set(o for o in plan.outputs if o)
        free = defaultdict(list)
        for v, i in last.items():
            if v not in outs:
                free[i].append(v)
        for i, p in enumerate(self.preps):
            p.free_after = tuple(free.get(i, ()))
        self.unread_inputs = frozenset(n for n, *_ in self.user_inputs if n not in last and n not in outs)
        # values produced and never read (unused outputs of a multi-output kernel)
        for i, p in enumerate(self.preps):
            dead = [o for o in p.outputs if o and o not in last and o not in outs]
            p.free_after = p.free_after + tuple(dead)
        for p in self.preps:          # static values stay on the device: never freed per call
            p.free_after = tuple(v for v in p.free_after if v not in self.static_vals)

        self.out_spec = self._output_spec()
        self._base_env, self._base_pinned = {}, frozenset()
        self._static_env = None       # value -> DeviceTensor, valid for _static_key
        self._static_key = None
        self._lifted_env = None
        self.calls = 0

    # ------------------------------------------------------------------ helpers

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

    def _upload(self, x, layout, dtype):
        from torchfl.kernels.tensor import DeviceTensor

        import torch

        if not isinstance(x, torch.Tensor):
            return x
        return DeviceTensor.from_torch(x, self.memory, layout=layout, dtype=dtype)

    def _tile_plan(self, p, inputs):
        """The kernel's tile plan for this problem on this chip, checked against the plan."""
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
        return tp

    def _run_fallback(self, p, env):
        import torch
        from torch.fx.node import map_arg

        from torchfl.kernels.tensor import DeviceTensor

        def value_of(n):
            name = p.base.get(n.name, n.name)
            v = env[name]
            return v.to_torch() if isinstance(v, DeviceTensor) else v

        node = p.node
        args = map_arg(node.args, value_of)
        kwargs = map_arg(node.kwargs, value_of)
        floats = {a.dtype for a in torch.utils._pytree.tree_leaves((args, kwargs))
                  if isinstance(a, torch.Tensor) and a.is_floating_point()}
        if len(floats) > 1:
            # float32 saved statistics beside float16 activations (planner/graph.py): torch's
            # CPU ops want one dtype, so the host runs the node in the graph's own dtypes
            def in_graph_dtype(n):
                v, want = value_of(n), getattr(n.meta.get("val"), "dtype", None)
                return v.to(want) if isinstance(v, torch.Tensor) and v.is_floating_point() and want else v
            args, kwargs = map_arg(node.args, in_graph_dtype), map_arg(node.kwargs, in_graph_dtype)
        with torch.no_grad():
            result = node.target(*args, **kwargs)
        results = result if isinstance(result, (tuple, list)) else (result,)
        out = []
        for name, r in zip(p.outputs, results):
            if not name:
                out.append(None)
                continue
            val = self.plan.values.get(name)
            if isinstance(r, torch.Tensor):
                lay = _kernel_layout(val.layout, r.dim()) if val else None
                out.append(DeviceTensor.from_torch(r, self.memory, layout=lay,
                                                   dtype=val.dtype if val else None))
            else:
                out.append(r)
        return out

    # ------------------------------------------------------------------ state

    def _lifted(self):
        if self._lifted_env is None:
            self._lifted_env = {n: self._upload(t, lay, dt) for n, t, lay, dt in self.lifted}
        return self._lifted_env

    def _static_inputs_key(self, args):
        """Identity and version of everything the cached device state was made from: an
        in-place update of a weight (optimizer step, load_state_dict) invalidates it."""
        return (tuple((i, id(args[i]), getattr(args[i], "_version", 0)) for i in sorted(self.static_positions)
                      if i < len(args)),
                tuple(getattr(t, "_version", 0) for _n, t, _l, _d in self.lifted))

    def release(self):
        """Free everything this executor keeps on the device (cached weights)."""
        from torchfl.kernels.tensor import DeviceTensor

        seen = set()
        for env in (self._static_env or {}, self._lifted_env or {}):
            for v in env.values():
                if isinstance(v, DeviceTensor) and not v.buffer.freed and id(v.buffer) not in seen:
                    seen.add(id(v.buffer))
                    v.buffer.free()
        self._static_env = self._lifted_env = self._static_key = None
        self._base_env, self._base_pinned = {}, frozenset()

    def __del__(self):
        try:
            self.release()
        except Exception:
            pass

    # ------------------------------------------------------------------ run

    def __call__(self, *args):
        return self.run(args)

    def run(self, args, record: Record | None = None):
        """Execute the plan on ``args`` (the flattened user inputs); returns a tuple."""
        from torchfl.kernels.tensor import DeviceTensor

        t0 = time.perf_counter()
        self.calls += 1
        measuring = record is not None
        mem = self.memory
        if measuring:
            mem.reset_peak_memory_stats()
        refs: Counter = Counter()
        pinned = set()
        env: dict = {}

        # cached state: lifted tensors and static values (skipped when measuring: analyze
        # executes and counts every step, static ones included)
        static_cached = False
        if measuring:
            env.update({n: self._upload(t, lay, dt) for n, t, lay, dt in self.lifted})
        else:
            key = self._static_inputs_key(args)
            if self._static_key is not None and key != self._static_key:
                self.release()          # weights changed: upload and cast them again
            if self._static_env is not None and key == self._static_key:
                static_cached = True
                env = dict(self._base_env)
                pinned = self._base_pinned
            else:
                lifted = self._lifted()
                env.update(lifted)
                pinned.update(id(v.buffer) for v in lifted.values() if isinstance(v, DeviceTensor))

        for name, pos, lay, dt in self.user_inputs:
            if (static_cached and name in self.static_vals) or name in self.unread_inputs:
                continue
            try:
                x = args[pos]
            except IndexError:
                raise TypeError(f"the plan expects user input #{pos} ({name}); got {len(args)} inputs") from None
            v = self._upload(x, lay, dt)
            env[name] = v
            if isinstance(v, DeviceTensor):
                refs[id(v.buffer)] += 1

        kernel_s = 0.0
        chip = self.chip
        perf = time.perf_counter
        for p in (self.dynamic_preps if static_cached else self.preps):
            if p.kind in HOST_STEPS:
                k0 = perf()
                outs = self._run_fallback(p, env)
                dt_s = perf() - k0
                kernel_s += dt_s
                if measuring:
                    # the round trip: inputs device -> host, results host -> device
                    rd = sum(env[v].nbytes for _, v in p.bind if isinstance(env.get(v), DeviceTensor))
                    wr = sum(o.nbytes for o in outs if isinstance(o, DeviceTensor))
                    record.steps.append(StepRecord(p.step.index, p.kind, None, rd, wr, 0, dt_s, True))
                    for op in p.step.ops:
                        record.routes[op][HOST_ROUTES[p.kind]] += 1
            else:
                inputs = {n: env[v] for n, v in p.bind}
                if p.tile_plan is None:
                    p.tile_plan = self._tile_plan(p, inputs)
                k0 = perf()
                outs, counted = p.spec.run(chip, inputs, p.attrs, p.tile_plan, mem)
                dt_s = perf() - k0
                if p.relabel:
                    outs = [_relabel(o) for o in outs]
                kernel_s += dt_s
                if measuring:
                    record.steps.append(StepRecord(p.step.index, p.kind, p.step.kernel, counted.bytes_read,
                                                   counted.bytes_written, counted.flops, dt_s, True))
                    for op in p.step.ops:
                        record.routes[op][p.step.kernel] += 1
            if len(outs) < p.n_out:
                raise PlanMismatch(f"step {p.step.index} ({p.step.kernel or p.kind}) returned {len(outs)} "
                                   f"outputs; the plan names {p.outputs}")
            for name, o in zip(p.outputs, outs):
                if not name:
                    if isinstance(o, DeviceTensor) and refs[id(o.buffer)] == 0 and id(o.buffer) not in pinned:
                        o.buffer.free()
                    continue
                env[name] = o
                if isinstance(o, DeviceTensor):
                    if p.static and not measuring:
                        pinned.add(id(o.buffer))
                    refs[id(o.buffer)] += 1
            for v in p.free_after:
                self._drop(env, v, refs, pinned)
            if measuring and record.on_step is not None:
                record.on_step(len(record.steps), len(self.preps), p.step)

        if not measuring and not static_cached:
            self._static_env = {v: env[v] for v in self.static_vals if v in env
                                and v not in self._lifted_env}
            self._static_key = key
            self._base_env = {**self._lifted_env, **self._static_env}
            self._base_pinned = frozenset(id(v.buffer) for v in self._base_env.values()
                                          if isinstance(v, DeviceTensor))

        values = []
        for name in self.plan.outputs:
            if not name:
                values.append(None)
                continue
            v = env[name]
            values.append(v.to_torch() if isinstance(v, DeviceTensor) else v)
        results = [values[x] if kind == "value" else x for kind, x in self.out_spec]
        for name in set(o for o in self.plan.outputs if o):
            self._drop(env, name, refs, pinned)
        if measuring:
            record.peak_bytes = mem.max_memory_allocated()
            # everything of a measuring run is temporary
            seen = set()
            for v in env.values():
                if isinstance(v, DeviceTensor) and not v.buffer.freed and id(v.buffer) not in seen:
                    seen.add(id(v.buffer))
                    v.buffer.free()
            record.kernel_s += kernel_s
            record.total_s += time.perf_counter() - t0
        self.last_kernel_s = kernel_s
        self.last_total_s = time.perf_counter() - t0
        return tuple(results)

    def _drop(self, env, name, refs, pinned):
        v = env.get(name)
        buf = getattr(v, "buffer", None)
        if buf is None or name in self.static_vals:
            return
        b = id(buf)
        n = refs[b] - 1
        refs[b] = n
        if n <= 0 and b not in pinned and not buf.freed:
            buf.free()
