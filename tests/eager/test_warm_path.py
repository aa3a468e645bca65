"""The warm paths of issue 19's speed work: a one-op plan run straight through its kernel
(ops.py's fast signature, direct.py), lazy mode's per-signature meta outputs, and weights
cached (and frozen) across lazy flushes keyed on their version counter, so a weight written
in place -- an optimizer step, ``copy_``, a write through a view, ``.data =`` -- is
re-derived at its next use and never served stale."""
import copy

import torch

from torchfl.planner.zoo import _resnet_classes


def _route_of(ops, op):
    return next(r for k, r in ops.fast_routes().items() if k[0] is op)


def test_one_op_warm_path_is_direct_and_exact(fp32_dev):
    from torchfl.runtime.eager import direct, ops

    torch.manual_seed(0)
    a, b = torch.randn(16, 16), torch.randn(16, 16)
    da, db = a.to(fp32_dev), b.to(fp32_dev)
    for _ in range(3):
        torch.testing.assert_close(torch.relu(da).cpu(), torch.relu(a), rtol=0, atol=0)
        torch.testing.assert_close((da + db).cpu(), a + b, rtol=0, atol=0)
        torch.testing.assert_close((da @ db).cpu(), a @ b, rtol=1e-5, atol=1e-5)
    route = _route_of(ops, torch.ops.aten.relu.default)
    assert isinstance(route.direct, direct.DirectRun)
    chip_ops = ops.STATS["chip_ops"]
    out = torch.relu(da)
    assert ops.STATS["chip_ops"] == chip_ops + 1 and out.device == torch.device(fp32_dev)
    assert out.data_ptr() != da.data_ptr() and out.data_ptr() % 256 == 0

    # a misaligned view (4 bytes into its buffer) is not the prepared input: the executor
    # converts it, as before; NaN and inf go through unchanged
    v = torch.tensor([0.0, float("nan"), -float("inf"), -2.0, 3.0])
    dv = v.to(fp32_dev)
    for _ in range(2):
        torch.testing.assert_close(torch.relu(dv[1:]).cpu(), torch.relu(v[1:]), rtol=0, atol=0, equal_nan=True)
    # a non-contiguous input and a channels-last one: other signatures, each right
    torch.testing.assert_close(torch.relu(da.t()).cpu(), torch.relu(a.t()), rtol=0, atol=0)
    x = torch.randn(1, 3, 4, 5)
    dx = x.to(fp32_dev).contiguous(memory_format=torch.channels_last)
    for _ in range(2):
        torch.testing.assert_close(torch.relu(dx).cpu(), torch.relu(x), rtol=0, atol=0)
    # an in-place op writes through the same route; an empty tensor still works
    dc = da.clone()
    dc.relu_()
    torch.testing.assert_close(dc.cpu(), torch.relu(a), rtol=0, atol=0)
    assert torch.relu(torch.empty(0, 3, device=fp32_dev)).shape == (0, 3)


def test_fast_signature_tells_scalars_apart(fp32_dev):
    """1, 1.0 and True are equal in Python: the signature keeps their types apart, so each
    gets its own plan (an int32 tensor plus 1.5 is float32, plus 1 stays int32)."""
    add = torch.ops.aten.add.Scalar
    xi = torch.arange(4, dtype=torch.int32)
    d = xi.to(fp32_dev)
    for _ in range(2):
        r_int, r_float = add(d, 1), add(d, 1.5)
        assert r_int.dtype == torch.int32 and r_float.dtype == torch.float32
        torch.testing.assert_close(r_int.cpu(), add(xi, 1), rtol=0, atol=0)
        torch.testing.assert_close(r_float.cpu(), add(xi, 1.5), rtol=0, atol=0)
        torch.testing.assert_close(add(d, True).cpu(), add(xi, True), rtol=0, atol=0)


def _small_resnet18():
    basic, _bottleneck, resnet = _resnet_classes()
    torch.manual_seed(0)
    return resnet(basic, [2, 2, 2, 2]).eval(), torch.randn(1, 3, 32, 32)


def _close(got, ref):
    scale = max(float(ref.abs().max()), 1e-6)
    assert float((got.cpu() - ref).abs().max()) <= 1e-4 * scale
    return ref


