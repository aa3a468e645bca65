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

from torchfl.kernels.tensor import DeviceTensor as _DeviceTensor
from torchfl.planner.memory import on_host

from . import resize as _resize
from . import steps as _steps
from .errors import FallbackNotAllowed, PlanMismatch
from .logs import log_plan
from .program import (DirectForm, Program, chip_for, compile_step, kernel_layout, memory_plan_for, output_spec,
                      relabel, reshaped, static_of)
from .record import HOST_ROUTES, Record, StepRecord

__all__ = ["Executor", "Record", "StepRecord", "DirectForm", "chip_for"]


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
    _refresh = None          # a program remaking static values of other sizes (resize.adopt)
    _stale_slots = ()

    def __init__(self, plan, chip=None, *, strict: bool = False,
                 static_inputs=(), graph_module=None, tensors=None, log: bool = True):
        from .device import device_memory

        self.plan = plan
        if strict and plan.fallbacks:
            raise FallbackNotAllowed(plan.chip, plan.fallbacks)
        self.chip = chip_for(plan, chip)
        self.memory = device_memory(self.chip)
        self._helper_started, self._helper = False, None     # see steps.compile_helper
        cap = plan.capture
        self.graph_module = graph_module if graph_module is not None else (cap.graph_module if cap else None)
        self.tensors = tensors if tensors is not None else (dict(cap.tensors) if cap else {})
        if log:
            log_plan(plan)
        self.static_positions = frozenset(int(i) for i in static_inputs)
        self.memory_plan = memory_plan_for(plan, self.chip, self.static_positions)
        self._compile()
        self._base = None             # slot list holding the cached static values, valid for _static_key
        self._static_key = None
        self._lifted_vals = None      # lifted uploads: slot -> value
        self.calls = 0
        self.last_kernel_s = self.last_total_s = 0.0

    # ------------------------------------------------------------------ build

    def _compile(self) -> None:
        """The plan as slots, steps and the two programs (full and dynamic)."""
        plan = self.plan
        slots: dict = {}

        def slot(name):
            s = slots.get(name)
            if s is None:
                s = slots[name] = len(slots)
            return s

        static_steps, static_vals = static_of(plan, self.static_positions)
        self._bind_inputs(slot)
        nodes = {n.name: n for n in self.graph_module.graph.nodes} if self.graph_module is not None else {}
        self.preps = [compile_step(step, plan, nodes, slot, static_steps) for step in plan.steps]
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
        self.out_spec = output_spec(plan, self.graph_module)

    def _bind_inputs(self, slot) -> None:
        """The plan's inputs: user inputs by position, lifted tensors (parameters, buffers,
        constants) from ``self.tensors``."""
        self.user_inputs = []     # (value name, position, layout, dtype)
        self.lifted = []          # (value name, tensor, layout, dtype)
        for pin in self.plan.inputs:
            lay = kernel_layout(pin.layout, len(pin.shape))
            slot(pin.name)
            if pin.kind == "input":
                self.user_inputs.append((pin.name, int(pin.target), lay, pin.dtype))
            else:
                if pin.name not in self.tensors:
                    raise PlanMismatch(
                        f"plan input {pin.name} ({pin.kind} {pin.target!r}) has no tensor: the plan was "
                        "not made in this process (plan.capture is missing); re-plan the model here")
                self.lifted.append((pin.name, self.tensors[pin.name], lay, pin.dtype))

    def _program(self, preps, cached) -> Program:
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
        return Program(uploads, steps, tuple(slots[v] for v in mp.at_end))

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

    adopt = _resize.adopt
    _link = _steps.link
    _compile_helper = _steps.compile_helper
    _calls_after = _steps.calls_after
    _call_of = _steps.call_of
    _bind = _steps.bind
    _run_host = _steps.run_host

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
        self._refresh, self._stale_slots = None, ()

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
        perf = time.perf_counter
        t0 = perf()
        self.calls += 1
        measuring = record is not None
        mem = self.memory
        if measuring:
            mem.reset_peak_memory_stats()
            record.base_bytes = mem.memory_allocated()
        # kept: the static values a measuring run reads where a real call does (Record.kept_static)
        kept = self._base if measuring and record.kept_static else None
        kept_bufs = None if kept is None else {id(v.buffer) for v in kept if v.__class__ is _DeviceTensor}
        vals, cached, key = self._start(args, measuring)
        prog = self._full if not cached else self._dynamic if self._refresh is None else self._refresh
        if prog is self._refresh:
            _resize.reupload(self, vals)
        for s, pos, lay, dt, name in prog.uploads:
            try:
                x = args[pos]
            except IndexError:
                raise TypeError(f"the plan expects user input #{pos} ({name}); got {len(args)} inputs") from None
            vals[s] = self._upload(x, lay, dt)

        kernel_s = self._steps(prog, vals, record, kept, kept_bufs)

        if self._helper is not None:   # every step is bound now: what the helper has left is moot
            if self._helper.poll() is None and not self._helper.later:   # (unless for later calls)
                self._helper.terminate()
            self._helper = None
        if not measuring and (not cached or prog is self._refresh):
            self._keep_static(vals, key, self._stale_slots if cached else None)
        results = self._results(vals)
        if measuring:
            record.peak_bytes = mem.max_memory_allocated() - record.base_bytes
            for v in vals:          # everything of a measuring run is temporary (not what it read kept)
                if v.__class__ is _DeviceTensor and not v.buffer.freed and (kept_bufs is None
                                                                          or id(v.buffer) not in kept_bufs):
                    v.buffer.free()
            record.kernel_s += kernel_s
            record.total_s += perf() - t0
        elif not self.keeps_outputs:
            for s in prog.free_at_end:
                v = vals[s]
                if v.__class__ is _DeviceTensor and not v.buffer.freed:
                    v.buffer.free()
        self.last_kernel_s = kernel_s
        self.last_total_s = perf() - t0
        return results

    def _start(self, args, measuring: bool):
        """The run's slot list, filled with the cached state (lifted tensors and static values;
        not when measuring: analyze executes and counts every step, static ones included, on
        fresh uploads); whether the static values were cached; the static inputs' key."""
        if measuring:
            vals = [None] * len(self.slots)
            for s, t, lay, dt in self._lifted_slots:
                vals[s] = self._upload(t, lay, dt)
            return vals, False, None
        key = self._static_inputs_key(args)
        if self._static_key is not None and key != self._static_key:
            self.release()          # weights changed: upload and cast them again
        if self._base is not None:
            return self._base[:], True, key
        vals = [None] * len(self.slots)
        if self._lifted_vals is None:
            self._lifted_vals = {s: self._upload(t, lay, dt) for s, t, lay, dt in self._lifted_slots}
        for s, v in self._lifted_vals.items():
            vals[s] = v
        return vals, False, key

    def _steps(self, prog, vals, record, kept, kept_bufs) -> float:
        """The hot loop: every step of ``prog`` in order, buffers freed as the memory plan
        says; returns the time inside kernel calls (and host steps' torch calls)."""
        perf = time.perf_counter
        DeviceTensor = _DeviceTensor
        kernel_s = 0.0
        vget = vals.__getitem__
        for p, host, names, ins, out1, frees in prog.steps:
            if host:
                k0 = perf()
                outs = self._run_host(p, vals)
                dt_s = perf() - k0
                if record is not None:
                    self._record_host(record, p, vals, ins, outs, dt_s)
            else:
                if kept is None or p.static:
                    inputs = dict(zip(names, map(vget, ins)))
                else:
                    inputs = {n: vals[i] if kept[i] is None else kept[i] for n, i in zip(names, ins)}
                call = p.call
                if call is None:        # first run of this step: its kernel may JIT-compile
                    k0 = perf()
                    outs, counted = self._first_call(p, inputs)
                else:
                    k0 = perf()
                    outs, counted = call(inputs)
                dt_s = perf() - k0
                if p.relabel:
                    outs = [relabel(o) for o in outs]
                if p.squeeze is not None:
                    outs = [reshaped(outs[0], p.squeeze), *outs[1:]]
                if record is not None:
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
            if record is not None and record.on_step is not None:
                record.on_step(len(record.steps), len(self.preps), p.step)
        return kernel_s

    def _first_call(self, p, inputs):
        """A chip step's first call: bound to its tile plan, its compile labelled (progress)
        and, when it compiles, the helper started on the later steps' kernels."""
        from torchfl.kernels.compiling import labelled

        call = self._bind(p, inputs)
        if self.calls > 1:      # a step rebound at new sizes (resize.adopt): its kernel ran before
            with labelled(f"{p.kernel} ({p.step.dtype})"):
                return call(inputs)
        with labelled(f"{p.kernel} ({p.step.dtype})"), self._compile_helper(p):
            return call(inputs)

    @staticmethod
    def _record_host(record, p, vals, ins, outs, dt_s) -> None:
        """A measured host step: the round trip (inputs device -> host, results host -> device)."""
        rd = sum(vals[s].nbytes for s in ins if isinstance(vals[s], _DeviceTensor))
        wr = sum(o.nbytes for o in outs if isinstance(o, _DeviceTensor))
        record.steps.append(StepRecord(p.step.index, p.kind, None, rd, wr, 0, dt_s, True))
        for op in p.ops:
            record.routes[op][HOST_ROUTES[p.kind]] += 1

    def _results(self, vals) -> tuple:
        """The outputs as the caller gets them (downloaded), in the graph's output structure."""
        values = []
        download = self._download
        for s in self.out_slots:
            v = vals[s] if s >= 0 else None
            values.append(download(v) if v.__class__ is _DeviceTensor else v)
        return tuple([values[x] if kind == "value" else x for kind, x in self.out_spec])

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

    def _keep_static(self, vals, key, only=None):
        """After a full run: the lifted uploads and static results become the base of every
        later call (until a weight's version changes); after a refresh run (``only``: the
        slots it made again), those slots. Their buffers are frozen: nothing writes them
        until ``release`` frees them, so kernels may keep host copies derived from them
        (packed GEMM weights, torchfl.kernels.frozen)."""
        from torchfl.kernels.frozen import freeze
        from torchfl.kernels.tensor import DeviceTensor

        base = [None] * len(vals) if only is None else self._base
        for s in (self.slots[v] for v in self.static_vals) if only is None else only:
            base[s] = vals[s]
            if self.freezes_static and vals[s].__class__ is DeviceTensor:
                freeze(vals[s].buffer)
        self._base = base
        self._static_key = key
        self._refresh, self._stale_slots = None, ()
