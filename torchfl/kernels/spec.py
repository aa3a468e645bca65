"""KernelSpec: what a kernel accepts, its one tiling function and how to run it.

Pure Python. A family subpackage ``torchfl/kernels/<family>/__init__.py`` defines
``KERNELS = [KernelSpec(...), ...]`` (specs, problem checks, the tiling function) and
``impl.py`` the Numba code; ``KernelSpec.run`` imports ``impl`` on first use and calls
the function named by ``impl``: ``fn(ctx: RunContext) -> list[DeviceTensor]``, counting
every tile load/store/op through ``ctx.read/ctx.write/ctx.ops``.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

from torchfl.hcd.dtypes import short_dtype

from .errors import KernelError
from .tiling import TilePlan, Traffic

__all__ = ["KernelSpec", "Problem", "TensorMeta", "RunContext", "BoundRun"]


@dataclass(frozen=True)
class TensorMeta:
    """A tensor described without its data: ``shape``, ``dtype`` (short name, ``float16``),
    ``layout`` (``NCHW``... or None). What a kernel says it outputs, what the planner
    propagates and what rule guards read (``rank`` and ``numel`` derived)."""

    shape: tuple[int, ...]
    dtype: str
    layout: str | None = None

    FIELDS = ("shape", "dtype", "layout", "rank", "numel")

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        object.__setattr__(self, "dtype", short_dtype(self.dtype))

    def field(self, name: str):
        """The value a guard's ``x.<name>`` reads."""
        if name == "shape":
            return list(self.shape)
        if name == "dtype":
            return self.dtype
        if name == "layout":
            return self.layout
        if name == "rank":
            return len(self.shape)
        if name == "numel":
            return numel(self.shape)
        raise KeyError(name)

    def as_dict(self) -> dict:
        return {"shape": list(self.shape), "dtype": self.dtype, "layout": self.layout}


@dataclass(frozen=True)
class Problem:
    """One call of a kernel: input shapes, full attrs (defaults filled), dtype, layouts."""

    kernel: str
    shapes: dict
    attrs: dict
    dtype: str
    layouts: dict
    dtypes: dict = field(default_factory=dict)   # per-input storage dtype (default: dtype)

    @property
    def key(self) -> tuple:
        def frz(v):
            if isinstance(v, dict):
                return tuple(sorted((k, frz(x)) for k, x in v.items()))
            if isinstance(v, (list, tuple)):
                return tuple(frz(x) for x in v)
            return v
        return (self.kernel, frz(self.shapes), frz(self.attrs), self.dtype, frz(self.layouts),
                frz(self.dtypes))

    def dtype_of(self, name: str) -> str:
        return self.dtypes.get(name, self.dtype)

    def has(self, name: str) -> bool:
        return name in self.shapes


def numel(shape) -> int:
    """Elements in ``shape``, a Python int (exact at any size): the one count of the tree."""
    n = 1
    for s in shape:
        n *= int(s)
    return n


