"""Selection result -> :class:`Plan`: casts, layout conversions, kernel, fold and fallback steps.

Order: input casts (the precision policy; static for parameters), then the chosen options
in the selection's schedule, each preceded by the layout conversions its inputs need (one
conversion per (value, layout), shared by every consumer), then the conversions and casts
that bring the graph outputs back to the identity layout and the caller's dtype.
"""

from __future__ import annotations

from torchfl.planner.texttable import human_time
from torchfl.planner.plan import (HOST_STEPS, Cast, Conversion, Fallback, LazyTuple, Plan, PlanInput, Rejected, Step,
                                  Summary, Value, identity_layout)


def assemble(target, precision, ir, cands, selection, pricer, capture, input_layouts, notes=()):
    """The Plan of ``selection``: its steps in the order of the module docstring, the totals."""
    b = _Steps(ir, pricer)
    inputs = b.placeholders(input_layouts)
    b.input_casts(precision)
    for opt in selection.chosen:
        b.chosen(opt, cands)
    outputs = b.outputs()
    steps = tuple(b.steps)
    fallbacks = tuple(Fallback(n, ir.nodes[n].op, cands.fallbacks[n]) for opt in selection.chosen
                      for n in opt.nodes if opt.payload.kind == "fallback")
    folded = tuple(Fallback(n, ir.nodes[n].op, cands.folded[n]) for opt in selection.chosen
                   for n in opt.nodes if opt.payload.kind == "fold")
    # built when read (explain, JSON, calibrate), not on every plan: ~8% of a warm ResNet-50 plan
    options, ruled_out = tuple(cands.options), tuple(cands.rejected)
    rejected = LazyTuple(lambda: _rejected(options, ruled_out, selection))
    summary = _summary(ir, steps, len(b.conversions), len(b.casts), len(fallbacks), len(folded))
    return Plan(chip=target.name, chip_version=target.version, chip_hash=target.chip_hash, precision=precision,
                inputs=tuple(inputs), outputs=tuple(outputs), values=b.values, steps=steps,
                conversions=tuple(b.conversions), casts=tuple(b.casts), fallbacks=fallbacks, folded=folded,
                rejected=rejected,
                summary=summary, notes=tuple(notes), capture=capture, target=target)