def test_lazy_weights_follow_in_place_writes(fp32_dev):
    """Lazy ResNet-18: forward, an SGD step on the npu weights, forward again -- equal to CPU
    after the step (the cached static values and frozen copies are re-derived); the same for
    a write through a view, a ``copy_`` and a ``.data`` swap. The graph is planned once."""
    from torchfl.kernels import frozen
    from torchfl.runtime.eager import lazy

    cpu, x = _small_resnet18()
    npu = copy.deepcopy(cpu).to(fp32_dev)
    xn = x.to(fp32_dev)

    def check():
        with torch.no_grad():
            ref = cpu(x)
            with torch.npu.lazy():
                got = npu(xn)
        return _close(got, ref)

    def changed(before, after):           # the write moved the output: a stale cache would show
        assert float((after - before).abs().max()) > 1e-2 * float(before.abs().max())
        return after

    out = check()
    planned = lazy.STATS["graphs_planned"]
    check()
    assert frozen.cached_bytes() > 0              # the classifier's GEMM keeps its weight packed
    grads = [0.1 * torch.randn(p.shape) for p in cpu.parameters()]
    for model in (cpu, npu):                      # an optimizer step, on each side
        opt = torch.optim.SGD(model.parameters(), lr=0.5, foreach=False)
        dev = next(model.parameters()).device
        for p, g in zip(model.parameters(), grads):
            p.grad = g.to(dev)
        opt.step()
    out = changed(out, check())
    with torch.no_grad():
        for model in (cpu, npu):
            model.fc.weight.t()[3:7].mul_(-2.0)   # a write through a view of the weight
    out = changed(out, check())
    new = torch.randn_like(cpu.conv1.weight)
    with torch.no_grad():
        cpu.conv1.weight.copy_(new)
        npu.conv1.weight.copy_(new.to(fp32_dev))
    out = changed(out, check())
    swapped = torch.randn_like(cpu.fc.weight)
    cpu.fc.weight.data = swapped
    npu.fc.weight.data = swapped.to(fp32_dev)
    changed(out, check())
    assert lazy.STATS["graphs_planned"] == planned  # the same graph throughout: planned once


def test_lazy_records_lists_tuples_and_named_outputs(fp32_dev):
    """The recorder's argument forms: tensors inside a list (cat), a list of ints (sum over
    dims), a tuple of outputs (batch-norm), a named tuple (max over a dim); recorded twice, so
    the second time every op's outputs come from the per-signature meta cache."""
    torch.manual_seed(3)
    a, b = torch.randn(2, 3, 4, 4), torch.randn(2, 3, 4, 4)
    bn = torch.nn.BatchNorm2d(6).eval()
    bn.running_mean.uniform_(-1, 1)
    npu_bn = copy.deepcopy(bn).to(fp32_dev)

    def f(x, y, norm):
        z = norm(torch.cat([x, y], 1))
        m = z.max(dim=3)
        return z.sum([2, 3]) + m.values.sum(2), m.indices

    ref = f(a, b, bn)
    da, db = a.to(fp32_dev), b.to(fp32_dev)
    with torch.no_grad():
        for _ in range(2):
            with torch.npu.lazy():
                got = f(da, db, npu_bn)
            torch.testing.assert_close(got[0].cpu(), ref[0], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(got[1].cpu(), ref[1], rtol=0, atol=0)


def test_signatures_keep_signed_zero_and_nan(fp32_dev):
    """0.0 == -0.0 in Python, and NaN is not equal to itself: the signatures neither merge
    the two zeros into one route nor make a new route per NaN call, and the planner's shared
    per-signature cache below them does not merge them either (x * -0.0 is -0 for x > 0)."""
    from torchfl.runtime.eager import ops

    mul = torch.ops.aten.mul.Scalar
    x = torch.tensor([1.0, -2.0])
    d = x.to(fp32_dev)
    ops.clear_cache()
    sizes = []
    for _ in range(3):
        for s in (0.0, -0.0, float("nan")):
            got, ref = mul(d, s).cpu(), mul(x, s)
            torch.testing.assert_close(got, ref, rtol=0, atol=0, equal_nan=True)
            assert torch.equal(torch.signbit(got), torch.signbit(ref)), (s, got)   # assert_close: -0 == +0
        sizes.append(len(ops.fast_routes()))
    # The dispatcher may hand the call over as mul.Scalar or mul.Tensor (the first call of a
    # process arrives as the latter): a route per (overload, scalar), found by the scalar's key.
    routes = {repr(s): {id(r) for k, r in ops.fast_routes().items() if k[-1] == ("float", s.hex())}
              for s in (0.0, -0.0, float("nan"))}
    assert sizes[-1] == sizes[-2], sizes                  # no new route per NaN (or any) call
    assert all(1 <= len(r) <= 2 for r in routes.values()), routes
    assert not routes["0.0"] & routes["-0.0"]


def test_compiled_on_npu_follows_optimizer_steps(fp16_dev):
    """torch.compile on npu tensors runs the same eager executor, frozen weights included
    (NPU-V3 keeps float16 linear weights decoded to float32): after an optimizer step the
    compiled model reads the new weights, without a recompile. Reference: CPU float32 on the
    npu model's float16 weights (float16 activations: atol 3e-2 on values of order 1)."""
    torch.manual_seed(4)
    npu = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)).eval()
    npu = npu.half().to(fp16_dev)
    x = torch.randn(2, 16)
    compiled = torch.compile(npu, backend="torchfl", options={"chip": "NPU-V3"})
    grads = [torch.randn(p.shape).half().to(fp16_dev) for p in npu.parameters()]
    with torch.no_grad():
        for step in range(3):
            ref = copy.deepcopy(npu).cpu().float()(x)
            for _ in range(2):
                got = compiled(x.half().to(fp16_dev)).cpu().float()
                torch.testing.assert_close(got, ref, rtol=0, atol=3e-2)
            for p, g in zip(npu.parameters(), grads):
                p.sub_(0.2 * g)


