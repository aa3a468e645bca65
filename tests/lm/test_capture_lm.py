"""Causal LMs as they come: a default config (use_cache=True, the cache returned) plans, and a
model built on the meta device plans exactly as the same model with real weights."""
import torch

from tests.lm.families import config
from torchfl.planner import plan_module


def _llama(device):
    from transformers import LlamaForCausalLM

    cfg = config("llama")       # use_cache=True: the default
    assert cfg.use_cache
    torch.manual_seed(0)
    with torch.device(device):
        m = LlamaForCausalLM(cfg).eval()
    return m, (torch.zeros((1, 8), dtype=torch.long, device=device),)


def _shape(plan):
    return [(s.kind, s.kernel, s.nodes, s.layouts_in, s.tile, tuple(plan.values[o].shape) if o in plan.values else ())
            for s in plan.steps for o in s.outputs[:1]]


def test_default_config_returns_its_cache_as_graph_outputs():
    """torch.export refused the DynamicCache output ("Found DynamicCache in output"); its keys and
    values are now outputs of the plan, and rotary embedding's `.to(x.device)` copies are no CPU
    fallbacks (a copy to the device the tensor is on moves nothing)."""
    m, inputs = _llama("cpu")
    plan = plan_module(m, inputs, chip="TFL-X1")
    assert len(plan.outputs) == 1 + 2 * 2          # logits, keys and values of 2 layers
    assert [tuple(plan.values[o].shape) for o in plan.outputs[1:]] == [(1, 2, 8, 16)] * 4
    assert not plan.fallbacks, plan.fallbacks


def test_meta_device_plans_as_real_weights():
    real = plan_module(*_llama("cpu"), chip="TFL-X1")
    meta = plan_module(*_llama("meta"), chip="TFL-X1")
    assert not meta.fallbacks, meta.fallbacks
    assert _shape(meta) == _shape(real)
    assert meta.memory.peak_bytes == real.memory.peak_bytes
    assert meta.summary.predicted_time_s == real.summary.predicted_time_s
