"""The ``torchfl`` torch.compile backend (registered as a ``torch_dynamo_backends`` entry
point, so ``backend="torchfl"`` needs no torchfl import in user code).

    torch.compile(model, backend="torchfl",
                  options={"chip": "NPU-V3", "precision": "float16", "strict": False,
                           "registry": "sqlite:///path/registry.db"})

Dynamo hands over one FX graph per frame (graph breaks give several); each becomes a
:class:`CompiledGraph`. When autograd is recording (an input requires grad), AOTAutograd
splits the graph into forward and backward core-ATen graphs. Every graph is planned by
the planner's one entry for them (``planner.plan_dynamo``: the graph surgery, lifting
weights and re-tracing symbolic shapes, is the planner's) and executed on the emulated
chip. This module is the torch.compile face only: options, the plans per input
signature, the ``aot_autograd`` wiring and the outputs as the caller expects them.

Planning happens at the first call of each input signature (shapes, dtypes,
channels-last), from the real inputs. Once Dynamo has made an inference graph
shape-polymorphic (a decoder's growing KV cache), it is captured once with its symbolic
sizes and planned once per bucket of sizes (``planner.lengths``); each concrete size runs an
instance of its bucket's plan, and only the latest few sizes keep an executor. Errors of
planning (hard constraints, strict mode, bad options) are raised unchanged to the caller
at that call, before anything runs, instead of being wrapped by Dynamo in
``BackendCompilerFailed``.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

from torchfl.planner.capture import is_static
from torchfl.planner.capture_training import attention_as_math

from .recording import active, recording
from . import hf_mamba

hf_mamba.for_compile()     # transformers' Mamba scan as torchfl's operator in this process's captures

__all__ = ["torchfl_backend", "CompiledGraph", "Options", "recording"]

_OPTION_KEYS = ("chip", "precision", "strict", "registry")


@dataclass(frozen=True)
class Options:
    """The backend's options (``torch.compile(..., options={...})``)."""

    chip: object
    precision: str | None = None
    strict: bool = False
    registry: object = None

    @classmethod
    def parse(cls, options) -> "Options":
        from .logs import strict_env

        options = dict(options or {})
        unknown = sorted(set(options) - set(_OPTION_KEYS))
        if unknown:
            raise ValueError(f"torchfl backend: unknown option(s) {', '.join(map(repr, unknown))}; "
                             f"it accepts {', '.join(_OPTION_KEYS)}")
        chip = options.get("chip")
        if not chip:
            raise ValueError(_no_chip_message(options.get("registry")))
        strict = options.get("strict", False)
        if not isinstance(strict, bool):
            raise ValueError(f"torchfl backend: strict must be True or False, got {strict!r}")
        return cls(chip, options.get("precision"), strict or strict_env(), options.get("registry"))


def _no_chip_message(registry) -> str:
    where = f" --registry {registry}" if isinstance(registry, str) and registry else ""
    return ('torchfl backend: no chip given; use torch.compile(model, backend="torchfl", '
            f'options={{"chip": NAME}}); `torchfl registry list{where}` shows the registered chips')


# ---------------------------------------------------------------- compiled graphs

def _signature(args, scalars=()) -> tuple:
    """What a plan depends on: shapes, dtypes, channels-last, which tensors the parameters
    are (a plan holds its parameters: new parameter objects replan), and the values of the
    inputs the graph reads as numbers (``scalars``: positions, see ``scalar_reads``)."""
    import torch

    sig = []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            cl = a.dim() == 4 and not a.is_contiguous() and a.is_contiguous(memory_format=torch.channels_last)
            value = a.item() if i in scalars else None
            sig.append((tuple(a.shape), a.dtype, cl, id(a) if is_static(a) else None, value, a.device))
        elif isinstance(a, (int, float, bool)):
            sig.append((type(a).__name__, a))
        else:
            sig.append(type(a).__name__)
    return tuple(sig)


def _static_positions(args) -> tuple:
    return tuple(i for i, a in enumerate(args) if is_static(a))


class _Entry:
    __slots__ = ("plan", "executor", "error", "user", "aot")

    def __init__(self, plan=None, executor=None, error=None, user=None, aot=None):
        self.plan, self.executor, self.error, self.user = plan, executor, error, user
        self.aot = aot    # a graph that mutates its inputs: its AOTAutograd callable


