"""Candidates: for every op node and every fusion group a rule pattern matches, the
kernels whose rules match on this chip, in each layout they may run in, priced.

Layouts apply to rank-4 values (the HCD's layouts are permutations of NCHW); an option in
layout L reads its rank-4 activation inputs in L and its output is stored in the layout
the kernel reports (L unless the kernel says otherwise). Parameters, buffers and other
values stay in their logical layout. A rule that does not match, or a kernel whose
problem check refuses the call, is kept as a rejection with its reason; an op with no
option at all becomes a CPU fallback option (never silently: it is listed in the plan).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torchfl.planner.cost import ELEM, Priced, Pricer, numel, price_plan
from torchfl.planner.graph import IRGraph, short_dtype
from torchfl.planner.plan import identity_layout
from torchfl.planner.select import Option


@dataclass(frozen=True)
class Payload:
    """What a chosen option turns into in the plan."""

    kind: str  # kernel | fused | fallback
    kernel: str | None
    nodes: tuple  # FX node names covered (through/getitem included)
    ops: tuple
    fx_inputs: tuple  # FX value names per kernel input ("" = omitted)
    kernel_inputs: tuple  # kernel input names
    attrs: dict
    dtype: str
    priced: Priced
    outs: tuple  # FX names of the outputs
    static: bool
    rule: str = ""
    warnings: tuple = ()


@dataclass
class Candidates:
    options: list = field(default_factory=list)
    rejected: list = field(default_factory=list)  # (nodes, kernel, reasons)
    fallbacks: dict = field(default_factory=dict)  # node -> reason
    warnings: list = field(default_factory=list)


def _jsonable(v):
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    return str(v)


class _CallBuilder:
    """FX node -> rules Call, remembering which TensorMeta stands for which value."""

    def __init__(self, ir: IRGraph):
        self.ir = ir
        self.ids: dict[int, tuple[str, str]] = {}  # id(TensorMeta) -> (ir value, fx value)
        self.keep: list = []

    def meta(self, fx_name: str, layout: str | None):
        from torchfl.rules import TensorMeta

        ir_name = self.ir.fx_to_ir.get(fx_name)
        info = self.ir.values.get(ir_name)
        if info is None:
            return None
        lay = layout if (info.rank == 4 and not info.static and layout) else (
            identity_layout(4) if info.rank == 4 else None)
        tm = TensorMeta(info.shape, info.dtype, lay)
        self.ids[id(tm)] = (ir_name, fx_name)
        self.keep.append(tm)
        return tm

    def convert(self, value, layout):
        import torch

        if isinstance(value, torch.fx.Node):
            tm = self.meta(value.name, layout)
            if tm is not None:
                return tm
            val = value.meta.get("val")
            if isinstance(val, (torch.SymInt, int)):
                return int(val)
            return None
        if isinstance(value, (list, tuple)):
            return [self.convert(v, layout) for v in value]
        if isinstance(value, torch.dtype):
            return short_dtype(value)
        if isinstance(value, (torch.device, torch.layout, torch.memory_format)):
            return str(value).removeprefix("torch.")
        return value

    def call(self, node, layout):
        from torchfl.rules import Call

        args = tuple(self.convert(a, layout) for a in node.args)
        kwargs = {k: self.convert(v, layout) for k, v in node.kwargs.items()}
        out = None
        if node.name in self.ir.values:
            out = self.meta(node.name, layout)
            if out is not None:
                self.ids.pop(id(out), None)
        return Call(args=args, kwargs=kwargs, layout=layout, out=out)


class Generator:
    """Builds the options of one graph on one chip."""

    def __init__(self, ir: IRGraph, hcd, packs, chip, pricer: Pricer):
        self.ir, self.hcd, self.packs, self.chip, self.pricer = ir, hcd, packs, chip, pricer
        self.out = Candidates()
        self.layouts4 = tuple(hcd.layouts)
        self._fx_users: dict[str, list] = {}
        for n in ir.nodes.values():
            for a in n.fx.all_input_nodes:
                self._fx_users.setdefault(a.name, []).append(n.fx)

    # -- layouts an option may take --
    def layout_choices(self, nodes) -> tuple:
        """Rank-4 groups (output and every non-static rank-4 input) may use any chip layout."""
        last = nodes[-1]
        info = self.ir.values.get(last.name)
        if info is None or info.rank != 4:
            return (None,)
        for n in nodes:
            for v in n.inputs:
                vi = self.ir.values[v]
                if not vi.static and vi.rank != 4:
                    return (None,)
        return self.layouts4

    def run(self) -> Candidates:
        for node in self.ir.nodes.values():
            self.single(node)
        self.fusions()
        for node in self.ir.nodes.values():
            if not any(node.name in o.nodes for o in self.out.options):
                self.fallback(node)
        return self.out

    # -- one op --
    def single(self, node):
        from torchfl.rules import candidates as rule_candidates

        for layout in self.layout_choices([node]):
            builder = _CallBuilder(self.ir)
            call = builder.call(node.fx, layout)
            results = rule_candidates(self.packs, self.hcd, node.op, call, layout=layout)
            if not results:
                from torchfl.rules.matching import no_rule_reason

                self.out.rejected.append(((node.name,), None, (str(no_rule_reason(self.packs, node.op)),)))
                return
            for r in results:
                if not r.ok:
                    kernel = getattr(r.rule, "kernel", None)
                    self.out.rejected.append(((node.name,), kernel, tuple(str(x) for x in r.reasons)))
                    continue
                self.option([node], r, builder, layout, "kernel")

    def option(self, nodes, match, builder, layout, kind):
        from torchfl.kernels.catalog import CATALOG

        names = tuple(n.name for n in nodes)
        spec = CATALOG.get(match.kernel)
        if spec is None:
            self.out.rejected.append((names, match.kernel, (f"kernel {match.kernel} is not in this build's catalog",)))
            return
        shapes, layouts, dtypes, ir_inputs, fx_inputs, knames = {}, {}, {}, [], [], []
        for kname in spec.input_names:
            tm = match.inputs.get(kname)
            if tm is None:
                continue
            ref = builder.ids.get(id(tm))
            if ref is None:
                self.out.rejected.append((names, match.kernel, (f"{match.kernel}: input {kname} is not a graph value",)))
                return
            ir_name, fx_name = ref
            info = self.ir.values[ir_name]
            shapes[kname] = info.shape
            dtypes[kname] = info.dtype
            lay = layout if (layout and info.rank == 4 and not info.static) else None
            layouts[kname] = lay
            ir_inputs.append((ir_name, lay or identity_layout(info.rank)))
            fx_inputs.append(fx_name)
            knames.append(kname)
        attrs = {k: v for k, v in match.attrs.items() if k in spec.attrs}
        dtype = match.dtype or (dtypes.get(spec.input_names[0]) if spec.input_names else None)
        try:
            problem = spec.problem(shapes, attrs, dtype, layouts, dtypes)
            metas = spec.output_meta(problem)
            plan = spec.tile(problem, self.chip)
        except Exception as exc:  # noqa: BLE001 - the kernel's own check: keep its sentence as the reason
            self.out.rejected.append((names, match.kernel, (f"{match.kernel}: {exc}",)))
            return
        last = nodes[-1]
        info = self.ir.values.get(last.name)
        out_meta = metas[0] if metas else None
        if info is not None and out_meta is not None:
            if tuple(out_meta.shape) != tuple(info.shape) and numel(out_meta.shape) != numel(info.shape):
                self.out.rejected.append((names, match.kernel, (
                    f"{match.kernel} would produce shape {list(out_meta.shape)}, the graph needs {list(info.shape)}",)))
                return
            if out_meta.dtype != info.dtype:
                self.out.rejected.append((names, match.kernel, (
                    f"{match.kernel} would produce {out_meta.dtype}, the plan needs {info.dtype} here",)))
                return
        rank = info.rank if info is not None else 0
        layout_out = (out_meta.layout if out_meta is not None and out_meta.layout else None) or identity_layout(rank)
        priced = price_plan(plan, self.chip, problem.dtype)
        fx_nodes = []
        for n in nodes:
            fx_nodes.append(n.name)
            fx_nodes.extend(o for o in n.outs if o and o != n.name)
        payload = Payload(kind, match.kernel, tuple(fx_nodes), tuple(n.op for n in nodes), tuple(fx_inputs),
                          tuple(knames), _jsonable(dict(problem.attrs)), problem.dtype, priced, tuple(last.outs),
                          all(n.static for n in nodes), getattr(match.rule, "id", ""), tuple(match.warnings))
        key = f"{match.kernel}@{'+'.join(names)}:{layout_out}"
        self.out.options.append(Option(key, names, tuple(v for v, _ in ir_inputs), tuple(l for _, l in ir_inputs),
                                       layout_out, priced.time_s, payload))

    # -- fusion groups --
    def fusions(self):
        from torchfl.rules.matching import all_fusions, match_fusion

        for fusion in all_fusions(self.packs):
            first_ops = set(fusion.steps[0].ops)
            for node in self.ir.nodes.values():
                if node.op not in first_ops:
                    continue
                group = self.walk(fusion, node)
                if group is None:
                    continue
                nodes, step_nodes = group
                for layout in self.layout_choices(nodes):
                    builder = _CallBuilder(self.ir)
                    calls = {sid: builder.call(n.fx, layout) for sid, n in step_nodes.items()}
                    m = match_fusion(fusion, self.hcd, calls, layout=layout)
                    names = tuple(n.name for n in nodes)
                    if not m.ok:
                        self.out.rejected.append((names, fusion.kernel, tuple(str(x) for x in m.reasons)))
                        continue
                    self.option(nodes, m, builder, layout, "fused")

    def walk(self, fusion, start):
        """The IR nodes of ``fusion`` starting at ``start``, or None when the pattern does not match."""
        step_nodes = {fusion.steps[0].id: start}
        chain = [start]
        through = set(fusion.through)
        for step in fusion.steps[1:]:
            producer = step_nodes.get(step.from_)
            if producer is None or producer is not chain[-1]:
                return None  # only linear patterns are walked
            fx_val = producer.outs[step.output] if step.output < len(producer.outs) else ""
            if not fx_val:
                return None
            extra = []
            while True:
                users = self._fx_users.get(fx_val, [])
                if len(users) != 1 or fx_val in self.ir.outputs:
                    return None
                user = users[0]
                nxt = self.ir.nodes.get(user.name)
                if nxt is None:
                    return None
                if nxt.op in step.ops:
                    break
                if nxt.op in through and len(nxt.outs) == 1:
                    extra.append(nxt)
                    fx_val = nxt.outs[0]
                    continue
                return None
            rule = fusion.rule_for(step.id)
            names = rule.arg_names()
            fed = [names[i] for i, a in enumerate(user.args) if i < len(names) and getattr(a, "name", None) == fx_val]
            want = step.input
            if want is not None and want not in fed and not (step.commutative and set(step.commutative) & set(fed)):
                return None
            chain.extend(extra)
            chain.append(nxt)
            step_nodes[step.id] = nxt
        return chain, step_nodes

    # -- CPU fallback --
    def fallback(self, node):
        reasons = [r for nodes, _k, rs in self.out.rejected if nodes == (node.name,) for r in rs]
        reason = "; ".join(dict.fromkeys(reasons)) or f"no rule for {node.op}"
        self.out.fallbacks[node.name] = reason
        fx_inputs = tuple(a.name for a in node.fx.all_input_nodes if a.name in self.ir.fx_to_ir)
        in_bytes = sum(numel(self.ir.values[self.ir.fx_to_ir[a]].shape) * ELEM.get(
            self.ir.values[self.ir.fx_to_ir[a]].dtype, 4) for a in fx_inputs)
        info = self.ir.values.get(node.name)
        out_bytes = numel(info.shape) * ELEM.get(info.dtype, 4) if info else 0
        priced = self.pricer.fallback(in_bytes, out_bytes)
        ir_inputs = tuple(self.ir.fx_to_ir[a] for a in fx_inputs)
        layouts_in = tuple(identity_layout(self.ir.values[v].rank) for v in ir_inputs)
        layout_out = identity_layout(info.rank if info else 0)
        payload = Payload("fallback", None, (node.name,) + tuple(o for o in node.outs if o and o != node.name),
                          (node.op,), fx_inputs, (), {}, info.dtype if info else "", priced, tuple(node.outs),
                          node.static, "", ())
        self.out.options.append(Option(f"cpu@{node.name}", (node.name,), ir_inputs, layouts_in, layout_out,
                                       priced.time_s, payload))