class _Steps:
    """The steps and values of one plan as they are emitted, in order; one layout conversion per
    (value, layout), shared by every consumer."""

    def __init__(self, ir, pricer):
        self.ir, self.pricer = ir, pricer
        self.steps: list[Step] = []
        self.values: dict[str, Value] = {}
        self.conversions: list[Conversion] = []
        self.casts: list[Cast] = []
        self.static_values: set[str] = set()
        self.converted: dict[tuple[str, str], str] = {}
        self.placeholder_names = {name for name, *_ in ir.placeholders}

    def add_value(self, name, shape, dtype, layout, producer, static):
        """Record a value (``static``: computed once, from weights only)."""
        self.values[name] = Value(name, tuple(shape), dtype, layout, producer)
        if static:
            self.static_values.add(name)

    def emit(self, **kw) -> Step:
        """Append the next step."""
        step = Step(index=len(self.steps), **kw)
        self.steps.append(step)
        return step

    def placeholders(self, input_layouts) -> list[PlanInput]:
        """The graph's placeholders as plan inputs: user inputs in the layout they arrive in."""
        inputs = []
        user_i = 0
        for name, kind, key, info in self.ir.placeholders:
            layout = identity_layout(info.rank)
            if kind == "input":
                lay = input_layouts[user_i] if user_i < len(input_layouts) else None
                layout = lay or layout
                user_i += 1
            inputs.append(PlanInput(name, kind, key, info.shape, info.graph_dtype, layout))
            self.add_value(name, info.shape, info.graph_dtype, layout, None, info.static)
        return inputs

    def input_casts(self, precision) -> None:
        """The precision policy's casts of the placeholders (static for parameters), first."""
        values = self.values
        for cname, src, to in self.ir.casts:
            info = self.ir.values[cname]
            src_layout = values[src].layout
            priced = self.pricer.cast(info.shape, info.graph_dtype, to)
            self.emit(kind="cast", kernel="cast", nodes=(), ops=(), inputs=(src,), outputs=(cname,),
                      layouts_in=(src_layout,), layout_out=src_layout, dtype=to, tile=priced.tile,
                      attrs={"to": to}, predicted_flops=float(priced.flops), predicted_bytes=float(priced.bytes),
                      predicted_time_s=priced.time_s, static=info.static,
                      note=f"precision policy: {info.graph_dtype} -> {to}" + (" (parameter, once)" if info.static
                                                                               else ""))
            self.add_value(cname, info.shape, to, src_layout, len(self.steps) - 1, info.static)
            self.casts.append(Cast(len(self.steps) - 1, src, info.graph_dtype, to,
                                   f"precision={precision}: {values[src].dtype} "
                                   f"{'parameter' if info.static else 'input'}"))

    def plan_name(self, ir_name, fx_name):
        """A placeholder's value is its IR name (its cast, if any); a node's, its FX name."""
        return ir_name if fx_name in self.placeholder_names else fx_name

    def need(self, value: str, layout: str, consumer: str) -> str:
        """``value`` in ``layout``: itself, or its conversion (emitted once, when first needed)."""
        values = self.values
        have = values[value].layout
        if have == layout:
            return value
        key = (value, layout)
        if key in self.converted:
            return self.converted[key]
        v = values[value]
        priced = self.pricer.layout(v.shape, v.dtype, have, layout)
        new = f"{value}.{layout}"
        static = value in self.static_values
        self.emit(kind="layout", kernel="layout_transform", nodes=(), ops=(), inputs=(value,), outputs=(new,),
                  layouts_in=(have,), layout_out=layout, dtype=v.dtype, tile=priced.tile, attrs={"layout": layout},
                  predicted_flops=float(priced.flops), predicted_bytes=float(priced.bytes),
                  predicted_time_s=priced.time_s, static=static, note=f"{have} -> {layout} for {consumer}")
        self.add_value(new, v.shape, v.dtype, layout, len(self.steps) - 1, static)
        self.conversions.append(Conversion(len(self.steps) - 1, value, have, layout, consumer))
        self.converted[key] = new
        return new

    def chosen(self, opt, cands) -> None:
        """One chosen option's step (kernel, fused group, fold or fallback), after the layout
        conversions its inputs need, and its output values."""
        p, ir, values = opt.payload, self.ir, self.values
        consumer = opt.nodes[-1]
        ins, lays = [], []
        for kinput, fx_name, ir_name, lay in zip(p.kernel_inputs or p.fx_inputs, p.fx_inputs, opt.inputs,
                                                 opt.layouts_in):
            name = self.plan_name(ir_name, fx_name)
            if name in values and len(lay) != len(values[name].shape):
                lay = identity_layout(len(values[name].shape))   # a side output (linalg_inv_ex's info)
            ins.append(self.need(name, lay, consumer))
            lays.append(lay)
        if p.kind not in HOST_STEPS and p.kernel_inputs:
            ins, lays = _positional(p.kernel, p.kernel_inputs, ins, lays)
        index = len(self.steps)
        outs = tuple(p.outs) if p.outs else (opt.nodes[-1],)
        static = p.static and all(i in self.static_values for i in ins)
        self.emit(kind=p.kind if p.kind != "kernel" or len(opt.nodes) == 1 else "fused", kernel=p.kernel,
                  nodes=p.nodes, ops=p.ops, inputs=tuple(ins), outputs=outs, layouts_in=tuple(lays),
                  layout_out=opt.layout_out, dtype=p.dtype, tile=p.priced.tile, attrs=p.attrs,
                  predicted_flops=float(p.priced.flops), predicted_bytes=float(p.priced.bytes),
                  predicted_time_s=p.priced.time_s, static=static, note=_step_note(p, opt, cands, ins, values))
        info = ir.values.get(opt.nodes[-1])
        for o in outs:
            if o and info is not None:
                shape = _shape_of(ir, o, info, ir.nodes.get(opt.nodes[-1]))
                # a multi-output op's side outputs (batch-norm's saved mean/invstd) have
                # another rank than the main one: they are stored in their identity layout
                layout = opt.layout_out if len(shape) == len(opt.layout_out) else identity_layout(len(shape))
                own = ir.out_values.get(o)   # its own dtype (float32 statistics, int64 indices)
                self.add_value(o, shape, own.dtype if own is not None else info.dtype, layout, index, static)

    def outputs(self) -> list[str]:
        """The graph outputs' values, converted back to the identity layout and cast back to the
        caller's dtype (both emitted here, last)."""
        ir, values = self.ir, self.values
        outputs = []
        for fx_name in ir.outputs:
            ir_name = ir.fx_to_ir.get(fx_name, fx_name)
            name = self.plan_name(ir_name, fx_name) if fx_name in values or ir_name in values else fx_name
            if name not in values:
                name = fx_name
            v = values[name]
            name = self.need(name, identity_layout(len(v.shape)), "output")
            v = values[name]
            graph_dtype = ir.info(fx_name).graph_dtype if ir.info(fx_name) is not None else v.dtype
            if v.dtype != graph_dtype:
                priced = self.pricer.cast(v.shape, v.dtype, graph_dtype)
                new = f"{name}.{graph_dtype}"
                self.emit(kind="cast", kernel="cast", nodes=(), ops=(), inputs=(name,), outputs=(new,),
                          layouts_in=(v.layout,), layout_out=v.layout, dtype=graph_dtype, tile=priced.tile,
                          attrs={"to": graph_dtype}, predicted_flops=float(priced.flops),
                          predicted_bytes=float(priced.bytes), predicted_time_s=priced.time_s, static=False,
                          note=f"output back to the caller's {graph_dtype}")
                self.add_value(new, v.shape, graph_dtype, v.layout, len(self.steps) - 1, False)
                self.casts.append(Cast(len(self.steps) - 1, name, v.dtype, graph_dtype, "output in the caller's dtype"))
                name = new
            outputs.append(name)
        return outputs