class CompiledGraph:
    """What the backend returns for one graph: plans per input signature, executes."""

    def __init__(self, gm, options: Options, kind: str = "inference", static_positions=()):
        self.gm = gm
        self.options = options
        self.kind = kind            # inference | forward | backward
        self.static_positions = tuple(static_positions)  # forward: Dynamo inputs that are weights
        self.entries: dict = {}
        self.lengths = None         # planner.lengths.LengthPlanner of a symbolic inference graph
        self._by_bucket: dict = {}  # its executors: one per bucket, adopting each length's plan
        if kind == "inference":    # inputs read with item(): plans are specialised on their values
            from torchfl.planner.capture import scalar_reads
            from torchfl.planner.lengths import is_symbolic

            self.scalar_positions = frozenset(scalar_reads(gm))
            self.channels_last_outputs = _channels_last_outputs(gm)
            self.symbolic = is_symbolic(gm) and not self.scalar_positions
        else:
            self.symbolic = False
            self.scalar_positions = frozenset()
            self.channels_last_outputs = ()

    # -- planning --
    def _plan(self, args):
        """(plan, positions of the user inputs among ``args``): the planner's one entry for
        the graphs a backend receives (weights lifted, symbolic AOT graphs made concrete)."""
        import torchfl.planner as planner

        o = self.options
        target = planner.resolve_target(o.chip, o.registry)
        if self.symbolic:
            from torchfl.planner.lengths import LengthPlanner

            if self.lengths is None:
                self.lengths = LengthPlanner(self.gm, target, o.precision, o.strict)
            planned = self.lengths.plan(args)
            if planned is not None:
                return planned
            self.symbolic = False     # nothing symbolic to share (or out of the export's range)
        return planner.plan_dynamo(self.gm, args, target, self.kind, self.static_positions,
                                   precision=o.precision, strict=o.strict)

    def _entry(self, args) -> _Entry:
        sig = _signature(args, self.scalar_positions)
        entry = self.entries.get(sig)
        if entry is None:
            from torchfl.planner.errors import MutatesInputs

            from .logs import announce_compiles

            announce_compiles()
            try:
                plan, user = self._plan(args)
                ex = self._executor_for(plan, args, user)
                entry = _Entry(plan, ex, user=None if len(user) == len(args) else user)
            except MutatesInputs:
                # as a training graph: AOTAutograd functionalises the writes, its forward graph
                # returns the new values, and its runtime wrapper copies them into the inputs
                try:
                    entry = _Entry(aot=_aot_compile(self.gm, list(args), self.options))
                except Exception as exc:   # kept, not swallowed: raised as below
                    entry = _Entry(error=exc)
            except Exception as exc:   # kept, not swallowed: raised to the caller now and at every call of
                entry = _Entry(error=exc)   # this signature (a bug too), so a refused graph is not planned again
            if self.lengths is not None:
                self._evict()
            self.entries[sig] = entry
        return entry

    def _executor_for(self, plan, args, user):
        """The plan's executor: for an instance of a symbolic graph's bucket, the bucket's
        executor, pointed at this instance (``Executor.adopt``: one executor runs every length
        of a bucket, rebinding only the steps whose sizes changed), else a new one."""
        static = _static_positions([args[i] for i in user])
        key = None
        if self.lengths is not None and _from_lengths(plan):
            key = (self.lengths.last_bucket, static, tuple(a.device for a in args if hasattr(a, "device")))
            ex = self._by_bucket.get(key)
            if ex is not None and ex.adopt(plan):
                return ex
        ex = _executor(plan, args, self.options, static, self._shared_weights())
        if key is not None:
            self._by_bucket[key] = ex
        return ex

    KEEP_LENGTHS = 2    # executors kept for a symbolic graph (their weights are shared: _SharedWeights)

    def _shared_weights(self):
        """A symbolic graph's executors (one per length) upload its weights once, together."""
        if self.lengths is None:
            return None
        if getattr(self, "_weights", None) is None:
            self._weights = _SharedWeights()
        return self._weights

    def _evict(self):
        """A decode makes a new size per token: keep the executors of the latest sizes only."""
        while len(self.entries) >= self.KEEP_LENGTHS:
            self.entries.pop(next(iter(self.entries)))

    @property
    def decisions(self) -> int:
        """Full plans made (a symbolic graph's buckets count once; otherwise one per signature)."""
        if self.lengths is not None:
            return self.lengths.decisions + sum(1 for e in self.entries.values() if e.plan is not None
                                                and not _from_lengths(e.plan))
        return len(self.plans)

    @property
    def plans(self) -> list:
        return [e.plan for e in self.entries.values() if e.plan is not None]

    def __call__(self, *args):
        entry = self._entry(args)
        if entry.error is not None:
            raise entry.error
        if entry.aot is not None:
            return entry.aot(*args)
        if entry.executor.plan is not entry.plan:   # the bucket's executor ran another length since
            self._readopt(entry, args)
        if entry.user is not None:
            args = tuple(args[i] for i in entry.user)
        rec = active()
        if rec is None:
            return self._as_output(entry.executor.run(args))
        return self._as_output(rec.run(self, entry.plan, entry.executor, args))

    def _readopt(self, entry, args):
        if not entry.executor.adopt(entry.plan):
            user = entry.user if entry.user is not None else range(len(args))
            entry.executor = _executor(entry.plan, args, self.options,
                                       _static_positions([args[i] for i in user]), self._shared_weights())

    def _as_output(self, out):
        """The executor's outputs (identity layout) as the caller gets them: in channels-last
        where eager torch returns channels-last (a conv net fed a channels-last input), a
        list for AOTAutograd's graphs."""
        if self.kind != "inference":
            return list(out)
        if self.channels_last_outputs:
            import torch

            out = list(out)
            for i in self.channels_last_outputs:
                if i < len(out) and isinstance(out[i], torch.Tensor) and out[i].dim() == 4:
                    out[i] = out[i].contiguous(memory_format=torch.channels_last)
            out = tuple(out)
        return out


