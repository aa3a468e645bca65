"""Kept parameters on the eager direct path (runtime/eager/kept.py): a conv's or linear's
weight is packed once and reused across calls, and a written weight is never served from
the kept copy. Each check compares the parameter's call bit for bit with the same call on
a plain copy of the weight (a tensor that is not a parameter: never kept, derived afresh),
and with the call before the write (the write must show)."""
import pytest
import torch
import torch.nn.functional as F

_CONVS = {   # (input shape, weight shape, stride, padding): the kernel paths ResNet-50 takes
    "pointwise_1x1": ((1, 32, 16, 16), (48, 32, 1, 1), 1, 0),
    "tiled_3x3": ((1, 16, 12, 12), (32, 16, 3, 3), 1, 1),
    "tiled_3x3_s2": ((1, 16, 12, 12), (24, 16, 3, 3), 2, 1),
    "one_tile_1x1_s2": ((1, 64, 8, 8), (40, 64, 1, 1), 2, 0),
}


def _writes(p, dev):
    """Ways a parameter gets written, each a different new value."""
    def step():
        opt = torch.optim.SGD([p], lr=0.5, foreach=False)
        p.grad = torch.randn(p.shape).to(p.dtype).to(dev)
        opt.step()
        p.grad = None

    def copy():
        with torch.no_grad():
            p.copy_(torch.randn(p.shape).to(p.dtype).to(dev))

    def view():
        with torch.no_grad():
            p.view(-1)[: p.numel() // 2].mul_(-3.0)

    def through_data():       # .data has a version counter of its own: write_back forgets
        p.data.mul_(0.5)

    def swap():
        p.data = torch.randn(p.shape).to(p.dtype).to(dev)

    def data_copy_from_host():     # the adapter's copy (C++), no version bump on p
        p.data.copy_(torch.randn(p.shape).to(p.dtype))

    def data_copy_on_device():
        p.data.copy_(torch.randn(p.shape).to(p.dtype).to(dev))

    def state_dict():
        p.requires_grad_(False)
        torch.nn.utils.vector_to_parameters(torch.randn(p.numel()).to(p.dtype).to(dev), [p])
        p.requires_grad_(True)

    return {"sgd_step": step, "copy_": copy, "view": view, ".data write": through_data, ".data swap": swap,
            ".data.copy_ from host": data_copy_from_host, ".data.copy_ on the device": data_copy_on_device,
            "vector_to_parameters": state_dict}


@pytest.mark.parametrize("case", sorted(_CONVS))
def test_conv_weight_kept_and_never_stale(case, fp16_dev):
    import gc

    from torchfl.kernels import frozen
    from torchfl.runtime.eager import device

    xs, ws, stride, pad = _CONVS[case]
    torch.manual_seed(7)
    x = torch.randn(xs).half().to(fp16_dev)
    p = torch.nn.Parameter(torch.randn(ws).half().to(fp16_dev))

    def conv(w):
        with torch.no_grad():
            return F.conv2d(x, w, None, stride, pad).cpu()

    def fresh():
        return conv(p.detach().clone())      # not a parameter: derived afresh every call

    gc.collect()           # (copies of earlier tests' freed weights go now, not during the count)
    before = frozen.cached_bytes()
    prev = conv(p)
    conv(p)
    assert frozen.is_frozen(device.buffer_at(p.untyped_storage().data_ptr()))
    assert frozen.cached_bytes() > before        # the weight's panels are kept
    for _ in range(2):
        assert torch.equal(conv(p), fresh())
    ref = F.conv2d(x.cpu().float(), p.detach().cpu().float(), None, stride, pad)
    assert float((prev.float() - ref).abs().max()) <= 2e-3 * float(ref.abs().max())
    for name, write in _writes(p, fp16_dev).items():
        write()
        got = conv(p)
        assert torch.equal(got, fresh()), f"{case}: stale weight after {name}"
        assert not torch.equal(got, prev), f"{case}: {name} did not change the output"
        prev = got


def test_one_weight_two_routes_follow_a_write(fp16_dev):
    """One parameter read by two routes (two input sizes): a write seen by the first route's
    call is seen by the second too."""
    torch.manual_seed(8)
    p = torch.nn.Parameter(torch.randn(32, 16, 3, 3).half().to(fp16_dev))
    xa = torch.randn(1, 16, 10, 10).half().to(fp16_dev)
    xb = torch.randn(1, 16, 14, 14).half().to(fp16_dev)
    with torch.no_grad():
        for _ in range(2):
            a0, b0 = F.conv2d(xa, p, padding=1).cpu(), F.conv2d(xb, p, padding=1).cpu()
        p.mul_(-1.0)
        a1 = F.conv2d(xa, p, padding=1).cpu()
        b1 = F.conv2d(xb, p, padding=1).cpu()
    assert torch.equal(a1, -a0) and torch.equal(b1, -b0)


def test_linear_weight_kept_and_never_stale(fp16_dev):
    """A classifier's linear (addmm on the weight's transposed view) reads its kept weight,
    and an optimizer step shows in the next call."""
    torch.manual_seed(9)
    lin = torch.nn.Linear(256, 40).half().to(fp16_dev)
    x = torch.randn(1, 256).half().to(fp16_dev)

    def fresh():       # new parameters of the same values: the same route (same sums), nothing kept
        w, b = (torch.nn.Parameter(t.detach().clone()) for t in (lin.weight, lin.bias))
        with torch.no_grad():
            return F.linear(x, w, b).cpu()

    with torch.no_grad():
        prev = lin(x).cpu()
        assert torch.equal(lin(x).cpu(), fresh())
    for name, write in _writes(lin.weight, fp16_dev).items():
        write()
        with torch.no_grad():
            got = lin(x).cpu()
        assert torch.equal(got, fresh()), f"stale weight after {name}"
        assert not torch.equal(got, prev), f"{name} did not change the output"
        prev = got


def test_linear_weight_read_in_place_not_converted(fp16_dev):
    """``F.linear`` hands ``addmm`` the weight's transposed view: the route reads the weight
    in place as one ``linear`` step (before: the view was copied into row-major order on every
    call, a converted input, and the GEMM packed it again). ``mm`` without a bias likewise;
    an ``addmm`` with alpha/beta other than 1 stays ``addmm``, and all are right."""
    from torchfl.runtime.eager import ops

    torch.manual_seed(10)
    w = torch.nn.Parameter(torch.randn(48, 96).half().to(fp16_dev))
    b = torch.nn.Parameter(torch.randn(48).half().to(fp16_dev))
    x = torch.randn(3, 96).half().to(fp16_dev)
    xc, wc, bc = x.cpu().float(), w.detach().cpu().float(), b.detach().cpu().float()
    cases = {"linear": (lambda: F.linear(x, w, b), xc @ wc.t() + bc),
             "mm": (lambda: x @ w.t(), xc @ wc.t()),
             "addmm_scaled": (lambda: torch.addmm(b, x, w.t(), beta=0.5, alpha=2.0), 0.5 * bc + 2.0 * (xc @ wc.t()))}
    with torch.no_grad():
        for name, (fn, ref) in cases.items():
            fn()
            before = ops.STATS["converted_inputs"]
            got = fn().cpu().float()
            assert float((got - ref).abs().max()) <= 2e-3 * float(ref.abs().max()), name
            if name != "addmm_scaled":
                assert ops.STATS["converted_inputs"] == before, f"{name}: the weight was converted"
    # chip routes only: a host route (another test's, on the same device) has no plan to read
    kernels = {tuple(s.kernel for s in r.plan.steps) for r in ops.routes() if getattr(r, "transposed", ())}
    assert ("linear",) in kernels
