"""One case on one chip: ``torch.compile(backend="torchfl", strict)`` against eager torch.

Each case is compiled afresh (``torch._dynamo.reset()``: Dynamo would otherwise stop
recompiling one function after a few shapes and run it eagerly, without a word) with
``fullgraph=True`` (no graph break runs part of it in torch) and ``strict=True`` (no op
falls back to the CPU). What the compiled call did is read from the plans the backend
reports (``runtime.backend.recording``), so a case counts only when its graph really ran
on the chip, and only for the ATen overloads that graph contained.

Outcomes: ``pass`` (within the dtype's tolerance, ``compare.py``), ``fail`` (a wrong value,
shape or dtype, an error, or a fallback that got through), ``refused`` (a hard constraint or
strict mode refused it before anything ran; the reason names the HCD field or the rule),
``skipped`` (eager torch rejects the inputs, or no graph reached the chip: not counted).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Outcome:
    case: str
    variant: str
    layout: str
    status: str                      # pass | fail | refused | skipped
    ops: tuple = ()                  # ATen overloads the case's graph contained
    reason: str | None = None        # refusal reason, failure detail or skip reason
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    inputs: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return dict(case=self.case, variant=self.variant, layout=self.layout, status=self.status, ops=list(self.ops),
                    reason=self.reason, max_abs_error=self.max_abs_error, max_rel_error=self.max_rel_error,
                    inputs=self.inputs)




def is_refusal(exc) -> bool:
    from torchfl.planner.errors import PlanError
    from torchfl.runtime.errors import FallbackNotAllowed

    return isinstance(exc, (PlanError, FallbackNotAllowed))


def _untraceable(exc) -> bool:
    """Dynamo refused the sample's Python (not torchfl, not the chip): nothing was tested."""
    import torch._dynamo.exc as dynamo_exc

    return isinstance(exc, dynamo_exc.Unsupported)


def refusal_reason(exc) -> str:
    """The refusal's message, with the HCD field a hard constraint names (``.field``)."""
    text = first_lines(exc)
    field = getattr(exc, "field", None)
    if field is None and type(exc).__name__ == "UnsupportedAttention":
        field = "compute_units.attention.supported_heads"
    return f"{text} [HCD field: {field}]" if field and field not in text else text


def first_lines(text: str, n: int = 6, width: int = 400) -> str:
    lines = [ln for ln in str(text).strip().splitlines() if ln.strip()][:n]
    out = "\n".join(lines)
    return out if len(out) <= width else out[: width - 3] + "..."


def _exact(case):
    """Eager torch in float64 on the same (already rounded) floating inputs, or None."""
    import torch
    import torch.utils._pytree as pytree

    if not any(t.is_floating_point() and t.dtype != torch.float64 for t in case.leaves()):
        return None
    up = pytree.tree_map(lambda x: x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x,
                         (case.args, case.kwargs))
    try:
        with torch.no_grad():
            out = case.func(*up[0], **up[1])
    except Exception:  # noqa: BLE001 - any op may lack a float64 kernel or refuse mixed dtypes: eager alone decides
        return None
    return out


def graph_ops(case) -> tuple:
    """The core-ATen overloads of the case's graph, as the planner captures it ("" on failure)."""
    import torch

    from torchfl.planner.capture import capture_module

    fn, leaves = case.as_function()

    class Call(torch.nn.Module):
        def forward(self, *xs):
            return fn(*xs)

    try:
        captured = capture_module(Call(), tuple(leaves))
    except Exception:  # noqa: BLE001 - a label for a case already failed or refused, whose own error is reported
        return ()
    return tuple(sorted({str(n.target) for n in captured.graph_module.graph.nodes if n.op == "call_function"}))


def graph_ops_many(prepared) -> list:
    """:func:`graph_ops` of each case, from one capture of them all (a capture per case was 40%
    of a max_pool2d slice's CPU: EDGE-C2 refuses its channels-last samples, each labelled by its
    own capture). A case's overloads are the ops its outputs are computed from; where the joint
    graph does not split into one part per case (an op shared by two cases' outputs, or one no
    output reads, or outputs that are not all tensors), each case gets its own capture."""
    import torch
    import torch.utils._pytree as pytree

    from torchfl.planner.capture import capture_module

    counts = []
    for p in prepared:
        leaves = pytree.tree_leaves(p.expected)
        if p.expected is None or not all(isinstance(x, torch.Tensor) for x in leaves):
            return [graph_ops(p.case) for p in prepared]
        counts.append(len(leaves))
    if len(prepared) < 2:
        return [graph_ops(p.case) for p in prepared]
    fns, leaves, n_in = [], [], []
    for p in prepared:
        fn, lv = p.case.as_function()
        fns.append(fn)
        leaves.extend(lv)
        n_in.append(len(lv))

    class Joint(torch.nn.Module):
        def forward(self, *xs):
            out, at = [], 0
            for fn, n in zip(fns, n_in):
                out.append(fn(*xs[at:at + n]))
                at += n
            return tuple(out)

    try:
        captured = capture_module(Joint(), tuple(leaves))
    except Exception:  # noqa: BLE001 - one case that does not capture: each on its own, as graph_ops does
        return [graph_ops(p.case) for p in prepared]
    split = _ops_per_part(captured, counts)
    return split if split is not None else [graph_ops(p.case) for p in prepared]


