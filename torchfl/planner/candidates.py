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
    """FX nodes -> rules Calls. Every TensorMeta gets a *path* (step, arg position, list
    index) so that a match found for one call can be replayed on another call with the same
    signature (repeated blocks), and a signature that keys that cache."""

    def __init__(self, ir: IRGraph):
        self.ir = ir
        self.path_of: dict[int, tuple] = {}  # id(TensorMeta) -> path
        self.values: dict[tuple, tuple[str, str]] = {}  # path -> (ir value, fx value)
        self.keep: list = []

    def meta(self, fx_name: str, layout: str | None, path):
        from torchfl.rules import TensorMeta

        ir_name = self.ir.fx_to_ir.get(fx_name)
        info = self.ir.values.get(ir_name)
        if info is None:
            return None, None
        lay = layout if (info.rank == 4 and not info.static and layout) else (
            identity_layout(4) if info.rank == 4 else None)
        tm = TensorMeta(info.shape, info.dtype, lay)
        if path is not None:
            self.path_of[id(tm)] = path
            self.values[path] = (ir_name, fx_name)
        self.keep.append(tm)
        return tm, ("T", info.shape, info.dtype, lay, info.static)

    def convert(self, value, layout, path):
        import torch

        if isinstance(value, torch.fx.Node):
            tm, sig = self.meta(value.name, layout, path)
            if tm is not None:
                return tm, sig
            val = value.meta.get("val")
            if isinstance(val, (torch.SymInt, int)):
                return int(val), int(val)
            return None, None
        if isinstance(value, (list, tuple)):
            pairs = [self.convert(v, layout, path + (i,)) for i, v in enumerate(value)]
            return [p[0] for p in pairs], tuple(p[1] for p in pairs)
        if isinstance(value, torch.dtype):
            d = short_dtype(value)
            return d, d
        if isinstance(value, (torch.device, torch.layout, torch.memory_format)):
            d = str(value).removeprefix("torch.")
            return d, d
        return value, (type(value).__name__, value)

    def call(self, node, layout, step=None):
        """(Call, signature) of one FX node."""
        from torchfl.rules import Call

        args, sig_args = [], []
        for i, a in enumerate(node.args):
            v, sig = self.convert(a, layout, (step, i))
            args.append(v)
            sig_args.append(sig)
        kwargs, sig_kw = {}, []
        for k in sorted(node.kwargs):
            v, sig = self.convert(node.kwargs[k], layout, (step, k))
            kwargs[k] = v
            sig_kw.append((k, sig))
        out = None
        out_sig = None
        if node.name in self.ir.values:
            out, out_sig = self.meta(node.name, layout, None)
        call = Call(args=tuple(args), kwargs=kwargs, layout=layout, out=out)
        return call, (str(node.target), tuple(sig_args), tuple(sig_kw), out_sig, layout)


