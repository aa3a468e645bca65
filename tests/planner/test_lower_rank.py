"""Views above rank 4 that only regroup data are planned at rank <= 4 (planner/decompose.
lower_rank): Swin's window partition (rank 6), BLOOM's fused q/k/v split (rank 5), Swin's
mask broadcast (rank 5) run on DSP-M4 (tensor.max_rank 4), exactly as eager; a chain that
cannot be lowered is still refused by name."""
import pytest
import torch

from torchfl.planner import plan_module
from torchfl.planner.errors import HardConstraintError
from torchfl.runtime.executor import Executor


class Windows(torch.nn.Module):
    def forward(self, x):                      # (B, H, W, C) -> (B * H/w * W/w, w, w, C), w = 4
        B, H, W, C = x.shape
        v = x.view(B, H // 4, 4, W // 4, 4, C)
        return v.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, 4, 4, C) * 2


class QKV(torch.nn.Module):
    def forward(self, x):                      # (B, L, H*3*D) -> three (B, L, H, D)
        B, L, _ = x.shape
        v = x.view(B, L, 4, 3, 8)
        return v[..., 0, :] + 1, v[..., 1, :] * 2, v[..., 2, :] - 1


class MaskBroadcast(torch.nn.Module):
    def forward(self, m, x):                   # m (4, 1, 16, 16) over a batch of 2: (8, 1, 16, 16)
        return m.unsqueeze(0).expand(2, -1, -1, -1, -1).contiguous().view(8, 1, 16, 16) + x


class Deep(torch.nn.Module):
    def forward(self, x):                      # a transpose of 5 independent dims: stays rank 5
        return x.view(2, 2, 2, 2, 2, 4).permute(5, 4, 3, 2, 1, 0).contiguous().view(8, 4, 4) + 1


def _run(model, *xs):
    plan = plan_module(model, xs, chip="DSP-M4", precision="float16", strict=True)
    got = Executor(plan).run(xs)
    ref = model(*xs)
    ref = ref if isinstance(ref, tuple) else (ref,)
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        torch.testing.assert_close(g.float(), r.float(), rtol=2e-3, atol=2e-3)
    return plan


@pytest.mark.parametrize("model,inputs", [
    (Windows(), (torch.randn(2, 8, 8, 32),)),
    (QKV(), (torch.randn(2, 16, 96),)),
    (MaskBroadcast(), (torch.randn(4, 1, 16, 16), torch.randn(8, 1, 16, 16))),
], ids=["swin-windows", "bloom-qkv", "swin-mask"])
def test_views_above_rank_4_run_on_a_max_rank_4_chip(model, inputs):
    plan = _run(model, *inputs)
    assert not plan.fallbacks


def test_a_chain_that_stays_above_rank_4_is_still_refused_by_name():
    with pytest.raises(HardConstraintError, match="tensor.max_rank"):
        plan_module(Deep(), (torch.randn(64, 2),), chip="DSP-M4", precision="float16")