@dataclass(frozen=True)
class KernelSpec:
    """A kernel of the emulated chip.

    ``inputs``: names, optional ones end with ``?``; ``attrs``: name -> default;
    ``dtypes``: storage dtypes it computes in; ``layouts``: ``"any"`` or a tuple;
    ``fuses``: ATen op names a fused kernel covers (empty otherwise).
    ``check(problem)`` raises KernelError for bad shapes/attrs; ``meta(problem)`` gives the
    outputs; ``tiler(problem, chip)`` the TilePlan; ``impl`` the function in ``impl.py``.
    """

    name: str
    family: str
    inputs: tuple
    attrs: dict
    dtypes: tuple
    layouts: Any = "any"
    fuses: tuple = ()
    doc: str = ""
    check: Callable | None = None
    meta: Callable | None = None
    tiler: Callable | None = None
    impl: str = ""
    mixed_dtypes: bool = False   # inputs may differ in dtype (cast, where, int8 scales...)
    dtype_input: str | None = None   # input whose dtype is the problem's (default: the first)

    # -- inputs --
    @property
    def required_inputs(self) -> tuple:
        return tuple(n for n in self.inputs if not n.endswith("?"))

    @property
    def input_names(self) -> tuple:
        return tuple(n.rstrip("?") for n in self.inputs)

    # -- problem --
    def problem(self, shapes: dict, attrs: dict | None = None, dtype: str | None = None,
                layouts: dict | None = None, dtypes: dict | None = None) -> Problem:
        """Validate a call and fill default attrs. Errors say what is wrong and what fits."""
        shapes = {k: tuple(int(s) for s in v) for k, v in dict(shapes).items()}
        attrs = dict(attrs or {})
        missing = [n for n in self.required_inputs if n not in shapes]
        if missing:
            raise KernelError(f"kernel {self.name}: missing input(s) {', '.join(missing)}; "
                              f"it takes {', '.join(self.inputs)}")
        unknown = [n for n in shapes if n not in self.input_names]
        if unknown:
            raise KernelError(f"kernel {self.name}: unknown input(s) {', '.join(unknown)}; "
                              f"it takes {', '.join(self.inputs)}")
        bad = [a for a in attrs if a not in self.attrs]
        if bad:
            raise KernelError(f"kernel {self.name}: unknown attribute(s) {', '.join(bad)}; "
                              f"it accepts {', '.join(self.attrs) or 'none'}")
        full = {**self.attrs, **attrs}
        dtypes = dict(dtypes or {})
        if dtype is None:
            first = self.dtype_input or (self.required_inputs[0] if self.required_inputs else None)
            dtype = dtypes.get(first, "float32")
        if dtype not in self.dtypes:
            raise KernelError(f"kernel {self.name} does not compute in {dtype}; it supports "
                              f"{', '.join(self.dtypes)}")
        if not self.mixed_dtypes:
            odd = {k: v for k, v in dtypes.items() if v != dtype and k in shapes}
            if odd:
                raise KernelError(f"kernel {self.name}: inputs must all be {dtype}, got {odd}; "
                                  "insert a cast")
        layouts = {k: v for k, v in dict(layouts or {}).items() if k in shapes}
        for k, lay in layouts.items():
            if lay is None:
                continue
            from .tensor import layout_perm
            try:
                layout_perm(lay, len(shapes[k]))
            except ValueError as e:
                raise KernelError(f"kernel {self.name}: input {k}: {e}") from None
            if self.layouts != "any" and lay not in self.layouts:
                raise KernelError(f"kernel {self.name}: input {k} layout {lay} not supported; "
                                  f"use one of {', '.join(self.layouts)}")
        from .tensor import _canon
        layouts = {k: v for k, v in layouts.items() if _canon(v, len(shapes[k])) is not None}
        p = Problem(self.name, shapes, full, dtype, layouts,
                    {k: v for k, v in dtypes.items() if k in shapes and v != dtype})
        if self.check is not None:
            self.check(p)
        return p

    def output_meta(self, problem: Problem) -> list:
        return list(self.meta(problem))

    def tile(self, problem: Problem, chip) -> TilePlan:
        """The plan for ``problem`` on ``chip`` (memoised: the planner asks repeatedly)."""
        key = (problem.key, chip)
        plan = _PLANS.get(key)
        if plan is None:
            plan = self.tiler(problem, chip)
            if len(_PLANS) > 50_000:
                _PLANS.clear()
            _PLANS[key] = plan
        return plan

    # -- execution --
    def run(self, chip, inputs: dict, attrs: dict | None = None, plan: TilePlan | None = None,
            memory=None):
        """Execute exactly ``plan`` (default: this chip's plan) on device tensors.

        Returns ``(outputs, counted)``: output DeviceTensors and the Traffic the kernel
        really moved and computed."""
        from .memory import DeviceMemory

        inputs = {k: v for k, v in inputs.items() if v is not None}
        for k, t in inputs.items():
            t.check_alignment(chip.alignment, f"kernel {self.name}: input {k!r}")
        problem = self.problem({k: t.shape for k, t in inputs.items()}, attrs,
                               _first_dtype(self, inputs) if (not self.mixed_dtypes or self.dtype_input) else None,
                               {k: t.layout for k, t in inputs.items()},
                               {k: t.dtype for k, t in inputs.items()})
        if plan is None:
            plan = self.tile(problem, chip)
        if memory is None:
            memory = next((t.buffer.memory for t in inputs.values()), None) or DeviceMemory(chip)
        return self.bind(chip, problem, plan, memory).execute(inputs)

    def bind(self, chip, problem: Problem, plan: TilePlan, memory) -> "BoundRun":
        """``run`` for one problem, resolved once (impl function, plan checked against the
        problem): a caller that runs the same step again and again (the executor) pays the
        validation once and a signature check per call."""
        if plan.key != problem.key:
            raise KernelError(f"kernel {self.name}: the plan was made for another problem "
                              f"({plan.key[1:3]}), not {problem.key[1:3]}; re-plan")
        return BoundRun(self, chip, problem, plan, memory)


