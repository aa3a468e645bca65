"""Fusion groups: where a rule pack's fusion patterns occur in a graph.

The pattern language (``fusions:`` in a pack, :class:`~torchfl.rules.pack.Fusion`) and the
search for it live together in the rules layer; the planner hands a :class:`GraphView`
over and prices the :class:`Group` objects it gets back (binding each with
:func:`torchfl.rules.matching.match_fusion`, which reads the group's orientation).

A pattern is a DAG of steps. The first step is the *root*; every other step is reached
from an earlier one: ``from:`` (the step reads that step's output ``output``, in its
argument ``input``, possibly through view-like ``through:`` ops) or ``into:`` (the step
*produces* argument ``input`` of that earlier step: a second operand, the weight's
dequantize feeding a conv). A group is one binding of every step to a distinct op node
such that

- each edge of the pattern is an edge of the graph, the value arriving in exactly one
  argument of its reader (a value in two arguments would hand the kernel an intermediate);
- every value computed inside the group, except the last step's (the group's output), is
  read only inside it, along the pattern's edges, and is not a graph output: the fused
  kernel never writes it;
- a ``commutative`` step may receive its producer in any of its commutative arguments.
  The group then records the swap (:attr:`Group.swaps`), and that one record is what both
  the search (which argument an ``into:`` step feeds) and the binding
  (:func:`oriented`) read: guards and binds always see the pattern's order.

A ``same:`` group names step arguments that must hold one and the same graph value (a
value read by several steps, which from:/into: edges alone cannot say: GELU-tanh's x feeds
its cube, its sum and its half); those reads count as edges of the group.

Fusions are indexed by their root op (:class:`FusionIndex`), so each fusion is tried only
at the nodes whose op can start it. Imports neither torch nor the planner.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping, Protocol, Sequence

from torchfl.rules.pack import Fusion, FusionStep, RulePack


class GraphView(Protocol):
    """What the group finder reads of a graph. Op nodes and values are named by strings."""

    def op_nodes(self) -> Sequence[str]:
        """The op nodes, in graph (topological) order."""

    def op(self, node: str) -> str:
        """The node's op (``aten.relu.default``)."""

    def outputs(self, node: str) -> Sequence[str]:
        """The node's values by output position (``""`` for an output nothing reads)."""

    def arg(self, node: str, index: int, name: str) -> str | None:
        """The value in positional argument ``index``, else keyword ``name``; None when that
        argument is absent or not a graph value."""

    def readers(self, value: str) -> Sequence[str]:
        """Every node that reads ``value`` (each once), op node or not (the graph output aside)."""

    def producer(self, value: str) -> str | None:
        """The op node that computes ``value`` (None for graph inputs and constants)."""

    def is_output(self, value: str) -> bool:
        """Is ``value`` returned by the graph?"""


@dataclass(frozen=True)
class Group:
    """One occurrence of a fusion pattern.

    ``steps``: (step id, node) in pattern order; ``nodes``: every op node covered (the
    ``through`` views included), in graph order, the group's output node last; ``swaps``:
    (step id, pattern argument, call argument) for each commutative step whose operands
    arrive swapped (both directions are implied)."""

    fusion: Fusion
    steps: tuple[tuple[str, str], ...]
    nodes: tuple[str, ...]
    swaps: tuple[tuple[str, str, str], ...] = ()

    @property
    def output(self) -> str:
        return self.nodes[-1]

    def node(self, step_id: str) -> str:
        return dict(self.steps)[step_id]


def call_arg(swaps, step_id: str, name: str) -> str:
    """The call's argument that holds the pattern's argument ``name`` of step ``step_id``."""
    for sid, a, b in swaps:
        if sid == step_id and name in (a, b):
            return b if name == a else a
    return name


def oriented(values: Mapping, step_id: str, swaps) -> dict:
    """A step's call values (argument name -> value) in the pattern's order."""
    out = dict(values)
    for sid, a, b in swaps:
        if sid == step_id:
            out[a], out[b] = values.get(b), values.get(a)
    return out


