"""Running one step of a plan, beyond the hot loop: a chip step's first call (its tile plan
checked against the plan, its kernel bound), a host step (the FX node with torch on the CPU),
a link cast, and the compile helper that compiles the later steps' kernels while the first
one compiles. Each takes the :class:`~torchfl.runtime.executor.Executor` as ``self``.
"""
from __future__ import annotations

from torchfl.planner.memory import on_host

from .errors import PlanMismatch
from .program import kernel_layout as _kernel_layout
from .program import same_tiling as _same_tiling

__all__ = ["link", "bind", "run_host", "compile_helper", "calls_after", "call_of"]


def link(self, p, vals):
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

def compile_helper(self, p):
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
            now = call_of(self, p)
            self._helper = precompile.start(self.chip, calls_after(self, p.step.index),
                                            skip={now.ident} if now is not None else ())

    stack.callback(compiling.subscribe(on_compile))
    return stack

def calls_after(self, index: int) -> list:
    """The kernel calls of the chip steps after ``index`` not bound yet."""
    calls = [call_of(self, q) for q in self.preps
             if not q.host and q.call is None and q.spec is not None and q.step.index > index]
    return [c for c in calls if c is not None]

def call_of(self, q):
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

def bind(self, p, inputs):
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

def run_host(self, p, vals):
    import torch
    from torch.fx.node import map_arg

    from torchfl.kernels.tensor import DeviceTensor

    if p.link is not None:
        return link(self, p, vals)
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
