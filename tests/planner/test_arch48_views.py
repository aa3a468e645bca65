"""Issue 48, 3a: rank lowering (planner/lowrank.lower_rank) must never make a view eager torch
would not make. GPT-J and CodeGen's rotary ``repeat_interleave(sin[:, :, None, :], 2, 3)`` reads
a slice of the sin/cos table (``torch.split`` on the last dim: stride 8, size 4): merging every
unexpanded dim into one view was ``RuntimeError: view size is not compatible with input
tensor's size and stride`` at planning, where eager torch runs the model (LLaMA's ``repeat_kv``
in float32 too). Dims merge only where the input's strides let them (the same elements, in the
same order, as eager); where that leaves more than 4 dims, the input is copied contiguous first
(``reshape``'s copy), so a max_rank 4 chip (DSP-M4) runs them too."""
import pytest
import torch

from torchfl.planner import plan_module
from torchfl.runtime.executor import Executor


class SliceInterleave(torch.nn.Module):
    """GPT-J's rotary: a split of a (B, L, 8) table, each half repeated twice along its last dim."""

    def forward(self, x):
        sin, cos = torch.split(x, x.shape[-1] // 2, dim=-1)
        sin = torch.repeat_interleave(sin[:, :, None, :], 2, 3)
        cos = torch.repeat_interleave(cos[:, :, None, :], 2, 3)
        return sin * 2 + cos


class PermutedInterleave(torch.nn.Module):
    """The same on a transposed input (dims 1 and 2 swapped): no two of B, L, D merge."""

    def forward(self, x):
        t = x.transpose(1, 2)                     # (B, D, L) with L's stride D
        return torch.repeat_interleave(t[:, :, None, :], 2, 3) + 1


class SliceWindows(torch.nn.Module):
    """view -> permute -> clone -> view on a slice: Swin's window partition of half the channels."""

    def forward(self, x):
        B, H, W, C = x.shape
        half = x[..., : C // 2]
        v = half.reshape(B, H // 4, 4, W // 4, 4, C // 2)
        return v.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, 4, 4, C // 2) * 2


class RepeatKV(torch.nn.Module):
    """LLaMA's ``repeat_kv`` of a transposed key (float32: no cast makes it contiguous first)."""

    def forward(self, k):                      # k (B, L, G, D) -> (B, G, L, D) -> (B, 2G, L, D)
        k = k.transpose(1, 2)
        B, G, L, D = k.shape
        return k[:, :, None, :, :].expand(B, G, 2, L, D).reshape(B, G * 2, L, D) * 2


@pytest.mark.parametrize("chip,precision", [("NPU-V3", "float16"), ("DSP-M4", "float16"), ("TFL-X1", None)])
@pytest.mark.parametrize("model,shape", [(SliceInterleave(), (2, 16, 8)), (PermutedInterleave(), (2, 16, 8)),
                                          (SliceWindows(), (2, 8, 8, 16)), (RepeatKV(), (2, 16, 2, 8))],
                         ids=["slice-interleave", "permuted-interleave", "slice-windows", "repeat-kv"])
def test_views_of_non_contiguous_inputs_plan_and_match_eager(model, shape, chip, precision):
    x = torch.randn(*shape)
    plan = plan_module(model, (x,), chip=chip, precision=precision)
    (got,) = Executor(plan).run((x,))
    tol = 2e-3 if precision else 1e-6
    torch.testing.assert_close(got.float(), model(x), rtol=tol, atol=tol)
    assert not plan.fallbacks