class FusionIndex:
    """The fusions of some rule packs, in pack and file order, by the ops of their root step."""

    def __init__(self, packs):
        packs = (packs,) if isinstance(packs, RulePack) else tuple(packs)
        self.fusions: tuple[Fusion, ...] = tuple(f for p in packs for f in p.fusions)
        self.root_ops = frozenset(op for f in self.fusions for op in f.steps[0].ops)

    def find(self, view: GraphView) -> list[Group]:
        """Every group of every fusion in ``view``: fusions in pack order, each at its root
        nodes in graph order."""
        order = tuple(view.op_nodes())
        position = {n: i for i, n in enumerate(order)}
        by_op: dict[str, list[int]] = {}
        for i, node in enumerate(order):
            op = view.op(node)
            if op in self.root_ops:
                by_op.setdefault(op, []).append(i)
        groups: list[Group] = []
        for fusion in self.fusions:
            ops = fusion.steps[0].ops
            roots = by_op.get(ops[0], []) if len(ops) == 1 else sorted(i for op in ops for i in by_op.get(op, ()))
            if roots:
                search = _Search(fusion, view, position)
                for i in roots:
                    groups.extend(search.groups(order[i]))
        return groups


def find_groups(packs, view: GraphView) -> list[Group]:
    """Every fusion group of ``packs`` in ``view`` (:meth:`FusionIndex.find`)."""
    return FusionIndex(packs).find(view)


class _Search:
    """Backtracking over the steps of one fusion from one root node."""

    def __init__(self, fusion: Fusion, view: GraphView, position: Mapping[str, int]):
        self.fusion, self.view, self.position = fusion, view, position
        self.step_of = {s.id: s for s in fusion.steps}
        self.sink = _sink(fusion)

    def groups(self, root: str) -> list[Group]:
        first = self.fusion.steps[0].id
        found, seen = [], set()
        for bound, through, edges, swaps in self._extend(1, {first: root}, [], [], ()):
            group = self._group(bound, through, edges, swaps)
            if group is not None and group.nodes not in seen:
                seen.add(group.nodes)
                found.append(group)
        return found

    def _extend(self, i, bound, through, edges, swaps) -> Iterator:
        if i == len(self.fusion.steps):
            yield dict(bound), list(through), list(edges), swaps
            return
        step = self.fusion.steps[i]
        taken = set(bound.values()) | set(through)
        options = self._operand(step, bound, swaps) if step.into else self._reader(step, bound)
        for node, via, new_edges, swap in options:
            if node in taken or taken.intersection(via):
                continue
            bound[step.id] = node
            yield from self._extend(i + 1, bound, through + via, edges + new_edges, swaps + swap)
            del bound[step.id]

    def _reader(self, step: FusionStep, bound) -> Iterator:
        """Nodes of a ``from:`` step: readers of its producer's output (through views)."""
        view = self.view
        outs = view.outputs(bound[step.from_])
        value = outs[step.output] if step.output < len(outs) else ""
        if not value:
            return
        stack = [(value, (), ())]
        while stack:
            value, via, edges = stack.pop()
            for reader in view.readers(value):
                op = view.op(reader) if reader in self.position else None
                if op in step.ops:
                    swap = self._arrival(step, reader, value)
                    if swap is not None:
                        yield reader, list(via), list(edges) + [(reader, value)], swap
                elif op in self.fusion.through:
                    viewed = view.outputs(reader)
                    if len(viewed) == 1 and viewed[0]:
                        stack.append((viewed[0], via + (reader,), edges + ((reader, value),)))

    def _arrival(self, step: FusionStep, reader: str, value: str):
        """() when ``value`` arrives in the step's ``input``, the swap when it arrives in
        another commutative argument, None otherwise (or in several arguments)."""
        names = self.fusion.rule_for(step.id).arg_names()
        fed = [n for i, n in enumerate(names) if self.view.arg(reader, i, n) == value]
        if len(fed) != 1:
            return None
        if fed[0] == step.input:
            return ()
        if step.input in step.commutative and fed[0] in step.commutative:
            return ((step.id, step.input, fed[0]),)
        return None

    def _operand(self, step: FusionStep, bound, swaps) -> Iterator:
        """The node of an ``into:`` step: the producer of the consumer's argument (as
        oriented by the consumer's swap)."""
        consumer = bound[step.into]
        names = self.fusion.rule_for(step.into).arg_names()
        name = call_arg(swaps, step.into, step.input)
        if name not in names:
            return
        value = self.view.arg(consumer, names.index(name), name)
        node = self.view.producer(value) if value else None
        if node is None or self.view.op(node) not in step.ops:
            return
        outs = self.view.outputs(node)
        if step.output < len(outs) and outs[step.output] == value:
            yield node, [], [(consumer, value)], ()

    def _group(self, bound, through, edges, swaps) -> Group | None:
        """The group, when its ``same:`` arguments hold one value each and no value computed
        inside it but its output escapes it."""
        view = self.view
        members = set(bound.values()) | set(through)
        out_node = bound[self.sink]
        allowed = set(edges)
        for refs in self.fusion.same:
            reads = [self._value_in(bound[sid], sid, arg, swaps) for sid, arg in refs]
            values = {v for _, v in reads}
            if len(values) != 1 or None in values:
                return None
            allowed.update(reads)        # the shared value's reads are edges of the group
        for node in members:
            if node == out_node:
                continue
            for value in view.outputs(node):
                if not value:
                    continue
                if view.is_output(value) or any((r, value) not in allowed for r in view.readers(value)):
                    return None
        nodes = sorted(members - {out_node}, key=self.position.__getitem__)
        steps = tuple((s.id, bound[s.id]) for s in self.fusion.steps)
        return Group(self.fusion, steps, tuple(nodes) + (out_node,), tuple(swaps))


    def _value_in(self, node: str, step_id: str, arg: str, swaps) -> tuple[str, str | None]:
        """(node, the graph value in the step's argument ``arg`` as the pattern orients it)."""
        names = self.fusion.rule_for(step_id).arg_names()
        name = call_arg(swaps, step_id, arg)
        return node, (self.view.arg(node, names.index(name), name) if name in names else None)


