"""The planner's view of a captured FX graph: op nodes over named values, with on-chip dtypes.

``getitem`` nodes are folded into their multi-output producer (the producer's outputs are
named after them); ``_assert_*`` nodes are dropped. The precision policy decides each
value's on-chip dtype: float32 becomes the policy dtype, everything else stays. Graph
inputs that change dtype are read through a cast value ``<name>.<dtype>``.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

from torchfl.planner.plan import identity_layout


def short_dtype(dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass
class VInfo:
    """A value: logical shape, caller dtype (from the graph), on-chip dtype, static?"""

    name: str
    shape: tuple
    graph_dtype: str
    dtype: str
    static: bool
    kind: str  # input | parameter | buffer | constant | node | cast

    @property
    def rank(self) -> int:
        return len(self.shape)


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

    def ir(self, fx_name: str) -> str:
        return self.fx_to_ir[fx_name]


FLOAT_TYPES = ("float32", "float64")


def build_ir(captured, precision: str | None) -> IRGraph:
    import torch

    gm = captured.graph_module
    kinds = {name: (kind, target) for name, kind, target in captured.placeholders}
    values: dict[str, VInfo] = {}
    fx_to_ir: dict[str, str] = {}
    placeholders, casts = [], []

    def onchip(dt: str) -> str:
        if dt in FLOAT_TYPES and precision:
            return precision
        return dt

    def meta_of(node):
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            return tuple(int(s) for s in val.shape), short_dtype(val.dtype)
        return None

    nodes: dict[str, INode] = {}
    dropped = []
    total = 0
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            kind, target = kinds.get(node.name, ("input", None))
            m = meta_of(node)
            if m is None:
                dropped.append(node.name)
                continue
            shape, dt = m
            info = VInfo(node.name, shape, dt, dt, kind != "input", kind)
            values[node.name] = info
            placeholders.append((node.name, kind, target, info))
            fx_to_ir[node.name] = node.name
            want = onchip(dt)
            if want != dt and node.users:   # an unused input (a specialised scalar) is never cast
                cname = f"{node.name}.{want}"
                values[cname] = VInfo(cname, shape, dt, want, info.static, "cast")
                fx_to_ir[node.name] = cname
                casts.append((cname, node.name, want))
            continue
        if node.op != "call_function":
            continue
        if node.target is operator.getitem:
            src, idx = node.args
            producer = nodes.get(src.name)
            if producer is not None and meta_of(node) is not None:
                outs = list(producer.outs)
                while len(outs) <= idx:
                    outs.append("")
                outs[idx] = node.name
                producer.outs = tuple(outs)
                fx_to_ir[node.name] = src.name
                if src.name not in values:
                    shape, dt = meta_of(node)
                    values[src.name] = VInfo(src.name, shape, dt, onchip(dt), producer.static, "node")
                continue
        op = str(node.target)
        if op.startswith("aten._assert") and not node.users:
            dropped.append(node.name)
            continue
        total += 1
        ins = []
        for arg in node.all_input_nodes:
            if arg.name in fx_to_ir:
                v = fx_to_ir[arg.name]
                if v not in ins:
                    ins.append(v)
        static = bool(ins) and all(values[v].static for v in ins if v in values)
        if not ins:
            static = True  # factory ops (arange, full): inputs-free, computable once
        m = meta_of(node)
        outs = (node.name,) if m is not None else ()
        nodes[node.name] = INode(node.name, node, op, tuple(ins), outs, static)
        if m is not None:
            shape, dt = m
            values[node.name] = VInfo(node.name, shape, dt, onchip(dt), static, "node")
            fx_to_ir[node.name] = node.name
        else:
            fx_to_ir[node.name] = node.name  # tuple-valued: getitems fill in its outputs
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
                values[n.name] = VInfo(n.name, tuple(int(s) for s in val[0].shape), short_dtype(val[0].dtype),
                                       onchip(short_dtype(val[0].dtype)), n.static, "node")
    return IRGraph(nodes, values, fx_to_ir, placeholders, casts, flat, dropped, total)


def default_layout(info: VInfo) -> str:
    return identity_layout(info.rank)