def _step_note(p, opt, cands, ins, values) -> str:
    """What explain says beside a chosen option's step: why it is on the host, or its tiling
    (and, for an int8 kernel, its quantisation)."""
    if p.kind == "fallback":
        return "CPU fallback: " + cands.fallbacks.get(opt.nodes[0], "")
    if p.kind == "fold":
        return ("folded: input-independent, computed once on the host and kept on the chip (no kernel: "
                + cands.folded.get(opt.nodes[0], "") + ")")
    note = p.priced.tile.get("notes", "")
    quant = quantisation_note(p.kernel, p.attrs, dict(zip(p.kernel_inputs, ins)), values)
    return f"{quant}; {note}" if quant and note else (quant or note)


def _summary(ir, steps, conversions: int, casts: int, fallbacks: int, folded: int) -> Summary:
    """The plan's totals: what is on the chip, and the predicted cost per call and run once."""
    compute = [s for s in steps if s.kind in ("kernel", "fused")]
    on_chip = sum(len([x for x in s.nodes if x in ir.nodes]) for s in compute)
    return Summary(
        nodes_total=ir.total_ops,
        nodes_on_chip=on_chip,
        kernels=len(compute),
        fused_groups=sum(1 for s in compute if s.kind == "fused"),
        conversions=conversions,
        casts=casts,
        fallbacks=fallbacks,
        folded=folded,
        predicted_flops=float(sum(s.predicted_flops for s in steps)),
        predicted_bytes=float(sum(s.predicted_bytes for s in steps)),
        predicted_time_s=float(sum(s.predicted_time_s for s in steps)),
        per_call_time_s=float(sum(s.predicted_time_s for s in steps if not s.static)),
        per_call_bytes=float(sum(s.predicted_bytes for s in steps if not s.static)),
        run_once_time_s=float(sum(s.predicted_time_s for s in steps if s.static)),
        run_once_bytes=float(sum(s.predicted_bytes for s in steps if s.static)),
    )


QUANTISED_KERNELS = ("qconv2d", "qlinear", "qadd")


def quantisation_note(kernel, attrs, inputs, values) -> str:
    """What explain says about an int8 step: the granularity of each operand's scales
    (per tensor, or per output channel and how many), and what the output is."""
    if kernel == "cast" and attrs.get("quantize"):
        if "scales" in inputs:
            n = values[inputs["scales"]].shape[0] if inputs["scales"] in values else "?"
            return f"int8 dequantise per-channel (axis {attrs.get('axis', 0)}, {n} scales)"
        verb = "quantise" if attrs.get("to") == "int8" else "dequantise"
        return f"int8 {verb} per-tensor (scale {attrs['scale']:.4g}, zero point {attrs['zero_point']})"
    if kernel not in QUANTISED_KERNELS:
        return ""
    if kernel == "qadd":
        ins = (f"a per-tensor (scale {attrs['a_scale']:.4g}, zp {attrs['a_zero_point']}), "
               f"b per-tensor (scale {attrs['b_scale']:.4g}, zp {attrs['b_zero_point']})")
    else:
        ws = inputs.get("w_scales")
        weight = (f"weight per-channel ({values[ws].shape[0]} scales"
                  + (", zero points" if "w_zero_points" in inputs else "") + ")" if ws in values else
                  f"weight per-tensor (scale {attrs['w_scale']:.4g}, zp {attrs['w_zero_point']})")
        ins = f"x per-tensor (scale {attrs['x_scale']:.4g}, zp {attrs['x_zero_point']}), {weight}"
    out = attrs.get("out_scale")
    tail = (f"out requantised per-tensor (scale {out:.4g}, zp {attrs['out_zero_point']})" if out
            else f"out dequantised to {attrs.get('out_dtype')}")
    relu = ", relu" if attrs.get("relu") else ""
    return f"int8 x int8 -> int32 on compute_units.int8: {ins}; {tail}{relu}"