def _ops_per_part(captured, counts):
    """Sorted call_function targets behind each part's outputs (``counts`` outputs per part, in
    order), or None where the graph does not split into parts (:func:`_owners`)."""
    owner = _owners(captured, counts)
    if owner is None:
        return None
    nodes = {n.name: n for n in captured.graph_module.graph.nodes}
    ops = [set() for _ in counts]
    for name, part in owner.items():
        ops[part].add(str(nodes[name].target))
    return [tuple(sorted(o)) for o in ops]


def _owners(captured, counts) -> dict | None:
    """Node name -> the part (case) whose outputs it computes, for every call_function node of
    ``captured`` (a joint graph, ``counts`` outputs per part in order); None where a node belongs
    to no part or to two, or the outputs are not one tensor each."""
    if captured is None or counts is None or len(captured.outputs) != sum(counts) or \
            any(name is None for name in captured.outputs):
        return None
    nodes = {n.name: n for n in captured.graph_module.graph.nodes}
    if any(name not in nodes for name in captured.outputs):
        return None
    owner: dict = {}
    at = 0
    for part, n in enumerate(counts):
        stack = [nodes[name] for name in captured.outputs[at:at + n]]
        at += n
        while stack:
            node = stack.pop()
            if node.op != "call_function":
                continue
            if owner.setdefault(node.name, part) != part:
                return None
            stack.extend(node.all_input_nodes)
    if any(n.name not in owner for n in captured.graph_module.graph.nodes if n.op == "call_function"):
        return None
    return owner


class Prepared:
    """A case with eager torch's answers: in its dtype, in float64, and the ATen ops it dispatched."""

    def __init__(self, case):
        self.case = case
        self.layout = case.layout()
        self.inputs = case.describe()
        self.expected = self.exact = None
        self.eager_ops: frozenset = frozenset()
        self.skip: str | None = None

    def outcome(self, status, **kw) -> Outcome:
        return Outcome(self.case.label, self.case.variant, self.layout, status, inputs=self.inputs, **kw)