class BoundRun:
    """One kernel call site: spec, chip, validated problem, its tile plan, device memory and
    the impl function. ``bound(inputs)`` executes exactly the plan; inputs whose shape,
    dtype or layout differ from the bound problem go through ``spec.run``'s full checks
    (which refuse a plan made for another problem). Alignment is checked on every call."""

    __slots__ = ("spec", "chip", "problem", "plan", "memory", "fn", "sig", "align", "cache")

    def __init__(self, spec, chip, problem, plan, memory):
        self.spec, self.chip, self.problem, self.plan, self.memory = spec, chip, problem, plan, memory
        mod = importlib.import_module(f"torchfl.kernels.{spec.family}.impl")
        self.fn = getattr(mod, spec.impl)
        self.sig = tuple((k, problem.shapes[k], problem.dtype_of(k), problem.layouts.get(k))
                         for k in problem.shapes)
        self.align = int(chip.alignment)
        self.cache = {}     # the impl's constants for this problem and plan (RunContext.cache)

    def __call__(self, inputs: dict):
        if len(inputs) != len(self.sig):
            return self.spec.run(self.chip, inputs, self.problem.attrs, self.plan, self.memory)
        for k, shape, dtype, layout in self.sig:
            t = inputs.get(k)
            if t is None or t.shape != shape or t.dtype != dtype or t.layout != layout:
                return self.spec.run(self.chip, inputs, self.problem.attrs, self.plan, self.memory)
        return self.execute(inputs)

    def execute(self, inputs: dict):
        """Run on ``inputs`` already known to match the bound problem: (outputs, counted)."""
        align, name = self.align, self.spec.name
        for k, t in inputs.items():
            if (t.buffer.address + t.offset) % align:
                t.check_alignment(align, f"kernel {name}: input {k!r}")
        ctx = RunContext(self.chip, self.spec, self.problem, self.plan, inputs, self.memory, self.cache)
        outputs = self.fn(ctx)
        for o in outputs:
            if (o.buffer.address + o.offset) % align:
                o.check_alignment(align, f"kernel {name}: output")
        return outputs, ctx.counted


_PLANS: dict = {}


def _first_dtype(spec, inputs):
    if spec.dtype_input and spec.dtype_input in inputs:
        return inputs[spec.dtype_input].dtype
    for n in spec.input_names:
        if n in inputs:
            return inputs[n].dtype
    return None


class RunContext:
    """What an impl function gets: the call, its plan, and the counters. ``cache`` is a
    dict that lives as long as the call site (a bound run): an impl keeps there what
    depends only on the problem and plan (geometry, tile lists), never tensor data."""

    def __init__(self, chip, spec, problem, plan, inputs, memory, cache=None):
        self.chip, self.spec, self.problem, self.plan = chip, spec, problem, plan
        self.inputs, self.memory = inputs, memory
        self.cache = {} if cache is None else cache
        self.attrs = problem.attrs
        self._r = self._w = self._f = 0

    def read(self, nbytes):
        self._r += int(nbytes)

    def write(self, nbytes):
        self._w += int(nbytes)

    def ops(self, n):
        self._f += int(n)

    def add(self, t: Traffic):
        self._r += t.bytes_read
        self._w += t.bytes_written
        self._f += t.flops

    @property
    def counted(self) -> Traffic:
        return Traffic(self._r, self._w, self._f)

    def output(self, meta: TensorMeta):
        from .tensor import DeviceTensor

        return DeviceTensor.empty(self.memory, meta.shape, meta.dtype, meta.layout)

    def output_metas(self) -> list:
        """The spec's output metas for this problem, computed once per call site (they depend
        on the problem only; a GPT-2 call runs ~350 steps, each asked for them)."""
        metas = self.cache.get(_METAS)
        if metas is None:
            metas = self.cache[_METAS] = self.spec.output_meta(self.problem)
        return metas

    def outputs(self):
        return [self.output(m) for m in self.output_metas()]


_METAS = ("spec.output_metas",)      # RunContext.cache key (a tuple: no impl uses one like it)

