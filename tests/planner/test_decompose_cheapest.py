"""decompose's price of the op it would replace and of its parts, from one index of the options
(``decompose.cheapest``) instead of a scan of every option per proposal (quadratic: 9.5 s of a
LLaMA-2 70B plan): the same (label, cost) as the scan for every node, ties to the first."""
from torchfl.planner import decompose
from torchfl.planner.candidates import Generator
from torchfl.planner.capture import capture_module
from torchfl.planner.cost import Pricer
from torchfl.planner.graph import build_ir
from torchfl.planner.lm import tiny_llama
from torchfl.planner.target import Target


def _scan(cands, nodes):
    """The scan decompose made per proposal before the index (the reference)."""
    best = ("cpu", float("inf"))
    for o in cands.options:
        if o.nodes == nodes and o.cost < best[1]:
            kind = o.payload.kind
            best = (o.payload.kernel if kind in ("kernel", "fused") else ("host fold" if kind == "fold" else "cpu"),
                    o.cost)
    return best


def test_index_equals_the_scan_for_every_node(chips):
    target = Target.of(chips["TFL-X1"])
    model, inputs = tiny_llama(layers=2)
    ir = build_ir(decompose.fold_repeat_kv(capture_module(model, inputs)), None)
    cands = Generator(ir, target.hcd, target.packs, target.model, Pricer.for_chip(target.model)).run()
    index = decompose.cheapest(cands)
    groups = {o.nodes for o in cands.options} | {(n,) for n in ir.nodes}
    assert len(groups) > 100
    for nodes in groups:
        assert index.get(nodes, ("cpu", float("inf"))) == _scan(cands, nodes), nodes
