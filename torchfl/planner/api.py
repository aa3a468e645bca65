"""Public entry points: ``plan_module`` (module + example inputs), ``plan_training``
(its AOTAutograd forward and backward graphs) and ``plan_graph`` (a Dynamo GraphModule),
all -> :class:`Plan`; ``plan_captured`` plans a graph already captured, and
``plan_dynamo`` any graph a torch.compile backend receives (Dynamo's, with its weights as
inputs, or AOTAutograd's), on a resolved :class:`~torchfl.planner.target.Target`. Graph
surgery (lifting weights, re-tracing symbolic shapes) lives in ``capture.py``.

``chip`` is a chip name, an HCD or a Target (:func:`~torchfl.planner.target.resolve_target`).
Pipeline: resolve the target -> check the precision and input layouts (before the costly
capture) -> capture -> hard constraints on every value and op -> candidates and prices ->
strict check -> exact selection -> Plan assembly.
"""

from __future__ import annotations

import contextlib
import gc

from torchfl.planner.errors import MutatesInputs, StrictFallbackError
from torchfl.planner.plan import Fallback
from torchfl.planner.target import resolve_target


def _prepared(chip, registry, precision, example_inputs):
    """The target, after the checks that need no capture."""
    from torchfl.planner.constraints import check_layout_inputs, check_precision

    target = resolve_target(chip, registry)
    check_precision(target.hcd, precision)
    check_layout_inputs(target.hcd, example_inputs)
    return target


def plan_module(module, example_inputs, chip, precision=None, strict=False, registry=None, training=False):
    """Plan ``module(*example_inputs)`` (inference; ``training=True`` plans the forward graph
    AOTAutograd produces, see :func:`plan_training` for both graphs)."""
    from torchfl.planner.capture import capture_module
    from torchfl.planner.capture_training import capture_training

    example_inputs = tuple(example_inputs) if isinstance(example_inputs, (list, tuple)) else (example_inputs,)
    target = _prepared(chip, registry, precision, example_inputs)
    if training:
        captured, _bw = capture_training(module, example_inputs, target.packs)
    else:
        captured = capture_module(module, example_inputs)
    return _plan(_compiled(captured), example_inputs, target, precision, strict)


def plan_training(module, example_inputs, chip, precision=None, strict=False, registry=None):
    """(forward plan, backward plan) of the AOTAutograd graphs of ``module``."""
    from torchfl.planner.capture_training import capture_training

    target = _prepared(chip, registry, precision, ())
    fw, bw = capture_training(module, tuple(example_inputs), target.packs)
    return _plan(_compiled(fw), (), target, precision, strict), _plan(_compiled(bw), (), target, precision, strict)


def plan_graph(gm, example_inputs, chip, precision=None, strict=False, registry=None):
    """Plan a Dynamo GraphModule; the plan's names refer to its core-ATen re-capture
    (``plan.capture.graph_module``), which is what the runtime executes."""
    from torchfl.planner.capture import capture_dynamo

    example_inputs = tuple(example_inputs)
    target = _prepared(chip, registry, precision, example_inputs)
    return _plan(_compiled(capture_dynamo(gm, example_inputs)), example_inputs, target, precision, strict)


def plan_dynamo(gm, args, chip, kind="inference", weights=(), precision=None, strict=False, registry=None):
    """Plan a graph as torch.compile hands it to a backend: ``(plan, positions of the args
    that are the plan's inputs)``.

    ``kind="inference"``: a Dynamo graph; the parameters and buffers Dynamo passes as
    inputs are lifted into the graph (planned as weights), the other args are the plan's
    inputs. Raises :class:`~torchfl.planner.errors.MutatesInputs` when the graph writes to
    its inputs. ``kind="forward"|"backward"``: an AOTAutograd graph, re-traced on the
    concrete ``args`` if its shapes are symbolic; every arg is an input, and ``weights``
    (the forward's parameter primals) carry no batch dimension."""
    from torchfl.planner.capture import capture_dynamo, lift_static
    from torchfl.planner.capture_training import captured_aot, concrete

    if kind == "inference":
        lifted, user = lift_static(gm, args)
        inputs = tuple(args[i] for i in user)
        target = _prepared(chip, registry, precision, inputs)
        captured = capture_dynamo(lifted, inputs)
        _refuse_writes(gm, captured)
        return _plan(_compiled(captured), inputs, target, precision, strict), user
    if kind not in ("forward", "backward"):
        raise ValueError(f"plan_dynamo: kind must be inference, forward or backward, not {kind!r}")
    target = _prepared(chip, registry, precision, ())
    plan = _plan(_compiled(captured_aot(concrete(gm, args), kind, weights)), (), target, precision, strict)
    return plan, tuple(range(len(args)))


def _compiled(captured):
    """``captured`` marked as a graph compiled whole: its clones may be elided (``elide.py``;
    after ``fold_repeat_kv``, which reads Hugging Face's repeat_kv clone). The eager device's
    plans (``plan_captured``) are never marked: their clones copy."""
    captured.extra["compiled"] = True
    return captured


def _n_outputs(gm, nodes_only=False) -> int:
    """How many values the graph returns (its output, flattened; ``nodes_only``: the graph's
    values among them, as the plan's outputs count them)."""
    import torch

    out = next(n for n in gm.graph.nodes if n.op == "output")
    leaves = torch.utils._pytree.tree_leaves(out.args[0])
    return sum(isinstance(x, torch.fx.Node) for x in leaves) if nodes_only else len(leaves)