def _from_lengths(plan) -> bool:
    return bool(plan.notes) and plan.notes[0].startswith("lengths: ")


class _SharedWeights:
    """The lifted weights of one symbolic graph on the chip, uploaded once for the executors of
    all its lengths (a decode makes one executor per token): keyed by the tensor, its version,
    layout and dtype; a buffer an executor freed (a float32 weight after its static cast) is
    uploaded again. Kernels' host copies of frozen buffers (packed GEMM panels) are shared too."""

    def __init__(self):
        self.by_key: dict = {}      # (id, layout, dtype) -> (tensor, version, DeviceTensor)
        self.ids: set = set()       # id() of the DeviceTensors held here

    def get(self, t, layout, dtype, upload):
        key = (id(t), layout, dtype)
        hit = self.by_key.get(key)
        version = getattr(t, "_version", 0)
        if hit is not None and hit[0] is t and hit[1] == version and not hit[2].buffer.freed:
            return hit[2]
        if hit is not None and not hit[2].buffer.freed:
            hit[2].buffer.free()
        if hit is not None:
            self.ids.discard(id(hit[2]))
        value = upload()
        self.by_key[key] = (t, version, value)
        self.ids.add(id(value))
        return value

    def owns(self, value) -> bool:
        return id(value) in self.ids

    def __del__(self, _finalizing=sys.is_finalizing):   # bound now: at shutdown the module's globals are None
        if _finalizing():   # interpreter shutdown: the device memory may be gone already
            return
        for _t, _v, value in self.by_key.values():
            if not value.buffer.freed:
                value.buffer.free()


def _shared_executor(plan, options, static, weights):
    """An Executor whose lifted uploads come from ``weights`` and are left to it on release."""
    from torchfl.kernels.tensor import DeviceTensor

    from .executor import Executor

    class Shared(Executor):
        def _upload(self, x, layout, dtype):
            if id(x) not in self._lifted_ids:
                return super()._upload(x, layout, dtype)
            return weights.get(x, layout, dtype, lambda: super(Shared, self)._upload(x, layout, dtype))

        def release(self):
            def mine(v):
                return not (v.__class__ is DeviceTensor and weights.owns(v))
            if self._base is not None:
                self._base = [v if mine(v) else None for v in self._base]
            if self._lifted_vals is not None:
                self._lifted_vals = {s: v for s, v in self._lifted_vals.items() if mine(v)}
            super().release()

    ex = Shared(plan, strict=options.strict, static_inputs=static)
    ex._lifted_ids = frozenset(id(t) for t in ex._lifted_tensors)
    return ex


def _executor(plan, args, options, static, weights=None):
    """The plan's executor: npu tensors (the eager device) are read and returned in place,
    on their chip, which must be the chip the model was compiled for; anything else is
    copied in and out of the chip's memory (``weights``: a symbolic graph's shared uploads)."""
    import torch

    from .executor import Executor

    npu = [a for a in args if isinstance(a, torch.Tensor) and a.device.type == "npu"]
    if not npu:
        if weights is not None:
            return _shared_executor(plan, options, static, weights)
        return Executor(plan, strict=options.strict, static_inputs=static)
    from .eager import device as eager_device
    from .eager.executor import EagerExecutor

    index = npu[0].device.index or 0
    target = eager_device.target_of(index)
    if target.name != plan.chip or (plan.chip_hash and target.chip_hash != plan.chip_hash):
        chip = target.name
        raise ValueError(f"torchfl backend: the inputs are on npu:{index} ({chip}) but the model is compiled for "
                         f"chip {plan.chip!r}; compile with options={{'chip': {chip!r}}} or move the inputs to "
                         f"the npu device of {plan.chip}")
    return EagerExecutor(plan, target, index, strict=options.strict, static_inputs=static)


