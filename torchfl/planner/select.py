"""Selection: the minimum-cost cover of a graph by kernel options and layouts.

The problem (independent of torch and of the kernels, so it can be tested on synthetic
costs): op nodes, each producing one value; graph inputs with fixed layouts; options,
each covering a chain of nodes (one node, or a fusion group whose inner values have no
other user) with required input layouts, an output layout and a cost; a price for
converting a value between layouts; required layouts for the graph outputs.
The objective is ``sum(option costs) + sum over every (consumer input, value) edge of
conv(value, its layout, the layout the consumer needs) + output conversions``.

Method (exact for chains *and* DAGs while the state count stays under ``beam``):

1. On the graph of the nodes (adjacency lists), contract every maximal *single-user path* (a node
   whose only user is the next one) and take the lexicographic topological order of the
   contracted graph, expanding each path in place. Every fusion group is a sub-path of
   such a path, so it is contiguous in this order (the contracted graph is acyclic: an
   edge can only leave a path at its last node).
2. Dynamic programming over that order: the state after node ``i`` is the layouts of the
   values *live* there (produced at or before ``i``, possibly read after it) plus the
   nodes *reserved* for a fusion group not yet completed. A transition into node ``i``
   applies a single-node option (from ``i-1``), or a fusion group contiguous in the
   schedule that ends at ``i`` (from the node before its first member: one transition,
   no reservation), or, for a group that is not contiguous (two single-user chains
   merging into one node), reserves ``i`` for it (no cost yet; its value's layout slot
   is ``RESERVED`` and nobody else may read it) or completes it at its last node (all
   its other members must be reserved).
   Graph inputs have fixed layouts and are not in the state; a state with open
   reservations at the end is infeasible. This is a shortest path through the layered
   DAG of (node, state) pairs; it is exact for any DAG because a future cost depends only
   on the layouts of live values and on the open reservations. On a chain the state is
   one layout; residual blocks and attention keep 2-4 live values. The schedule of step 1
   keeps fusion groups contiguous, so few reservations are open at once.
3. If more than ``beam`` states survive at a boundary, only the ``beam`` cheapest are kept
   (ties broken by the state key), and the result says it is no longer proven optimal.
4. Large graphs (``REPEAT_MIN_NODES``; ``repeat=``): ready names are taken in :func:`natural`
   order, so that N identical layers are scheduled alike; graph outputs leave the state after
   their last reader (their conversion is priced where they are made); and a stretch of
   identical blocks is searched only until one block's tables repeat the previous block's,
   the rest are those tables shifted (:mod:`torchfl.planner.cover_period`: exact up to float
   rounding; ``tests/planner/test_cover_period.py`` and ``tests/lm/test_repeat.py``). A LLaMA-2
   70B prefill (80 layers, 5957 nodes) searches 407 positions, 8 states each (was 512, beam-cut).

Deterministic: every iteration order is fixed by names and positions, ties keep the first
candidate in the options' given order. Time O(nodes x options per node x states).
"""

from __future__ import annotations

import heapq
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from torchfl.planner.cover import INF, RESERVED, Search  # noqa: F401 - INF and RESERVED: the problem's words too
from torchfl.planner.cover_period import Period, find, signatures


_DIGITS = re.compile(r"(\d+)")
REPEAT_MIN_NODES = 1000   # smaller graphs: searched whole, in plain name order (their plans as before)


class SelectionError(RuntimeError):
    """The options cannot cover the graph (a node has no option, or none is feasible).
    ``node``: the node the cover cannot pass (None when no one node is to blame), ``options``:
    the keys of the options that cover it; the planner turns both into a user's message
    (:func:`torchfl.planner.select_explain.no_cover`)."""

    def __init__(self, message: str, node: str | None = None, options: tuple = ()):
        super().__init__(message)
        self.node, self.options = node, tuple(options)


@dataclass(frozen=True)
class Option:
    """One way to compute a chain of nodes: kernel id, layouts and cost (``payload``: caller's)."""

    key: str
    nodes: tuple[str, ...]
    inputs: tuple[str, ...]
    layouts_in: tuple[str, ...]
    layout_out: str
    cost: float
    payload: Any = field(default=None, compare=False, hash=False, repr=False)


@dataclass(frozen=True)
class CoverProblem:
    """Nodes (name -> input value names), fixed input layouts, outputs, options, prices."""

    nodes: dict[str, tuple[str, ...]]
    input_layouts: dict[str, str]
    outputs: tuple[tuple[str, str], ...]  # (value, required layout)
    options: tuple[Option, ...]
    conv_cost: Callable[[str, str, str], float]


