"""The Plan: what the SME decided, as plain frozen data (the contract with the runtime).

A plan is a straight-line program over **named values**. Every name is either a graph
input (a placeholder of the captured core-ATen FX graph) or the output of exactly one
earlier step. The runtime executes ``plan.steps`` in order; nothing else is implied.

Values
------
* ``plan.inputs`` lists the captured graph's placeholders, in graph order, as
  :class:`PlanInput`. ``kind`` is ``"input"`` (a user input; ``target`` is its position in
  the flattened example inputs), ``"parameter"``, ``"buffer"`` or ``"constant"``
  (``target`` is the state-dict / constant key of the original module). The tensors of
  non-user placeholders are in ``plan.capture.tensors[name]`` when the plan came from
  :func:`torchfl.planner.plan_module` / :func:`plan_graph` in this process.
* Graph inputs arrive in ``PlanInput.layout``: the identity layout, or ``NHWC`` for a
  rank-4 channels-last user input; and in ``PlanInput.dtype`` (the caller's dtype).
* ``plan.values[name]`` gives every value's logical ``shape``, storage ``dtype`` and
  physical ``layout`` and the index of the step that produces it (``None`` for inputs).
  A value whose dtype the chip cannot store (float64, complex; ``kernels.dtypes.stored``)
  is a *host value*: it has no device buffer, host steps read and write it as a torch
  tensor, and a ``cast`` step between it and a chip dtype (the precision policy on a
  float64 input, a float64 output returned to the caller) converts on the link
  (``planner.memory.is_link_cast``) instead of running the cast kernel.
* A step's ``inputs`` are value names, positionally matching the kernel's inputs in
  :mod:`torchfl.kernels.catalog` (``KernelSpec.inputs``); an optional input that the call
  omits is the empty string ``""``.
* A step's ``outputs`` are value names, one per kernel output; the name of a value that an
  FX node computes is that node's name (for a multi-output ATen op the names are those of
  its ``getitem`` users, ``""`` for an unused output). A fused step's output is named after
  the last node of its group; the group's inner values never exist.
* Values a step adds that are not FX nodes: casts are named ``<value>.<dtype>`` and layout
  conversions ``<value>.<layout>`` (e.g. ``p_conv1_weight.float16.NHWC``).
* ``plan.outputs`` are the value names that correspond, in order, to the FX graph's
  ``output`` node (flattened). They are always in the identity layout and the caller's
  dtype: the planner inserts (and prices) the conversions and casts needed.

Steps
-----
``kind`` is one of ``kernel`` (one FX node), ``fused`` (a fusion group, ``len(nodes) > 1``),
``cast``, ``layout``, ``fallback`` and ``fold``. For kernel, fused, cast and layout steps the runtime
calls ``CATALOG[step.kernel].run(chip, inputs, step.attrs, tile_plan)`` where the tile plan
is rebuilt from ``step.tile`` (``TileConfig.as_dict()``) and ``step.attrs`` are the kernel
attributes bound from the call (JSON scalars and lists). A ``fallback`` step runs the single
FX node ``step.nodes[0]`` of ``plan.capture.graph_module`` on the CPU with torch; its inputs
are given in the identity layout and the listed dtype, its output is returned likewise.
A ``fold`` step is the same host computation for a node that depends on no user input
(only on parameters, buffers, constants, or nothing, like ``arange``): it is ``static``, run
once and kept on the device (constant folding), listed in ``plan.folded``, not a fallback.
``static`` is true for a step whose inputs are all parameters/buffers/constants or other
static values (casts and layout transforms of weights): the runtime may run it once and
cache the result.

A ``layout_transform`` step that covers an FX node (``permute``/``transpose``/``t``) has
``attrs["layout"]`` as axis indices: the kernel stores its input in that physical axis
order, and that buffer read row-major *is* the node's permuted logical tensor, so its output
value has the node's (permuted) shape in the identity layout. A ``layout`` step (kind
``layout``, no FX node) keeps the logical shape and changes the physical layout to
``attrs["layout"]`` letters. Cast steps carry ``attrs["to"]``.

Layouts are strings of dimension letters (any permutation); the logical (identity) letters
of a rank-r tensor are given by :func:`identity_layout`. ``layouts_in[i]`` is the layout in
which ``inputs[i]`` must be stored (the value's own layout: the planner inserts a ``layout``
step before a consumer whenever they differ); ``layout_out`` is that of every output.

Chip
----
``plan.chip``, ``plan.chip_version`` and ``plan.chip_hash`` (the HCD's content hash) name
the chip the plan was made for. ``plan.target`` (process-local, never serialised, like
``plan.capture``) is the :class:`~torchfl.planner.target.Target` it was planned on; the
executor runs on that target, or on one it is given whose ``chip_hash`` must match.

Memory
------
``plan.memory`` is its :class:`~torchfl.planner.buffers.MemoryPlan`: every device buffer
(size as the allocator accounts it, the step that allocates it, the step after which the
executor frees it), the bytes live at each step and the peak. The executor frees exactly
what it says; a plan whose peak exceeds the chip's ``off_chip_memory.size_gb`` is refused
by the planner before anything runs.

Everything here is JSON-serialisable deterministically: ``plan.to_json()`` is
byte-identical for the same model, chip and options in any process.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any

from torchfl.planner.buffers import MemoryPlan
from torchfl.planner.records import HOST_STEPS, STEP_KINDS, Data, LazyTuple, as_tuple, identity_layout

__all__ = ["HOST_STEPS", "STEP_KINDS", "LazyTuple", "identity_layout", "PlanInput", "Value", "Step", "Conversion",
           "Cast", "Fallback", "Rejected", "Summary", "Capture", "Decomposed", "Plan"]


@dataclass(frozen=True)
class PlanInput(Data):
    """A placeholder of the captured graph (see the module docstring)."""

    name: str
    kind: str  # input | parameter | buffer | constant
    target: Any  # int position for inputs, state-dict key otherwise
    shape: tuple[int, ...]
    dtype: str
    layout: str


@dataclass(frozen=True)
class Value(Data):
    """A value of the plan: logical shape, storage dtype, physical layout, producer step."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    layout: str
    producer: int | None


