"""The adapter's C++ fast path (``adapter.cpp``: ``FastKernel``): a functional op whose
signature was seen before runs its route's bound kernel without the Python router. Each
result must be bit-identical to the router's path on the same inputs (the router is forced by
the adapter's bypass, as in an optimizer step), and everything the fast path does not know
(a tensor list, an argument it cannot key, lazy mode, a kernel error) behaves as before."""
import gc
import re

import pytest
import torch


def _adapter():
    from torchfl.runtime.eager import ensure_adapter

    return ensure_adapter()


def _bits(t):
    """The tensor's bytes as integers (NaN payloads and -0.0 compared exactly)."""
    t = t.detach().cpu().contiguous()
    if t.dtype in (torch.float16, torch.bfloat16):
        return t.view(torch.int16)
    if t.dtype == torch.float32:
        return t.view(torch.int32)
    return t


def _both_paths(fn):
    """``fn()`` through the C++ fast path (a cached signature) and through the Python router,
    with the number of fast-path hits each took."""
    ad = _adapter()
    fn()
    fn()                               # the signature is cached now (its route has a direct form)
    before = ad.fast_stats()["hits"]
    fast = fn()
    fast_hits = ad.fast_stats()["hits"] - before
    ad.set_bypass(1, 1)                # what an optimizer step does: the router decides every call
    try:
        before = ad.fast_stats()["hits"]
        slow = fn()
        slow_hits = ad.fast_stats()["hits"] - before
    finally:
        ad.set_bypass(1, 0)
    return fast, slow, fast_hits, slow_hits


def _special(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    flat = x.view(-1)
    flat[: min(6, flat.numel())] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 65504.0])[
        : min(6, flat.numel())]
    return x.to(dtype)


@pytest.mark.parametrize("case", ["relu", "add", "add_alpha", "mul", "mul_number", "mm", "matmul", "addmm", "conv", "relu_t",
                                  "add_strided", "relu_empty"])
def test_fast_path_is_bit_identical_to_the_router(case, fp16_dev):
    h = torch.float16
    a = _special((16, 16), h).to(fp16_dev)
    b = _special((16, 16), h, seed=1).to(fp16_dev)
    bias = _special((16,), h, seed=2).to(fp16_dev)
    x = _special((1, 4, 8, 8), h, seed=3).to(fp16_dev)
    w = _special((8, 4, 3, 3), h, seed=4).to(fp16_dev)
    wide = _special((16, 32), h, seed=5).to(fp16_dev)
    fns = {
        "relu": lambda: torch.relu(a),
        "add": lambda: a + b,
        "add_alpha": lambda: torch.add(a, b, alpha=2),
        "mul": lambda: a * b,
        "mul_number": lambda: 0.5 * a,                              # a wrapped number: a value in the key
        "mm": lambda: torch.mm(a, b),
        "matmul": lambda: a @ b,                                    # aten::matmul (composite) -> mm
        "addmm": lambda: torch.addmm(bias, a, b),
        "conv": lambda: torch.nn.functional.conv2d(x, w, padding=1),
        "relu_t": lambda: torch.relu(a.t()),                        # non-contiguous input
        "add_strided": lambda: wide[:, ::2] + b,                    # a strided view
        "relu_empty": lambda: torch.relu(torch.empty(0, 16, dtype=h, device=fp16_dev)),
    }
    fast, slow, fast_hits, slow_hits = _both_paths(fns[case])
    assert slow_hits == 0
    if case in ("relu", "add", "mul", "mul_number", "mm", "matmul", "addmm", "conv"):
        assert fast_hits == 1, f"{case}: the cached signature did not take the fast path"
    assert fast.shape == slow.shape and fast.stride() == slow.stride() and fast.dtype == slow.dtype
    assert fast.device == slow.device == torch.device(fp16_dev)
    assert torch.equal(_bits(fast), _bits(slow)), f"{case}: the fast path's result differs from the router's"


def test_python_numbers_are_values_of_the_key(fp32_dev):
    """``x * 0.5`` and ``x * 0.25`` reach the op as a wrapped 0-dim CPU tensor each, of one
    shape and dtype: the fast path keys their values (GELU's constants in GPT-2 were all served
    by the first one's route before)."""
    x = torch.randn(8, 8)
    dx = x.to(fp32_dev)
    for _ in range(3):
        for c in (0.5, 0.25, 0.044715, 3, True):
            torch.testing.assert_close((dx * c).cpu(), x * c, rtol=0, atol=0)
            torch.testing.assert_close((c * dx).cpu(), c * x, rtol=0, atol=0)
            torch.testing.assert_close((dx + c).cpu(), x + c, rtol=0, atol=0)