@dataclass(frozen=True)
class Selection:
    """The chosen options in execution order, each value's layout, the objective."""

    chosen: tuple[Option, ...]
    layouts: dict[str, str]
    cost: float
    order: tuple[str, ...]
    exact: bool
    max_states: int
    searched: int = 0   # positions whose tables were searched (fewer than ``order`` when blocks repeat)


def _users(nodes: dict[str, tuple[str, ...]]) -> dict[str, list[str]]:
    users: dict[str, list[str]] = {}
    for name, inputs in nodes.items():
        for value in dict.fromkeys(inputs):
            users.setdefault(value, []).append(name)
    return users


def natural(name: str) -> tuple:
    """``name`` with its digit runs as numbers (``slice_9`` before ``slice_11``): the order in
    which two identical layers, numbered on, list their nodes alike."""
    parts = _DIGITS.split(name)
    parts[1::2] = [int(x) for x in parts[1::2]]
    return (tuple(parts), name)


def _lexicographic_order(succ: dict[str, list[str]], key=None) -> list[str]:
    """The topological order of the DAG ``succ`` (node -> successors, every node a key) that
    always takes the smallest available name next: the order of networkx's
    ``lexicographical_topological_sort``, without building a DiGraph per plan (``key``: the
    names' sort key, e.g. :func:`natural`)."""
    key = key or (lambda v: v)
    indegree = dict.fromkeys(succ, 0)
    for users in succ.values():
        for u in users:
            indegree[u] += 1
    heap = [(key(v), v) for v, d in indegree.items() if d == 0]
    heapq.heapify(heap)
    order = []
    while heap:
        v = heapq.heappop(heap)[1]
        order.append(v)
        for u in succ[v]:
            indegree[u] -= 1
            if indegree[u] == 0:
                heapq.heappush(heap, (key(u), u))
    if len(order) != len(succ):
        raise SelectionError("the graph has a cycle")
    return order


def schedule(nodes: dict[str, tuple[str, ...]], outputs: Iterable[str] = (),
             prefer: set[tuple[str, str]] = frozenset(), key=None) -> list[str]:
    """A topological order of ``nodes`` in which chosen single-user paths are contiguous.

    A node joins the path of one input whose only user it is: an input edge listed in
    ``prefer`` (consecutive nodes of a fusion option) first, else its first such input.
    ``key``: the sort key of names where several are ready (plain string order by default).
    """
    succ: dict[str, list[str]] = {name: [] for name in nodes}  # distinct users, as a DiGraph's edges
    for name, inputs in nodes.items():
        for value in dict.fromkeys(inputs):
            if value in nodes:
                succ[value].append(name)
    escaping = set(outputs)
    head: dict[str, str] = {}
    paths: dict[str, list[str]] = {}
    for name in _lexicographic_order(succ, key):
        single = [p for p in dict.fromkeys(nodes[name])
                  if p in nodes and len(succ[p]) == 1 and p not in escaping
                  and paths[head[p]][-1] == p]
        join = next((p for p in single if (p, name) in prefer), single[0] if single else None)
        if join is not None:
            h = head[join]
        else:
            h = name
            paths[h] = []
        head[name] = h
        paths[h].append(name)
    contracted: dict[str, list[str]] = {h: [] for h in paths}
    seen = set()
    for u, users in succ.items():
        for v in users:
            edge = (head[u], head[v])
            if edge[0] != edge[1] and edge not in seen:
                seen.add(edge)
                contracted[edge[0]].append(edge[1])
    order: list[str] = []
    for h in _lexicographic_order(contracted, key):
        order.extend(paths[h])
    return order


def select(problem: CoverProblem, beam: int = 256, repeat: bool | None = None, skip: bool = True) -> Selection:
    """Solve ``problem`` (module docstring: method, exactness, determinism). ``repeat``: search
    a stretch of identical blocks until one block repeats the one before, in the schedule of
    :func:`natural` name order (step 4); None: for graphs of ``REPEAT_MIN_NODES`` nodes or more.
    ``skip=False`` searches the repeated blocks too (tests: the same selection)."""
    repeat = len(problem.nodes) >= REPEAT_MIN_NODES if repeat is None else repeat
    order = _checked_order(problem, natural if repeat else None)
    if not order:
        return Selection((), dict(problem.input_layouts), 0.0, (), True, 0)
    pos = {name: i for i, name in enumerate(order)}
    singles, segments, completes, groups_of = _classify(problem, order, pos)
    spans = _spans(segments)
    search = Search(problem, order, _liveness(problem, order, pos, groups_of, outputs=not repeat))
    found = find(signatures(search, singles, segments, completes, groups_of)) if repeat and skip else None
    period = Period(search, found, singles, segments, completes) if found else None
    exact, max_states, p, searched = True, 1, 0, 0
    while p < len(order):
        searched += 1
        table = search.step(p, singles, segments, completes, groups_of)
        max_states = max(max_states, len(table))
        if len(table) > beam:
            exact = False
            table = _beam_cut(table, beam, search.real)
        search.keep(p, table)
        if not table and not any(start == 0 or search.tables[start - 1] for start in spans.get(p, ())):
            raise _dead_end(problem, order[p])
        p = _next(period, p)
    chosen, layouts, best = _backtrack(problem, search.tables, order, search.real)
    return Selection(tuple(chosen), layouts, best, tuple(order), exact, max_states, searched)


