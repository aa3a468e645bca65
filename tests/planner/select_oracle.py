"""Test oracles of the selection: the objective of a given cover and the brute-force
minimum over every cover (exponential; small graphs only)."""
from __future__ import annotations

from typing import Iterable

from torchfl.planner.select import INF, CoverProblem, Option, _users


def evaluate(problem: CoverProblem, chosen: Iterable[Option]) -> float:
    """The objective of a given cover (used by brute force and by tests)."""
    chosen = list(chosen)
    layouts = dict(problem.input_layouts)
    for opt in chosen:
        layouts[opt.nodes[-1]] = opt.layout_out
    total = 0.0
    for opt in chosen:
        total += opt.cost
        for value, need in zip(opt.inputs, opt.layouts_in):
            if value and layouts.get(value, need) != need:
                total += problem.conv_cost(value, layouts[value], need)
    for value, need in problem.outputs:
        if layouts[value] != need:
            total += problem.conv_cost(value, layouts[value], need)
    return total


def brute_force(problem: CoverProblem) -> float:
    """Minimum objective over every cover (exponential; for tests on small graphs)."""
    names = list(problem.nodes)
    users = _users(problem.nodes)
    out_values = {v for v, _ in problem.outputs}
    valid = [o for o in problem.options
             if not any(u not in o.nodes for x in o.nodes[:-1] for u in users.get(x, ()))
             and not (set(o.nodes[:-1]) & out_values)]
    best = INF

    def rec(covered: frozenset, picked: list[Option]):
        nonlocal best
        first = next((x for x in names if x not in covered), None)
        if first is None:
            best = min(best, evaluate(problem, picked))
            return
        for o in valid:
            if first in o.nodes and not (covered & set(o.nodes)):
                picked.append(o)
                rec(covered | set(o.nodes), picked)
                picked.pop()

    rec(frozenset(), [])
    return best
