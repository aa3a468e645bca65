"""core 1.16.0's rules for division with a rounding mode (div.Tensor_mode, div.Scalar_mode,
floor_divide): planned on NPU-V3 with no fallback (strict) and equal to torch, compiled and on
the eager device. MoE routing's ``perm // top_k`` (int64 slots back to tokens) fell back in both
modes before (issue 48)."""
import pytest
import torch

from torchfl.planner import plan_module
from torchfl.runtime.executor import Executor


class Slots(torch.nn.Module):
    def forward(self, perm, x):
        tokens = perm // 2                                       # MoE: sorted slots -> tokens
        buckets = torch.div(x, 0.25, rounding_mode="floor")      # float floor
        trunc = torch.div(x, perm.view(-1, 1)[:4].float() + 1, rounding_mode="trunc")
        return tokens, buckets, trunc


def test_rounding_divisions_planned_whole_on_npu_v3():
    perm = torch.tensor([5, 0, 3, 7, 2, 6, 1, 4])
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(0)).half().float()
    plan = plan_module(Slots(), (perm, x), chip="NPU-V3", precision="float16", strict=True)
    assert "div_rounding" in {s.kernel for s in plan.steps}
    got = Executor(plan).run((perm, x))
    ref = Slots()(perm, x)
    assert torch.equal(got[0], ref[0])
    torch.testing.assert_close(got[1].float(), ref[1], rtol=0, atol=0)
    torch.testing.assert_close(got[2].float(), ref[2].half().float(), rtol=0, atol=0)


@pytest.mark.parametrize("mode", ["floor", "trunc"])
def test_rounding_divisions_on_the_eager_device(fp16_dev, monkeypatch, mode):
    monkeypatch.setenv("TORCHFL_STRICT", "1")
    perm = torch.tensor([5, -3, 3, 7, -2, 6, 1, 4])
    assert torch.equal((perm.to(fp16_dev) // 2).cpu(), perm // 2)
    assert torch.equal(torch.div(perm.to(fp16_dev), 3, rounding_mode=mode).cpu(), torch.div(perm, 3, rounding_mode=mode))
    x = torch.tensor([7.5, -7.5, 1e-3, float("nan")]).half()
    got = torch.div(x.to(fp16_dev), -2.0, rounding_mode=mode).cpu()
    torch.testing.assert_close(got, torch.div(x.float(), -2.0, rounding_mode=mode).half(), rtol=0, atol=0,
                               equal_nan=True)
