"""core 1.20.0's index_put rules: the scatter that restores the tokens' order after the experts
(transformers' ``inv_perm[perm] = arange(S)``) planned on NPU-V3 with no fallback (strict),
compiled (``aten.index_put``) and on the eager device (``aten._index_put_impl``), int64 indices
and an int64 self as transformers builds them, and a float16 accumulate (``+=`` with repeated
indices). Before: no rule (``no scatter kernel``), 2 host ops per MoE forward in both modes."""
import torch

from torchfl.planner import plan_module
from torchfl.runtime.executor import Executor


class InversePermutation(torch.nn.Module):
    def forward(self, perm, rows):
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(perm.size(0))
        return inv, rows[inv]


class Accumulate(torch.nn.Module):
    def forward(self, x, idx, v):
        return torch.index_put(x, (idx,), v, accumulate=True)


def test_inverse_permutation_planned_whole_on_npu_v3():
    perm = torch.randperm(32, generator=torch.Generator().manual_seed(0))
    rows = torch.randn(32, 8)
    plan = plan_module(InversePermutation(), (perm, rows), chip="NPU-V3", precision="float16", strict=True)
    assert "index_put" in {s.kernel for s in plan.steps}
    got = Executor(plan).run((perm, rows))
    ref = InversePermutation()(perm, rows)
    assert torch.equal(got[0], ref[0])
    assert torch.equal(got[1].float(), ref[1].half().float())


def test_accumulate_planned_whole_on_npu_v3():
    x = torch.randn(6, 4).half()
    idx = torch.tensor([1, 1, 5, 0, 1])
    v = torch.randn(5, 4).half()
    plan = plan_module(Accumulate(), (x, idx, v), chip="NPU-V3", precision="float16", strict=True)
    (got,) = Executor(plan).run((x, idx, v))
    assert torch.equal(got, Accumulate()(x, idx, v))


def test_inverse_permutation_on_the_eager_device(fp16_dev, monkeypatch):
    monkeypatch.setenv("TORCHFL_STRICT", "1")
    perm = torch.randperm(32, generator=torch.Generator().manual_seed(0))
    inv = torch.empty_like(perm).to(fp16_dev)
    inv[perm.to(fp16_dev)] = torch.arange(32).to(fp16_dev)
    ref = torch.empty_like(perm)
    ref[perm] = torch.arange(32)
    assert torch.equal(inv.cpu(), ref)
    x = torch.zeros(6, 4).half()
    idx, v = torch.tensor([1, 1, 5]), torch.randn(3, 4).half()
    y = x.to(fp16_dev)
    y.index_put_((idx.to(fp16_dev),), v.to(fp16_dev), accumulate=True)
    assert torch.equal(y.cpu(), x.index_put((idx,), v, accumulate=True))
