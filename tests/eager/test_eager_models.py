"""Whole models on the npu device: ResNet-18 forward and a training step on npu:0 against
CPU, an MLP trained on another chip, lazy mode's fused plans, and torch.compile taking
npu tensors.

Tolerances: npu:0 is TFL-X1, which has a float32 unit; its kernels accumulate in float32
in another order than MKL, so forward outputs agree to ~1e-5 relative (checked at 1e-4 of
the largest magnitude) and each parameter's gradient, after ~60 more reductions and
training-mode batch-norms, to ~2e-5 in relative norm (checked at 5e-4; measured: 1.7e-5 at
64x64, batch 2; at 32x32 layer4's batch-norm sees 2 values per channel and amplifies
rounding to 1 %, so the test uses 64x64). npu:1 (NPU-V3) computes
in float16: the MLP is compared against CPU float32 on the same float16 weights, within
float16's resolution (2^-10) times the depth of the sums (atol 3e-2 on values of order 1).
"""
import copy

import pytest
import torch

from torchfl.planner.zoo import _resnet_classes


def _resnet18(image=64, batch=2):
    basic, _bottleneck, resnet = _resnet_classes()
    torch.manual_seed(0)
    return resnet(basic, [2, 2, 2, 2]), torch.randn(batch, 3, image, image)


def _close(got, ref, rel):
    scale = max(float(ref.abs().max()), 1e-6)
    assert float((got.detach().cpu().float() - ref.float()).abs().max()) <= rel * scale


def _close_norm(got, ref, rel):
    ref = ref.detach().float()
    err = float((got.detach().cpu().float() - ref).norm())
    scale = max(float(ref.norm()), 1e-12)
    assert err <= rel * scale, err / scale


def test_resnet18_forward_and_training_step(fp32_dev):
    from torchfl.runtime.eager import ops

    model, x = _resnet18()
    cpu = copy.deepcopy(model)
    npu = copy.deepcopy(model).to(fp32_dev)
    cpu.eval(), npu.eval()
    with torch.no_grad():
        ref = cpu(x)
        before = dict(ops.STATS)
        got = npu(x.to(fp32_dev))
    assert got.device == torch.device(fp32_dev)
    _close(got, ref, 1e-4)
    assert ops.STATS["host_fallback_ops"] == before.get("host_fallback_ops", 0)   # every op on the chip
    # one training step (batch-norm in training mode, SGD with momentum)
    cpu.train(), npu.train()
    target = torch.randint(0, 1000, (x.shape[0],))
    for model_, xx, tt in ((cpu, x, target), (npu, x.to(fp32_dev), target.to(fp32_dev))):
        opt = torch.optim.SGD(model_.parameters(), lr=0.05, momentum=0.9)
        loss = torch.nn.functional.cross_entropy(model_(xx), tt)
        loss.backward()
        opt.step()
    for (name, p), q in zip(cpu.named_parameters(), npu.parameters()):
        assert q.device == torch.device(fp32_dev)
        _close_norm(q.grad, p.grad, 5e-4)
        _close_norm(q, p, 5e-4)                            # biases start at 0: the step is all of them
    for (name, b), c in zip(cpu.named_buffers(), npu.buffers()):
        _close(c, b, 1e-4)                                     # running statistics


def test_mlp_trains_on_another_chip(fp16_dev):
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).half()
    ref = copy.deepcopy(model).float()
    npu = model.to(fp16_dev)
    x, y = torch.randn(16, 32), torch.randn(16, 8)
    losses = []
    for step in range(3):
        out = npu(x.half().to(fp16_dev))
        loss = ((out - y.half().to(fp16_dev)) ** 2).mean()
        npu.zero_grad()
        loss.backward()
        losses.append(loss.item())
        if step == 0:
            ref_loss = ((ref(x) - y) ** 2).mean()
            ref_loss.backward()
            for p, q in zip(ref.parameters(), npu.parameters()):
                assert q.grad.device == torch.device(fp16_dev) and q.grad.dtype == torch.float16
                torch.testing.assert_close(q.grad.cpu().float(), p.grad, rtol=3e-2, atol=3e-2)
        with torch.no_grad():
            for q in npu.parameters():
                q -= 0.05 * q.grad
    assert losses[-1] < losses[0]


def test_lazy_mode_fuses_and_matches_eager(fp32_dev):
    from torchfl.runtime.eager import lazy

    class ConvBlock(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.bn = torch.nn.BatchNorm2d(8)

        def forward(self, x):
            return torch.relu(self.bn(self.conv(x))).mean((2, 3))

    torch.manual_seed(2)
    block = ConvBlock().eval().to(fp32_dev)
    x = torch.randn(2, 3, 8, 8).to(fp32_dev)
    with torch.no_grad():
        eager_out = block(x).cpu()
        with torch.npu.lazy():
            y = block(x)
            flushes = lazy.STATS["flushes"]
        assert lazy.STATS["flushes"] == flushes + 1          # leaving the block ran the graph
        plan = lazy.last_plan()
        fused = [s for s in plan.steps if s.kind == "fused"]
        assert fused and any(len(s.ops) >= 3 for s in fused), [s.kernel for s in plan.steps]
        torch.testing.assert_close(y.cpu(), eager_out, rtol=1e-5, atol=1e-5)
        planned = lazy.STATS["graphs_planned"]
        with torch.npu.lazy():
            y2 = block(x)
        assert lazy.STATS["graphs_planned"] == planned       # the same graph: planned once
        torch.testing.assert_close(y2.cpu(), eager_out, rtol=1e-5, atol=1e-5)
        with torch.npu.lazy():                               # a sync point inside the block
            z = block(x) * 2
            assert abs(z[0, 0].item() - 2 * float(eager_out[0, 0])) < 1e-4


def test_torch_compile_takes_npu_tensors(fp32_dev):
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).to(fp32_dev)
    x = torch.randn(4, 16).to(fp32_dev)
    ref = model(x).cpu()
    compiled = torch.compile(model, backend="torchfl", options={"chip": "TFL-X1"})
    with torch.no_grad():
        got = compiled(x)
    assert got.device == torch.device(fp32_dev)
    torch.testing.assert_close(got.cpu(), ref, rtol=1e-5, atol=1e-5)
