"""Repeated stretches of the schedule in the selection's dynamic programme: N identical decoder
layers are searched until one layer's tables repeat the previous layer's; the others are that
layer's tables, shifted, not searched again.

Why: the DP's work is (positions x states x options); a LLaMA-2 70B step has 80 identical layers
(~6100 positions, 256 states each) and spent ~13 s there, 7B (32 layers) ~3 s.

How (exact up to float rounding; :class:`Period`):

1. Each schedule position gets a *signature*: everything the DP's step into it reads, with node
   names replaced by what does not change from one layer to the next (transition kinds, the
   source's relative offset, which live slots are kept, the options in order with their costs,
   layouts and fixed-input prices, the conversion prices of the live values they read, the
   relative positions of fusion reservations). Two positions with equal signatures map equal
   tables (translated: reserved node names shifted by the distance) to equal tables.
2. The longest run of signatures that repeats with a period ``L`` (:func:`find`) gives the blocks.
3. The DP runs block by block; once block ``j``'s tables are block ``j-1``'s translated by ``L``
   (same states in the same order, same back pointers, every cost shifted by one constant
   ``delta`` within 1e-9 relative), every later block is too (equal steps on equal inputs):
   their tables become :class:`Shifted` views of block ``j``'s and the search resumes after the
   stretch. Where no block repeats the previous one, every position is searched as before.

``tests/planner/test_cover_period.py`` checks the selections against the whole search.
"""

from __future__ import annotations

from collections import Counter

__all__ = ["signatures", "find", "Period", "Shifted"]

REL_TOL = 1e-9      # a repeated block's costs: the same shift for every state, to this relative error
MIN_BLOCKS = 3      # the first searched, the second compared with it, at least one shifted


def signatures(search, singles, segments, completes, groups_of) -> list:
    """One hashable signature per schedule position (module docstring, step 1)."""
    problem, order, live = search.problem, search.order, search.live
    pos = search.pos
    reservable = {x for groups in groups_of.values() for g in groups for x in g[:-1]}
    makers: dict[str, set] = {}
    for opt in problem.options:
        makers.setdefault(opt.nodes[-1], set()).add(opt.layout_out)

    def kept(src, dst):
        before = search.live_index[src] if src >= 0 else {}
        width = len(live[src]) if src >= 0 else 0
        return tuple(before.get(v, width) for v in live[dst]), width

    def rel(name, p):
        return pos[name] - p if name in reservable else None

    def option(p, opt, src, pairs):
        before = search.live_index[src] if src >= 0 else {}
        base = opt.cost
        for need in search.required_out.get(opt.nodes[-1], ()):
            base += search.price(opt.nodes[-1], opt.layout_out, need)
        reads = []
        for value, need in zip(opt.inputs, opt.layouts_in):
            if not value:
                reads.append(None)
            elif value in before:
                prices = tuple(search.price(value, h, need) for h in sorted(makers.get(value, ())))
                reads.append((before[value], need, prices, rel(value, p)))
            else:
                base += search.price(value, problem.input_layouts.get(value, need), need)
        return (src - p, kept(src, p), base, opt.layout_out, tuple(reads),
                tuple((pos[m] - p, tuple(pos[x] - p for x in g)) for m, g in pairs))

    sigs = []
    for p in range(len(order)):
        parts = [option(p, o, p - 1, ()) for o in singles.get(p, ())]
        parts += [option(p, o, start - 1, ()) for start, o in segments.get(p, ())]
        parts += [option(p, o, p - 1, tuple((m, o.nodes) for m in o.nodes[:-1])) for o in completes.get(p, ())]
        parts += [("reserve", kept(p - 1, p), tuple(pos[x] - p for x in g)) for g in groups_of.get(p, ())]
        sigs.append(tuple(parts))
    return sigs


def find(sigs) -> tuple[int, int, int] | None:
    """(first position, period L, blocks R) of the longest stretch of ``sigs`` repeating with one
    period, R >= MIN_BLOCKS; None where there is none."""
    ids: dict = {}
    seq = [ids.setdefault(s, len(ids)) for s in sigs]
    last: dict[int, int] = {}
    gaps: Counter = Counter()
    for p, i in enumerate(seq):
        if i in last:
            gaps[p - last[i]] += 1
        last[i] = p
    best = None
    for period, _count in gaps.most_common(4):
        run, start = 0, 0
        for p in range(len(seq) - period + 1):
            if p + period < len(seq) and seq[p] == seq[p + period]:
                run += 1
                continue
            blocks = (run + period) // period
            if blocks >= MIN_BLOCKS and (best is None or (blocks - 2) * period > (best[2] - 2) * best[1]):
                best = (start, period, blocks)
            run, start = 0, p + 1
    return best