@dataclass(frozen=True)
class Step(Data):
    """One executable step; fields are documented in the module docstring."""

    index: int
    kind: str
    kernel: str | None
    nodes: tuple[str, ...]
    ops: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    layouts_in: tuple[str, ...]
    layout_out: str
    dtype: str
    tile: dict[str, Any]
    attrs: dict[str, Any]
    predicted_flops: float
    predicted_bytes: float
    predicted_time_s: float
    static: bool = False
    note: str = ""

    @property
    def fused(self) -> bool:
        return self.kind == "fused"


@dataclass(frozen=True)
class Conversion(Data):
    """A layout conversion inserted on a graph edge (its step is ``plan.steps[step]``)."""

    step: int
    value: str
    from_layout: str
    to_layout: str
    consumer: str  # FX node (or "output") that needed the other layout


@dataclass(frozen=True)
class Cast(Data):
    """A dtype cast the precision policy inserted (its step is ``plan.steps[step]``)."""

    step: int
    value: str
    from_dtype: str
    to_dtype: str
    why: str


@dataclass(frozen=True)
class Fallback(Data):
    """An FX node run by torch on the host, and why no chip kernel could take it: per call
    (``plan.fallbacks``) or once, as a folded constant (``plan.folded``)."""

    node: str
    op: str
    reason: str


@dataclass(frozen=True)
class Rejected(Data):
    """An alternative that lost: ruled out (``reasons``; no time) or more expensive."""

    nodes: tuple[str, ...]
    kernel: str
    reasons: tuple[str, ...]
    predicted_time_s: float | None = None
    chosen_time_s: float | None = None
    # a priced alternative's kernel call, so it can be run and timed (tools/calibrate.py):
    # kernel, inputs (value names), kernel_inputs, layouts_in, layout_out, attrs, dtype
    call: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Summary(Data):
    """Totals; :meth:`headline` is the first line of ``explain``.

    Time and off-chip bytes in two parts, named alike wherever they are shown: **per call**,
    what every call pays (the steps that read a user input), and **run once**, the static
    steps (casts and layout copies of parameters, folds) whose results stay on the chip.
    ``predicted_time_s``/``predicted_bytes``/``predicted_flops`` are both together: the first
    call's.
    """

    nodes_total: int
    nodes_on_chip: int
    kernels: int
    fused_groups: int
    conversions: int
    casts: int
    fallbacks: int
    predicted_flops: float
    predicted_bytes: float
    predicted_time_s: float
    folded: int = 0  # nodes computed once on the host (input-independent), neither on chip nor fallbacks
    per_call_time_s: float = 0.0
    per_call_bytes: float = 0.0
    run_once_time_s: float = 0.0
    run_once_bytes: float = 0.0

    def headline(self, chip: str) -> str:
        folded = f"{self.folded} input-independent nodes folded (once, on the host), " if self.folded else ""
        return (
            f"{self.nodes_on_chip} of {self.nodes_total} nodes on {chip} in {self.kernels} kernels "
            f"({self.fused_groups} fused groups), {self.conversions} layout conversions, "
            f"{folded}{self.fallbacks} fallbacks to CPU"
        )