def _next(period, p: int) -> int:
    """The position searched after ``p``: past the rest of a repeated stretch once ``p`` ends a
    block whose tables repeat the block before (:mod:`torchfl.planner.cover_period`)."""
    if period is None or p < period.start or (p - period.start + 1) % period.length:
        return p + 1
    j = (p - period.start + 1) // period.length - 1
    if not 1 <= j < period.blocks - 1:
        return p + 1
    delta = period.repeats(j)
    return p + 1 if delta is None else period.shift(j, delta)


def _dead_end(problem: CoverProblem, name: str) -> SelectionError:
    covering = tuple(o.key for o in problem.options if name in o.nodes)
    return SelectionError(f"no feasible cover reaches node {name}: every option covering it "
                          f"({', '.join(covering[:6]) or 'none'}) needs an impossible layout conversion, "
                          "reads a value reserved for a fusion group, or follows a node no option reaches",
                          node=name, options=covering)


def _checked_order(problem: CoverProblem, key=None) -> list[str]:
    """The schedule (step 1), fusion options' consecutive nodes preferred; a node reading a
    value that is neither a node nor a graph input is a SelectionError before any search."""
    nodes = problem.nodes
    prefer = {(o.nodes[k], o.nodes[k + 1]) for o in problem.options for k in range(len(o.nodes) - 1)}
    order = schedule(nodes, [v for v, _ in problem.outputs], prefer, key)
    for name in order:
        for value in nodes[name]:
            if value not in nodes and value not in problem.input_layouts:
                raise SelectionError(f"node {name} reads {value!r}, which is neither a node nor a graph input")
    return order


def _spans(segments) -> dict[int, list[int]]:
    """Position -> first positions of the contiguous fusion groups that span it: a node strictly
    inside such a group needs no option of its own (the group's transition jumps from the node
    before its first member to its last: a linear whose own rule is refused, fused with the
    gelu after it), so an empty table there is no dead end."""
    spans: dict[int, list[int]] = {}
    for last, entries in segments.items():
        for start, _opt in entries:
            for q in range(start, last):
                spans.setdefault(q, []).append(start)
    return spans


def _classify(problem: CoverProblem, order: list[str], pos: dict[str, int]):
    """The valid options by the schedule position of their last node: single nodes, fusion
    groups contiguous in the schedule (one transition), and the others (completed at their
    last node, their inner nodes reserved for them on the way); a node no option covers is
    a SelectionError."""
    # valid options: known nodes, inner values used only inside the group, not outputs
    users = _users(problem.nodes)
    singles: dict[int, list[Option]] = {}
    completes: dict[int, list[Option]] = {}  # fusion groups not contiguous in the schedule
    segments: dict[int, list[tuple[int, Option]]] = {}  # contiguous fusion groups: (first position, option)
    groups_of: dict[int, list[tuple[str, ...]]] = {}  # position -> groups it may be reserved for
    covered: set[str] = set()
    dominant: dict[tuple, Option] = {}
    outs = {v for v, _ in problem.outputs}
    _check_options(problem.options, pos)
    for opt in problem.options:
        inner = opt.nodes[:-1]
        last = pos[opt.nodes[-1]]
        if inner and (any(u not in opt.nodes for x in inner for u in users.get(x, ())) or set(inner) & outs
                      or len(set(opt.nodes)) != len(opt.nodes) or any(pos[x] > last for x in inner)):
            continue  # (a single node, most options, passes these checks by construction)
        covered.update(opt.nodes)
        shape_key = (opt.nodes, opt.inputs, opt.layouts_in, opt.layout_out)
        kept = dominant.get(shape_key)
        if kept is not None and kept.cost <= opt.cost:
            continue  # same transition, not cheaper: can never be chosen (ties keep the first)
        dominant[shape_key] = opt
        if not inner:
            singles.setdefault(last, []).append(opt)
            continue
        start = pos[opt.nodes[0]]
        if [pos[x] for x in opt.nodes] == list(range(start, last + 1)):
            segments.setdefault(last, []).append((start, opt))  # contiguous: one transition, no reservation
            continue
        completes.setdefault(last, []).append(opt)
        for x in inner:
            lst = groups_of.setdefault(pos[x], [])
            if opt.nodes not in lst:
                lst.append(opt.nodes)
    missing = [x for x in order if x not in covered]
    if missing:
        raise SelectionError(f"no kernel option covers node(s) {', '.join(missing[:10])}", node=missing[0],
                             options=tuple(o.key for o in problem.options if missing[0] in o.nodes))
    return singles, segments, completes, groups_of


