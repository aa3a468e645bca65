"""One executor across the lengths of a bucket (``planner.lengths``): a decoder's step at length
n+1 is the plan of length n with other sizes, so the executor built for the first length of a
bucket runs every later one instead of a new executor per token.

:func:`adopt` points an executor at another instance of its plan: same steps, kernels, values,
inputs, outputs and buffer frees (else it refuses, and the caller builds a new executor). Steps
whose sizes or attributes changed are unbound, so their next call tiles and binds the problem
at the new sizes (checked against the instance's ``step.tile`` as any first call is); the other
steps keep their bound calls. Host steps take the instance's FX nodes (size arguments are
numbers there). Static results computed from a size (a fold of ``arange(past, past + 1)``, what
is made of it) are recomputed at the next call, once; weight uploads and casts are kept.
"""
from __future__ import annotations

from .program import memory_plan_for

__all__ = ["adopt", "same_structure", "reupload"]

_STEP_FIELDS = ("kind", "kernel", "nodes", "ops", "inputs", "outputs", "layouts_in", "layout_out", "dtype",
                "static")


def same_structure(a, b) -> bool:
    """Do plans ``a`` and ``b`` differ only in sizes (shapes, tiles, prices, size attributes)?"""
    if a.chip_hash != b.chip_hash or a.outputs != b.outputs or len(a.steps) != len(b.steps):
        return False
    if len(a.inputs) != len(b.inputs) or a.values.keys() != b.values.keys():
        return False
    for x, y in zip(a.inputs, b.inputs):
        if (x.name, x.kind, x.target, x.dtype, x.layout) != (y.name, y.kind, y.target, y.dtype, y.layout):
            return False
    for x, y in zip(a.steps, b.steps):
        for f in _STEP_FIELDS:
            if getattr(x, f) != getattr(y, f):
                return False
    return True


def _args_of(node):
    from torch.fx.node import map_arg

    return map_arg((node.args, node.kwargs), lambda n: n.name)


def _changed(step, old_plan, plan) -> bool:
    """Do the sizes a step runs at differ between the two instances?"""
    if step.attrs != old_plan.steps[step.index].attrs:
        return True
    ov, nv = old_plan.values, plan.values
    for name in step.inputs + step.outputs:
        if name and ov[name].shape != nv[name].shape:
            return True
    return False


def adopt(self, plan) -> bool:
    """Run ``plan`` (an instance of this executor's plan at other sizes) from now on; False,
    changing nothing, when it is not one (:func:`same_structure`, same buffer frees)."""
    old = self.plan
    if plan is old:
        return True
    if not same_structure(old, plan):
        return False
    mp = memory_plan_for(plan, self.chip, self.static_positions)
    if mp.frees != self.memory_plan.frees or mp.at_end != self.memory_plan.at_end:
        return False
    cap = plan.capture
    nodes = {}
    if any(p.host and p.node is not None for p in self.preps):
        if cap is None:
            return False
        nodes = {n.name: n for n in cap.graph_module.graph.nodes}
        if any(p.node is not None and p.node.name not in nodes for p in self.preps):
            return False
    stale_vals: set = set()      # slots of static values made at the old sizes
    stale_steps: set = set()
    for p in self.preps:
        step = plan.steps[p.step.index]
        differs = _changed(step, old, plan)
        if p.node is not None:
            node = nodes[p.node.name]
            differs = differs or _args_of(node) != _args_of(p.node)
            p.node = node
        p.step = step
        if differs and p.spec is not None:
            p.attrs, p.call, p.tile_plan = dict(step.attrs), None, None
        if p.static and (differs or any(s in stale_vals for s in p.ins)):
            stale_steps.add(step.index)
            stale_vals.update(s for s in p.outs if s >= 0)
    self.plan, self.memory_plan = plan, mp
    if cap is not None:
        self.graph_module = cap.graph_module
    if stale_steps and self._base is not None:
        _with_producers(self, stale_steps, stale_vals)
        _refresh(self, stale_steps, stale_vals)
    return True


def _with_producers(self, stale_steps, stale_vals) -> None:
    """Add the static steps whose results a stale step reads but the last full run freed (an
    ``arange`` freed after the step that used it): they run again with it."""
    from torchfl.kernels.tensor import DeviceTensor

    base = self._base
    producer = {s: p for p in self.preps if p.static for s in p.outs if s >= 0}
    for p in reversed(self.preps):
        if p.step.index not in stale_steps:
            continue
        for s in p.ins:
            q, v = producer.get(s), base[s]
            if q is not None and v.__class__ is DeviceTensor and v.buffer.freed:
                stale_steps.add(q.step.index)
                stale_vals.update(o for o in q.outs if o >= 0)


def _refresh(self, stale_steps, stale_vals) -> None:
    """The static values of the old sizes: freed now, made again by the next call (the dynamic
    program plus the stale static steps, :attr:`Executor._refresh`)."""
    from torchfl.kernels.tensor import DeviceTensor

    stale = set(self._stale_slots) | stale_vals
    if self._base is not None:
        for s in stale_vals:
            v = self._base[s]
            if v.__class__ is DeviceTensor and not v.buffer.freed:
                v.buffer.free()
            self._base[s] = None
    key = (frozenset(stale_steps), frozenset(stale))
    made = self.__dict__.setdefault("_refreshes", {})   # a decode refreshes the same steps every token
    hit = made.get(key)
    if hit is None:
        preps = [p for p in self.preps if not p.static or p.step.index in stale_steps
                 or any(s in stale for s in p.outs)]
        resident = {self.slots[v] for v in self.static_vals} - stale
        hit = made[key] = (self._program(preps, resident), frozenset(s for p in preps if p.static for s in p.ins))
    self._refresh, self._refresh_reads = hit
    self._stale_slots = tuple(sorted(stale))


def reupload(self, vals) -> None:
    """Before a refresh run: the lifted tensors its static steps read that the last full run
    freed after their use (a float32 constant once cast or folded) are uploaded again."""
    from torchfl.kernels.tensor import DeviceTensor

    need = self._refresh_reads
    for s, t, lay, dt in self._lifted_slots:
        v = vals[s]
        if s in need and v.__class__ is DeviceTensor and v.buffer.freed:
            vals[s] = self._lifted_vals[s] = self._upload(t, lay, dt)
