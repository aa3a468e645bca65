"""Transformer fusions end to end (real planner, real kernels): GPT-2's written-out
GELU-tanh runs as one gelu step, and matches eager torch at the fp16 tolerance."""
import math

import pytest
import torch
from torch import nn

from tests.runtime.models import rel_err
from torchfl.planner.api import plan_module

FP16_TOL = 1e-2   # end-to-end fp16 storage with fp32 accumulation, relative to max |ref|


class NewGELU(nn.Module):
    """transformers' NewGELUActivation (GPT-2's gelu_new); ``half`` other than 0.5 is not GELU."""

    def __init__(self, half=0.5):
        super().__init__()
        self.half = half

    def forward(self, x):
        return self.half * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def _mlp(half=0.5):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), NewGELU(half), nn.Linear(64, 16)).eval()


def test_gelu_new_is_one_gelu_step_and_matches_eager():
    m, x = _mlp(), torch.randn(2, 8, 32)
    plan = plan_module(m, (x,), "TFL-X1", precision="float16")
    kernels = [s.kernel for s in plan.steps if s.kernel]
    gelus = [s for s in plan.steps if s.kernel == "gelu"]
    assert len(gelus) == 1 and gelus[0].attrs.get("approximate") == "tanh", kernels
    assert not {"tanh", "pow"} & set(kernels)
    c = torch.compile(m, backend="torchfl", options={"chip": "TFL-X1", "precision": "float16"})
    with torch.no_grad():
        assert rel_err(c(x), m(x)) < FP16_TOL


@pytest.mark.parametrize("half", [0.25])
def test_not_quite_gelu_keeps_its_ops(half):
    m, x = _mlp(half), torch.randn(2, 8, 32)
    plan = plan_module(m, (x,), "TFL-X1", precision="float16")
    kernels = [s.kernel for s in plan.steps if s.kernel]
    assert "gelu" not in kernels and "tanh" in kernels


class Conv1DGelu(nn.Module):
    """GPT-2's MLP input: transformers' Conv1D (addmm with an un-transposed [K, N] weight) then
    gelu_new, or the plain gelu op."""

    def __init__(self, written_out=True):
        super().__init__()
        torch.manual_seed(0)
        self.w = nn.Parameter(torch.randn(32, 48) * 0.2)
        self.b = nn.Parameter(torch.randn(48) * 0.1)
        self.act = NewGELU() if written_out else nn.GELU(approximate="tanh")

    def forward(self, x):
        y = torch.addmm(self.b, x.view(-1, 32), self.w).view(*x.shape[:-1], 48)
        return self.act(y)


@pytest.mark.parametrize("written_out", [True, False])
def test_gelu_after_an_untransposed_addmm_runs_in_the_gemm_epilogue(written_out):
    m, x = Conv1DGelu(written_out).eval(), torch.randn(2, 8, 32)
    plan = plan_module(m, (x,), "TFL-X1", precision="float16")
    kernels = [s.kernel for s in plan.steps if s.kernel]
    fused = [s for s in plan.steps if s.kernel == "matmul_gelu"]
    assert len(fused) == 1 and fused[0].attrs.get("approximate") == "tanh", kernels
    assert not {"gelu", "tanh", "pow", "matmul"} & set(kernels)
    c = torch.compile(m, backend="torchfl", options={"chip": "TFL-X1", "precision": "float16"})
    with torch.no_grad():
        assert rel_err(c(x), m(x)) < FP16_TOL