def _shape_of(ir, fx_name, info, producer=None):
    """Shape of an output value: a getitem output has its own meta."""
    if fx_name not in ir.nodes and producer is not None:
        for u in producer.fx.users:
            if u.name == fx_name and "val" in u.meta and hasattr(u.meta["val"], "shape"):
                return tuple(int(s) for s in u.meta["val"].shape)
    return info.shape


def _rejected(options, ruled_out, selection):
    """Alternatives that lost on cost (the cheapest per kernel and layout) and those ruled out.

    An alternative is compared with the chosen steps covering the same nodes: its own price
    against theirs (layout conversions are priced on edges and not included on either side).
    """
    chosen_by_node = {}
    for opt in selection.chosen:
        for n in opt.nodes:
            chosen_by_node[n] = opt
    position = {n: i for i, n in enumerate(selection.order)}
    best_alt = {}
    chosen_keys = {o.key for o in selection.chosen}
    for opt in options:
        if opt.key in chosen_keys or opt.nodes[-1] not in chosen_by_node:
            continue
        k = (opt.nodes, opt.payload.kernel, opt.layout_out)
        if k not in best_alt or opt.cost < best_alt[k].cost:
            best_alt[k] = opt
    out = []
    against: dict = {}  # alternative's nodes -> (chosen cost, label, same nodes?, the nodes the chosen cover)
    for k in sorted(best_alt, key=lambda k: (position.get(k[0][-1], 0), k[0], str(k[1]), k[2])):
        opt = best_alt[k]
        hit = against.get(opt.nodes)
        if hit is None:
            chosen = list({id(c): c for c in (chosen_by_node[n] for n in opt.nodes)}.values())
            covered = {n for o in chosen for n in o.nodes}
            label = " + ".join(f"{o.payload.kernel or 'cpu'} ({o.layout_out})" for o in chosen)
            hit = against[opt.nodes] = (sum(o.cost for o in chosen), label, set(opt.nodes) == covered,
                                        "+".join(sorted(covered, key=lambda n: position.get(n, 0))))
        chosen_cost, label, same, covered_text = hit
        if not same:
            why = (f"covers {'+'.join(opt.nodes)} for {human_time(opt.cost)}; the chosen {label} covers "
                   f"{covered_text} for {human_time(chosen_cost)} "
                   "and the whole cover is cheaper")
        elif opt.cost == chosen_cost:
            why = f"tie at {human_time(opt.cost)} with the chosen {label}; the earlier candidate is kept"
        elif opt.cost > chosen_cost:
            why = f"{human_time(opt.cost)} vs {human_time(chosen_cost)} for the chosen {label}"
        else:
            why = (f"{human_time(opt.cost)} alone, but the chosen {label} ({human_time(chosen_cost)}) is cheaper "
                   "once the layout conversions and fusions around it are counted")
        out.append(Rejected(opt.nodes, f"{opt.payload.kernel or 'cpu'} ({opt.layout_out})", (why,),
                            opt.cost, chosen_cost, _call_of(opt)))
    seen = set()
    for nodes, kernel, reasons in sorted(ruled_out, key=lambda r: (position.get(r[0][-1], 0), r[0],
                                                                        str(r[1]), r[2])):
        key = (nodes, kernel, reasons)
        if key in seen:
            continue
        seen.add(key)
        out.append(Rejected(tuple(nodes), kernel or "(no rule)", tuple(reasons)))
    return tuple(out)


def _call_of(opt) -> dict:
    """A priced alternative's kernel call as Rejected.call keeps it (none for a host option)."""
    pl = opt.payload
    if not pl.kernel or pl.kind not in ("kernel", "fused"):
        return {}
    return {"kernel": pl.kernel, "inputs": list(pl.fx_inputs), "kernel_inputs": list(pl.kernel_inputs),
            "layouts_in": list(opt.layouts_in), "layout_out": opt.layout_out, "attrs": dict(pl.attrs),
            "dtype": pl.dtype}


def _positional(kernel: str, names, ins: list, lays: list) -> tuple[list, list]:
    """Inputs in the kernel's own order, ``""`` for an omitted optional one (the Plan contract).

    Candidates list only the inputs a call provides; a conv without bias must not shift its
    batch-norm inputs one place left.
    """
    from torchfl.kernels.catalog import CATALOG

    order = CATALOG[kernel].input_names
    given = dict(zip(names, zip(ins, lays)))
    if set(given) - set(order):
        return ins, lays  # not a spec-named binding: leave as produced
    last = max(order.index(n) for n in given) if given else -1
    picked = [given.get(n, ("", "")) for n in order[: last + 1]]
    return [v for v, _ in picked], [lay for _, lay in picked]