def _check_options(options, pos) -> None:
    """A SelectionError for the first option that covers an unknown node or whose inputs and
    layouts_in are not equally long tuples of names (checked in bulk first: the common case
    is that all are well formed)."""
    if (all(x in pos for o in options for x in o.nodes) and all(len(o.inputs) == len(o.layouts_in) for o in options)
            and {type(v) for o in options for v in o.inputs} <= {str}):
        return
    for opt in options:
        if any(x not in pos for x in opt.nodes):
            raise SelectionError(f"option {opt.key} covers unknown node(s) {opt.nodes}")
        if len(opt.inputs) != len(opt.layouts_in) or not all(isinstance(v, str) for v in opt.inputs):
            raise SelectionError(f"option {opt.key}: inputs {opt.inputs!r} and layouts_in {opt.layouts_in!r} "
                                 "must be equally long tuples of value names / layouts")


def _beam_cut(table: dict, beam: int, real) -> dict:
    """The ``beam`` cheapest states of ``table`` in (cost, real state) order: the ones
    cheaper than the ``beam``-th cost, then the ties at it by state; only those are ranked
    by their spelt-out state (the costly part of the sort key)."""
    cut = sorted([v[0] for v in table.values()])[beam - 1]
    kept = [kv for kv in table.items() if kv[1][0] < cut]
    ties = sorted((kv for kv in table.items() if kv[1][0] == cut), key=lambda kv: real(kv[0]))
    kept.extend(ties[:beam - len(kept)])
    kept.sort(key=lambda kv: (kv[1][0], real(kv[0])))
    return dict(kept)


def _liveness(problem: CoverProblem, order: list[str], pos: dict[str, int], groups_of,
              outputs: bool = True) -> list[tuple[str, ...]]:
    """The values live after each schedule position (produced there or before, read after;
    ``outputs``: graph outputs to the end. Not needed: a transition prices its output's
    conversion to the required layout when it makes it, so an output no node reads adds states
    that differ in nothing ahead: every layer's cache outputs would widen each later state)."""
    nodes, n = problem.nodes, len(order)
    # a value read by a member of a group may be read as late as the group's last node
    late = {x: pos[x] for x in order}
    for p_, groups in groups_of.items():
        for g in groups:
            late[order[p_]] = max(late[order[p_]], pos[g[-1]])
    last_use: dict[str, int] = {}
    for name in order:
        for value in nodes[name]:
            if value in nodes:
                last_use[value] = max(last_use.get(value, -1), late[name])
    for value, _ in problem.outputs if outputs else ():
        if value in nodes:
            last_use[value] = n
    live: list[tuple[str, ...]] = []
    current: list[str] = []
    for i, name in enumerate(order):
        current = [v for v in current if last_use.get(v, -1) > i]
        if last_use.get(name, -1) > i:
            current.append(name)
        live.append(tuple(current))
    return live


def _backtrack(problem: CoverProblem, tables, order, real) -> tuple[list[Option], dict[str, str], float]:
    """The cheapest final state with no open reservation (id 0), walked back to the chosen
    options; ``real(state)`` spells a state's reservations out for the tie order."""
    n = len(order)
    finals = [(k, v) for k, v in tables[-1].items() if not k[1]]
    if not finals:
        raise SelectionError("no feasible cover: a fusion group could not be completed")
    final_state, (best, *_b) = min(finals, key=lambda kv: (kv[1][0], real(kv[0])))
    chosen: list[Option] = []
    state, p = final_state, n - 1
    while p >= 0:
        _cost, prev_state, opt, src = tables[p][state]
        if opt is not None:
            chosen.append(opt)
        state, p = prev_state, src
    chosen.reverse()
    layouts = dict(problem.input_layouts)
    for opt in chosen:
        layouts[opt.nodes[-1]] = opt.layout_out
    return chosen, layouts, best
