"""1x1 convs on channel-outer tensors run as a GEMM with pixels in the vector lanes
(kernels/conv/pointwise.py): vs torch, bit for bit vs the tiled conv (channel-inner
layout, same sums in the same order), and counted as the plan says."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from torchfl.kernels import ChipModel, DeviceMemory
from torchfl.kernels.conv import forward

from .test_conv import close, dev, run_checked
from .test_fused_conv import _bn_params


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("name", ["conv2d_bn_relu", "conv2d_bn_add_relu"])
def test_pointwise_conv_matches_torch_and_tiled_path(name, stride, dtype, monkeypatch):
    """Two images, 13 x 11 output pixels (143: eight full 16-pixel panels, a partial one, and
    an odd panel out of the pairs), K = 40 (three 12-channel blocks and a partial one), C = 24;
    a residual with inf/NaN reaches the output like torch's."""
    calls = []
    real = forward.conv1x1_rows

    def spy(*a):
        calls.append(1)
        return real(*a)
    monkeypatch.setattr(forward, "conv1x1_rows", spy)
    chip = ChipModel()
    mem = DeviceMemory(chip)
    torch.manual_seed(12)
    tdt = getattr(torch, dtype)
    x = torch.randn(2, 24, 13 * stride, 11 * stride).to(tdt)
    w = (torch.randn(40, 24, 1, 1) * 0.3).to(tdt)
    gamma, beta, mean, var = (t.to(tdt) for t in _bn_params(40))
    ref = F.batch_norm(F.conv2d(x.float(), w.float(), stride=stride), mean.float(), var.float(), gamma.float(),
                       beta.float(), False, 0.0, 1e-5)
    r = None
    if "add" in name:
        r = torch.randn_like(ref).to(tdt)
        r[0, 3, 2, 5], r[1, 17, 12, 10], r[0, 39, 0, 0] = float("inf"), float("-inf"), float("nan")
        ref = ref + r.float()
    ref = F.relu(ref)
    outs = {}
    for layout in ("NCHW", "NHWC"):
        ins = {"x": dev(x, mem, layout), "weight": dev(w, mem), "bn_weight": dev(gamma, mem),
               "bn_bias": dev(beta, mem), "running_mean": dev(mean, mem), "running_var": dev(var, mem)}
        if r is not None:
            ins["residual"] = dev(r, mem, layout)
        n0 = len(calls)
        (y,), _ = run_checked(name, chip, ins, {"stride": stride})
        assert (len(calls) > n0) == (layout == "NCHW")      # the GEMM path only for channel-outer tensors
        outs[layout] = y.to_numpy()
    out = outs["NCHW"]
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref.numpy()))
    close(np.nan_to_num(out), np.nan_to_num(ref.numpy()), dtype, scale=8)
    np.testing.assert_array_equal(out, outs["NHWC"])


def test_small_images_keep_the_tiled_path(monkeypatch):
    """7 x 7 outputs (49 pixels) would pad to 64 in 16-pixel panels: the tiled conv keeps them."""
    calls = []
    monkeypatch.setattr(forward, "conv1x1_rows", lambda *a: calls.append(1))
    chip = ChipModel()
    mem = DeviceMemory(chip)
    x, w = torch.randn(1, 16, 7, 7), torch.randn(32, 16, 1, 1)
    (y,), _ = run_checked("conv2d", chip, {"x": dev(x, mem, "NCHW"), "weight": dev(w, mem)}, {})
    assert not calls
    close(y.to_numpy(), F.conv2d(x, w).numpy(), "float32", scale=4)


@pytest.mark.parametrize("stride", [1, 2])
def test_pointwise_parts_span_chunks_and_images(stride, monkeypatch):
    """C = 256 packs 32 panels a chunk: 3 images of 24 x 23 output pixels (35 panels: a full
    chunk, then 3 panels, the last partial) split into equal parts over the host threads
    cross chunk and image bounds; forced to 3 threads (one more than this machine's cores) and
    to 1, the output is the tiled conv's bit for bit."""
    import numba

    chip = ChipModel()
    mem = DeviceMemory(chip)
    torch.manual_seed(3)
    x = torch.randn(3, 256, 24 * stride, 23 * stride).half()
    w = (torch.randn(20, 256, 1, 1) * 0.05).half()
    r = torch.randn(3, 20, 24, 23).half()
    gamma, beta, mean, var = (t.half() for t in _bn_params(20))
    ref = F.relu(F.batch_norm(F.conv2d(x.float(), w.float(), stride=stride), mean.float(), var.float(),
                              gamma.float(), beta.float(), False, 0.0, 1e-5) + r.float())
    outs = {}
    for layout, threads in (("NHWC", None), ("NCHW", None), ("NCHW", 1), ("NCHW", 3)):
        if threads is not None:
            monkeypatch.setattr(numba, "get_num_threads", lambda t=threads: t)
        ins = {"x": dev(x, mem, layout), "weight": dev(w, mem), "bn_weight": dev(gamma, mem),
               "bn_bias": dev(beta, mem), "running_mean": dev(mean, mem), "running_var": dev(var, mem),
               "residual": dev(r, mem, layout)}
        (y,), _ = run_checked("conv2d_bn_add_relu", chip, ins, {"stride": stride})
        outs[(layout, threads)] = y.to_numpy()
        monkeypatch.undo()
    close(outs[("NCHW", None)], ref.numpy(), "float16", scale=8)
    for key in (("NCHW", None), ("NCHW", 1), ("NCHW", 3)):
        np.testing.assert_array_equal(outs[key], outs[("NHWC", None)])
