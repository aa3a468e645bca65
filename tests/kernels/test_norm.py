"""Normalisation family vs torch / autograd, any layout, resident and chunked tilings."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from torchfl.kernels import ChipModel, DeviceMemory, KernelError
from torchfl.kernels.catalog import get
from .test_conv import close, dev, run_checked

CACHES = [8 << 20, 1024, 64]   # resident / several segments per tile / chunked


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("shape,layout", [((2, 3, 5, 7), "NHWC"), ((4, 5), None), ((1, 7, 3), "CLN"),
                                          ((3, 2, 4, 1), "WCNH")])
def test_batch_norm_infer(shape, layout, cache):
    chip = ChipModel(cache_bytes=cache)
    mem = DeviceMemory(chip)
    torch.manual_seed(0)
    C = shape[1]
    x = torch.randn(*shape)
    w, b, m, v = torch.rand(C) + 0.5, torch.randn(C), torch.randn(C), torch.rand(C) + 0.1
    ins = {"x": dev(x, mem, layout), "weight": dev(w, mem), "bias": dev(b, mem),
           "running_mean": dev(m, mem), "running_var": dev(v, mem)}
    (y, *side), _ = run_checked("batch_norm_infer", chip, ins, {"eps": 1e-3})
    close(y.to_numpy(), F.batch_norm(x, m, v, w, b, False, 0.1, 1e-3).numpy(), "float32")
    # as ATen's _native_batch_norm_legit_no_training: empty saved mean / invstd
    assert [tuple(t.shape) for t in side] == [(0,), (0,)]


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("shape,layout", [((2, 3, 5, 7), "NHWC"), ((6, 4), None), ((3, 2, 4, 5), "HCWN")])
def test_batch_norm_train_and_backward(shape, layout, cache):
    chip = ChipModel(cache_bytes=cache)
    mem = DeviceMemory(chip)
    torch.manual_seed(1)
    C = shape[1]
    x = (torch.randn(*shape) * 3 + 2).requires_grad_(True)
    w = (torch.rand(C) + 0.5).requires_grad_(True)
    b = torch.randn(C).requires_grad_(True)
    rm, rv = torch.randn(C), torch.rand(C) + 0.5
    # ATen's functional training op: (out, save_mean, save_rstd, new_running_mean, new_running_var)
    out, smean, srstd, nrm, nrv = torch.ops.aten._native_batch_norm_legit_functional(
        x, w, b, rm, rv, True, 0.1, 1e-5)
    ins = {"x": dev(x.detach(), mem, layout), "weight": dev(w.detach(), mem), "bias": dev(b.detach(), mem),
           "running_mean": dev(rm, mem), "running_var": dev(rv, mem)}
    (y, mt, it, rmt, rvt), _ = run_checked("batch_norm_train", chip, ins, {"momentum": 0.1})
    close(y.to_numpy(), out.detach().numpy(), "float32")
    close(mt.to_numpy(), smean.numpy(), "float32")
    close(it.to_numpy(), srstd.numpy(), "float32")
    close(rmt.to_numpy(), nrm.numpy(), "float32")
    close(rvt.to_numpy(), nrv.numpy(), "float32")
    gy = torch.randn_like(out)
    out.backward(gy)
    bins = {"grad_out": dev(gy, mem, layout), "x": dev(x.detach(), mem),
            "weight": dev(w.detach(), mem), "save_mean": dev(smean, mem), "save_invstd": dev(srstd, mem)}
    (dx, dw, db), _ = run_checked("batch_norm_backward", chip, bins)
    close(dx.to_numpy(), x.grad.numpy(), "float32")
    close(dw.to_numpy(), w.grad.numpy(), "float32", scale=10)
    close(db.to_numpy(), b.grad.numpy(), "float32", scale=10)


def test_batch_norm_train_rejects_single_value():
    with pytest.raises(KernelError, match="more than 1 value"):
        get("batch_norm_train").problem({"x": (1, 3, 1, 1)}, {}, "float32")


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("shape,ns,layout", [((4, 7), (7,), None), ((2, 3, 10), (10,), "CNL"),
                                             ((2, 3, 4, 5), (4, 5), "NHCW"), ((1, 1), (1,), None),
                                             ((5, 768), (768,), None)])
def test_layer_norm_and_backward(shape, ns, layout, cache):
    chip = ChipModel(cache_bytes=cache)
    mem = DeviceMemory(chip)
    torch.manual_seed(2)
    x = (torch.randn(*shape) * 2 + 1).requires_grad_(True)
    w = (torch.rand(*ns) + 0.5).requires_grad_(True)
    b = torch.randn(*ns).requires_grad_(True)
    out, mean, rstd = torch.ops.aten.native_layer_norm(x, list(ns), w, b, 1e-5)
    ins = {"x": dev(x.detach(), mem, layout), "weight": dev(w.detach(), mem), "bias": dev(b.detach(), mem)}
    (y, mt, rt), _ = run_checked("layer_norm", chip, ins, {"normalized_shape": ns})
    close(y.to_numpy(), out.detach().numpy(), "float32")
    assert mt.shape == tuple(mean.shape)
    close(mt.to_numpy(), mean.numpy(), "float32")
    close(rt.to_numpy(), rstd.numpy(), "float32")
    gy = torch.randn_like(out)
    out.backward(gy)
    if cache == 64 and shape[-1] > 1:
        pytest.skip("layer_norm_backward keeps whole rows on chip (no chunked backward)")
    bins = {"grad_out": dev(gy, mem, layout), "x": dev(x.detach(), mem), "mean": dev(mean, mem),
            "rstd": dev(rstd, mem), "weight": dev(w.detach(), mem), "bias": dev(b.detach(), mem)}
    (dx, dw, db), _ = run_checked("layer_norm_backward", chip, bins, {"normalized_shape": ns})
    close(dx.to_numpy(), x.grad.numpy(), "float32", scale=max(1.0, float(rstd.max())))  # D=1: noise * rstd
    close(dw.to_numpy(), w.grad.numpy(), "float32", scale=5)
    close(db.to_numpy(), b.grad.numpy(), "float32", scale=5)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_norm_half(dtype):
    chip = ChipModel()
    mem = DeviceMemory(chip)
    tdt = getattr(torch, dtype)
    x = torch.randn(3, 4, 6, 5).to(tdt)
    w, b = torch.rand(5).to(tdt) + 0.5, torch.randn(5).to(tdt)
    (y, _, _), _ = run_checked("layer_norm", chip, {"x": dev(x, mem, "NHWC"), "weight": dev(w, mem),
                                                    "bias": dev(b, mem)})
    assert y.dtype == dtype
    ref = F.layer_norm(x.float(), (5,), w.float(), b.float())
    close(y.to_numpy(), ref.numpy(), dtype, scale=2)
    C = 4
    m, v = torch.randn(C).to(tdt), (torch.rand(C) + 0.5).to(tdt)
    (y, *side), _ = run_checked("batch_norm_infer", chip, {"x": dev(x, mem, "NHWC"), "running_mean": dev(m, mem),
                                                     "running_var": dev(v, mem)})
    close(y.to_numpy(), F.batch_norm(x.float(), m.float(), v.float()).numpy(), dtype, scale=2)


def test_norm_bigger_cache_never_moves_more():
    for name, shapes in [("layer_norm", {"x": (64, 4096), "weight": (4096,)}),
                         ("batch_norm_train", {"x": (8, 16, 30, 30)}),
                         ("batch_norm_backward", {"grad_out": (8, 16, 30, 30), "x": (8, 16, 30, 30),
                                                  "save_mean": (16,), "save_invstd": (16,)})]:
        spec = get(name)
        prob = spec.problem(shapes, {}, "float32")
        last = None
        for kb in [1, 4, 16, 64, 256, 4096, 65536]:
            t = spec.tile(prob, ChipModel(cache_bytes=kb << 10)).traffic.bytes
            assert last is None or t <= last, (name, kb)
            last = t


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_layer_norm_kept_weights_decoded_once(dtype):
    """Frozen weight and bias (the executor's kept parameters) are decoded once and kept:
    same results and counts as unfrozen; freeing the buffer drops the copy."""
    from torchfl.kernels import frozen

    chip = ChipModel()
    mem = DeviceMemory(chip)
    torch.manual_seed(3)
    x, w, b = torch.randn(6, 40), torch.rand(40) + 0.5, torch.randn(40)
    tdt = getattr(torch, dtype)
    plain = {"x": dev(x.to(tdt), mem), "weight": dev(w.to(tdt), mem), "bias": dev(b.to(tdt), mem)}
    (ref, _, _), _ = run_checked("layer_norm", chip, plain, {"normalized_shape": (40,)})
    kept = {"x": plain["x"], "weight": dev(w.to(tdt), mem), "bias": dev(b.to(tdt), mem)}
    before = frozen.cached_bytes()
    for t in ("weight", "bias"):
        frozen.freeze(kept[t].buffer)
    for _ in range(2):
        (y, _, _), _ = run_checked("layer_norm", chip, kept, {"normalized_shape": (40,)})
        np.testing.assert_array_equal(y.to_numpy(), ref.to_numpy())
    assert frozen.cached_bytes() - before == 2 * 40 * 4
    for t in ("weight", "bias"):
        kept[t].buffer.free()
        assert frozen.derived(kept[t].buffer, "any", lambda: 1 / 0) is None
    assert frozen.cached_bytes() == before


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_batch_norm_infer_channel_innermost_walks_rows(dtype):
    """NHWC batch norm (channels interleaved in every row) takes the row-by-row walk
    (``interleaved_affine``) and matches torch, NaN and +-inf included (tolerance: the
    dtype's, as every norm test; fp16 stores round to 11 bits)."""
    from torchfl.kernels.norm.impl import _interleaved, _tables

    chip = ChipModel(cache_bytes=8 << 20)
    mem = DeviceMemory(chip)
    torch.manual_seed(3)
    tdt = getattr(torch, dtype)
    x = torch.randn(3, 37, 9, 11).to(tdt)
    x[0, 5, 2, 3], x[1, 36, 0, 0], x[2, 0, 8, 10] = float("nan"), float("inf"), float("-inf")
    m, v = torch.randn(37).to(tdt), (torch.rand(37) + 0.5).to(tdt)
    xd = dev(x, mem, "NHWC")
    _, seg, _, est = _tables(xd, (1,))
    assert _interleaved(seg, est, 37)
    (y, *_), _ = run_checked("batch_norm_infer", chip, {"x": xd, "running_mean": dev(m, mem),
                                                        "running_var": dev(v, mem)}, {"eps": 1e-5})
    ref = F.batch_norm(x.float(), m.float(), v.float(), eps=1e-5).to(tdt).float().numpy()
    ours = y.to_numpy().astype(np.float32)
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(ref))
    close(np.nan_to_num(ours, nan=0.0), np.nan_to_num(ref, nan=0.0), dtype, scale=2)
