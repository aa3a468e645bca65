"""Public entry points: ``plan_module`` (module + example inputs) and ``plan_graph`` (a
Dynamo GraphModule, as a torch.compile backend receives it), both -> :class:`Plan`.

Pipeline: resolve the chip and rule packs -> check the precision and input layouts ->
capture -> hard constraints on every value and op -> candidates and prices -> strict
check -> exact selection -> Plan assembly.
"""

from __future__ import annotations

from torchfl.planner.errors import StrictFallbackError


def plan_module(module, example_inputs, chip, precision=None, strict=False, registry=None, training=False):
    """Plan ``module(*example_inputs)`` (inference; ``training=True`` plans the forward graph
    AOTAutograd produces, see :func:`plan_training` for both graphs)."""
    from torchfl.planner.capture import capture_module, capture_training
    from torchfl.planner.constraints import check_layout_inputs, check_precision
    from torchfl.planner.source import resolve

    example_inputs = tuple(example_inputs) if isinstance(example_inputs, (list, tuple)) else (example_inputs,)
    hcd, packs = resolve(chip, registry)
    check_precision(hcd, precision)
    check_layout_inputs(hcd, example_inputs)
    if training:
        captured, _bw = capture_training(module, example_inputs, packs)
    else:
        captured = capture_module(module, example_inputs)
    return plan_captured(captured, example_inputs, hcd, packs, precision=precision, strict=strict)


def plan_training(module, example_inputs, chip, precision=None, strict=False, registry=None):
    """(forward plan, backward plan) of the AOTAutograd graphs of ``module``."""
    from torchfl.planner.capture import capture_training
    from torchfl.planner.constraints import check_precision
    from torchfl.planner.source import resolve

    hcd, packs = resolve(chip, registry)
    check_precision(hcd, precision)
    fw, bw = capture_training(module, tuple(example_inputs), packs)
    return (plan_captured(fw, (), hcd, packs, precision=precision, strict=strict),
            plan_captured(bw, (), hcd, packs, precision=precision, strict=strict))


def plan_graph(gm, example_inputs, chip, precision=None, strict=False, registry=None):
    """Plan a Dynamo GraphModule; the plan's names refer to its core-ATen re-capture
    (``plan.capture.graph_module``), which is what the runtime executes."""
    from torchfl.planner.capture import capture_dynamo
    from torchfl.planner.constraints import check_layout_inputs, check_precision
    from torchfl.planner.source import resolve

    example_inputs = tuple(example_inputs)
    hcd, packs = resolve(chip, registry)
    check_precision(hcd, precision)
    check_layout_inputs(hcd, example_inputs)
    captured = capture_dynamo(gm, example_inputs)
    return plan_captured(captured, example_inputs, hcd, packs, precision=precision, strict=strict)


def plan_captured(captured, example_inputs, hcd, packs, precision=None, strict=False, chip_model=None):
    """Plan an already captured graph on a resolved chip (tests and the benchmark reuse captures)."""
    from torchfl.kernels.chip import ChipModel
    from torchfl.planner.build import assemble
    from torchfl.planner.candidates import Generator
    from torchfl.planner.constraints import check_graph, check_layout_inputs, check_precision, input_layouts
    from torchfl.planner.cost import Pricer
    from torchfl.planner.graph import build_ir
    from torchfl.planner.plan import Capture, identity_layout
    from torchfl.planner.select import Problem, select

    check_precision(hcd, precision)
    check_layout_inputs(hcd, example_inputs)
    ir = build_ir(captured, precision)
    check_graph(hcd, ir, precision, unbatched=frozenset(captured.extra.get("unbatched", ())))
    chip = chip_model or ChipModel.from_hcd(hcd)
    pricer = Pricer.for_chip(chip)
    cands = Generator(ir, hcd, packs, chip, pricer).run()
    if strict and cands.fallbacks:
        lines = [f"  {n} ({ir.nodes[n].op}): {why}" for n, why in cands.fallbacks.items()]
        raise StrictFallbackError(
            f"strict=True: {len(lines)} op(s) would fall back to the CPU on {hcd.chip.name}:\n" + "\n".join(lines)
            + "\nadd rules for them, or plan without strict to run them on the CPU", tuple(cands.fallbacks))
    layouts_in = input_layouts(example_inputs)
    fixed = {}
    user_i = 0
    for name, kind, _t, info in ir.placeholders:
        lay = identity_layout(info.rank)
        if kind == "input":
            if user_i < len(layouts_in) and layouts_in[user_i]:
                lay = layouts_in[user_i]
            user_i += 1
        fixed[name] = lay
    for cname, src, _to in ir.casts:
        fixed[cname] = fixed[src]
    values = ir.values

    def conv_cost(value, have, need):
        v = values[value]
        return pricer.layout(v.shape, v.dtype, have, need).time_s

    outputs = tuple((ir.fx_to_ir.get(o, o), identity_layout(values[ir.fx_to_ir.get(o, o)].rank))
                    for o in ir.outputs if ir.fx_to_ir.get(o, o) in values)
    problem = Problem({n.name: n.inputs for n in ir.nodes.values()}, fixed, outputs, tuple(cands.options),
                      conv_cost)
    selection = select(problem)
    notes = [f"selection: {'exact' if selection.exact else 'beam-pruned (not proven optimal)'} dynamic "
             f"programming over {len(selection.order)} nodes, at most {selection.max_states} layout states"]
    notes += sorted(set(w for w in hcd.warnings for w in [str(w)]))
    for opt in selection.chosen:
        notes.extend(opt.payload.warnings)
    notes = list(dict.fromkeys(notes))
    capture = Capture(captured.graph_module, dict(captured.tensors), captured.training)
    return with_memory(assemble(hcd, precision, ir, cands, selection, pricer, capture, layouts_in, notes), hcd, chip)


def with_memory(plan, hcd, chip):
    """``plan`` with its memory plan; refused (MemoryLimitError) when its peak exceeds the
    chip's off-chip memory."""
    import dataclasses

    from torchfl.planner.memory import check_memory, plan_memory

    plan = dataclasses.replace(plan, memory=plan_memory(plan, chip.alignment, chip.memory_bytes))
    check_memory(plan, hcd)
    return plan
