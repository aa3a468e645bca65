"""The dynamic programme of :func:`torchfl.planner.select.select` (its step 2): the layered
tables of states over the schedule and the transitions into each position.

A state is ``(layouts of the live values, id of its reserved (node, group) pairs)``; the
pairs are interned (``reservations[id]``, id 0 = none) so that a state key hashes a few short
strings and an int. A table maps a state to ``(cost, previous state, option, previous
position)``. Kept apart from ``select.py`` (the problem, the schedule, the cover) because
this is the hot loop: its transitions bind what they read to locals once per option.
"""

from __future__ import annotations

import math
from operator import itemgetter
from typing import Any

INF = math.inf
RESERVED = "~"  # layout slot of a value reserved for an open fusion group (layouts are letters, "" is rank 0)
START = {((), 0): (0.0, None, None, None)}   # the table before the first node: nothing live, nothing reserved


class Search:
    """The tables of one selection: ``step(p, ...)`` builds position ``p``'s, ``keep`` stores it
    (after the beam cut), ``tables`` are the kept ones; ``real`` spells a state out."""

    def __init__(self, problem, order: list[str], live: list[tuple[str, ...]]):
        self.problem, self.order, self.live = problem, order, live
        self.pos = {name: i for i, name in enumerate(order)}
        self.spelt: dict[int, tuple] = {0: ()}    # reservation id -> its pairs as positions (real)
        self.live_index = [{v: k for k, v in enumerate(t)} for t in live]
        self.required_out: dict[str, list[str]] = {}
        for value, layout in problem.outputs:
            self.required_out.setdefault(value, []).append(layout)
        self.conv_cache: dict[tuple[str, str, str], float] = {}
        self.reservations: list[tuple] = [()]
        self.reservation_id: dict[tuple, int] = {(): 0}
        self.reserved_names: dict[int, frozenset] = {0: frozenset()}  # reservation id -> the reserved nodes
        self.completed: dict[tuple, int | None] = {}  # (reservation id, pairs a group completes) -> id after it
        self.rows_cache: dict[tuple[int, int], list] = {}
        self.tables: list[dict[tuple, tuple]] = []

    def price(self, value: str, have: str, need: str) -> float:
        """The conversion price of ``value`` from ``have`` to ``need``, asked once per triple."""
        if have == need:
            return 0.0
        key = (value, have, need)
        c = self.conv_cache.get(key)
        if c is None:
            c = self.conv_cache[key] = self.problem.conv_cost(value, have, need)
        return c

    def intern(self, reserved: tuple) -> int:
        """The id of a set of reserved pairs (a state key carries the int, not the pairs)."""
        rid = self.reservation_id.get(reserved)
        if rid is None:
            rid = self.reservation_id[reserved] = len(self.reservations)
            self.reservations.append(reserved)
        return rid

    def real(self, state) -> tuple:
        """The state with its reserved pairs spelt out as schedule positions: the order ties are
        broken in, the same for two identical layers (names would order them differently)."""
        spelt = self.spelt.get(state[1])
        if spelt is None:
            pos = self.pos
            spelt = self.spelt[state[1]] = tuple(sorted((pos[n], tuple(pos[x] for x in g))
                                                        for n, g in self.reservations[state[1]]))
        return (state[0], spelt)

    def rows(self, src: int, dst: int):
        """(n, groups): the states at ``src`` grouped by reservation id (first seen first), each
        as (state, cost, its layouts, the layouts it keeps at ``dst``); a transition's new
        layouts are the kept ones followed by ``n`` times its output layout (the produced value,
        and inner members of the fusion group it completes that a reservation keeps live).
        Computed once per transition, not per option."""
        hit = self.rows_cache.get((src, dst))
        if hit is not None:
            return hit
        live, live_index = self.live, self.live_index
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
        for state, entry in (self.tables[src] if src >= 0 else START).items():
            layouts = state[0]
            proj = getter(layouts) if getter else ((layouts[one],) if kept else ())
            members = groups.get(state[1])
            if members is None:
                members = groups[state[1]] = []
            members.append((state, entry[0], layouts, proj))
        hit = self.rows_cache[(src, dst)] = (n_out, list(groups.items()))
        return hit

    def after(self, reserved: int, read, need_pairs) -> int | None:
        """The reservation id a transition leaves (None: not allowed: it reads a reserved
        value, whose price is INF, or lacks a pair it completes)."""
        if reserved and read:
            names = self.reserved_names.get(reserved)
            if names is None:
                names = self.reserved_names[reserved] = frozenset(r[0] for r in self.reservations[reserved])
            if any(v in names for v in read):
                return None
        if not need_pairs:
            return reserved
        key = (reserved, need_pairs)
        completed = self.completed
        if key not in completed:
            pairs = self.reservations[reserved]
            completed[key] = (self.intern(tuple(r for r in pairs if r not in need_pairs))
                              if all(pair in pairs for pair in need_pairs) else None)
        return completed[key]

    def apply(self, table: dict, p: int, opt, need_pairs, src: int) -> None:
        """Every state ``opt`` reaches at ``p`` from the states at ``src``, into ``table``."""
        before = self.live_index[src] if src >= 0 else {}
        price, input_layouts = self.price, self.problem.input_layouts
        produced = opt.nodes[-1]
        base = opt.cost
        for need in self.required_out.get(produced, ()):
            base += price(produced, opt.layout_out, need)
        dynamic = []
        for value, need in zip(opt.inputs, opt.layouts_in):
            if not value:
                continue
            if value in before:
                dynamic.append((before[value], value, need, {need: 0.0, RESERVED: INF}))
            else:
                base += price(value, input_layouts.get(value, need), need)
        if base == INF:
            return
        n_out, groups = self.rows(src, p)
        out = (opt.layout_out,) * n_out
        read = [d[1] for d in dynamic]
        get = table.get
        after = self.after
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

    def reserve(self, table: dict, p: int, group: tuple) -> None:
        """The states that reserve node ``p`` for the open fusion ``group`` (no cost yet; its
        value's layout slot is RESERVED until the group completes)."""
        before = self.live_index[p - 1] if p > 0 else {}
        cmap = tuple(before.get(v, -1) for v in self.live[p])
        name, reservations = self.order[p], self.reservations
        for state, entry in (self.tables[p - 1] if p > 0 else START).items():
            cost = entry[0]
            layouts, reserved = state
            new = (tuple(layouts[k] if k >= 0 else RESERVED for k in cmap),
                   self.intern(tuple(sorted(reservations[reserved] + ((name, group),)))))
            old = table.get(new)
            if old is None or cost < old[0]:
                table[new] = (cost, state, None, p - 1)

    def step(self, p: int, singles, segments, completes, groups_of) -> dict[tuple, tuple[float, Any]]:
        """The table at position ``p``: every transition into it, in a fixed order (ties keep
        the first)."""
        table: dict[tuple, tuple[float, Any]] = {}
        for opt in singles.get(p, ()):
            self.apply(table, p, opt, (), p - 1)
        for start, opt in segments.get(p, ()):
            self.apply(table, p, opt, (), start - 1)
        for opt in completes.get(p, ()):
            self.apply(table, p, opt, tuple(sorted((m, opt.nodes) for m in opt.nodes[:-1])), p - 1)
        for group in groups_of.get(p, ()):
            self.reserve(table, p, group)
        return table

    def keep(self, p: int, table: dict) -> None:
        """Store position ``p``'s table; the rows grouped for transitions into ``p`` are done."""
        self.tables.append(table)
        for src in [k for k in self.rows_cache if k[1] == p]:
            del self.rows_cache[src]