def pattern_ends(steps: Sequence[FusionStep]) -> list[str]:
    """The steps whose output no other step reads. A pattern has one (the group's output:
    a fused kernel writes one value); the pack compiler refuses any other count."""
    read = {s.from_ for s in steps} | {s.id for s in steps if s.into}
    return [s.id for s in steps if s.id not in read]


def _sink(fusion: Fusion) -> str:
    return pattern_ends(fusion.steps)[-1]


class FxGraphView:
    """A :class:`GraphView` of a torch.fx graph (read by duck typing: no torch import).

    Op nodes are its ``call_function`` nodes; a ``getitem`` of one is not a node but that
    node's output value at that position (tuple-returning ops: batch-norm, max-pool with
    indices). An ``_assert_*`` node nothing reads (``.to()``'s ``_assert_tensor_metadata``)
    is neither a node nor a reader: it moves no data and the planner drops it (planner/graph.py),
    so it cannot keep a value inside a group (LlamaRMSNorm's normalised value is one)."""

    def __init__(self, graph, ops: Mapping[str, str] | None = None):
        """``ops``: node name -> op string, when the caller has them already (``str`` of an
        ATen overload is slow); else read from the nodes' targets."""
        self._nodes: dict = {}
        self._outs: dict[str, list] = {}
        self._value: dict = {}      # value name -> FX node holding it
        self._producer: dict[str, str] = {}
        self._outputs: set[str] = set()
        self._dropped: set = set()
        for n in graph.nodes:
            if n.op == "output":
                self._outputs.update(_node_names(n.args))
            elif n.op == "call_function" and not n.users and str(n.target).startswith("aten._assert"):
                self._dropped.add(n.name)
            elif n.op != "call_function":
                self._value[n.name] = n
            elif n.target is operator.getitem and n.args[0].name in self._nodes and isinstance(n.args[1], int):
                src, idx = n.args[0].name, n.args[1]
                outs = self._outs[src]
                if outs == [src]:
                    outs.clear()
                outs.extend([""] * (idx + 1 - len(outs)))
                outs[idx] = n.name
                self._value[n.name] = n
                self._producer[n.name] = src
            else:
                self._nodes[n.name] = n
                self._outs[n.name] = [n.name]
                self._value[n.name] = n
                self._producer[n.name] = n.name
        self._order = tuple(self._nodes)
        self._ops = ops if ops is not None else {name: str(n.target) for name, n in self._nodes.items()}

    def op_nodes(self):
        return self._order

    def op(self, node):
        op = self._ops.get(node)
        return op if op is not None else str(self._nodes[node].target)

    def outputs(self, node):
        return self._outs[node]

    def arg(self, node, index, name):
        n = self._nodes[node]
        a = n.args[index] if index < len(n.args) else n.kwargs.get(name)
        return getattr(a, "name", None) if hasattr(a, "users") else None

    def readers(self, value):
        return [u.name for u in self._value[value].users if u.op != "output" and u.name not in self._dropped]

    def producer(self, value):
        return self._producer.get(value)

    def is_output(self, value):
        return value in self._outputs


def _node_names(args) -> Iterable[str]:
    stack = [args]
    while stack:
        a = stack.pop()
        if isinstance(a, (list, tuple)):
            stack.extend(a)
        elif isinstance(a, dict):
            stack.extend(a.values())
        elif hasattr(a, "users"):
            yield a.name


__all__ = ["FusionIndex", "FxGraphView", "GraphView", "Group", "call_arg", "find_groups", "oriented", "pattern_ends"]
