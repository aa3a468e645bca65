"""Selection is exact against brute force on random chains and small DAGs, and deterministic."""

import random

import pytest

from tests.planner.select_oracle import brute_force, evaluate
from torchfl.planner.select import CoverProblem, Option, schedule, select

LAYOUTS = ("NCHW", "NHWC", "NHCW")


def _conv_cost(rng):
    table = {}

    def cost(value, a, b):
        key = (value, a, b)
        if key not in table:
            table[key] = rng.choice([0.5, 1.0, 2.0, 3.5])
        return table[key]

    return cost


def _options_for(rng, nodes, fusable):
    """Per node: one option per (in layout, out layout) choice with random costs; plus
    random fusion options along single-user chains."""
    options = []
    for name, inputs in nodes.items():
        for lin in LAYOUTS:
            for lout in LAYOUTS:
                if rng.random() < 0.35:
                    options.append(Option(f"{name}:{lin}>{lout}", (name,), inputs, tuple(lin for _ in inputs),
                                          lout, rng.uniform(1, 10)))
        if not any(o.nodes == (name,) for o in options):
            options.append(Option(f"{name}:NCHW", (name,), inputs, tuple("NCHW" for _ in inputs), "NCHW", 5.0))
    for chain in fusable:
        ext = []
        for k, name in enumerate(chain):
            ext += [v for v in nodes[name] if k == 0 or v != chain[k - 1]]
        for lay in LAYOUTS:
            if rng.random() < 0.5:
                options.append(Option(f"fused:{'+'.join(chain)}:{lay}", tuple(chain), tuple(ext),
                                      tuple(lay for _ in ext), lay, rng.uniform(2, 12)))
    return options


@pytest.mark.parametrize("seed", range(40))
def test_chain_is_exact(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 8)
    nodes = {}
    prev = "x"
    for i in range(n):
        nodes[f"op{i}"] = (prev,)
        prev = f"op{i}"
    fusable = []
    for _ in range(rng.randint(0, 3)):
        if n >= 2:
            a = rng.randrange(0, n - 1)
            b = rng.randint(a + 1, min(n - 1, a + 2))
            fusable.append([f"op{k}" for k in range(a, b + 1)])
    problem = CoverProblem(nodes, {"x": rng.choice(LAYOUTS)}, ((prev, "NCHW"),),
                      tuple(_options_for(rng, nodes, fusable)), _conv_cost(rng))
    sel = select(problem)
    assert sel.exact
    assert sel.cost == pytest.approx(brute_force(problem))
    assert sel.cost == pytest.approx(evaluate(problem, sel.chosen))


def _random_dag(rng, n):
    nodes = {}
    names = ["x"]
    for i in range(n):
        k = 1 if rng.random() < 0.5 or len(names) < 2 else 2
        inputs = tuple(rng.sample(names[-4:], min(k, len(names[-4:]))))
        nodes[f"v{i}"] = inputs
        names.append(f"v{i}")
    return nodes


@pytest.mark.parametrize("seed", range(40))
def test_small_dag_is_exact(seed):
    rng = random.Random(1000 + seed)
    nodes = _random_dag(rng, rng.randint(2, 7))
    users = {}
    for name, inputs in nodes.items():
        for v in inputs:
            users.setdefault(v, set()).add(name)
    last = list(nodes)[-1]
    outputs = [last] + [v for v in nodes if v not in users and v != last]
    fusable = [[u, next(iter(users[u]))] for u in nodes if len(users.get(u, ())) == 1 and u not in outputs]
    problem = CoverProblem(nodes, {"x": "NCHW"}, tuple((v, "NCHW") for v in outputs),
                      tuple(_options_for(rng, nodes, fusable[:3])), _conv_cost(rng))
    sel = select(problem)
    assert sel.exact
    assert sel.cost == pytest.approx(brute_force(problem))


def test_residual_block_and_attention_shapes_are_exact():
    # x -> a -> b -> add(b, x) ; q,k,v from h -> s=qk -> p=softmax(s) -> o=pv -> out=add(o,h)
    nodes = {"h": ("x",), "q": ("h",), "k": ("h",), "v": ("h",), "s": ("q", "k"), "p": ("s",),
             "o": ("p", "v"), "a": ("o",), "b": ("a",), "r": ("b", "h")}
    rng = random.Random(7)
    fusable = [["s", "p", "o"], ["a", "b"], ["b", "r"]]
    problem = CoverProblem(nodes, {"x": "NCHW"}, (("r", "NCHW"),), tuple(_options_for(rng, nodes, fusable)),
                      _conv_cost(rng))
    sel = select(problem)
    assert sel.cost == pytest.approx(brute_force(problem))


def test_fusion_chains_are_contiguous_in_the_schedule():
    nodes = {"a": ("x",), "skip": ("x",), "conv": ("a",), "add": ("conv", "skip"), "relu": ("add",)}
    order = schedule(nodes, ["relu"], {("conv", "add"), ("add", "relu")})
    i = order.index("conv")
    assert order[i:i + 3] == ["conv", "add", "relu"]


def test_ties_are_broken_deterministically():
    nodes = {"a": ("x",), "b": ("a",)}
    opts = tuple(Option(f"{n}:{lay}", (n,), i, (lay,), lay, 1.0) for n, i in nodes.items() for lay in LAYOUTS)
    problem = CoverProblem(nodes, {"x": "NHWC"}, (("b", "NHWC"),), opts, lambda v, a, b: 1.0)
    keys = {tuple(o.key for o in select(problem).chosen) for _ in range(5)}
    assert keys == {("a:NHWC", "b:NHWC")}