def test_thaw_drops_derived_copies(fp32_dev):
    """``frozen.thaw``: the owner will write the buffer, so its derived copies go (and are
    no longer made) until it is frozen again."""
    import numpy as np

    from torchfl.kernels import frozen
    from torchfl.runtime.eager import device

    t = torch.zeros(64, device=fp32_dev)
    buf = device.buffer_at(t.untyped_storage().data_ptr())
    before = frozen.cached_bytes()
    frozen.freeze(buf)
    assert frozen.derived(buf, "k", lambda: np.ones(8)) is not None
    assert frozen.cached_bytes() == before + 64
    frozen.thaw(buf)
    assert frozen.cached_bytes() == before and not frozen.is_frozen(buf)
    assert frozen.derived(buf, "k", lambda: np.ones(8)) is None


def test_environment_flags_follow_every_change_between_warm_calls(fp32_dev, fp16_dev, monkeypatch):
    """The warm path parses TORCHFL_STRICT / TORCHFL_PRECISION only when their raw values
    change: each set, change and unset between two calls of one warm signature still takes
    effect at the next call, both ways."""
    import pytest

    x = torch.randn(4, 4, device=fp32_dev)
    for _ in range(2):
        torch.flip(x, [0])                                   # warm: a host fallback route
    for strict in ("1", "0", "yes", "off", "true"):
        monkeypatch.setenv("TORCHFL_STRICT", strict)
        if strict in ("1", "yes", "true"):
            with pytest.raises(RuntimeError, match="strict"):
                torch.flip(x, [0])
        else:
            torch.testing.assert_close(torch.flip(x, [0]).cpu(), torch.flip(x.cpu(), [0]))
    monkeypatch.delenv("TORCHFL_STRICT")
    torch.flip(x, [0])
    d = torch.randn(8, 8).to(fp16_dev)                         # float32 on a float16-only chip
    for _ in range(2):
        monkeypatch.setenv("TORCHFL_PRECISION", "float16")
        assert torch.mm(d, d).dtype == torch.float32
        monkeypatch.delenv("TORCHFL_PRECISION")
        with pytest.raises(Exception, match="float16"):
            torch.mm(d, d)


def test_eval_batch_norm_is_one_direct_kernel_with_empty_statistics(fp16_dev):
    """An inference batch-norm returns its saved statistics empty, as torch on the CPU does
    (shape (0,), the input's dtype), now without planning them: they were two extra cast
    steps (of empty values) that kept the op off the direct path. The output is the same
    kernel's."""
    from torchfl.runtime.eager import direct, ops

    torch.manual_seed(5)
    bn = torch.nn.BatchNorm2d(6).eval()
    bn.running_mean.uniform_(-1, 1)
    bn.running_var.uniform_(0.5, 2)
    x = torch.randn(1, 6, 5, 7)
    args = [t.half() for t in (x, bn.weight.detach(), bn.bias.detach(), bn.running_mean, bn.running_var)]
    ref = torch.ops.aten.native_batch_norm.default(*args, False, 0.1, 1e-5)
    dargs = [t.to(fp16_dev) for t in args]
    for _ in range(3):
        got = torch.ops.aten.native_batch_norm.default(*dargs, False, 0.1, 1e-5)
        assert [(tuple(t.shape), t.dtype) for t in got] == [(tuple(t.shape), t.dtype) for t in ref]
        torch.testing.assert_close(got[0].cpu().float(), ref[0].float(), rtol=0, atol=4e-3)
    # this call's own route (by its fast key): another test on this worker may have left a
    # training-mode batch-norm route on the same device, which _route_of could pick first
    key, _, dev = ops.fast_key(torch.ops.aten.native_batch_norm.default, [*dargs, False, 0.1, 1e-5])
    route = dev.fast_routes[key]
    assert [s.kernel for s in route.plan.steps] == ["batch_norm_infer"]
    assert isinstance(route.direct, direct.DirectRun)
    with torch.no_grad():                                  # the module path reads output 0
        torch.testing.assert_close(bn.half().to(fp16_dev)(dargs[0]).cpu(), got[0].cpu(), rtol=0, atol=0)