def _channels_last_outputs(gm) -> tuple:
    """Positions of the graph's (flattened) outputs that Dynamo traced as channels-last
    4-D tensors: eager torch propagates a channels-last input's layout through convs,
    norms and pointwise ops, and the caller gets that layout back from us too."""
    import torch
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    out = next(n for n in gm.graph.nodes if n.op == "output")
    positions = []
    for i, a in enumerate(torch.utils._pytree.tree_leaves(out.args[0])):
        v = a.meta.get("example_value", a.meta.get("val")) if isinstance(a, torch.fx.Node) else None
        try:
            if (isinstance(v, torch.Tensor) and v.dim() == 4 and not v.is_contiguous()
                    and v.is_contiguous(memory_format=torch.channels_last)):
                positions.append(i)
        except GuardOnDataDependentSymNode:   # strides of data-dependent sizes: identity layout
            continue
    return tuple(positions)


# ---------------------------------------------------------------- the backend

def _deferred(exc):
    def raise_it(*_args):
        raise exc
    return raise_it


def _prestart_compile_helpers() -> None:
    """With an empty kernel cache, start the compile helpers now (``kernels.precompile.prestart``),
    so their imports overlap capture and planning instead of the first call's compiles. A bad
    ``TORCHFL_COMPILE_HELPERS`` is left to the first compile, which names it."""
    from torchfl.kernels import precompile
    from torchfl.kernels.envvars import EnvError

    try:
        precompile.prestart()
    except EnvError:
        pass


def torchfl_backend(gm, example_inputs, options=None, **kwargs):
    """Dynamo backend: plan each graph for the chip in ``options`` and run it there."""
    import torch

    try:
        if kwargs.get("mode") not in (None, "default"):
            raise ValueError(f"torchfl backend: mode={kwargs['mode']!r} is not supported; use options=")
        opts = Options.parse(options)
    except ValueError as exc:
        return _deferred(exc)
    _prestart_compile_helpers()
    training = torch.is_grad_enabled() and any(
        isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs) and not _quantised(gm)
    if not training:
        return CompiledGraph(gm, opts, "inference")
    from torchfl.planner.target import resolve_errors

    try:
        decompositions = training_decompositions(opts)
    except resolve_errors() as exc:   # unknown chip, registry unavailable: raised at the call
        return _deferred(exc)
    return _aot_compile(gm, example_inputs, opts, decompositions)


def _quantised(gm) -> bool:
    """A PT2E-quantised graph (quantized_decomposed ops) is inference only: its float
    parameters (biases) still ask for gradients, but no backward through int8 exists."""
    return any(n.op == "call_function" and str(n.target).startswith("quantized_decomposed.")
               for n in gm.graph.nodes)


def _aot_compile(gm, example_inputs, opts, decompositions=None):
    """AOTAutograd's callable for ``gm``: forward and backward (or, under no_grad, the
    inference) core-ATen graphs, each a :class:`CompiledGraph`; mutated inputs are
    functionalised into extra forward outputs and copied back by AOTAutograd."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    if decompositions is None:
        decompositions = training_decompositions(opts)
    static = _static_positions(example_inputs)

    def compiler(kind):
        def compile_aot(aot_gm, _example_inputs):
            n_user = sum(1 for n in aot_gm.graph.nodes if n.op == "placeholder")
            # the forward's primals are the Dynamo graph's inputs, in order (no extra ones
            # when no input is mutated); otherwise exempt nothing rather than guess
            ok = kind != "forward" or n_user == len(example_inputs)
            return make_boxed_func(CompiledGraph(aot_gm, opts, kind, static if ok else ()))
        return compile_aot

    with attention_as_math():   # the flash kernel's traced backward is wrong (capture_training.attention_as_math)
        return aot_autograd(fw_compiler=compiler("forward"), bw_compiler=compiler("backward"),
                            inference_compiler=compiler("forward"),
                            decompositions=decompositions)(gm, example_inputs)


def training_decompositions(opts):
    """AOTAutograd's decompositions for the chip and rule packs in ``opts``
    (:func:`torchfl.planner.capture_training.training_decompositions`)."""
    from torchfl.planner import resolve_target
    from torchfl.planner.capture_training import training_decompositions as for_packs

    return for_packs(resolve_target(opts.chip, opts.registry).packs)
