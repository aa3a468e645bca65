"""Issue 33, item 1 (end): what torch's RNG, autocast, GradScaler, checkpointing and sdpa with
dropout ask a device module for. Before: ``module 'torchfl.runtime.eager.module' has no
attribute 'get_rng_state'``; ``torch.autocast("npu")`` raised "the module miss some
necessary funcs", and with that fixed every op raised "Could not run 'aten::linear' with
arguments from the 'Autocastnpu' backend".

Tolerances: npu:0 is TFL-X1 (float32, float16 and bfloat16 units). Autocast float16 results
are compared with CPU autocast float16 on the same weights: the same casts, products in
float16 with float32 accumulation in another order, 2e-3 of the largest magnitude (two
float16 ulps). Random draws are exact (the same generator algorithm on the host).
"""
import pytest
import torch
import torch.nn.functional as F


def test_rng_state_round_trip_and_own_stream(fp32_dev):
    torch.npu.manual_seed(5)
    state = torch.npu.get_rng_state(fp32_dev)
    a = torch.randn(6, device=fp32_dev)
    torch.npu.set_rng_state(state, fp32_dev)
    b = torch.randn(6, device=fp32_dev)
    assert torch.equal(a.cpu(), b.cpu())
    # npu draws use the device's generator: the CPU stream is not advanced by them
    torch.manual_seed(0)
    c1 = torch.randn(3)
    torch.manual_seed(0)
    torch.randn(100, device=fp32_dev)
    c2 = torch.randn(3)
    assert torch.equal(c1, c2)
    # torch.manual_seed seeds the device too (through torch.npu.manual_seed_all)
    torch.manual_seed(7)
    d1 = torch.rand(4, device=fp32_dev).cpu()
    torch.manual_seed(7)
    d2 = torch.rand(4, device=fp32_dev).cpu()
    assert torch.equal(d1, d2)
    assert len(torch.npu.get_rng_state_all()) == torch.npu.device_count()


def test_fork_rng_restores_the_device_stream(fp32_dev):
    torch.npu.manual_seed(11)
    with torch.random.fork_rng(devices=[fp32_dev], device_type="npu"):
        torch.randn(10, device=fp32_dev)
    x = torch.randn(3, device=fp32_dev).cpu()
    torch.npu.manual_seed(11)
    assert torch.equal(x, torch.randn(3, device=fp32_dev).cpu())


def test_sdpa_with_dropout_is_reproducible(fp32_dev):
    q, k, v = (torch.randn(1, 2, 8, 16).to(fp32_dev) for _ in range(3))
    torch.npu.manual_seed(3)
    a = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    torch.npu.manual_seed(3)
    b = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    c = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    assert torch.equal(a.cpu(), b.cpu())
    assert not torch.equal(b.cpu(), c.cpu())          # the stream moved on


def test_checkpoint_with_dropout_matches_plain_backward(fp32_dev):
    """``torch.utils.checkpoint`` saves and restores the device's RNG state around the
    recomputation: the recomputed dropout mask is the forward's, so gradients match."""
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Dropout(0.3), torch.nn.GELU(),
                                torch.nn.Linear(32, 16)).to(fp32_dev)
    x = torch.randn(4, 16).to(fp32_dev)
    grads = []
    for use_ckpt in (False, True):
        block.zero_grad()
        torch.npu.manual_seed(42)
        if use_ckpt:
            y = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
        else:
            y = block(x)
        y.square().sum().backward()
        grads.append([p.grad.cpu().clone() for p in block.parameters()])
    for g0, g1 in zip(*grads):
        assert torch.allclose(g0, g1, rtol=1e-6, atol=1e-6)


def test_autocast_float16_policy(fp32_dev):
    torch.manual_seed(1)
    lin = torch.nn.Linear(32, 16)
    x = torch.randn(8, 32)
    ln, xn = lin.to(fp32_dev), x.to(fp32_dev)
    with torch.autocast("npu", dtype=torch.float16):
        y = ln(xn)                       # lower precision: float16
        s = torch.softmax(y, -1)         # needs float32's range: float32
        cat = torch.cat([y, xn[:, :16]])  # promoted to the widest
    assert (y.dtype, s.dtype, cat.dtype) == (torch.float16, torch.float32, torch.float32)
    lin_cpu = torch.nn.Linear(32, 16)
    lin_cpu.load_state_dict({k: v.cpu() for k, v in ln.state_dict().items()})
    with torch.autocast("cpu", dtype=torch.float16):
        ref = lin_cpu(x)
    assert ref.dtype == torch.float16
    scale = float(ref.float().abs().max())
    assert float((y.cpu().float() - ref.float()).abs().max()) <= 2e-3 * scale
    # outside the region nothing is cast
    assert ln(xn).dtype == torch.float32


def test_autocast_gradients_of_float32_parameters_are_float32(fp32_dev):
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(fp32_dev)
    x, t = torch.randn(8, 16).to(fp32_dev), torch.randint(0, 4, (8,)).to(fp32_dev)
    with torch.autocast("npu", dtype=torch.float16):
        loss = F.cross_entropy(model(x), t)
    assert loss.dtype == torch.float32
    loss.backward()
    assert all(p.grad.dtype == torch.float32 and p.grad.device == torch.device(fp32_dev)
               for p in model.parameters())


def test_grad_scaler_skips_a_step_with_inf_and_halves_the_scale(fp32_dev):
    torch.manual_seed(3)
    model = torch.nn.Linear(8, 2).to(fp32_dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("npu", init_scale=2.0 ** 10)
    x = torch.randn(4, 8).to(fp32_dev)
    before = [p.detach().cpu().clone() for p in model.parameters()]
    with torch.autocast("npu", dtype=torch.float16):
        loss = model(x).float().square().mean()
    scaler.scale(loss).backward()
    model.weight.grad[0, 0] = float("inf")          # an overflowed gradient
    scaler.step(opt)
    scaler.update()
    assert all(torch.equal(b, p.detach().cpu()) for b, p in zip(before, model.parameters()))   # skipped
    assert scaler.get_scale() == 2.0 ** 9
    opt.zero_grad()
    with torch.autocast("npu", dtype=torch.float16):
        loss = model(x).float().square().mean()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    assert not torch.equal(before[0], model.weight.detach().cpu())                             # stepped
    assert scaler.get_scale() == 2.0 ** 9


@pytest.mark.parametrize("fn", ["is_bf16_supported", "initial_seed"])
def test_device_module_answers(fp32_dev, fn):
    assert getattr(torch.npu, fn)() is not None
