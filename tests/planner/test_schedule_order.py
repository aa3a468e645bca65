"""select's own lexicographic topological order (no DiGraph per plan) is networkx's."""

import random

import networkx as nx
import pytest

from torchfl.planner.select import SelectionError, _lexicographic_order


@pytest.mark.parametrize("seed", range(20))
def test_lexicographic_order_is_networkx(seed):
    rng = random.Random(seed)
    names = [f"n{rng.randrange(10**6)}_{i}" for i in range(rng.randrange(1, 60))]
    rng.shuffle(names)
    succ = {n: [] for n in names}
    for i, a in enumerate(names):   # edges only forward in a hidden order: a DAG, names unsorted
        for b in names[i + 1:]:
            if rng.random() < 0.15:
                succ[a].append(b)
    graph = nx.DiGraph()
    graph.add_nodes_from(names)
    graph.add_edges_from((a, b) for a, users in succ.items() for b in users)
    assert _lexicographic_order(succ) == list(nx.lexicographical_topological_sort(graph))


def test_a_cycle_is_refused():
    with pytest.raises(SelectionError, match="cycle"):
        _lexicographic_order({"a": ["b"], "b": ["a"]})
