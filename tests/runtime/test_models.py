"""End to end: real zoo models (own ResNets, Hugging Face BERT and GPT-2 built offline from
their configs) compiled with backend="torchfl", run on the emulated chips, compared with
eager torch. Shapes are small (CI: 2 cores, cold Numba cache)."""
import pytest
import torch

from tests.runtime.models import SmallCNN, rel_err, seeded

from torchfl.planner.zoo import load_model
from torchfl.runtime.backend import recording

# fp16 storage, fp32 accumulation, relative to max |eager fp32| over the whole output:
# ~2^-11 per rounding, compounded over tens of layers
TOL = {"resnet": 3e-2, "transformer": 3e-2}


def _last_hidden(out):
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out


def compile_and_run(model, inputs, options):
    c = torch.compile(model, backend="torchfl", options=options)
    with torch.no_grad(), recording() as rec:
        y = _last_hidden(c(*inputs))
    with torch.no_grad():
        ref = _last_hidden(model(*inputs))
    plans = [p for _cg, p, _r in rec.entries]
    return y, ref, plans


def _no_fallbacks(plans):
    """Every node runs on the chip, or is folded: input-independent (HF masks, token-type and
    position ids from buffers and ``arange``), computed once, never per call on the CPU."""
    fb = [(f.op, f.reason) for p in plans for f in p.fallbacks]
    assert not fb, fb
    assert plans and all(p.summary.nodes_on_chip + p.summary.folded == p.summary.nodes_total for p in plans)
    for p in plans:
        folded = {f.node for f in p.folded}
        assert all(st.static for st in p.steps if st.kind == "fold")
        assert folded == {n for st in p.steps if st.kind == "fold" for n in st.nodes[:1]}


V3 = {"chip": "NPU-V3", "precision": "float16"}


@pytest.mark.parametrize("name", ["resnet18", "resnet50"])
def test_resnet_on_npu_v3_fp16(name):
    model, inputs = load_model(name, batch=1, image=64)
    y, ref, plans = compile_and_run(model, inputs, V3)
    _no_fallbacks(plans)
    assert y.shape == ref.shape == (1, 1000)
    assert rel_err(y, ref) < TOL["resnet"]


def test_bert_large_shaped_16_heads_on_npu_v3_fp16():
    model, inputs = load_model("bert-large", batch=1, seq_len=32, layers=2)
    assert model.config.num_attention_heads == 16 and model.config.hidden_size == 1024
    y, ref, plans = compile_and_run(model, inputs, V3)
    _no_fallbacks(plans)
    assert rel_err(y, ref) < TOL["transformer"]


def test_gpt2_small_config():
    """GPT-2 small's 12 heads: NPU-V3's attention unit runs 1/2/4/8/16 heads, so on NPU-V3
    the hard-constraint error; the same config runs on TFL-X1 (12 heads), and with 16
    heads (head_dim 48) on NPU-V3."""
    from torchfl.planner.errors import UnsupportedAttention

    model, inputs = load_model("gpt2", batch=1, seq_len=32, layers=2)
    assert model.config.n_head == 12 and model.config.n_embd == 768
    with pytest.raises(UnsupportedAttention, match="num_heads=12 not supported on NPU-V3"):
        compile_and_run(model, inputs, V3)
    y, ref, plans = compile_and_run(model, inputs, {"chip": "TFL-X1", "precision": "float16"})
    _no_fallbacks(plans)
    assert rel_err(y, ref) < TOL["transformer"]
    model16, inputs16 = load_model("gpt2", batch=1, seq_len=32, layers=2, num_heads=16)
    y, ref, plans = compile_and_run(model16, inputs16, V3)
    _no_fallbacks(plans)
    assert rel_err(y, ref) < TOL["transformer"]


# What each bundled chip does with a small CNN and a 4-head transformer (fp16 policy where
# the chip has no fp32 unit): both run and match eager; the only CPU fallbacks allowed are
# those the chip's HCD explains (DSP-M4 has no attention unit: the core pack decomposes
# attention into its GEMM and softmax kernels, so none there either). An 8-head transformer on
# EDGE-C2 (heads 1/2/4) is the hard-constraint error, before anything runs.
ALLOWED_FALLBACKS = {}
HEAD_LIMIT = {"EDGE-C2": 8}
CHIPS = ("DSP-M4", "EDGE-C2", "NPU-E1", "NPU-V2", "NPU-V3", "TFL-X1")


@pytest.mark.parametrize("chip", CHIPS)
def test_every_bundled_chip(chip):
    from torchfl.planner.errors import UnsupportedAttention

    opts = {"chip": chip, "precision": None if chip == "TFL-X1" else "float16"}
    cases = [(seeded(SmallCNN), (torch.randn(2, 3, 16, 16),)),
             load_model("bert-base", batch=1, seq_len=16, layers=1, num_heads=4, hidden=64)]
    for model, inputs in cases:
        torch._dynamo.reset()
        y, ref, plans = compile_and_run(model, inputs, opts)
        fell_back = {f.op for p in plans for f in p.fallbacks}
        assert fell_back <= ALLOWED_FALLBACKS.get(chip, set()), sorted(
            (f.op, f.reason) for p in plans for f in p.fallbacks)
        assert rel_err(y, ref) < TOL["transformer"], chip
    if chip in HEAD_LIMIT:
        heads = HEAD_LIMIT[chip]
        model, inputs = load_model("bert-base", batch=1, seq_len=16, layers=1, num_heads=heads, hidden=64)
        torch._dynamo.reset()
        with pytest.raises(UnsupportedAttention,
                           match=f"MultiheadAttention with num_heads={heads} not supported on {chip}"):
            compile_and_run(model, inputs, opts)
