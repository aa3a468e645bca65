"""A stretch of identical blocks is searched until one block repeats the one before
(planner.cover_period): the selection must be the one of the search over every position, on
synthetic problems with residuals, a value every block reads, graph outputs per block, fusion
groups contiguous and not (reservations), layout conversions and tied costs."""
import random

import pytest

from torchfl.planner.cover_period import find
from torchfl.planner.select import CoverProblem, Option, natural, schedule, select
from tests.planner.select_oracle import evaluate

LAYOUTS = ("A", "B")


def _block(k, rng_costs, prev):
    """Nodes and options of block ``k`` (costs from ``rng_costs``: the same generator state per
    block gives identical blocks)."""
    c = lambda: rng_costs.choice([1.0, 2.0, 2.0, 3.0, 0.5])   # noqa: E731 - ties on purpose
    q, r, s, m, o, add = (f"{x}_{k}" for x in ("q", "r", "s", "m", "o", "add"))
    nodes = {q: (prev, "pre"), r: (q,), s: (q,), m: (r, s), o: (q,), add: (m, prev)}
    opts = []
    for name, ins in nodes.items():
        for lay in LAYOUTS:
            opts.append(Option(f"{name}:{lay}", (name,), ins, tuple(lay for _ in ins), lay, c()))
    opts.append(Option(f"fuse_rsm_{k}", (r, s, m), (q, q), ("A", "A"), "B", c()))      # two chains: reservations
    opts.append(Option(f"fuse_madd_{k}", (m, add), (r, s, prev), ("B", "B", "A"), "A", c()))  # contiguous
    return nodes, opts, add, o


def _problem(blocks, seed=0, last_differs=False, drift=False):
    """``blocks`` identical blocks after ``pre`` (read by every block). ``drift``: ``pre`` may be
    made in layout B too, whose states then pay a conversion in every block: their costs drift
    apart from the others', no block repeats the one before with one cost shift."""
    nodes = {"pre": ("x",)}
    opts = [Option("pre:A", ("pre",), ("x",), ("A",), "A", 1.0)]
    if drift:
        opts.append(Option("pre:B", ("pre",), ("x",), ("A",), "B", 0.1))
    outputs = []
    prev = "x"
    for k in range(blocks):
        rng = random.Random(seed if not (last_differs and k == blocks - 1) else seed + 1)
        more, extra, prev, out = _block(k, rng, prev)
        nodes.update(more)
        opts += extra
        outputs.append((out, "A"))
    outputs.append((prev, "B"))
    prices = {("A", "B"): 0.7, ("B", "A"): 0.9}
    return CoverProblem(nodes, {"x": "A"}, tuple(outputs), tuple(opts),
                        lambda v, h, n: prices.get((h, n), 0.0))


def _same(a, b):
    assert [o.key for o in a.chosen] == [o.key for o in b.chosen]
    assert a.layouts == b.layouts
    assert a.cost == pytest.approx(b.cost, rel=1e-12)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("last_differs", [False, True])
def test_repeated_blocks_select_as_the_whole_search(seed, last_differs):
    problem = _problem(24, seed, last_differs)
    whole = select(problem, repeat=True, skip=False)
    fast = select(problem, repeat=True)
    _same(whole, fast)
    assert whole.searched == len(whole.order)
    assert fast.searched < len(fast.order) // 2       # the stretch was not searched block by block
    assert evaluate(problem, fast.chosen) == pytest.approx(fast.cost, rel=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_drifting_costs_are_searched_whole(seed):
    problem = _problem(16, seed, drift=True)
    whole = select(problem, repeat=True, skip=False)
    fast = select(problem, repeat=True)
    _same(whole, fast)
    assert fast.searched == len(fast.order)


def test_no_period_no_shortcut():
    """Blocks with different costs each: every position is searched."""
    nodes, opts, prev = {}, [], "x"
    for k in range(12):
        more, extra, prev, _o = _block(k, random.Random(100 + k), prev)
        nodes.update(more)
        opts += extra
    nodes["pre"] = ("x",)
    opts.append(Option("pre:A", ("pre",), ("x",), ("A",), "A", 1.0))
    problem = CoverProblem(nodes, {"x": "A"}, ((prev, "A"),), tuple(opts), lambda v, h, n: 0.5)
    fast = select(problem, repeat=True)
    assert fast.searched == len(fast.order)
    _same(select(problem, repeat=True, skip=False), fast)


def test_find_the_longest_repeating_stretch():
    assert find(list("xy" + "abcd" * 5 + "z")) == (2, 4, 5)
    assert find(list("abcabd")) is None             # two blocks are not enough
    assert find(list("xyz")) is None


def test_natural_order_schedules_numbered_layers_alike():
    """Plain string order puts slice_11 before slice_9 (layer 3's independent nodes in another
    order than layer 1's); natural order lists every layer's nodes alike."""
    nodes = {f"slice_{k}": ("x",) for k in (5, 7, 9, 11)}
    assert schedule(nodes) == ["slice_11", "slice_5", "slice_7", "slice_9"]
    assert schedule(nodes, key=natural) == ["slice_5", "slice_7", "slice_9", "slice_11"]


def test_graphs_below_the_size_keep_their_plain_schedule():
    """Small graphs are planned as before (golden plans): plain name order, outputs live."""
    problem = _problem(3, 1)
    assert select(problem).searched == len(select(problem).order)
    assert select(problem).order == tuple(schedule(problem.nodes, [v for v, _ in problem.outputs],
                                                   {(o.nodes[k], o.nodes[k + 1]) for o in problem.options
                                                    for k in range(len(o.nodes) - 1)}))
