"""The planner's view of a captured FX graph: op nodes over named values, with on-chip dtypes.

``getitem`` nodes are folded into their multi-output producer (the producer's outputs are
named after them); ``_assert_*`` nodes are dropped. For layouts and selection a
multi-output node is one value (its name); each of its outputs still has its own shape
and dtype (``IRGraph.slots``, ``IRGraph.info(fx_name)``): a split piece, saved statistics,
max-pool indices. ``bind_outputs`` says which op output each output of a kernel is.

The precision policy decides each value's on-chip dtype: float32 becomes the policy
dtype, everything else stays, except saved normalisation statistics (``ACCUMULATOR_*``),
which are accumulator-precision data and stay float32. Graph inputs that change dtype are
read through a cast value ``<name>.<dtype>``.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

from torchfl.hcd.dtypes import short_dtype
from torchfl.kernels.spec import numel as _numel
from torchfl.planner.records import identity_layout


@dataclass
class VInfo:
    """A value: logical shape, caller dtype (from the graph), on-chip dtype, static?"""

    name: str
    shape: tuple
    graph_dtype: str
    dtype: str
    static: bool
    kind: str  # input | parameter | buffer | constant | node | cast
    rank: int = field(init=False, repr=False, compare=False)  # len(shape), read thousands of times per plan

    def __post_init__(self):
        self.rank = len(self.shape)


@dataclass
class INode:
    """An op node: FX node, ATen op name, IR input values, output FX names by index."""

    name: str
    fx: Any
    op: str
    inputs: tuple
    outs: tuple
    static: bool
    users: list = field(default_factory=list)


@dataclass
class IRGraph:
    nodes: dict  # name -> INode (graph order)
    values: dict  # name -> VInfo (IR value names)
    fx_to_ir: dict  # FX value name -> IR value name
    placeholders: list  # (name, kind, target, VInfo)
    casts: list  # (cast value, source placeholder, to dtype)
    outputs: list  # FX names of the graph outputs (flattened)
    dropped: list
    total_ops: int
    # multi-output node -> one VInfo (or None: not a tensor) per op output position, and
    # the same VInfos by the FX name of their getitem
    slots: dict = field(default_factory=dict)
    out_values: dict = field(default_factory=dict)

    def ir(self, fx_name: str) -> str:
        return self.fx_to_ir[fx_name]

    def info(self, fx_name: str):
        """The VInfo of an FX value: its own for an output of a multi-output node (shape
        and dtype of that output), else that of the IR value it reads (a cast input)."""
        own = self.out_values.get(fx_name)
        if own is not None:
            return own
        return self.values.get(self.fx_to_ir.get(fx_name, fx_name))


FLOAT_TYPES = ("float32", "float64")
STAT_DTYPES = ("float32", "float16", "bfloat16")

# SPEC 8: the precision policy casts activations and parameters and accumulates in fp32.
# The saved statistics of the normalisations (mean and invstd / rstd) are accumulator
# data, not activations: the norm kernels write them float32 whatever dtype they compute
# in and read them float32 in the backward (torchfl/kernels/norm: STAT, ``_meta``,
# ``_check``). So they are never downcast, and a graph input the backward reads only as
# such a statistic stays float32 (no cast). tests/planner/test_training_precision.py checks
# this table against the kernel catalog.
ACCUMULATOR_OUTPUTS = {   # op -> positions of its outputs that are saved statistics
    "aten.native_layer_norm.default": (1, 2),
    "aten.native_group_norm.default": (1, 2),
    # 3, 4: the new running statistics, float32 as ATen's decomposition computes them
    "aten._native_batch_norm_legit_functional.default": (1, 2, 3, 4),
    "aten._native_batch_norm_legit.default": (1, 2),
    "aten._native_batch_norm_legit_no_training.default": (1, 2),
    "aten.native_batch_norm.default": (1, 2),
}
ACCUMULATOR_ARGS = {      # op -> arguments (ATen schema names) that are saved statistics
    "aten.native_batch_norm_backward.default": ("save_mean", "save_invstd"),
    "aten.native_layer_norm_backward.default": ("mean", "rstd"),
}
# quantisation parameters of a quantised graph (PT2E): the int8 kernels' epilogue reads them
# exactly as the reference does; downcast, every weight scale would move. Kept as they are
# like the statistics above.
QUANT_PARAM_ARGS = {"quantized_decomposed.dequantize_per_channel.default": ("scales", "zero_points")}
KEPT_ARGS = {**ACCUMULATOR_ARGS, **QUANT_PARAM_ARGS}


def _stat_only(node) -> bool:
    """Does every user read ``node`` only as a saved statistic or a quantisation parameter
    (KEPT_ARGS)?"""
    if not node.users:
        return False
    for user in node.users:
        names = KEPT_ARGS.get(str(user.target))
        schema = getattr(user.target, "_schema", None)
        if not names or schema is None:
            return False
        args = [a.name for a in schema.arguments]
        reads = [args[i] if i < len(args) else None for i, a in enumerate(user.args) if a is node]
        reads += [k for k, a in user.kwargs.items() if a is node]
        if not reads or any(r not in names for r in reads):
            return False
    return True


def check_static_shapes(gm):
    """Plans are made for concrete shapes: a node whose output size depends on the data
    (nonzero, boolean-mask indexing, unique) is named with the ways around it, instead of
    torch's GuardOnDataDependentSymNode from deep inside the planner."""
    import torch
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    from torchfl.planner.capture import CaptureError

    for node in gm.graph.nodes:
        vals = node.meta.get("val")
        for v in vals if isinstance(vals, (list, tuple)) else (vals,):
            # concrete sizes (plain ints, the usual case) carry no symbol: skip torch's walk
            if (isinstance(v, torch.Tensor) and not all(type(d) is int for d in v.shape)
                    and free_unbacked_symbols(v)):
                raise CaptureError(
                    f"node {node.name} ({node.target}) has a data-dependent output shape {tuple(v.shape)}: "
                    "torchfl plans concrete shapes. Run the model through torch.compile(model, "
                    "backend=\"torchfl\") (Dynamo breaks the graph around such ops and runs them on the host), "
                    "or compute that part outside the captured module")