class Period:
    """A repeated stretch of one selection (first position ``start``, period ``length``,
    ``blocks`` blocks) and the translation of states and options between its blocks."""

    def __init__(self, search, found, singles, segments, completes):
        self.search = search
        self.start, self.length, self.blocks = found
        self.pos = search.pos
        self._singles, self._segments, self._completes = singles, segments, completes
        self._shifted: dict[tuple[int, int], int] = {}
        self._index: dict[int, dict[int, int]] = {}

    def block_end(self, j: int) -> int:
        """The last position of block ``j``."""
        return self.start + (j + 1) * self.length - 1

    def transitions(self, p: int) -> list:
        """The options of the transitions into ``p``, in the step's order."""
        return (list(self._singles.get(p, ())) + [o for _s, o in self._segments.get(p, ())]
                + list(self._completes.get(p, ())))

    def option_at(self, opt, p: int, d: int):
        """The option into ``p + d`` in the place of ``opt`` (an option into ``p``)."""
        if opt is None:
            return None
        index = self._index.get(p)
        if index is None:
            index = self._index[p] = {id(o): k for k, o in enumerate(self.transitions(p))}
        return self.transitions(p + d)[index[id(opt)]]

    def rid(self, rid: int, d: int) -> int:
        """Reservation id ``rid`` with every reserved node ``d`` positions later."""
        if not rid or not d:
            return rid
        key = (rid, d)
        got = self._shifted.get(key)
        if got is None:
            order, pos, s = self.search.order, self.pos, self.search
            moved = tuple(sorted((order[pos[n] + d], tuple(order[pos[x] + d] for x in g))
                                 for n, g in s.reservations[rid]))
            got = self._shifted[key] = s.intern(moved)
        return got

    def state(self, state, d: int):
        return state if state is None else (state[0], self.rid(state[1], d))

    def repeats(self, j: int) -> float | None:
        """The cost shift ``delta`` when block ``j``'s tables are block ``j - 1``'s translated by
        one period (module docstring, step 3), else None."""
        tables, n, delta = self.search.tables, self.length, None
        for q in range(self.block_end(j - 1) - n + 1, self.block_end(j - 1) + 1):
            mine, theirs = tables[q], tables[q + n]
            if len(mine) != len(theirs):
                return None
            for (k1, e1), (k2, e2) in zip(mine.items(), theirs.items()):
                if delta is None:
                    delta = e2[0] - e1[0]
                if (self.state(k1, n) != k2 or self.state(e1[1], n) != e2[1] or e1[3] + n != e2[3]
                        or abs(e2[0] - e1[0] - delta) > REL_TOL * abs(e2[0])
                        or self.option_at(e1[2], q, n) is not e2[2]):
                    return None
        return delta

    def shift(self, j: int, delta: float) -> int:
        """Views of block ``j``'s tables for blocks ``j+1`` .. the last, appended to the search's
        tables; returns the first position after the stretch."""
        for i in range(j + 1, self.blocks):
            d = (i - j) * self.length
            for q in range(self.block_end(j) - self.length + 1, self.block_end(j) + 1):
                self.search.tables.append(Shifted(self, self.search.tables[q], q, d, (i - j) * delta))
        return self.block_end(self.blocks - 1) + 1


class Shifted:
    """The table at position ``q + d``: the one at ``q`` translated by ``d`` positions, its
    costs plus ``delta`` (read by the back-track; spelt out when a later step reads it)."""

    __slots__ = ("period", "base", "q", "d", "delta", "_full")

    def __init__(self, period: Period, base, q: int, d: int, delta: float):
        self.period, self.base, self.q, self.d, self.delta, self._full = period, base, q, d, delta, None

    def _entry(self, entry):
        cost, prev, opt, src = entry
        return (cost + self.delta, self.period.state(prev, self.d), self.period.option_at(opt, self.q, self.d),
                src + self.d)

    def __getitem__(self, state):
        return self._entry(self.base[self.period.state(state, -self.d)])

    def __len__(self) -> int:
        return len(self.base)

    def items(self):
        if self._full is None:
            self._full = {self.period.state(k, self.d): self._entry(e) for k, e in self.base.items()}
        return self._full.items()

