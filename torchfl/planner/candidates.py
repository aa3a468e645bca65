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
from typing import NamedTuple

from torchfl.hcd.dtypes import ITEMSIZE
from torchfl.kernels.spec import numel
from torchfl.planner.cost import Priced, Pricer, price_plan
from torchfl.planner.graph import IRGraph, bind_outputs, short_dtype
from torchfl.planner.records import identity_layout
from torchfl.planner.select import Option


class Payload(NamedTuple):
    """What a chosen option turns into in the plan (a named tuple: one is built per option,
    and a frozen dataclass of 13 fields costs several times more to construct)."""

    kind: str  # kernel | fused | fallback | fold
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
    folded: dict = field(default_factory=dict)  # node -> why no kernel took it (computed once on the host)
    warnings: list = field(default_factory=list)


def _jsonable(v):
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    return str(v)


def foldable(node) -> bool:
    """Constant folding: a node no kernel takes whose value depends on no user input (only on
    parameters, buffers, constants, or nothing: ``arange``, ``full``) is computed once on the
    host with torch and kept on the chip as a static value, as a compiler folds constants,
    instead of a per-call CPU fallback. The executor computes it again when a parameter or
    buffer it reads changes. Ops with random results are never folded."""
    import torch

    target = node.fx.target
    if not node.static or not isinstance(target, torch._ops.OpOverload):
        return False
    return torch.Tag.nondeterministic_seeded not in target.tags and not target._schema.is_mutable


_TARGET_NAMES: dict = {}  # FX node target (an ATen op) -> its name
_PLAIN = (int, float, bool, str, type(None))  # argument types that stand for themselves in a signature


def _not_a_tensor(nodes, rule, kernel, kname, value) -> str:
    """Why a kernel input bound to a non-tensor rejects the rule, in a user's words: the op,
    its argument (the rule's binding), what the program passed there (``1 - x`` passes the
    Python number 1 as ``sub``'s ``self``) and what the kernel needed. Was: "input a is bound to
    something that is not a graph value", which named neither the argument nor the value."""
    from torchfl.planner.errors import aten_name

    bind = next((b for b in getattr(rule, "bind", ()) if b.name == kname), None)
    arg = bind.expr.text.strip() if bind is not None and bind.expr is not None else kname
    op = aten_name(nodes[0].op) if len(nodes) == 1 else "the group"
    if isinstance(value, bool) or not isinstance(value, (int, float, complex)):
        what = "absent (None)" if value is None else f"a {type(value).__name__} ({value!r:.40}), not a tensor"
    else:
        what = f"the Python number {value!r}, not a tensor on the device"
    return (f"argument '{arg}' of {op} is {what}: kernel {kernel} needs a tensor there (its input {kname}), "
            "so the call runs on the host")


class CallBuilder:
    """FX nodes -> rules Calls. Every TensorMeta gets a *path* (step, arg position, list
    index) so that a match found for one call can be replayed on another call with the same
    signature (repeated blocks), and a signature that keys that cache."""

    def __init__(self, ir: IRGraph):
        self.ir = ir
        self.path_of: dict[int, tuple] = {}  # id(TensorMeta) -> path
        self.values: dict[tuple, tuple[str, str]] = {}  # path -> (ir value, fx value)
        self.keep: list = []

    build = True  # False: signature and paths only (no TensorMeta objects), for cache hits
    _policy: dict = {}   # the call's dtype arguments as the precision policy plans them (call())

    def meta(self, fx_name: str, layout: str | None, path):
        ir_name = self.ir.fx_to_ir.get(fx_name)
        info = self.ir.info(fx_name)   # a multi-output node's output: its own shape and dtype
        if info is None:
            return None, None
        lay = layout if (info.rank == 4 and not info.static and layout) else (
            identity_layout(4) if info.rank == 4 else None)
        sig = ("T", info.shape, info.dtype, lay, info.static)
        if not self.build:
            if path is not None:
                self.values[path] = (ir_name, fx_name)
            return True, sig
        from torchfl.rules import TensorMeta

        tm = TensorMeta(info.shape, info.dtype, lay)
        if path is not None:
            self.path_of[id(tm)] = path
            self.values[path] = (ir_name, fx_name)
        self.keep.append(tm)
        return tm, sig

    def convert(self, value, layout, path):
        kind = type(value)
        if kind in _PLAIN:   # the common scalar argument: no torch type checks
            if kind is float and (value == 0.0 or value != value):
                # as dict keys -0.0 == 0.0 (x * -0.0 would reuse x * 0.0's call) and nan != nan
                return value, ("float", value.hex())
            return value, (kind.__name__, value)
        import torch

        _Node = torch.fx.Node

        if isinstance(value, _Node):
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
            d = self._policy.get(d, d)
            return d, d
        if isinstance(value, (torch.device, torch.layout, torch.memory_format)):
            d = str(value).removeprefix("torch.")
            return d, d
        return value, (type(value).__name__, value)

    def signature(self, node, layout, step=None):
        """The signature of a call (and its value paths) without building it."""
        self.build = False
        try:
            return self.call(node, layout, step)[1]
        finally:
            self.build = True

    def call(self, node, layout, step=None):
        """(Call, signature) of one FX node (Call is None in signature-only mode).

        A dtype argument naming the dtype the node's output has in the graph reads as the dtype
        that value has on the chip: under a precision policy ``softmax(x, dtype=torch.float64)``
        and ``x.float()`` produce the policy's dtype, like float64 and float32 inputs do."""
        info = self.ir.values.get(node.name)
        self._policy = {info.graph_dtype: info.dtype} if info is not None and info.graph_dtype != info.dtype \
            else {}
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
        target = _TARGET_NAMES.get(node.target)
        if target is None:   # an OpOverload formats its name in Python on every str()
            target = _TARGET_NAMES[node.target] = str(node.target)
        sig = (target, tuple(sig_args), tuple(sig_kw), out_sig, layout)
        if not self.build:
            return None, sig
        from torchfl.rules import Call

        return Call(args=tuple(args), kwargs=kwargs, layout=layout, out=out), sig