@dataclass(frozen=True)
class Capture:
    """Process-local handles the runtime needs for a plan made in this process.

    ``graph_module`` is the captured core-ATen graph (its node names are the plan's value
    names); ``tensors`` maps parameter/buffer/constant placeholder names to tensors.
    Never serialised.
    """

    graph_module: Any
    tensors: dict[str, Any]
    training: bool = False


@dataclass(frozen=True)
class Decomposed:
    """A node the plan serves by a decomposition (``planner/decompose.py``): its parts (FX names
    of the new nodes, the last one computing the node's value), the predicted time of the parts
    and of the best alternative (a direct kernel or the CPU fallback)."""

    node: str
    op: str
    rule: str
    parts: tuple[str, ...]
    part_ops: tuple[str, ...]
    predicted_time_s: float
    alternative: str
    alternative_time_s: float

    def to_dict(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class Plan(Data):
    """The SME's decision for one graph on one chip (module docstring: the contract)."""

    chip: str
    chip_version: str
    precision: str | None
    inputs: tuple[PlanInput, ...]
    outputs: tuple[str, ...]
    values: dict[str, Value]
    steps: tuple[Step, ...]
    conversions: tuple[Conversion, ...]
    casts: tuple[Cast, ...]
    fallbacks: tuple[Fallback, ...]
    rejected: tuple[Rejected, ...]
    summary: Summary
    notes: tuple[str, ...] = ()
    folded: tuple[Fallback, ...] = ()
    chip_hash: str = ""  # the chip's HCD content hash (Target.chip_hash); "" for a hand-built plan
    memory: MemoryPlan | None = None  # live buffers per step, the peak (planner/memory.py plans it)
    decomposed: tuple[Decomposed, ...] = ()  # ops served by their rule pack's decomposition
    capture: Capture | None = field(default=None, compare=False, repr=False, metadata={"json": False})
    target: Any = field(default=None, compare=False, repr=False, metadata={"json": False})

    def to_json(self, indent: int | None = 2) -> str:
        """Deterministic JSON (sorted keys); identical bytes for identical plans."""
        separators = (",", ": ") if indent else (",", ":")
        return json.dumps(self.to_dict(), sort_keys=True, indent=indent, separators=separators)

    def explain(self, format: str = "text", width: int | None = None) -> str:  # noqa: A002 - the CLI's word
        """The plan as ``text`` (EXPLAIN-style table, ``width`` columns: default the
        terminal's, 100 in a pipe), ``json`` or ``dot`` (Graphviz)."""
        # the plan's one reference upward, at call time: ``plan.explain()`` is the public face (the
        # runtime, the CLI and the tests call it); the renderer imports nothing of the plan
        from torchfl.planner.explain import render_plan

        return render_plan(self, format, width)

    def step_of(self, value: str) -> Step | None:
        producer = self.values[value].producer
        return None if producer is None else self.steps[producer]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        """Inverse of :meth:`to_dict` (without ``capture``)."""

        def build(klass, item):
            kwargs = {}
            for f in fields(klass):
                if not f.metadata.get("json", True) or f.name not in item:
                    continue
                v = item[f.name]
                kwargs[f.name] = v if isinstance(v, dict) else as_tuple(v)
            return klass(**kwargs)

        return cls(
            chip=data["chip"],
            chip_version=data["chip_version"],
            precision=data["precision"],
            inputs=tuple(build(PlanInput, i) for i in data["inputs"]),
            outputs=tuple(data["outputs"]),
            values={k: build(Value, v) for k, v in data["values"].items()},
            steps=tuple(build(Step, s) for s in data["steps"]),
            conversions=tuple(build(Conversion, c) for c in data["conversions"]),
            casts=tuple(build(Cast, c) for c in data["casts"]),
            fallbacks=tuple(build(Fallback, f) for f in data["fallbacks"]),
            rejected=tuple(build(Rejected, r) for r in data["rejected"]),
            summary=build(Summary, data["summary"]),
            notes=tuple(data.get("notes", ())),
            folded=tuple(build(Fallback, f) for f in data.get("folded", ())),
            chip_hash=data.get("chip_hash", ""),
            memory=MemoryPlan.from_dict(data["memory"]) if data.get("memory") else None,
            decomposed=tuple(Decomposed(**{k: as_tuple(v) for k, v in d.items()}) for d in data.get("decomposed", ())),
        )

    @classmethod
    def from_json(cls, text: str) -> Plan:
        return cls.from_dict(json.loads(text))
