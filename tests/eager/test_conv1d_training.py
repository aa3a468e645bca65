"""Training a 1-D convolution under weight normalisation on the eager device: Wav2Vec2's positional
convolution (grouped Conv1d, weight norm over dim 2), forward, backward and a clipped SGD step, with
nothing on the host.

Before: the backward fell back twice per step, "Fallback to CPU: aten::convolution_backward (...
guard `input.rank == 4` is false ...)" and "aten::_weight_norm_interface_backward (no rule ...)": the
backward kernels are 2-D, and the weight norm's backward had no decomposition.

Tolerances: float32 on a chip with a float32 unit; the convolution gradients sum 2 x 40 products
per weight in another order than torch's CPU kernels (rtol 1e-4, atol 1e-6 of gradients ~1e-2)."""
import torch

from torchfl.runtime.eager.stats import ROUTES


def _fallbacks():
    return {str(op): n for (op, route), n in ROUTES.items() if route == "host fallback"}


def test_weight_normed_conv1d_trains_on_the_chip(fp32_dev):
    from torch.nn.utils.parametrizations import weight_norm

    torch.manual_seed(0)
    make = lambda: weight_norm(torch.nn.Conv1d(16, 16, 5, padding=2, groups=4), name="weight", dim=2)
    cpu = make()
    npu = make()
    npu.load_state_dict(cpu.state_dict())
    npu = npu.to(fp32_dev)
    x = torch.randn(2, 16, 40)
    before = _fallbacks()
    for model, xin in ((cpu, x), (npu, x.to(fp32_dev))):
        out = model(xin)
        out.square().mean().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
    assert _fallbacks() == before, f"the backward fell back: {set(_fallbacks().items()) - set(before.items())}"
    for (name, p), c in zip(npu.named_parameters(), cpu.parameters()):
        torch.testing.assert_close(p.grad.cpu(), c.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_plain_conv1d_backward_runs_on_the_chip(fp32_dev):
    """Strided, dilated Conv1d with a bias: input, weight and bias gradients on the chip."""
    torch.manual_seed(1)
    cpu = torch.nn.Conv1d(6, 8, 3, stride=2, padding=1, dilation=2)
    npu = torch.nn.Conv1d(6, 8, 3, stride=2, padding=1, dilation=2)
    npu.load_state_dict(cpu.state_dict())
    npu = npu.to(fp32_dev)
    x = torch.randn(3, 6, 17, requires_grad=True)
    xn = x.detach().to(fp32_dev).requires_grad_()
    before = _fallbacks()
    cpu(x).sum().backward()
    npu(xn).sum().backward()
    assert _fallbacks() == before
    torch.testing.assert_close(xn.grad.cpu(), x.grad, rtol=1e-5, atol=1e-6)
    for p, c in zip(npu.parameters(), cpu.parameters()):
        torch.testing.assert_close(p.grad.cpu(), c.grad, rtol=1e-5, atol=1e-5)
