"""LLaMA-family blocks fuse (core 1.9.0, kernels/lm): RMSNorm -> rms_norm, the SwiGLU gate's
silu(a) * b -> silu_mul, RoPE -> rope. The groups are found in the captured graphs (float32 and
float16), the plan of tiny-llama counts them, and generate() through torch.compile gives eager's
greedy tokens with the fused kernels running."""
import logging
from collections import Counter

import pytest
import torch

from tests.lm.families import model

X1 = {"chip": "TFL-X1"}
LAYERS = 2
# per tiny model: two RMSNorms a layer and the final one, one gated MLP a layer, RoPE on q and k
RMS = 2 * LAYERS + 1
GATES = LAYERS
ROPES = 2 * LAYERS


def _ids(seed=1, n=5):
    return torch.randint(0, 128, (1, n), generator=torch.Generator().manual_seed(seed))


def _fused(plan) -> Counter:
    return Counter(s.kernel for s in plan.steps if s.kind == "fused")


def _groups(family, dtype):
    from torchfl.planner.capture import capture_module
    from torchfl.planner.target import bundled_packs
    from torchfl.rules.groups import FxGraphView, find_groups

    m, _cfg = model(family, dtype)
    captured = capture_module(m, (_ids(n=8),))
    return Counter(g.fusion.name for g in find_groups(bundled_packs(), FxGraphView(captured.graph_module.graph)))


def _rms_graph(extra_reader):
    """RMSNorm's six ops by hand; the normalised value also read by ``extra_reader``."""
    aten = torch.ops.aten
    g = torch.fx.Graph()
    x, w = g.placeholder("x"), g.placeholder("w")
    ms = g.call_function(aten.mean.dim, (g.call_function(aten.pow.Tensor_Scalar, (x, 2)), [-1], True))
    rs = g.call_function(aten.rsqrt.default, (g.call_function(aten.add.Tensor, (ms, 1e-6)),))
    nrm = g.call_function(aten.mul.Tensor, (x, rs))
    other = extra_reader(g, nrm)
    out = g.call_function(aten.mul.Tensor, (w, nrm))
    g.output((out, other) if other is not None else out)
    return g


@pytest.mark.parametrize("reader,fused", [
    (lambda g, v: g.call_function(torch.ops.aten._assert_tensor_metadata.default, (v,), {"dtype": torch.float32})
     and None, True),
    (lambda g, v: g.call_function(torch.ops.aten.relu.default, (v,)), False),
    (lambda g, v: v, False),
])
def test_an_assert_on_an_inner_value_does_not_break_the_group(reader, fused):
    """A data-free ``_assert_*`` reader (``.to()``'s metadata check) is no reader; a real op or the
    graph output reading the inner value still keeps the group out (the kernel never writes it)."""
    from torchfl.planner.target import bundled_packs
    from torchfl.rules.groups import FxGraphView, find_groups

    names = [gr.fusion.name for gr in find_groups(bundled_packs(), FxGraphView(_rms_graph(reader)))]
    assert names == (["rms_norm"] if fused else []), names


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_rmsnorm_groups_in_the_captured_llama_graph(dtype):
    """LlamaRMSNorm's ``.to()`` leaves an ``_assert_tensor_metadata`` reading the normalised value:
    the group finder must not count it as a reader outside the group (it found 0 groups)."""
    groups = _groups("llama", dtype)
    assert groups["rms_norm" if dtype == torch.float32 else "rms_norm_upcast"] == RMS, groups
    assert groups["silu_mul" if dtype == torch.float32 else "silu_mul_upcast"] == GATES, groups
    assert groups["rope"] == ROPES, groups


@pytest.mark.parametrize("family,fusion", [("mistral", "rms_norm_upcast"), ("qwen2", "rms_norm_upcast"),
                                           ("gemma", "rms_norm_upcast_weight_f32")])
def test_rmsnorm_groups_in_the_other_llama_family_decoders(family, fusion):
    """float16; Gemma multiplies by (1 + w) in float32 before its downcast (and its MLP gates
    with GELU-tanh: no silu_mul there)."""
    groups = _groups(family, torch.float16)
    assert groups[fusion] == RMS and groups["rope"] == ROPES, groups
    assert groups["silu_mul_upcast"] == (0 if family == "gemma" else GATES), groups


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_tiny_llama_plan_counts_the_fused_groups(registry_url, dtype):
    from torchfl.planner import plan_module

    m, _cfg = model("llama", dtype)
    plan = plan_module(m, (_ids(n=8),), "TFL-X1", registry=registry_url)
    fused = _fused(plan)
    assert fused["rms_norm"] == RMS and fused["silu_mul"] == GATES and fused["rope"] == ROPES, fused
    assert plan.summary.fused_groups == sum(fused.values())


def _generate(m, ids):
    with torch.no_grad():
        return m.generate(ids, max_new_tokens=6, min_new_tokens=6, do_sample=False)


@pytest.mark.parametrize("family,dtype", [("llama", torch.float32), ("llama", torch.float16),
                                          ("mistral", torch.float32), ("qwen2", torch.float32),
                                          ("gemma", torch.float32), ("gemma", torch.bfloat16)])
def test_generate_with_the_fused_kernels_gives_eager_tokens(family, dtype, monkeypatch, caplog):
    m, _cfg = model(family, dtype)
    ids = _ids()
    ref = _generate(m, ids)
    monkeypatch.setenv("TORCH_FL_DEBUG", "1")
    m.forward = torch.compile(m.forward, backend="torchfl", options=X1)
    with caplog.at_level(logging.DEBUG, logger="torchfl"):
        out = _generate(m, ids)
    assert torch.equal(out, ref)
    mapped = [r.getMessage() for r in caplog.records if "[SME] Mapping" in r.getMessage()]
    for kernel in ("rms_norm", "rope") + (() if family == "gemma" else ("silu_mul",)):
        assert any(f"-> {kernel} (" in line for line in mapped), (kernel, mapped[:5])
