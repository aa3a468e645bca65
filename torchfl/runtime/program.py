"""A plan compiled once into the executor's flat program (the way tinygrad or ONNX Runtime run
a graph): values in integer slots, each step with its input and output slots, its kernel (or
FX node for a host step) and the slots whose buffers die after it. What the compiled steps are
checked against (the chip, the kernel catalog, the captured graph) is checked here, once.
"""
from __future__ import annotations

from dataclasses import dataclass

from torchfl.kernels.spec import numel as _numel
from torchfl.planner.memory import is_alias, is_link_cast
from torchfl.planner.plan import HOST_STEPS, identity_layout

from .errors import PlanMismatch

__all__ = ["Prep", "Program", "DirectForm", "kernel_layout", "memory_plan_for", "static_of", "relabel",
           "reshaped", "same_tiling", "chip_for", "compile_step", "output_spec"]

CHIP_STEPS = ("kernel", "fused", "cast", "layout")


def kernel_layout(layout: str | None, rank: int):
    """Plan layout string -> DeviceTensor layout (None for the identity)."""
    if not layout or layout == identity_layout(rank):
        return None
    return layout


class Prep:
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


class Program:
    """A list of steps to run in order, with the buffer frees decided for that list.

    ``uploads``: (slot, position, layout, dtype, name) of the user inputs its steps or the
    outputs read; ``steps``: per step (prep, host step?, kernel input names, input slots,
    the output slot when it has exactly one else -1, slots whose buffers die after it);
    ``free_at_end``: slots of output buffers, freed after their download."""

    __slots__ = ("uploads", "steps", "free_at_end")

    def __init__(self, uploads, steps, free_at_end):
        self.uploads, self.steps, self.free_at_end = uploads, steps, free_at_end


def memory_plan_for(plan, chip, static_positions):
    """The plan's memory plan, or the same computation with ``static_positions`` resident."""
    from torchfl.planner.memory import plan_memory

    mp = plan.memory
    if mp is None or static_positions or mp.alignment != chip.alignment:
        mp = plan_memory(plan, chip.alignment, chip.memory_bytes, static_positions)
    return mp


def static_of(plan, static_positions):
    from torchfl.planner.memory import static_steps

    return static_steps(plan, static_positions)


def relabel(t):
    from torchfl.kernels.tensor import DeviceTensor

    return DeviceTensor(t.buffer, t.physical_shape, None, t.dtype, t.offset)


VIEWED_GEMMS = frozenset({"linear_gelu", "linear_relu", "matmul_gelu"})
VIEW_OPS = frozenset({"aten.view.default", "aten._unsafe_view.default"})


def reshaped(t, shape):
    """``t`` (identity layout) seen with ``shape`` (same elements): select drops its dim."""
    from torchfl.kernels.tensor import DeviceTensor

    if tuple(t.shape) == shape:
        return t
    if t.layout is not None or t.numel != _numel(shape):
        raise PlanMismatch(f"select: a slice of shape {t.shape} cannot be seen as {shape}")
    return DeviceTensor(t.buffer, shape, None, t.dtype, t.offset)


def same_tiling(planned: dict, config) -> bool:
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


def compile_step(step, plan, nodes: dict, slot, static_steps) -> Prep:
    """One plan step as a :class:`Prep`: its kernel (from the catalog) or FX node, its input
    names and slots (``slot(name)`` numbers a value), its output slots."""
    from torchfl.kernels.catalog import get

    p = Prep(step)
    # the kernel's result seen with the group output's shape (same elements): a select
    # drops its dim; a GEMM fused through a view (addmm -> view -> gelu) returns [M, N]
    if step.outputs[:1] and step.outputs[0] in plan.values and (
            (step.kernel == "slice" and "aten.select.int" in step.ops)
            or (step.kernel in VIEWED_GEMMS and VIEW_OPS & set(step.ops))):
        p.squeeze = tuple(plan.values[step.outputs[0]].shape)
    if is_link_cast(step, plan.values):
        p.host, p.link = True, step.attrs["to"]
        bound = [(v, v) for v in step.inputs if v]
    elif step.kind in CHIP_STEPS:
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
    return p


def output_spec(plan, graph_module) -> tuple:
    """Where each entry of the FX output comes from: ``("value", plan output index)`` for
    a node, ``("const", x)`` for None or a literal (AOT backward graphs return None for
    inputs without gradient). Without a graph: the plan's outputs in order."""
    n_out = len(plan.outputs)
    if graph_module is None:
        return tuple(("value", i) for i in range(n_out))
    import torch

    out_node = next(n for n in graph_module.graph.nodes if n.op == "output")
    spec, count = [], [0]

    def walk(a):
        if isinstance(a, (list, tuple)):
            for x in a:
                walk(x)
        elif isinstance(a, torch.fx.Node):
            spec.append(("value", count[0]))
            count[0] += 1
        else:
            spec.append(("const", a))

    walk(out_node.args[0])
    k = count[0]
    if k != n_out:
        raise PlanMismatch(f"the graph returns {k} values but the plan lists {n_out} outputs "
                           f"({', '.join(plan.outputs)}); re-plan")
    return tuple(spec)
