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

Deterministic: every iteration order is fixed by names and positions, ties keep the first
candidate in the options' given order. Time O(nodes x options per node x states).
"""

from __future__ import annotations

import heapq
import math
from operator import itemgetter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable


INF = math.inf
RESERVED = "~"  # layout slot of a value reserved for an open fusion group (layouts are letters, "" is rank 0)


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


def _users(nodes: dict[str, tuple[str, ...]]) -> dict[str, list[str]]:
    users: dict[str, list[str]] = {}
    for name, inputs in nodes.items():
        for value in dict.fromkeys(inputs):
            users.setdefault(value, []).append(name)
    return users


def _lexicographic_order(succ: dict[str, list[str]]) -> list[str]:
    """The topological order of the DAG ``succ`` (node -> successors, every node a key) that
    always takes the smallest available name next: the order of networkx's
    ``lexicographical_topological_sort``, without building a DiGraph per plan."""
    indegree = dict.fromkeys(succ, 0)
    for users in succ.values():
        for u in users:
            indegree[u] += 1
    heap = [v for v, d in indegree.items() if d == 0]
    heapq.heapify(heap)
    order = []
    while heap:
        v = heapq.heappop(heap)
        order.append(v)
        for u in succ[v]:
            indegree[u] -= 1
            if indegree[u] == 0:
                heapq.heappush(heap, u)
    if len(order) != len(succ):
        raise SelectionError("the graph has a cycle")
    return order


def schedule(nodes: dict[str, tuple[str, ...]], outputs: Iterable[str] = (),
             prefer: set[tuple[str, str]] = frozenset()) -> list[str]:
    """A topological order of ``nodes`` in which chosen single-user paths are contiguous.

    A node joins the path of one input whose only user it is: an input edge listed in
    ``prefer`` (consecutive nodes of a fusion option) first, else its first such input.
    """
    succ: dict[str, list[str]] = {name: [] for name in nodes}  # distinct users, as a DiGraph's edges
    for name, inputs in nodes.items():
        for value in dict.fromkeys(inputs):
            if value in nodes:
                succ[value].append(name)
    escaping = set(outputs)
    head: dict[str, str] = {}
    paths: dict[str, list[str]] = {}
    for name in _lexicographic_order(succ):
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
    for h in _lexicographic_order(contracted):
        order.extend(paths[h])
    return order


def select(problem: CoverProblem, beam: int = 256) -> Selection:
    """Solve ``problem`` (module docstring: method, exactness, determinism)."""
    nodes = problem.nodes
    out_values = [v for v, _ in problem.outputs]
    prefer = {(o.nodes[k], o.nodes[k + 1]) for o in problem.options for k in range(len(o.nodes) - 1)}
    order = schedule(nodes, out_values, prefer)
    pos = {name: i for i, name in enumerate(order)}
    n = len(order)
    for name in order:
        for value in nodes[name]:
            if value not in nodes and value not in problem.input_layouts:
                raise SelectionError(f"node {name} reads {value!r}, which is neither a node nor a graph input")
    if n == 0:
        return Selection((), dict(problem.input_layouts), 0.0, (), True, 0)

    singles, segments, completes, groups_of = _classify(problem, order, pos)
    # a node strictly inside a fusion group contiguous in the schedule needs no option of its
    # own: the group's transition jumps from the node before its first member to its last
    # (a linear whose own rule is refused, fused with the gelu after it)
    spans: dict[int, list[int]] = {}
    for last, entries in segments.items():
        for start, _opt in entries:
            for q in range(start, last):
                spans.setdefault(q, []).append(start)
    live = _liveness(problem, order, pos, groups_of)
    live_index = [{v: k for k, v in enumerate(t)} for t in live]

    required_out: dict[str, list[str]] = {}
    for value, layout in problem.outputs:
        required_out.setdefault(value, []).append(layout)
    conv = problem.conv_cost
    conv_cache: dict[tuple[str, str, str], float] = {}

    def price(value: str, have: str, need: str) -> float:
        if have == need:
            return 0.0
        key = (value, have, need)
        c = conv_cache.get(key)
        if c is None:
            c = conv_cache[key] = conv(value, have, need)
        return c

    # a state is (layouts of live values, id of its reserved (node, group) pairs); RESERVED =
    # reserved value. The pairs are interned (``reservations[id]``, id 0 = none) so that a state
    # key hashes a few short strings and an int. A table maps a state to (cost, previous
    # state, option, previous position).
    State = tuple
    reservations: list[tuple] = [()]
    reservation_id: dict[tuple, int] = {(): 0}

    def intern(reserved: tuple) -> int:
        rid = reservation_id.get(reserved)
        if rid is None:
            rid = reservation_id[reserved] = len(reservations)
            reservations.append(reserved)
        return rid

    def real(state) -> tuple:
        """The state with its reserved pairs spelt out (the order ties are broken in)."""
        return (state[0], reservations[state[1]])

    prev_table: dict[State, tuple] = {((), 0): (0.0, None, None, None)}
    tables: list[dict[State, tuple]] = []
    exact = True
    max_states = 1
    start_table: dict[State, tuple] = {((), 0): (0.0, None, None, None)}
    rows_cache: dict[tuple[int, int], list] = {}

    def rows(src: int, dst: int):
        """(n, groups): the states at ``src`` grouped by reservation id (first seen first), each
        as (state, cost, its layouts, the layouts it keeps at ``dst``); a transition's new
        layouts are the kept ones followed by ``n`` times its output layout (the produced value,
        and inner members of the fusion group it completes that a reservation keeps live).
        Computed once per transition, not per option."""
        hit = rows_cache.get((src, dst))
        if hit is not None:
            return hit
        before = live_index[src] if src >= 0 else {}
        width = len(live[src]) if src >= 0 else 0
        idx = [before.get(v, width) for v in live[dst]]  # width -> produced by the transition
        kept = [i for i in idx if i < width]
        n_out = len(idx) - len(kept)
        # _liveness appends values in schedule order: those live at src precede the new ones
        assert idx[len(kept):] == [width] * n_out, (src, dst, idx)
        getter = itemgetter(*kept) if len(kept) > 1 else None
        groups: dict[int, list] = {}
        one = kept[0] if len(kept) == 1 else None
        for state, entry in (tables[src] if src >= 0 else start_table).items():
            layouts = state[0]
            proj = getter(layouts) if getter else ((layouts[one],) if kept else ())
            members = groups.get(state[1])
            if members is None:
                members = groups[state[1]] = []
            members.append((state, entry[0], layouts, proj))
        hit = rows_cache[(src, dst)] = (n_out, list(groups.items()))
        return hit

    reserved_names: dict[int, frozenset] = {0: frozenset()}  # reservation id -> the reserved nodes
    completed: dict[tuple, int | None] = {}  # (reservation id, pairs a group completes) -> id after it

    def after(reserved: int, read, need_pairs) -> int | None:
        """The reservation id a transition leaves (None: not allowed: it reads a reserved
        value, whose price is INF, or lacks a pair it completes)."""
        if reserved and read:
            names = reserved_names.get(reserved)
            if names is None:
                names = reserved_names[reserved] = frozenset(r[0] for r in reservations[reserved])
            if any(v in names for v in read):
                return None
        if not need_pairs:
            return reserved
        key = (reserved, need_pairs)
        if key not in completed:
            pairs = reservations[reserved]
            completed[key] = (intern(tuple(r for r in pairs if r not in need_pairs))
                              if all(pair in pairs for pair in need_pairs) else None)
        return completed[key]

    for p in range(n):
        name = order[p]
        before = live_index[p - 1] if p > 0 else {}
        cmap = tuple(before.get(v, -1) for v in live[p])
        table: dict[State, tuple[float, Any]] = {}

        def apply(opt: Option, need_pairs, src: int):
            before = live_index[src] if src >= 0 else {}
            produced = opt.nodes[-1]
            base = opt.cost
            for need in required_out.get(produced, ()):
                base += price(produced, opt.layout_out, need)
            dynamic = []
            for value, need in zip(opt.inputs, opt.layouts_in):
                if not value:
                    continue
                if value in before:
                    dynamic.append((before[value], value, need, {need: 0.0, RESERVED: INF}))
                else:
                    base += price(value, problem.input_layouts.get(value, need), need)
            if base == INF:
                return
            n_out, groups = rows(src, p)
            out = (opt.layout_out,) * n_out
            read = [d[1] for d in dynamic]
            get = table.get
            one = dynamic[0] if len(dynamic) == 1 else None
            for reserved, members in groups:
                reserved = after(reserved, read, need_pairs)
                if reserved is None:
                    continue
                if one is not None:  # the common case, unrolled: one input read from a live value
                    k, value, need, memo = one
                    for state, cost, layouts, proj in members:
                        have = layouts[k]
                        c = memo.get(have)
                        if c is None:
                            c = memo[have] = price(value, have, need)
                        total = cost + base + c
                        if total == INF:
                            continue
                        new = (proj + out, reserved)
                        old = get(new)
                        if old is None or total < old[0]:
                            table[new] = (total, state, opt, src)
                    continue
                for state, cost, layouts, proj in members:
                    total = cost + base
                    for k, value, need, memo in dynamic:
                        have = layouts[k]
                        c = memo.get(have)
                        if c is None:
                            c = memo[have] = price(value, have, need)
                        total += c
                    if total == INF:
                        continue
                    new = (proj + out, reserved)
                    old = get(new)
                    if old is None or total < old[0]:
                        table[new] = (total, state, opt, src)

        for opt in singles.get(p, ()):
            apply(opt, (), p - 1)
        for start, opt in segments.get(p, ()):
            apply(opt, (), start - 1)
        for opt in completes.get(p, ()):
            apply(opt, tuple(sorted((m, opt.nodes) for m in opt.nodes[:-1])), p - 1)
        for group in groups_of.get(p, ()):
            for state, entry in prev_table.items():
                cost = entry[0]
                layouts, reserved = state
                new = (tuple(layouts[k] if k >= 0 else RESERVED for k in cmap),
                       intern(tuple(sorted(reservations[reserved] + ((name, group),)))))
                old = table.get(new)
                if old is None or cost < old[0]:
                    table[new] = (cost, state, None, p - 1)
        if len(table) > max_states:
            max_states = len(table)
        if len(table) > beam:
            exact = False
            table = _beam_cut(table, beam, real)
        tables.append(table)
        prev_table = table
        for src in [k for k in rows_cache if k[1] == p]:
            del rows_cache[src]  # rows serve transitions into p only
        if not table and not any(start == 0 or tables[start - 1] for start in spans.get(p, ())):
            covering = tuple(o.key for o in problem.options if name in o.nodes)
            raise SelectionError(f"no feasible cover reaches node {name}: every option covering it "
                                 f"({', '.join(covering[:6]) or 'none'}) needs an impossible layout conversion, "
                                 "reads a value reserved for a fusion group, or follows a node no option reaches",
                                 node=name, options=covering)
    chosen, layouts, best = _backtrack(problem, tables, order, real)
    return Selection(tuple(chosen), layouts, best, tuple(order), exact, max_states)


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


def _liveness(problem: CoverProblem, order: list[str], pos: dict[str, int], groups_of) -> list[tuple[str, ...]]:
    """The values live after each schedule position (produced there or before, read after)."""
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
    for value, _ in problem.outputs:
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