class Generator:
    """Builds the options of one graph on one chip."""

    def __init__(self, ir: IRGraph, hcd, packs, chip, pricer: Pricer):
        self.ir, self.hcd, self.packs, self.chip, self.pricer = ir, hcd, packs, chip, pricer
        self.out = Candidates()
        self.layouts4 = tuple(hcd.layouts)
        self._match_cache: dict = {}  # call signature -> outcomes (replayable by path)
        self._kernel_cache: dict = {}  # problem key -> (priced, metas, problem) or error sentence
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
            call, sig = builder.call(node.fx, layout)
            outcomes = self._match_cache.get(sig)
            if outcomes is None:
                results = rule_candidates(self.packs, self.hcd, node.op, call, layout=layout)
                outcomes = self._match_cache[sig] = self._record(results, builder)
            if not outcomes:
                from torchfl.rules.matching import no_rule_reason

                self.out.rejected.append(((node.name,), None, (str(no_rule_reason(self.packs, node.op)),)))
                return
            self._replay([node], outcomes, builder, layout, "kernel")

    @staticmethod
    def _record(results, builder):
        """Match/Rejection list -> replayable outcomes (kernel inputs as arg paths)."""
        out = []
        for r in results:
            kernel = getattr(r.rule, "kernel", None)
            if not r.ok:
                out.append(("reject", kernel, tuple(str(x) for x in r.reasons)))
                continue
            paths = {}
            for kname, tm in r.inputs.items():
                if tm is None:
                    continue
                path = builder.path_of.get(id(tm))
                if path is None:
                    paths = None
                    break
                paths[kname] = path
            if paths is None:
                out.append(("reject", kernel, (f"{kernel}: an input is bound to something that is not a graph value",)))
                continue
            out.append(("match", kernel, paths, dict(r.attrs), r.dtype, getattr(r.rule, "id", ""), tuple(r.warnings)))
        return out

    def _replay(self, nodes, outcomes, builder, layout, kind):
        names = tuple(n.name for n in nodes)
        for o in outcomes:
            if o[0] == "reject":
                self.out.rejected.append((names, o[1], o[2]))
            else:
                _, kernel, paths, attrs, dtype, rule_id, warnings = o
                bound = {k: builder.values[p] for k, p in paths.items()}
                self.option(nodes, kernel, bound, attrs, dtype, rule_id, warnings, layout, kind)

    def _kernel(self, spec, shapes, attrs, dtype, layouts, dtypes):
        def frz(v):
            if isinstance(v, dict):
                return tuple(sorted((k, frz(x)) for k, x in v.items()))
            if isinstance(v, (list, tuple)):
                return tuple(frz(x) for x in v)
            return v

        key = (spec.name, frz(shapes), frz(attrs), dtype, frz(layouts), frz(dtypes))
        hit = self._kernel_cache.get(key)
        if hit is None:
            try:
                problem = spec.problem(shapes, attrs, dtype, layouts, dtypes)
                metas = spec.output_meta(problem)
                plan = spec.tile(problem, self.chip)
                hit = (price_plan(plan, self.chip, problem.dtype), metas, problem)
            except Exception as exc:  # noqa: BLE001 - the kernel's own check: its sentence is the reason
                hit = f"{spec.name}: {exc}"
            self._kernel_cache[key] = hit
        return hit

    def option(self, nodes, kernel, bound, match_attrs, match_dtype, rule_id, warnings, layout, kind):
        from torchfl.kernels.catalog import CATALOG

        names = tuple(n.name for n in nodes)
        spec = CATALOG.get(kernel)
        if spec is None:
            self.out.rejected.append((names, kernel, (f"kernel {kernel} is not in this build's catalog",)))
            return
        shapes, layouts, dtypes, ir_inputs, fx_inputs, knames = {}, {}, {}, [], [], []
        for kname in spec.input_names:
            ref = bound.get(kname)
            if ref is None:
                continue
            ir_name, fx_name = ref
            info = self.ir.values[ir_name]
            shapes[kname] = info.shape
            dtypes[kname] = info.dtype
            lay = layout if (layout and info.rank == 4 and not info.static) else None
            layouts[kname] = lay
            ir_inputs.append((ir_name, lay or identity_layout(info.rank)))
            fx_inputs.append(fx_name)
            knames.append(kname)
        attrs = {k: v for k, v in match_attrs.items() if k in spec.attrs}
        dtype = match_dtype or (dtypes.get(spec.input_names[0]) if spec.input_names else None)
        hit = self._kernel(spec, shapes, attrs, dtype, layouts, dtypes)
        if isinstance(hit, str):
            self.out.rejected.append((names, kernel, (hit,)))
            return
        priced, metas, problem = hit
        last = nodes[-1]
        info = self.ir.values.get(last.name)
        out_meta = metas[0] if metas else None
        if info is not None and out_meta is not None:
            if tuple(out_meta.shape) != tuple(info.shape) and numel(out_meta.shape) != numel(info.shape):
                self.out.rejected.append((names, kernel, (
                    f"{kernel} would produce shape {list(out_meta.shape)}, the graph needs {list(info.shape)}",)))
                return
            if out_meta.dtype != info.dtype:
                self.out.rejected.append((names, kernel, (
                    f"{kernel} would produce {out_meta.dtype}, the plan needs {info.dtype} here",)))
                return
        rank = info.rank if info is not None else 0
        layout_out = (out_meta.layout if out_meta is not None and out_meta.layout else None) or identity_layout(rank)
        fx_nodes = []
        for n in nodes:
            fx_nodes.append(n.name)
            fx_nodes.extend(o for o in n.outs if o and o != n.name)
        payload = Payload(kind, kernel, tuple(fx_nodes), tuple(n.op for n in nodes), tuple(fx_inputs),
                          tuple(knames), _jsonable(dict(problem.attrs)), problem.dtype, priced, tuple(last.outs),
                          all(n.static for n in nodes), rule_id, tuple(warnings))
        key = f"{kernel}@{'+'.join(names)}:{layout_out}"
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
                    calls, sigs = {}, []
                    for sid, n in step_nodes.items():
                        calls[sid], sig = builder.call(n.fx, layout, sid)
                        sigs.append((sid, sig))
                    key = (fusion.id, tuple(sigs), tuple(n.op for n in nodes))
                    outcomes = self._match_cache.get(key)
                    if outcomes is None:
                        m = match_fusion(fusion, self.hcd, calls, layout=layout)
                        outcomes = self._match_cache[key] = self._record([m], builder)
                    self._replay(nodes, outcomes, builder, layout, "fused")

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