_CACHES: dict = {}
_CACHE_CHIPS = 16


def _shared_cache(hcd, packs, chip) -> dict:
    """The process-wide outcome cache of one (chip, rule packs) pair.

    An outcome (which rules match a call signature, their kernels' tile plans and prices)
    is a pure function of the signature, the HCD, the chip model and the packs, all in the
    key, so planning the same layer shapes again (repeated blocks, a second model, a
    recompile) replays it. Bounded to the last few chips."""
    key = (hcd.content_hash(), hash(chip), chip.cache_bytes, tuple(p.content_hash() for p in packs))
    cache = _CACHES.get(key)
    if cache is None:
        if len(_CACHES) >= _CACHE_CHIPS:
            _CACHES.pop(next(iter(_CACHES)))
        cache = _CACHES[key] = {}
    return cache


_INDEXES: dict = {}


def _fusion_index(packs):
    """The packs' fusions by root op, built once per set of packs."""
    from torchfl.rules.groups import FusionIndex

    key = tuple(p.content_hash() for p in packs)
    index = _INDEXES.get(key)
    if index is None:
        if len(_INDEXES) >= _CACHE_CHIPS:
            _INDEXES.pop(next(iter(_INDEXES)))
        index = _INDEXES[key] = FusionIndex(packs)
    return index


def clear_caches() -> None:
    """Forget every cached outcome and price (benchmarks measure cold planning with it)."""
    from torchfl.planner import cost, memory

    _CACHES.clear()
    cost.clear_cache()
    memory.clear_cache()