def prepare(case) -> Prepared:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpLog(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.add(str(func))
            return func(*args, **(kwargs or {}))

    p = Prepared(case)
    log = OpLog()
    try:
        with torch.no_grad(), log:
            p.expected = case.call()
    except Exception as exc:  # noqa: BLE001 - eager torch refuses a sample with any of its types: the case is skipped
        p.skip = f"eager torch rejects it: {type(exc).__name__}: {first_lines(exc, 1)}"
        return p
    p.eager_ops = frozenset(log.ops)
    p.exact = _exact(case)
    return p


def _plan_ops(plans) -> set:
    return {op for p in plans for s in p.steps for op in s.ops} | {f.op for p in plans for f in p.folded}


def judge(p: Prepared, got, ops, bf16_emulated) -> Outcome:
    from torchfl.conformance.compare import compare

    result = compare(got, p.expected, p.exact, bf16_emulated=bf16_emulated)
    if not result.ok:
        return p.outcome("fail", ops=ops, reason=result.detail, max_abs_error=result.max_abs_error,
                         max_rel_error=result.max_rel_error)
    return p.outcome("pass", ops=ops, max_abs_error=result.max_abs_error, max_rel_error=result.max_rel_error)


def run_case(case, *, chip, registry=None, bf16_emulated: bool = False, prepared: Prepared | None = None) -> Outcome:
    """Run ``case`` on ``chip`` (name or HCD) strictly, compare with eager torch."""
    p = prepared or prepare(case)
    if p.skip:
        return p.outcome("skipped", reason=p.skip)
    out: dict = {chip: {}}
    _run_single(p, 0, out, {chip: Chip((), bf16_emulated)}, registry)
    return out[chip][0]


@dataclass(frozen=True)
class Chip:
    """What a batch needs of one chip under test: the claimed overloads it checks, and how
    its bfloat16 is compared."""

    targets: tuple = ()
    bf16_emulated: bool = False


def _single_outcome(p: Prepared, got, plans, exc, bf16_emulated, graph_ops_of) -> Outcome:
    """One case's outcome from its own compiled call on one chip."""
    if exc is not None:
        if is_refusal(exc):
            return p.outcome("refused", ops=graph_ops_of(), reason=refusal_reason(exc))
        if _untraceable(exc):
            return p.outcome("skipped", reason=f"Dynamo cannot trace this OpInfo sample's function: "
                                               f"{first_lines(exc, 1)}")
        return p.outcome("fail", ops=graph_ops_of(), reason=f"error: {type(exc).__name__}: {first_lines(exc, 3)}")
    if not plans:
        return p.outcome("skipped", reason="no graph reached the chip (Dynamo compiled nothing to run)")
    ops = tuple(sorted(_plan_ops(plans)))
    fellback = [f for pl in plans for f in pl.fallbacks]
    if fellback:
        return p.outcome("fail", ops=ops, reason="fell back to the CPU despite strict: " + ", ".join(
            f"{f.op} ({f.reason})" for f in fellback))
    return judge(p, got, ops, bf16_emulated)


def _run_single(p: Prepared, i: int, out: dict, chips: dict, registry, label: tuple | None = None) -> None:
    """Case ``i`` alone, compiled once for every chip in ``chips``; its outcome per chip into ``out``
    (``label``: its :func:`graph_ops` where known already)."""
    from torchfl.conformance.shared import GroupCompile

    fn, leaves = p.case.as_function()
    group = GroupCompile(fn, leaves, registry)
    ops: list = [] if label is None else [label]

    def graph_ops_of():   # chip-independent: captured once, for the first chip that needs it
        if not ops:
            ops.append(graph_ops(p.case))
        return ops[0]

    for chip, c in chips.items():
        got, plans, exc = group.run(chip)
        out[chip][i] = _single_outcome(p, got, plans, exc, c.bf16_emulated, graph_ops_of)


#: composite ops the planner keeps whole (``planner.capture.KEEP_OPS``): eager dispatch never
#: shows them, so a batch attributes them to every case of the OpInfo that maps to them
def _kept_whole() -> frozenset:
    from torchfl.planner.capture import KEEP_OPS

    return frozenset(f"aten.{name}" for name in KEEP_OPS)


def run_cases(cases, *, chip, registry=None, bf16_emulated: bool = False, targets=()) -> list[Outcome]:
    """Every case of one OpInfo and dtype on ``chip`` (:func:`run_cases_on`, one chip)."""
    return run_cases_on(cases, {chip: Chip(tuple(targets), bf16_emulated)}, registry)[chip]


def run_cases_on(cases, chips: dict, registry=None, first: int = 0) -> dict[str, list[Outcome]]:
    """Every case of one OpInfo and dtype on every chip of ``chips`` (name -> :class:`Chip`):
    compiled together as one graph where a chip takes them all (one capture instead of one per
    case), else, for the chips that refused, the cases whose ops they refused run alone and the
    rest as one graph again (halves where the refusal names no op of a case). Eager torch's
    answers are computed once, and each graph is traced and captured once for all the chips
    (``shared.py``); planning, running and judging are each chip's.

    In a joint graph each case counts for the chip's ``targets`` that (a) the joint plan ran on
    the chip and (b) the case itself dispatched in eager torch (or, for the composites the
    planner keeps whole, that its OpInfo maps to); a single case counts for what its own plan ran.

    ``first``: the index of ``cases[0]`` among its OpInfo's cases (a run across chips hands a
    worker one slice of a large OpInfo): the joint graphs are the cases of one block of
    :data:`JOINT_MAX` indices, so a slice starting at a multiple of it makes the same graphs."""
    prepared = [prepare(c) for c in cases]
    out: dict = {chip: {} for chip in chips}
    live = []
    for i, p in enumerate(prepared):
        if p.skip:
            for chip in chips:
                out[chip][i] = p.outcome("skipped", reason=p.skip)
        else:
            live.append(i)
    blocks: dict = {}
    for i in live:   # --samples all: max_pool2d has 1,444 samples
        blocks.setdefault((first + i) // JOINT_MAX, []).append(i)
    for block in blocks.values():
        _run_group(block, prepared, out, dict(chips), registry)
    return {chip: [out[chip][i] for i in range(len(cases))] for chip in chips}


#: cases compiled together in one joint graph at most (planning time grows with the graph)
JOINT_MAX = 48


def _run_group(idx, prepared, out, chips: dict, registry) -> None:
    if not idx or not chips:
        return
    if len(idx) == 1:
        _run_single(prepared[idx[0]], idx[0], out, chips, registry)
        return
    by_early: dict = {}
    for chip, c in chips.items():
        by_early.setdefault(_early_refusals(idx, prepared, chip, registry), {})[chip] = c
    if any(by_early):
        # a case whose inputs alone a chip refuses (a channels-last variant on an NCWH chip) would
        # refuse the joint graph and split it in halves down to that case: ~2 log2(n) traces and
        # captures; it runs alone at once, and the rest stays one graph
        alone = sorted(set().union(*by_early))
        labels = dict(zip(alone, graph_ops_many([prepared[i] for i in alone])))
        for early, group in by_early.items():
            for i in sorted(early):
                _run_single(prepared[i], i, out, group, registry, labels[i])
            _run_group([i for i in idx if i not in early], prepared, out, group, registry)
        return
    _run_joint(idx, prepared, out, chips, registry)


def _early_refusals(idx, prepared, chip, registry) -> frozenset:
    """The cases of ``idx`` that ``chip`` refuses on their inputs' layouts alone, before any
    capture (``ChipGraph._plan``'s first check): as a single case, each is refused the same way."""
    from torchfl.planner.constraints import input_layouts
    from torchfl.planner.target import resolve_target

    layouts = resolve_target(chip, registry).hcd.layouts
    return frozenset(i for i in idx if any(lay and lay not in layouts for lay in input_layouts(prepared[i].case.leaves())))


def _run_joint(idx, prepared, out, chips: dict, registry) -> None:
    """The cases of ``idx`` as one graph for every chip; a chip that refuses it runs the refused cases alone (:func:`_refused_nodes`)."""
    from torchfl.conformance.shared import GroupCompile

    fns, leaves, counts = [], [], []
    for i in idx:
        fn, lv = prepared[i].case.as_function()
        fns.append(fn)
        leaves.extend(lv)
        counts.append(len(lv))

    def joint(*tensors):
        results, at = [], 0
        for fn, n in zip(fns, counts):
            results.append(fn(*tensors[at:at + n]))
            at += n
        return tuple(results)

    group = GroupCompile(joint, leaves, registry)
    refused = {}
    for chip, c in chips.items():
        got, plans, exc = group.run(chip)
        if exc is not None or any(pl.fallbacks for pl in plans):
            refused[chip] = (c, _refused_nodes(exc, plans))
            continue
        _judge_joint(idx, prepared, out[chip], got, _plan_ops(plans), c)
    owners = _owners(group.captured, _output_counts(idx, prepared)) if refused else None
    del group
    by_culprits: dict = {}
    for chip, (c, nodes) in refused.items():
        parts = {owners.get(n) for n in nodes} if owners and nodes else {None}
        key = None if None in parts else frozenset(idx[k] for k in parts)
        by_culprits.setdefault(key, {})[chip] = c
    for culprits, group_chips in by_culprits.items():
        if culprits is None:   # the refusal names no op of one case: halves, down to the cases refused
            half = len(idx) // 2
            _run_group(idx[:half], prepared, out, group_chips, registry)
            _run_group(idx[half:], prepared, out, group_chips, registry)
            continue
        # the ops the chip refused belong to these cases (max_pool2d's 3-D samples: a whole graph
        # of them): each alone, the rest one graph again (was: halves down to each of them, 2n-1
        # traces and captures for a graph refused whole)
        alone = sorted(culprits)
        labels = dict(zip(alone, graph_ops_many([prepared[i] for i in alone])))
        for i in alone:
            _run_single(prepared[i], i, out, group_chips, registry, labels[i])
        _run_group([i for i in idx if i not in culprits], prepared, out, group_chips, registry)


def _refused_nodes(exc, plans) -> tuple:
    """The graph nodes a refusal names: a strict refusal's fallbacks, a constraint's node; () if none."""
    fallbacks = [f for pl in plans for f in pl.fallbacks] if exc is None else list(getattr(exc, "fallbacks", ()))
    if fallbacks:
        return tuple(str(f.node) for f in fallbacks)
    node = getattr(exc, "node", None)
    return (str(node),) if isinstance(node, str) else ()


def _output_counts(idx, prepared):
    """Tensor outputs of each case (eager torch's), or None where one returns something else."""
    import torch
    import torch.utils._pytree as pytree

    counts = []
    for i in idx:
        leaves = pytree.tree_leaves(prepared[i].expected)
        if prepared[i].expected is None or not all(isinstance(x, torch.Tensor) for x in leaves):
            return None
        counts.append(len(leaves))
    return counts


def _judge_joint(idx, prepared, out: dict, got, ran: set, chip: Chip) -> None:
    kept = _kept_whole()
    targets = chip.targets
    for k, i in enumerate(idx):
        p = prepared[i]
        ops = tuple(sorted(t for t in targets if t in ran and (t in p.eager_ops or t in kept)))
        if not ops and len([t for t in targets if t in ran]) == 1:
            ops = tuple(t for t in targets if t in ran)   # capture turned its overload into this one
        if not ops:
            out[i] = p.outcome("skipped", reason="none of the overloads under test reached the chip for this case")
            continue
        out[i] = judge(p, got[k], ops, chip.bf16_emulated)
