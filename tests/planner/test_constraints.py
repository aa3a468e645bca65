"""Hard constraints are errors before anything runs, with the seed's exact words."""

import pytest
import torch
from torch import nn

from tests.planner.planner_helpers import capture_of, hcd_variant
from torchfl.planner import plan_module
from torchfl.planner.api import plan_captured
from torchfl.planner.target import Target
from torchfl.planner.errors import HardConstraintError, StrictFallbackError, UnsupportedAttention


class Conv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        return self.conv(x)


def _no_nhwc(hcd):
    def edit(d):
        d["compute_units"]["fp16"]["supported_layouts"] = ["NCHW"]
        d["tensor"]["default_layout"] = "NCHW"

    return hcd_variant(hcd, edit)


def test_channels_last_on_a_chip_without_nhwc(chips):
    x = torch.randn(2, 8, 16, 16).to(memory_format=torch.channels_last)
    with pytest.raises(RuntimeError) as err:
        plan_module(Conv().eval(), (x,), chip=_no_nhwc(chips["NPU-V2"]), precision="float16")
    assert str(err.value) == "Layout channels_last not supported on NPU-V2"
    with pytest.raises(RuntimeError, match="^Layout channels_last not supported on EDGE-C2$"):
        plan_module(Conv().eval(), (x,), chip=chips["EDGE-C2"], precision="float16")


def test_channels_last_input_arrives_in_nhwc_where_supported(chips, packs):
    x = torch.randn(2, 8, 16, 16).to(memory_format=torch.channels_last)
    cap, _ = capture_of(Conv().eval(), (x,), "conv-cl")
    plan = plan_captured(cap, (x,), Target.of(chips["NPU-V2"], packs), precision="float16")
    assert next(i for i in plan.inputs if i.kind == "input").layout == "NHWC"


def _mha_capture():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(768, 12, batch_first=True).eval()

    class Wrap(nn.Module):
        def __init__(self):
            super().__init__()
            self.mha = mha

        def forward(self, x):
            return self.mha(x, x, x, need_weights=False)[0]

    x = torch.randn(1, 16, 768)
    return capture_of(Wrap().eval(), (x,), "mha12")


def test_multihead_attention_heads_not_supported(chips, packs):
    cap, x = _mha_capture()
    with pytest.raises(NotImplementedError) as err:
        plan_captured(cap, x, Target.of(chips["NPU-V2"], packs), precision="float16")
    # the article's words, then what fixes it: the chip's head counts and the model's option
    assert str(err.value).startswith("MultiheadAttention with num_heads=12 not supported on NPU-V2: its attention "
                                     "unit runs num_heads 1, 2, 4, 8 (HCD compute_units.attention.supported_heads)")
    assert "num_attention_heads" in str(err.value) and "--heads" in str(err.value)
    assert isinstance(err.value, UnsupportedAttention) and err.value.heads == 12
    # NPU-E1 lists 12 heads: no error, and the attention op is never rewritten into matmuls
    plan = plan_captured(cap, x, Target.of(chips["NPU-E1"], packs), precision="float16")
    assert any("aten.scaled_dot_product_attention.default" in s.ops for s in plan.steps)


def test_rank_above_max_rank(chips, packs):
    class Rank6(nn.Module):
        def forward(self, x):
            return (x.view(1, 2, 2, 2, 2, 2) * 2.0).sum()

    x = torch.randn(1, 32)
    cap, _ = capture_of(Rank6(), (x,), "rank6")
    with pytest.raises(HardConstraintError) as err:
        plan_captured(cap, (x,), Target.of(chips["NPU-V2"], packs), precision="float16")
    msg = str(err.value)
    assert "rank 6" in msg and "max_rank 5" in msg and "tensor.max_rank" in msg
    assert isinstance(err.value, RuntimeError) and err.value.limit == 5 and err.value.value == 6


def test_batch_above_max_batch_size(chips, packs):
    lin = nn.Linear(16, 16).eval()
    x = torch.randn(300, 16)
    cap, _ = capture_of(lin, (x,), "lin300")
    with pytest.raises(RuntimeError) as err:
        plan_captured(cap, (x,), Target.of(chips["NPU-V2"], packs), precision="float16")
    msg = str(err.value)
    assert msg.startswith("Batch size 300 of input") and "max_batch_size 256" in msg
    assert "constraints.max_batch_size" in msg


def test_sequence_above_the_attention_unit_limit(chips, packs):
    class Attn(nn.Module):
        def forward(self, q):
            return torch.nn.functional.scaled_dot_product_attention(q, q, q)

    q = torch.randn(1, 2, 300, 16)
    cap, _ = capture_of(Attn(), (q,), "attn300")
    with pytest.raises(RuntimeError) as err:
        plan_captured(cap, (q,), Target.of(chips["EDGE-C2"], packs), precision="float16")
    msg = str(err.value)
    assert "Sequence length 300" in msg and "256" in msg and "compute_units.attention.max_sequence_length" in msg


def test_sequence_above_the_chip_limit(chips, packs):
    emb = nn.Embedding(100, 8).eval()
    ids = torch.randint(0, 100, (1, 600))
    cap, _ = capture_of(emb, (ids,), "emb600")
    with pytest.raises(RuntimeError) as err:
        plan_captured(cap, (ids,), Target.of(chips["EDGE-C2"], packs), precision="float16")
    msg = str(err.value)
    assert "Sequence length 600" in msg and "max_sequence_length 512" in msg
    assert "constraints.max_sequence_length" in msg


def test_float32_without_fp32_unit_needs_a_precision_policy(chips, packs):
    lin = nn.Linear(16, 16).eval()
    x = torch.randn(4, 16)
    cap, _ = capture_of(lin, (x,), "lin4")
    with pytest.raises(RuntimeError) as err:
        plan_captured(cap, (x,), Target.of(chips["NPU-V3"], packs))
    msg = str(err.value)
    assert "float16, int8, bfloat16" in msg and "precision" in msg
    # a chip with an fp32 unit plans it as written
    plan = plan_captured(cap, (x,), Target.of(chips["TFL-X1"], packs))
    assert not plan.casts


def test_precision_policy_casts_are_visible_steps(chips, packs):
    lin = nn.Linear(16, 16).eval()
    x = torch.randn(4, 16)
    cap, _ = capture_of(lin, (x,), "lin4")
    plan = plan_captured(cap, (x,), Target.of(chips["NPU-V3"], packs), precision="float16")
    casts = [s for s in plan.steps if s.kind == "cast"]
    # weight, bias (static) and the input in; the output back to float32
    assert len(casts) == 4 and sum(s.static for s in casts) == 2
    assert plan.values[plan.outputs[0]].dtype == "float32"
    assert all(s.dtype == "float16" for s in plan.steps if s.kind in ("kernel", "fused"))


def test_strict_turns_every_fallback_into_one_error(chips, packs):
    class Odd(nn.Module):
        def forward(self, x):
            return torch.cummax(x, 1)[0], torch.flip(x, [1])

    x = torch.randn(2, 8)
    cap, _ = capture_of(Odd(), (x,), "odd")
    plan = plan_captured(cap, (x,), Target.of(chips["TFL-X1"], packs))
    assert len(plan.fallbacks) == 2 and all(f.reason for f in plan.fallbacks)
    with pytest.raises(StrictFallbackError) as err:
        plan_captured(cap, (x,), Target.of(chips["TFL-X1"], packs), strict=True)
    assert "cummax" in str(err.value) and "flip" in str(err.value) and len(err.value.fallbacks) == 2
