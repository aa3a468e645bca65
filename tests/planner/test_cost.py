"""The cost model's decisions come from the numbers: the seed's matmul example and
metamorphic checks on HCD numbers."""

import pytest
import torch
from torch import nn

from tests.planner.planner_helpers import capture_of, captured, hcd_variant
from torchfl.planner.api import plan_captured
from torchfl.planner.target import Target


class MatMul(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.b = nn.Parameter(torch.randn(768, 1024))

    def forward(self, a):
        return a @ self.b


def _matmul_step(plan):
    steps = [s for s in plan.steps if s.kind == "kernel" and s.kernel == "matmul"]
    assert len(steps) == 1, [(s.kind, s.kernel) for s in plan.steps]
    return steps[0]


@pytest.mark.parametrize("batch, strategy", [(1, "resident"), (32, "streamed")])
def test_seed_matmul_small_is_resident_large_is_streamed(chips, packs, batch, strategy):
    a = torch.randn(batch, 1024, 768)
    cap, _ = capture_of(MatMul(), (a,), f"matmul{batch}")
    plan = plan_captured(cap, (a,), Target.of(chips["NPU-V3"], packs), precision="float16")
    step = _matmul_step(plan)
    assert step.tile["strategy"] == strategy
    assert step.tile["double_buffered"] is (strategy == "streamed")
    text = plan.explain()
    assert strategy in text and step.note in text  # explain says why


def test_a_bigger_cache_never_moves_more_bytes(chips, packs):
    from torchfl.kernels.chip import ChipModel
    from torchfl.planner.candidates import Generator
    from torchfl.planner.cost import Pricer
    from torchfl.planner.graph import build_ir

    base = chips["NPU-V3"]
    big = hcd_variant(base, lambda d: d["memory"]["on_chip_cache"].update(size_kb=2 * d["memory"]["on_chip_cache"]["size_kb"]))
    for name, opts in (("resnet18", {"image": 64}), ("mlp", {})):
        cap, x = captured(name, **opts)
        ir = build_ir(cap, "float16")
        priced = {}
        for hcd in (base, big):
            chip = ChipModel.from_hcd(hcd)
            cands = Generator(ir, hcd, packs, chip, Pricer(chip)).run()
            priced[hcd is big] = {o.key: o.payload.priced.bytes for o in cands.options if o.payload.kind != "fallback"}
        common = set(priced[False]) & set(priced[True])
        assert common
        assert all(priced[True][k] <= priced[False][k] for k in common)
    a = torch.randn(32, 1024, 768)
    cap, _ = capture_of(MatMul(), (a,), "matmul32")
    small = plan_captured(cap, (a,), Target.of(base, packs), precision="float16")
    large = plan_captured(cap, (a,), Target.of(big, packs), precision="float16")
    assert large.summary.predicted_bytes <= small.summary.predicted_bytes


def test_removing_nhwc_removes_every_nhwc_step(chips, packs):
    base = chips["NPU-V2"]

    def edit(d):
        d["compute_units"]["fp16"]["supported_layouts"] = ["NCHW"]
        d["tensor"]["default_layout"] = "NCHW"

    no_nhwc = hcd_variant(base, edit)
    cap, x = captured("resnet18", image=64)
    with_nhwc = plan_captured(cap, x, Target.of(base, packs), precision="float16")
    without = plan_captured(cap, x, Target.of(no_nhwc, packs), precision="float16")
    assert not any("NHWC" in (s.layout_out, *s.layouts_in) for s in without.steps)
    assert not any(v.layout == "NHWC" for v in without.values.values())


def test_no_attention_unit_never_gets_an_attention_kernel(chips, packs):
    cap, x = captured("bert-base", layers=1, num_heads=2, hidden=64, seq_len=16)
    plan = plan_captured(cap, x, Target.of(chips["DSP-M4"], packs), precision="float16")
    assert not any(s.kernel == "attention" for s in plan.steps)
    sdpa = "aten.scaled_dot_product_attention.default"
    # the core pack's decomposition (GEMM + softmax kernels), explicit in the plan, no fallback
    assert [d.op for d in plan.decomposed] == [sdpa] and not any(f.op == sdpa for f in plan.fallbacks)
    with_unit = plan_captured(cap, x, Target.of(chips["NPU-V3"], packs), precision="float16")
    assert any(s.kernel == "attention" for s in with_unit.steps) or any(f.op == sdpa for f in with_unit.fallbacks)


def test_resnet_block_tail_is_one_fused_kernel(chips, packs):
    """conv -> bn -> add(residual) -> relu closes every bottleneck block: one fused kernel
    (the sum never makes a round trip), because it is cheaper than conv2d_bn + add + relu."""
    cap, x = captured("resnet50", image=64)
    plan = plan_captured(cap, x, Target.of(chips["NPU-V3"], packs), precision="float16")
    tails = [s for s in plan.steps if s.kernel == "conv2d_bn_add_relu"]
    assert len(tails) == 16                      # 3 + 4 + 6 + 3 bottleneck blocks
    assert all(s.kind == "fused" and len(s.nodes) >= 4 for s in tails)
    assert not any(s.kernel == "add" for s in plan.steps)
