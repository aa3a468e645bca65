"""One plan across sequence lengths (planner.lengths): a decoder's shape-polymorphic graph is
captured once, decided once per bucket of lengths and instanced per length; generate() through
torch.compile gives eager's greedy tokens with a handful of plans."""
import pytest
import torch

from tests.lm.families import model
from torchfl.planner import lengths
from torchfl.runtime import backend

X1 = {"chip": "TFL-X1"}     # a float32 unit: float32 models plan without a precision policy


@pytest.fixture
def graphs(monkeypatch):
    """Every CompiledGraph the backend makes in the test."""
    made = []
    init = backend.CompiledGraph.__init__

    def spy(self, *a, **k):
        init(self, *a, **k)
        made.append(self)
    monkeypatch.setattr(backend.CompiledGraph, "__init__", spy)
    return made


def test_bucket_rule():
    assert lengths.bucket_of(1) == (0, 64)
    assert lengths.bucket_of(64) == (0, 64)
    assert lengths.bucket_of(65) == (64, 512)
    assert lengths.bucket_of(512) == (64, 512)
    assert lengths.bucket_of(513) == (512, 4096)


def _generate(m, ids, n, **kw):
    with torch.no_grad():
        return m.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, **kw)


def test_256_token_decode_makes_at_most_four_plans(graphs):
    """The issue's goal: <= 4 plans for a 256-token decode (prefill, the first decode step,
    then Dynamo's symbolic graph: lengths 8..64 and 65..512, one decision each); the tokens
    are eager torch's, and only the latest executors stay on the chip."""
    m, _cfg = model("llama")
    ids = torch.randint(0, 128, (1, 6), generator=torch.Generator().manual_seed(1))
    ref = _generate(m, ids, 256)
    m.forward = torch.compile(m.forward, backend="torchfl", options=X1)
    out = _generate(m, ids, 256)
    assert torch.equal(out, ref)
    assert sum(g.decisions for g in graphs) <= 4, [(g.decisions, g.lengths and g.lengths.instances) for g in graphs]
    dynamic = [g for g in graphs if g.lengths is not None]
    assert len(dynamic) == 1 and dynamic[0].lengths.decisions == 2
    assert dynamic[0].lengths.instances >= 250
    assert len(dynamic[0].entries) <= backend.CompiledGraph.KEEP_LENGTHS
    plan = next(e.plan for e in dynamic[0].entries.values())
    assert plan.notes[0].startswith("lengths: one plan for ") and "in 65..512" in plan.notes[0]
    assert "lengths: one plan for" in plan.explain()


def test_instance_equals_a_plan_made_for_that_length(graphs):
    """An instance (the bucket's choices on the specialised graph) is what the planner makes when
    it plans that length in full (same steps, tiles, shapes, memory: the choices did not change
    here), and the specialised graph is the graph torch.export traces at that length."""
    from torch.fx.node import map_arg

    from torchfl import planner
    from torchfl.planner.api import plan_specialised
    from torchfl.planner.capture import capture_dynamo, lift_static

    m, _cfg = model("gpt2")
    ids = torch.randint(0, 128, (1, 5), generator=torch.Generator().manual_seed(2))
    m.forward = torch.compile(m.forward, backend="torchfl", options=X1)
    calls = []
    dyn_call = backend.CompiledGraph.__call__

    def keep(self, *args):
        if self.lengths is not None:
            calls.append((self, args))
        return dyn_call(self, *args)
    backend.CompiledGraph.__call__ = keep
    try:
        _generate(m, ids, 6)
    finally:
        backend.CompiledGraph.__call__ = dyn_call
    cg, args = calls[-1]
    assert cg.lengths.decisions == 1 and cg.lengths.instances >= 2
    inst = cg.entries[backend._signature(args, cg.scalar_positions)].plan
    lifted, user = lift_static(cg.gm, args)
    inputs = tuple(args[i] for i in user)
    special = lengths.specialise(cg.lengths.symbolic, inputs)
    traced = capture_dynamo(lifted, inputs)

    def ops(gm):    # node names differ (the symbolic trace numbered its size arithmetic too)
        return [(str(n.target), str(map_arg(n.args, lambda a: "%"))) for n in gm.graph.nodes
                if n.op == "call_function"]
    assert ops(special.graph_module) == ops(traced.graph_module)
    full = plan_specialised(special, inputs, planner.resolve_target("TFL-X1"))
    assert [(s.kind, s.kernel, s.nodes, s.layouts_in, s.tile) for s in inst.steps] == \
        [(s.kind, s.kernel, s.nodes, s.layouts_in, s.tile) for s in full.steps]
    assert {k: v.shape for k, v in inst.values.items()} == {k: v.shape for k, v in full.values.items()}
    assert inst.memory.peak_bytes == full.memory.peak_bytes
    assert inst.summary.predicted_time_s == full.summary.predicted_time_s


def test_a_choice_refused_at_a_length_is_not_run():
    """A bucket's choice that is no candidate at a length (its guard fails there) raises
    NotInBucket: that length is planned in full instead (LengthPlanner.plan)."""
    from torchfl.planner.select import CoverProblem, Option, Selection

    a = Option("attention@n:ABCD", ("n",), ("x",), ("ABCD",), "ABCD", 1.0)
    b = Option("bmm@n:ABCD", ("n",), ("x",), ("ABCD",), "ABCD", 2.0)
    sel = Selection((a,), {}, 1.0, ("n",), True, 1)
    problem = CoverProblem({"n": ("x",)}, {"x": "ABCD"}, (("n", "ABCD"),), (b,), lambda *_: 0.0)
    with pytest.raises(lengths.NotInBucket, match="attention@n:ABCD"):
        lengths.forced((lengths.choice(a),), sel)(problem)
    # the same kernel reading its input in another layout is another choice
    a2 = Option("attention@n:ABCD", ("n",), ("x",), ("ACBD",), "ABCD", 0.5)
    problem = CoverProblem({"n": ("x",)}, {"x": "ABCD"}, (("n", "ABCD"),), (b, a, a2), lambda *_: 0.0)
    assert lengths.forced((lengths.choice(a),), sel)(problem).chosen == (a,)


def test_a_size_passed_as_a_number_stays_symbolic():
    """Without position_ids a decoder adds the cache's length to its positions; Dynamo passes
    that length as a number (a SymInt input). Captured as a constant, every later length reused
    the first one's positions (RoPE at the wrong position: the new keys were wrong)."""
    import copy

    m, _cfg = model("llama")
    ids = torch.randint(0, 128, (1, 6), generator=torch.Generator().manual_seed(4))
    compiled = torch.compile(m.forward, backend="torchfl", options=X1)
    with torch.no_grad():
        pre = m(input_ids=ids, use_cache=True)
        eager_cache, chip_cache = copy.deepcopy(pre.cache), copy.deepcopy(pre.cache)
        token = pre.logits[:, -1:].argmax(-1)
        for _step in range(5):      # the third call on is Dynamo's symbolic graph, planned by lengths
            e = m(input_ids=token, cache=eager_cache, use_cache=True)
            c = compiled(input_ids=token, cache=chip_cache, use_cache=True)
            eager_cache, chip_cache = e.cache, c.cache
            torch.testing.assert_close(c.logits, e.logits, rtol=1e-4, atol=1e-4)
            for a, b in zip(chip_cache.layers, eager_cache.layers):
                torch.testing.assert_close(a.keys, b.keys, rtol=1e-4, atol=1e-4)
            token = e.logits[:, -1:].argmax(-1)