def drop_unread_getitems(gm) -> None:
    """Remove ``getitem`` nodes nobody reads. The IR folds a multi-output node's getitems into it
    and expects each to be read; AOTAutograd can leave one unread (a first conv's input gradient
    after an earlier ``torch.compile`` in the process), which would be a node with no rule."""
    import operator

    dead = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is operator.getitem and not n.users]
    for n in dead:
        gm.graph.erase_node(n)
    if dead:
        gm.recompile()


def build_ir(captured, precision: str | None) -> IRGraph:
    """The IR of a captured graph: its values with their on-chip dtypes under ``precision``,
    its op nodes (``getitem`` folded into their producer), its flattened outputs."""
    gm = captured.graph_module
    check_static_shapes(gm)
    b = _IRBuilder(captured, precision)
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            b.placeholder(node)
        elif node.op == "call_function" and not (node.target is operator.getitem and b.getitem(node)):
            b.op_node(node)
    return b.finish(gm)


def _meta_of(node):
    """(shape, dtype) of a node whose value is one tensor, else None."""
    import torch

    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return tuple(int(s) for s in val.shape), short_dtype(val.dtype)
    return None


class _IRBuilder:
    """The IR's tables as :func:`build_ir` walks the graph once, in order."""

    def __init__(self, captured, precision):
        self.precision = precision
        self.kinds = {name: (kind, target) for name, kind, target in captured.placeholders}
        self.values: dict[str, VInfo] = {}
        self.fx_to_ir: dict[str, str] = {}
        self.placeholders, self.casts = [], []
        self.nodes: dict[str, INode] = {}
        self.slots: dict[str, tuple] = {}
        self.out_values: dict[str, VInfo] = {}
        self.dropped = []
        self.total = 0

    def onchip(self, dt: str) -> str:
        """The dtype a value of graph dtype ``dt`` has on the chip (the precision policy)."""
        if dt in FLOAT_TYPES and self.precision:
            return self.precision
        return dt

    def onchip_out(self, op: str, index: int, dt: str) -> str:
        """The on-chip dtype of output ``index`` of ``op``: a saved statistic stays float32."""
        if index in ACCUMULATOR_OUTPUTS.get(op, ()) and dt in STAT_DTYPES:
            return "float32"     # a saved statistic: accumulator precision, never downcast
        return self.onchip(dt)

    def placeholder(self, node) -> None:
        """A graph input, parameter, buffer or constant, and its precision cast if it needs one."""
        kind, target = self.kinds.get(node.name, ("input", None))
        m = _meta_of(node)
        if m is None:
            self.dropped.append(node.name)
            return
        shape, dt = m
        info = VInfo(node.name, shape, dt, dt, kind != "input", kind)
        self.values[node.name] = info
        self.placeholders.append((node.name, kind, target, info))
        self.fx_to_ir[node.name] = node.name
        want = self.onchip(dt)
        if want != dt and _stat_only(node):
            want = dt   # read only as a saved statistic (float32): kept as it is
        if want != dt and node.users:   # an unused input (a specialised scalar) is never cast
            cname = f"{node.name}.{want}"
            self.values[cname] = VInfo(cname, shape, dt, want, info.static, "cast")
            self.fx_to_ir[node.name] = cname
            self.casts.append((cname, node.name, want))

    def getitem(self, node) -> bool:
        """Fold ``getitem`` of a multi-output producer into it (its output at that position);
        False when it is not one (then it is an op node of its own)."""
        src, idx = node.args
        producer = self.nodes.get(src.name)
        meta = _meta_of(node)
        if producer is None or meta is None:
            return False
        outs = list(producer.outs)
        while len(outs) <= idx:
            outs.append("")
        outs[idx] = node.name
        producer.outs = tuple(outs)
        self.fx_to_ir[node.name] = src.name
        shape, dt = meta
        per = self.slots.get(src.name, ())
        slot = per[idx] if idx < len(per) else None
        own = VInfo(node.name, shape, dt, slot.dtype if slot else self.onchip_out(producer.op, idx, dt),
                    producer.static, "node")
        self.out_values[node.name] = own
        if src.name not in self.values:
            self.values[src.name] = VInfo(src.name, shape, dt, own.dtype, producer.static, "node")
        return True

    def op_node(self, node) -> None:
        """An op node, its IR inputs and its value(s); static when it reads only static values."""
        values, fx_to_ir = self.values, self.fx_to_ir
        op = str(node.target)
        if op.startswith("aten._assert") and not node.users:
            self.dropped.append(node.name)
            return
        self.total += 1
        ins = []
        for arg in node.all_input_nodes:
            if arg.name in fx_to_ir:
                v = fx_to_ir[arg.name]
                if v not in ins:
                    ins.append(v)
        static = bool(ins) and all(values[v].static for v in ins if v in values)
        if not ins:
            static = True  # factory ops (arange, full): inputs-free, computable once
        m = _meta_of(node)
        self.nodes[node.name] = INode(node.name, node, op, tuple(ins), (node.name,) if m is not None else (), static)
        if m is None and isinstance(node.meta.get("val"), (list, tuple)):
            self.output_slots(node, op, static)
        if m is not None:
            shape, dt = m
            values[node.name] = VInfo(node.name, shape, dt, self.onchip(dt), static, "node")
        fx_to_ir[node.name] = node.name  # a tuple-valued one: getitems fill in its outputs

    def output_slots(self, node, op: str, static: bool) -> None:
        """A multi-output node: every output position's own shape and dtype; the node's value
        is its first tensor."""
        import torch

        per = []
        for i, v in enumerate(node.meta["val"]):
            if isinstance(v, torch.Tensor):
                sh, dt = tuple(int(s) for s in v.shape), short_dtype(v.dtype)
                per.append(VInfo(node.name, sh, dt, self.onchip_out(op, i, dt), static, "node"))
            else:
                per.append(None)
        self.slots[node.name] = tuple(per)
        first = next((v for v in per if v is not None), None)
        if first is not None:
            self.values[node.name] = first

    def finish(self, gm) -> IRGraph:
        """The IRGraph: node users, the flattened outputs, a value for every tuple-valued node."""
        import torch

        nodes, values = self.nodes, self.values
        for n in nodes.values():
            for v in n.inputs:
                if v in nodes:
                    nodes[v].users.append(n.name)
        out_node = next(n for n in gm.graph.nodes if n.op == "output")
        flat = []

        def walk(a):
            if isinstance(a, (list, tuple)):
                for x in a:
                    walk(x)
            elif isinstance(a, torch.fx.Node):
                flat.append(a.name)

        walk(out_node.args[0])
        # tuple-valued nodes with no getitem: take the first tensor output meta when possible
        for n in nodes.values():
            if n.name not in values:
                val = n.fx.meta.get("val")
                if isinstance(val, (list, tuple)) and val and isinstance(val[0], torch.Tensor):
                    dt = short_dtype(val[0].dtype)
                    values[n.name] = VInfo(n.name, tuple(int(s) for s in val[0].shape), dt, self.onchip(dt),
                                           n.static, "node")
        return IRGraph(nodes, values, self.fx_to_ir, self.placeholders, self.casts, flat, self.dropped, self.total,
                       self.slots, self.out_values)


