"""A deep decoder on the meta device is traced as a two-layer twin whose second layer is copied
(planner.repeat): the plan must be the one of the same model captured whole, with real weights."""
import pytest
import torch

from tests.lm.families import config
from torchfl.planner import plan_module
from torchfl.planner import repeat

FAMILIES = ["llama", "mistral", "qwen2", "gemma", "phi"]     # gpt_neox keeps its layers elsewhere: traced whole


def _model(family, device, layers=5):
    from transformers import AutoModelForCausalLM

    cfg = config(family)
    cfg.num_hidden_layers = layers
    if getattr(cfg, "layer_types", None) is not None:
        cfg.layer_types = [cfg.layer_types[0]] * layers
    torch.manual_seed(0)
    with torch.device(device):
        m = AutoModelForCausalLM.from_config(cfg).eval()
    return m


def _shape(plan):
    return [(s.kind, s.kernel, s.nodes and len(s.nodes), s.layouts_in, s.tile,
             tuple(plan.values[o].shape) if o in plan.values else ()) for s in plan.steps for o in s.outputs[:1]]


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_meta_twin_plans_as_the_whole_model_with_real_weights(family, monkeypatch):
    """Prefill of a 5-layer model: meta (two layers traced, three copied) == real weights (traced whole)."""
    calls = []
    real_expand = repeat.expand
    monkeypatch.setattr(repeat, "expand", lambda c, n: calls.append(n) or real_expand(c, n))
    ids = torch.zeros((1, 8), dtype=torch.long)
    real = plan_module(_model(family, "cpu"), (ids,), chip="TFL-X1")
    assert calls == []                      # real weights: traced whole
    meta = plan_module(_model(family, "meta"), (ids.to("meta"),), chip="TFL-X1")
    assert calls == [5]                     # the twin, expanded to five layers
    assert len(meta.outputs) == 1 + 2 * 5
    assert _shape(meta) == _shape(real)
    assert meta.memory.peak_bytes == real.memory.peak_bytes
    assert meta.summary.predicted_time_s == real.summary.predicted_time_s
    assert not meta.fallbacks


@pytest.mark.parametrize("family", FAMILIES)
def test_expanded_graph_has_the_whole_graphs_nodes(family, monkeypatch):
    """Decode step of every decoder family the twin takes: the same ops on the same shapes as
    the whole capture, the cache inputs and outputs in layer order."""
    from torchfl.planner.capture import capture_module
    from torchfl.planner.lm import decode_inputs

    m = _model(family, "meta")
    step, inputs = decode_inputs(m, 2, 9)
    assert repeat.twin_of(step, inputs) is not None
    twinned = capture_module(step, inputs)
    monkeypatch.setattr(repeat, "MIN_LAYERS", 10 ** 6)
    whole = capture_module(step, inputs)

    def nodes(c):
        """The ops the outputs depend on, in graph order (mistral's cache makes one dead constant
        copy per layer, outside the layers: the twin has two)."""
        graph = c.graph_module.graph
        live, todo = set(), [next(n for n in graph.nodes if n.op == "output")]
        while todo:
            for a in todo.pop().all_input_nodes:
                if a not in live:
                    live.add(a)
                    todo.append(a)
        return [(str(n.target), tuple(n.meta["val"].shape) if hasattr(n.meta.get("val"), "shape") else None)
                for n in graph.nodes if n.op == "call_function" and n in live]

    def placeholders(c):
        vals = {n.name: n.meta.get("val") for n in c.graph_module.graph.nodes if n.op == "placeholder"}
        return [(kind, target if kind == "input" else str(target), tuple(vals[name].shape))
                for name, kind, target in c.placeholders if kind != "constant"]     # the dead copies' constants

    assert nodes(twinned) == nodes(whole)
    assert sorted(placeholders(twinned)) == sorted(placeholders(whole))
    assert [p for p in placeholders(twinned) if p[0] == "input"] == [p for p in placeholders(whole) if p[0] == "input"]
    assert len(twinned.outputs) == len(whole.outputs) == 1 + 2 * 5