def test_float32_chip_and_parameters(fp32_dev):
    """A Linear's weight is a Parameter (its transpose a view of one): another key than a plain
    tensor of the same shape; both right, against CPU float32."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 4)
    x = torch.randn(3, 8)
    dlin = torch.nn.Linear(8, 4).to(fp32_dev)
    dlin.load_state_dict(lin.state_dict())
    dx = x.to(fp32_dev)
    ref = lin(x)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(dlin(dx).cpu(), ref.detach(), rtol=1e-5, atol=1e-5)
            plain = torch.addmm(dlin.bias.detach().clone(), dx, dlin.weight.detach().clone().t())
            torch.testing.assert_close(plain.cpu(), ref.detach(), rtol=1e-5, atol=1e-5)


def test_autograd_through_the_fast_path(fp32_dev):
    torch.manual_seed(0)
    a = torch.randn(8, 8, requires_grad=True)
    b = torch.randn(8, 8)
    da = a.detach().to(fp32_dev).requires_grad_()
    db = b.to(fp32_dev)
    for _ in range(3):
        da.grad = None
        (torch.relu(da) * db).sum().backward()
    (torch.relu(a) * b).sum().backward()
    torch.testing.assert_close(da.grad.cpu(), a.grad, rtol=0, atol=0)


def test_ops_the_fast_path_does_not_key_fall_back(fp32_dev):
    """A tensor list (cat) cannot be keyed: each call goes to the router, right, and caches
    nothing; softmax's dtype argument keeps it on the Python kernel."""
    ad = _adapter()
    torch.manual_seed(0)
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    da, db = a.to(fp32_dev), b.to(fp32_dev)
    torch.testing.assert_close(torch.cat([da, db]).cpu(), torch.cat([a, b]), rtol=0, atol=0)
    entries = ad.fast_stats()["entries"]
    for _ in range(3):
        torch.testing.assert_close(torch.cat([da, db]).cpu(), torch.cat([a, b]), rtol=0, atol=0)
        torch.testing.assert_close(torch.softmax(da, -1).cpu(), torch.softmax(a, -1), rtol=1e-5, atol=1e-6)
    assert ad.fast_stats()["entries"] <= entries + 1      # softmax's decomposition may key one op


def test_lazy_mode_is_not_served_by_the_fast_path(fp32_dev):
    from torchfl.runtime.eager import lazy

    ad = _adapter()
    a = torch.randn(8, 8)
    da = a.to(fp32_dev)
    for _ in range(3):
        torch.relu(da)                     # cached
    recorded = lazy.STATS.get("recorded_ops", None)
    before = ad.fast_stats()["hits"]
    with torch.npu.lazy():
        y = torch.relu(da)
        assert ad.fast_stats()["hits"] == before, "lazy mode's op ran through the fast path"
    torch.testing.assert_close(y.cpu(), torch.relu(a), rtol=0, atol=0)
    if recorded is not None:
        assert lazy.STATS["recorded_ops"] > recorded
    torch.relu(da)
    assert ad.fast_stats()["hits"] == before + 1       # after the block: fast again


def test_clearing_routes_clears_the_fast_path(fp32_dev):
    from torchfl.runtime.eager import ops

    ad = _adapter()
    da = torch.randn(8, 8).to(fp32_dev)
    for _ in range(3):
        torch.relu(da)
    assert ad.fast_stats()["entries"] > 0
    ops.clear_cache()
    assert ad.fast_stats()["entries"] == 0
    torch.testing.assert_close(torch.relu(da).cpu(), torch.relu(da.cpu()), rtol=0, atol=0)


def test_kernel_error_in_the_fast_path_is_the_routers_error(fp32_dev):
    """Out of device memory while the kernel allocates its output: the same exception type
    and message as through the router, nothing leaked, and the next call works."""
    from torchfl.kernels.errors import DeviceOOMError
    from torchfl.runtime.eager import device

    ad = _adapter()
    index = torch.device(fp32_dev).index
    a = torch.randn(64, 64)
    da = a.to(fp32_dev)
    for _ in range(3):
        torch.relu(da)
    mem = device.memory_of(index)
    errors = []
    for bypass in (0, 1):
        ad.set_bypass(1, bypass)
        # a tensor of an earlier test in this worker freed inside the block (a collection, a
        # deferred free) would put a block in the allocator's cache or make room below the
        # capacity, which the call would use instead of running out: no room at all, no cache
        gc.collect()
        gc.disable()
        empty_cache = getattr(mem, "empty_cache", None)
        if empty_cache is not None:
            empty_cache()
        capacity, mem.capacity = mem.capacity, 0
        max_reserved = getattr(mem, "max_reserved", None)
        if max_reserved is not None:
            mem.max_reserved = 0
        allocated = mem.memory_allocated()
        hits = ad.fast_stats()["hits"]
        try:
            with pytest.raises(DeviceOOMError) as info:
                torch.relu(da)
        finally:
            mem.capacity = capacity
            if max_reserved is not None:
                mem.max_reserved = max_reserved
            ad.set_bypass(1, 0)
            gc.enable()
        # the failed call gave back what it took (an earlier test's tensor may have been freed meanwhile)
        assert mem.memory_allocated() <= allocated, "the failed call kept device memory"
        errors.append((type(info.value), str(info.value), ad.fast_stats()["hits"] - hits))
    (fast_type, fast_msg, _), (slow_type, slow_msg, slow_hits) = errors
    # the same sentence; its byte counts (free, peak) move if another tensor was freed in between
    assert fast_type is slow_type and re.sub(r"-?[\d.]+", "N", fast_msg) == re.sub(r"-?[\d.]+", "N", slow_msg)
    assert slow_hits == 0
    assert "out of memory" in fast_msg
    torch.testing.assert_close(torch.relu(da).cpu(), torch.relu(a), rtol=0, atol=0)