def bind_outputs(ir: IRGraph, node: INode, kernel: str, metas) -> tuple | str:
    """Which op output each output of ``kernel`` is, for ``node``: a tuple of op output
    positions (one per kernel output, in order), or the reason the kernel cannot stand in
    for the node (a sentence for the rejection list).

    A kernel's outputs are an ordered subset of its op's outputs: all of them, or a prefix
    (batch-norm in a fused conv), or another subset (``conv2d_backward_weight`` computes
    ``convolution_backward``'s outputs 1 and 2, the weight and bias gradients, as its outputs
    0 and 1). A kernel may also compute an output the call does not ask for (the op's
    ``output_mask`` is false there, so the op's output is not a tensor: layer-norm backward
    when the input needs no gradient): that kernel output is unused. The positions come
    from the shapes: among the order-preserving assignments of kernel outputs to op outputs
    of the same shape (or to op outputs that are not tensors), those that use the fewest
    non-tensor outputs; the identity if it is one of them, else the only one (none, or
    several, reject the kernel: never a guess). Dtypes must then be those the plan stores.
    Kernel outputs beyond the op's last output are dropped.
    """
    slots = ir.slots.get(node.name)
    if slots is None:   # one output: the kernel's first is it (a relabelled permute may differ in shape)
        info = ir.values.get(node.name)
        out_meta = metas[0] if metas else None
        if info is not None and out_meta is not None:
            if tuple(out_meta.shape) != tuple(info.shape) and _numel(out_meta.shape) != _numel(info.shape):
                return f"{kernel} would produce shape {list(out_meta.shape)}, the graph needs {list(info.shape)}"
            if out_meta.dtype != info.dtype:
                return f"{kernel} would produce {out_meta.dtype}, the plan needs {info.dtype} here"
        return (0,) if metas else ()
    from itertools import combinations

    metas = list(metas)[:len(slots)]
    shapes = [tuple(int(s) for s in m.shape) for m in metas]

    def unasked(pos):   # None when the assignment does not fit, else how many non-tensor outputs it uses
        n = 0
        for j, sh in zip(pos, shapes):
            if slots[j] is None:
                n += 1
            elif slots[j].shape != sh:
                return None
        return n

    scored = [(unasked(c), c) for c in combinations(range(len(slots)), len(metas))]
    fitting = [(n, c) for n, c in scored if n is not None]
    best = [c for n, c in fitting if n == min(n for n, _c in fitting)] if fitting else []
    identity = tuple(range(len(metas)))
    if identity in best:
        pos = identity
    elif len(best) == 1:
        pos = best[0]
    else:
        have = [list(s.shape) if s is not None else None for s in slots]
        why = "matches none" if not best else f"could be {' or '.join(str(list(c)) for c in best)}"
        return (f"{kernel}'s outputs {[list(s) for s in shapes]} cannot be placed among {node.op}'s outputs "
                f"{have}: the assignment by shape {why}")
    for j, m in zip(pos, metas):
        if slots[j] is not None and m.dtype != slots[j].dtype:
            return f"{kernel} would produce {m.dtype} as output {j} of {node.op}, the plan needs {slots[j].dtype} here"
    return pos


def default_layout(info: VInfo) -> str:
    return identity_layout(info.rank)
