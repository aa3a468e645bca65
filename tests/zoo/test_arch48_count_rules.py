"""core 1.15.0's histc rule: MoE tokens per expert planned on NPU-V3 with no fallback (strict),
compiled and on the eager device (float ids, as transformers passes them on CPU). int32 ids (as
it passes them on any other device: CUDA's histc counts integers): torch's meta kernel of histc
refuses integers on CPU tensors, so the op could not be traced and ran on the host (before that it
crashed: issue 48, 3c); the eager device traces it over meta-device examples (the check is CPU's
alone) and the histc kernel counts int32/int64 on the chip (issue 48: every MoE forward's host step)."""
import pytest
import torch

from torchfl.planner import plan_module
from torchfl.runtime.executor import Executor


class TokensPerExpert(torch.nn.Module):
    def forward(self, expert_ids):
        counts = torch.histc(expert_ids.float(), bins=8, min=0, max=7)
        return counts * 1, torch.cumsum(counts, dim=0, dtype=torch.int32)     # core 1.19.0: offsets


def test_tokens_per_expert_planned_whole_on_npu_v3():
    ids = torch.randint(0, 8, (24, 2), generator=torch.Generator().manual_seed(0))
    plan = plan_module(TokensPerExpert(), (ids,), chip="NPU-V3", precision="float16", strict=True)
    assert {"histc", "offsets"} <= {s.kernel for s in plan.steps}
    got = Executor(plan).run((ids,))
    ref = TokensPerExpert()(ids)
    assert torch.equal(got[0].float(), ref[0]) and torch.equal(got[1], ref[1])


def test_expert_counts_on_the_eager_device(fp16_dev, monkeypatch):
    monkeypatch.setenv("TORCHFL_STRICT", "1")
    ids = torch.randint(0, 8, (24, 2), generator=torch.Generator().manual_seed(0))
    got = torch.histc(ids.half().to(fp16_dev), bins=8, min=0, max=7)
    assert got.dtype == torch.float16
    assert torch.equal(got.cpu().float(), torch.histc(ids.float(), bins=8, min=0, max=7))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_int_expert_ids_on_the_eager_device(fp16_dev, monkeypatch, dtype):
    """int ids on the chip (strict: no host fallback), counted as CUDA counts them."""
    monkeypatch.setenv("TORCHFL_STRICT", "1")
    ids = torch.randint(0, 8, (24, 2), generator=torch.Generator().manual_seed(0)).to(dtype)
    got = torch.histc(ids.to(fp16_dev), bins=8, min=0, max=7)
    assert got.dtype == dtype
    assert torch.equal(got.cpu(), torch.histc(ids.double(), bins=8, min=0, max=7).to(dtype))