class Generator:
    """Builds the options of one graph on one chip."""

    def __init__(self, ir: IRGraph, hcd, packs, chip, pricer: Pricer):
        self.ir, self.hcd, self.packs, self.chip, self.pricer = ir, hcd, packs, chip, pricer
        self.out = Candidates()
        self.layouts4 = tuple(hcd.layouts)
        self._match_cache = _shared_cache(hcd, packs, chip)  # call signature -> priced outcomes
        self._sigs: dict = {}

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
        covered = {n for o in self.out.options for n in o.nodes}
        for node in self.ir.nodes.values():
            if node.name not in covered:
                self.fallback(node)
        return self.out

    # -- one op --
    def single(self, node):
        base, values = self._sig(node, None)
        for layout in self.layout_choices([node]):
            key = (base, layout)
            outcomes = self._match_cache.get(key)
            if outcomes is None:
                from torchfl.rules import candidates as rule_candidates

                builder = CallBuilder(self.ir)
                call, _sig = builder.call(node.fx, layout)
                results = rule_candidates(self.packs, self.hcd, node.op, call, layout=layout)
                outcomes = self._match_cache[key] = self._record(results, builder, [node], layout)
            if not outcomes:
                from torchfl.rules.matching import no_rule_reason

                self.out.rejected.append(((node.name,), None, (str(no_rule_reason(self.packs, node.op)),)))
                return
            self._replay([node], outcomes, values, layout, "kernel")

    def _sig(self, node, step):
        """Layout-free signature of a node's call and its value paths, once per (node, step):
        the layout only changes the rank-4 non-static slots, so (signature, layout) is a key."""
        key = (node.name, step)
        hit = self._sigs.get(key)
        if hit is None:
            builder = CallBuilder(self.ir)
            hit = self._sigs[key] = (builder.signature(node.fx, None, step), builder.values)
        return hit

    def _record(self, results, builder, nodes, layout):
        """Match/Rejection list -> replayable outcomes: kernel inputs as arg paths, already
        priced (everything a price depends on is in the call's signature)."""
        out = []
        inside = {o for n in nodes for o in n.outs if o}
        for r in results:
            kernel = getattr(r.rule, "kernel", None)
            if not r.ok:
                out.append(("reject", kernel, tuple(str(x) for x in r.reasons)))
                continue
            paths, why = {}, None
            for kname, tm in r.inputs.items():
                if tm is None:
                    continue
                path = builder.path_of.get(id(tm))
                if path is None:
                    why = _not_a_tensor(nodes, r.rule, kernel, kname, tm)
                elif builder.values[path][1] in inside:
                    why = (f"{kernel}: input {kname} is bound to {builder.values[path][1]}, a value computed inside "
                           f"the group ({getattr(r.rule, 'id', kernel)}: bind it to a value from outside)")
                if why:
                    break
                paths[kname] = path
            if why:
                out.append(("reject", kernel, (why,)))
                continue
            out.append(self._price(nodes, kernel, paths, builder, dict(r.attrs), r.dtype, getattr(r.rule, "id", ""),
                                   tuple(r.warnings), layout))
        return out

    def _price(self, nodes, kernel, paths, builder, match_attrs, match_dtype, rule_id, warnings, layout):
        from torchfl.kernels.catalog import CATALOG
        from torchfl.kernels.errors import KernelError

        spec = CATALOG.get(kernel)
        if spec is None:
            return ("reject", kernel, (f"kernel {kernel} is not in this build's catalog",))
        shapes, layouts, dtypes, inputs = {}, {}, {}, []
        for kname in spec.input_names:
            path = paths.get(kname)
            if path is None:
                continue
            ir_name, _fx = builder.values[path]
            info = self.ir.info(_fx)
            shapes[kname] = info.shape
            dtypes[kname] = info.dtype
            lay = layout if (layout and info.rank == 4 and not info.static) else None
            layouts[kname] = lay
            inputs.append((kname, path, lay or identity_layout(info.rank)))   # side outputs: _tracked
        attrs = {k: v for k, v in match_attrs.items() if k in spec.attrs}
        dtype = match_dtype or (dtypes.get(spec.input_names[0]) if spec.input_names else None)
        try:
            problem = spec.problem(shapes, attrs, dtype, layouts, dtypes)
            metas = spec.output_meta(problem)
            priced = price_plan(spec.tile(problem, self.chip), self.chip, problem.dtype)
        except KernelError as exc:  # the kernel's own check refuses the call: its sentence is the reason
            return ("reject", kernel, (f"{kernel}: {exc}",))
        info = self.ir.values.get(nodes[-1].name)
        out_meta = metas[0] if metas else None
        slots = bind_outputs(self.ir, nodes[-1], kernel, metas)  # kernel output i is op output slots[i]
        if isinstance(slots, str):
            return ("reject", kernel, (slots,))
        rank = info.rank if info is not None else 0
        layout_out = out_meta.layout if out_meta is not None else None
        if not isinstance(layout_out, str) or len(layout_out) != rank:
            # a permutation given as axis indices (permute/transpose as a layout_transform):
            # its physical order, read row-major, is the node's permuted logical shape
            layout_out = None
        layout_out = layout_out or identity_layout(rank)
        # the inputs' kernel names, layouts and paths apart too: every replay reads them
        return ("match", kernel, tuple(inputs), priced, layout_out, _jsonable(dict(problem.attrs)), problem.dtype,
                rule_id, warnings, slots, tuple([k for k, _p, _l in inputs]), tuple([l for _k, _p, l in inputs]),
                tuple([p for _k, p, _l in inputs]))

    def _tracked(self, refs, lays) -> tuple:
        """The layouts the selection needs these inputs in: a side output of a multi-output node
        (batch norm's running mean, a layer-norm backward's weight gradient) is tracked by that
        node's first output, as for a fallback reading it (the side output itself is stored in
        its own identity layout). Per node, never in the cached outcome: a call of the same
        signature elsewhere may read plain values of these shapes (ALBERT's backward adds two
        layer-norm weight gradients, then two bias gradients)."""
        out = None
        side = self.ir.out_values
        for k, (ir_name, fx) in enumerate(refs):
            own = side.get(fx)
            if own is None:
                continue
            tracked = self.ir.values.get(ir_name)
            if tracked is not None and tracked.rank != own.rank:
                out = out or list(lays)
                out[k] = identity_layout(tracked.rank)
        return tuple(out) if out else lays

    def _replay(self, nodes, outcomes, values, layout, kind):
        names = tuple(n.name for n in nodes)
        last = nodes[-1]
        op_outs = last.outs
        fx_nodes, ops, static, label = None, None, None, None  # per call, built at the first match
        options, rejected = self.out.options, self.out.rejected
        for o in outcomes:
            if o[0] == "reject":
                rejected.append((names, o[1], o[2]))
                continue
            _, kernel, _inputs, priced, layout_out, attrs, dtype, rule_id, warnings, slots, knames, lays, paths = o
            # the kernel's outputs by FX name (graph.bind_outputs); every output the graph reads must be one
            outs = tuple(op_outs[j] if j < len(op_outs) else "" for j in slots) if op_outs else ()
            unread = [x for x in op_outs if x and x not in outs]
            if unread:
                rejected.append((names, kernel, (f"{kernel} computes output(s) {list(slots)} of "
                                                 f"{last.op}; the graph also reads {', '.join(unread)}",)))
                continue
            if fx_nodes is None:
                fx_nodes = []
                for n in nodes:
                    fx_nodes.append(n.name)
                    fx_nodes.extend(x for x in n.outs if x and x != n.name)
                fx_nodes, ops, static, label = (tuple(fx_nodes), tuple(n.op for n in nodes),
                                                all(n.static for n in nodes), "+".join(names))
            refs = [values[path] for path in paths]
            lays = self._tracked(refs, lays)
            payload = Payload(kind, kernel, fx_nodes, ops, tuple([f for _i, f in refs]), knames, attrs, dtype, priced,
                              outs, static, rule_id, warnings)
            options.append(Option(f"{kernel}@{label}:{layout_out}", names, tuple([i for i, _f in refs]), lays,
                                  layout_out, priced.time_s, payload))

    # -- fusion groups (found by the rules layer, priced here) --
    def fusions(self):
        from torchfl.rules.groups import FxGraphView
        from torchfl.rules.matching import match_fusion

        graph = next(iter(self.ir.nodes.values())).fx.graph if self.ir.nodes else None
        if graph is None:
            return
        ops = {n.name: n.op for n in self.ir.nodes.values()}
        for group in _fusion_index(self.packs).find(FxGraphView(graph, ops)):
            if any(n not in self.ir.nodes for n in group.nodes):
                continue
            fusion = group.fusion
            nodes = [self.ir.nodes[n] for n in group.nodes]
            step_nodes = {sid: self.ir.nodes[n] for sid, n in group.steps}
            values, sigs = {}, []
            for sid, n in step_nodes.items():
                sig, vals = self._sig(n, sid)
                sigs.append((sid, sig))
                values.update(vals)
            sigs = tuple(sigs)
            for layout in self.layout_choices(nodes):
                key = (fusion.id, sigs, group.swaps, tuple(n.op for n in nodes), tuple(n.static for n in nodes),
                       layout)
                outcomes = self._match_cache.get(key)
                if outcomes is None:
                    builder = CallBuilder(self.ir)
                    calls = {sid: builder.call(n.fx, layout, sid)[0] for sid, n in step_nodes.items()}
                    m = match_fusion(fusion, self.hcd, calls, layout=layout, swaps=group.swaps)
                    outcomes = self._match_cache[key] = self._record([m], builder, nodes, layout)
                self._replay(nodes, outcomes, values, layout, "fused")

    # -- CPU fallback, or a fold of an input-independent node --
    def fallback(self, node):
        reasons = [r for nodes, _k, rs in self.out.rejected if nodes == (node.name,) for r in rs]
        reason = "; ".join(dict.fromkeys(reasons)) or f"no rule for {node.op}"
        kind = "fold" if foldable(node) else "fallback"
        (self.out.folded if kind == "fold" else self.out.fallbacks)[node.name] = reason
        fx_inputs = tuple(a.name for a in node.fx.all_input_nodes if a.name in self.ir.fx_to_ir)
        in_bytes = sum(numel(self.ir.info(a).shape) * ITEMSIZE.get(self.ir.info(a).dtype, 4) for a in fx_inputs)
        info = self.ir.values.get(node.name)
        # every output it writes back, each in its own shape and dtype (topk: values and indices)
        out_bytes = sum(numel(self.ir.info(o).shape) * ITEMSIZE.get(self.ir.info(o).dtype, 4) for o in node.outs
                        if o and self.ir.info(o) is not None)
        priced = self.pricer.fallback(in_bytes, out_bytes)
        ir_inputs = tuple(self.ir.fx_to_ir[a] for a in fx_inputs)
        layouts_in = tuple(identity_layout(self.ir.values[v].rank) for v in ir_inputs)
        layout_out = identity_layout(info.rank if info else 0)
        payload = Payload(kind, None, (node.name,) + tuple(o for o in node.outs if o and o != node.name),
                          (node.op,), fx_inputs, (), {}, info.dtype if info else "", priced, tuple(node.outs),
                          node.static, "", ())
        self.out.options.append(Option(f"cpu@{node.name}", (node.name,), ir_inputs, layouts_in, layout_out,
                                       priced.time_s, payload))