def test_decode_symbolic_capture_through_the_twin(monkeypatch):
    """The what-if decode step (symbolic context) of a meta model: two contexts planned from one
    twin capture equal the whole model's. (The symbolic graph reads the context length from one
    layer's cache: that cache input is still copied per layer.)"""
    from torchfl.planner import resolve_target, whatif

    expanded = []
    real_expand = repeat.expand
    monkeypatch.setattr(repeat, "expand", lambda c, n: expanded.append(real_expand(c, n) is not None) or c)
    chip = resolve_target("TFL-X1")
    got = []
    for min_layers in (repeat.MIN_LAYERS, 10 ** 6):
        repeat.MIN_LAYERS, saved = min_layers, repeat.MIN_LAYERS
        try:
            dec = whatif.Decoder(_model("llama", "meta").to(torch.float16))
            got.append([(p.plan.summary.predicted_time_s, p.peak_bytes, len(p.plan.steps))
                        for p in (whatif.plan_decode(chip, dec, 1, n, "float16") for n in (40, 300))])
        finally:
            repeat.MIN_LAYERS = saved
    assert expanded == [True]
    assert got[0] == got[1]


def test_twin_only_for_meta_models_with_identical_layers():
    from torchfl.planner.lm import decode_inputs

    step, inputs = decode_inputs(_model("llama", "cpu"), 1, 5)
    assert repeat.twin_of(step, inputs) is None                 # real weights: bound per layer
    step, inputs = decode_inputs(_model("llama", "meta", layers=3), 1, 5)
    assert repeat.twin_of(step, inputs) is None                 # too shallow to gain
    m = _model("llama", "meta")
    m.model.layers[3].mlp.up_proj = torch.nn.Linear(64, 128, bias=True, device="meta")   # a bias: one more parameter
    step, inputs = decode_inputs(m, 1, 5)
    assert repeat.twin_of(step, inputs) is None                 # one layer differs


@pytest.mark.parametrize("case", ["tiny-real-8", "7b-meta-decode-6"])
def test_repeated_layers_searched_once_plan_as_the_whole_search(case, monkeypatch):
    """Issue 34's 70B goal: the selection searches N identical layers until one repeats the one
    before, then shifts that layer's tables (planner.cover_period). The plan, step by step, and
    its predictions equal the search over every position; and the predictions equal the plain
    schedule's (small graphs keep it)."""
    from torchfl.hcd import load_hcd
    from torchfl.planner import resolve_target, select as sel, whatif
    from torchfl.planner.lm import llama, tiny_llama

    real_select, seen = sel.select, []

    def planned(**kw):
        monkeypatch.setattr(sel, "select", lambda p: seen.append(real_select(p, **kw)) or seen[-1])
        if case == "tiny-real-8":
            model, inputs = tiny_llama(layers=8)
            return plan_module(model, inputs, chip="TFL-X1")
        target = resolve_target(load_hcd("hcd_registry/a100_sxm4_80gb.hcd"))
        step = whatif.plan_decode(target, whatif.Decoder(llama("7b", layers=6)[0]), 1, 512, None)
        assert step.ok
        return step.plan

    fast, whole, plain = planned(repeat=True), planned(repeat=True, skip=False), planned(repeat=False)
    assert seen[0].searched < 0.7 * len(seen[0].order)     # two or three layers searched, not six or eight
    assert seen[1].searched == len(seen[1].order)
    assert fast.to_json() == whole.to_json()
    assert fast.explain() == whole.explain()
    assert fast.summary.predicted_time_s == plain.summary.predicted_time_s
    assert fast.memory.peak_bytes == plain.memory.peak_bytes
    assert sorted(s.kernel or "" for s in fast.steps) == sorted(s.kernel or "" for s in plain.steps)