def _refuse_writes(gm, captured) -> None:
    """MutatesInputs when the capture of a Dynamo graph returns more values than the graph:
    torch.export returns the inputs the graph writes to (a train-mode batch-norm's running
    statistics and num_batches_tracked, under no_grad) as extra outputs. Checked before
    planning: the caller compiles such a graph another way, so a plan of it is wasted."""
    if _n_outputs(captured.graph_module, nodes_only=True) != _n_outputs(gm):
        raise MutatesInputs(f"the graph returns {_n_outputs(gm)} values but writes to some of its inputs too")


def plan_captured(captured, example_inputs, target, precision=None, strict=False):
    """Plan an already captured graph on a resolved ``target`` (a Target; tests and the
    benchmark reuse captures)."""
    from torchfl.planner.target import Target

    if not isinstance(target, Target):
        raise TypeError(f"plan_captured needs a Target (Target.of(hcd, packs) or resolve_target(...)), "
                        f"got {type(target).__name__}")
    target = _prepared(target, None, precision, example_inputs)
    return _plan(captured, example_inputs, target, precision, strict)


def _plan(captured, example_inputs, target, precision, strict, decide=None):
    """Plan ``captured`` on ``target`` (its preconditions checked by the caller), with the
    cyclic garbage collector paused (:func:`_gc_paused`). ``decide(problem) -> Selection``
    replaces the exact selection (``planner.lengths``: a bucket's choices at another length)."""
    with _gc_paused():
        return _plan_uncollected(captured, example_inputs, target, precision, strict, decide)


def plan_specialised(captured, inputs, target, precision=None, strict=False, keep=None, decide=None):
    """Plan one length of a symbolic capture (``planner.lengths``): in full, keeping the
    Selection in ``keep["selection"]``, or with ``decide(problem) -> Selection`` (the choices of
    an earlier length: ``lengths.forced``, which raises ``lengths.NotInBucket`` when one of them
    is not a candidate at this length)."""
    target = _prepared(target, None, precision, inputs)
    if decide is not None:
        return _plan(captured, inputs, target, precision, strict, decide)

    def decide(problem):
        from torchfl.planner.select import select

        sel = select(problem)
        if keep is not None:
            keep["selection"] = sel
        return sel
    return _plan(captured, inputs, target, precision, strict, decide)


@contextlib.contextmanager
def _gc_paused():
    """Planning allocates many short-lived tuples and dataclasses but creates no reference
    cycles worth collecting mid-plan; with torch and the captured graph in the heap, the full
    collections those allocations trigger cost about half of a warm ResNet-50 plan. Paused
    for the plan, restored after (a no-op when the caller already disabled it)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _plan_uncollected(captured, example_inputs, target, precision, strict, decide=None):
    from torchfl.planner import decompose   # repeat_kv -> GQA; ops a pack serves by a composition of others
    from torchfl.planner.build import assemble
    from torchfl.planner.candidates import Generator
    from torchfl.planner.constraints import check_graph, input_layouts
    from torchfl.planner.cost import Pricer
    from torchfl.planner.graph import build_ir, drop_unread_getitems
    from torchfl.planner.memory import check_weights
    from torchfl.planner.promote import promote_operands
    from torchfl.planner.plan import Capture
    from torchfl.planner.records import identity_layout
    from torchfl.planner.select import CoverProblem, SelectionError, select

    hcd, packs, chip = target.hcd, target.packs, target.model
    drop_unread_getitems(captured.graph_module)
    captured = decompose.fold_repeat_kv(captured)
    promote_operands(captured, precision)     # mixed-dtype elementwise operands: explicit casts
    if captured.extra.get("compiled"):
        from torchfl.planner.elide import elide_clones

        elide_clones(captured)
    ir = build_ir(captured, precision)
    check_graph(hcd, ir, precision, unbatched=frozenset(captured.extra.get("unbatched", ())))
    check_weights(ir, hcd, chip)     # weights that cannot fit: refused before candidates and the search
    pricer = Pricer.for_chip(chip)
    cands = Generator(ir, hcd, packs, chip, pricer).run()
    captured, ir, cands, decomposed = decompose.apply(captured, precision, target, ir, cands, pricer)
    if strict and cands.fallbacks:
        raise StrictFallbackError(hcd.chip.name, [Fallback(n, ir.nodes[n].op, why)
                                                  for n, why in cands.fallbacks.items()])
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
    problem = CoverProblem({n.name: n.inputs for n in ir.nodes.values()}, fixed, outputs, tuple(cands.options),
                      conv_cost)
    try:
        selection = (decide or select)(problem)
    except SelectionError as exc:   # the user's sentence: the node, its refusals, the fix
        from torchfl.planner.select_explain import no_cover

        raise no_cover(exc, ir, cands, hcd.chip.name) from None
    notes = [f"selection: {'exact' if selection.exact else 'beam-pruned (not proven optimal)'} dynamic "
             f"programming over {len(selection.order)} nodes, at most {selection.max_states} layout states"]
    notes += sorted(set(w for w in hcd.warnings for w in [str(w)]))
    notes += captured.extra.get("notes", [])
    for opt in selection.chosen:
        notes.extend(opt.payload.warnings)
    notes = list(dict.fromkeys(notes))
    capture = Capture(captured.graph_module, dict(captured.tensors), captured.training)
    plan = decompose.annotate(assemble(target, precision, ir, cands, selection, pricer, capture, layouts_in, notes),
                              decomposed)
    return with_memory(plan, hcd, chip)


def with_memory(plan, hcd, chip):
    """``plan`` with its memory plan; refused (MemoryLimitError) when its peak exceeds the
    chip's off-chip memory."""
    import dataclasses

    from torchfl.planner.memory import check_memory, plan_memory

    plan = dataclasses.replace(plan, memory=plan_memory(plan, chip.alignment, chip.memory_bytes))
    check_memory(plan, hcd)
    return plan
