"""Fused conv kernels (conv+relu, conv+bn, conv+bn+relu, conv+add+relu) vs torch, and the
off-chip bytes fusion saves (the intermediate's round trip)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from torchfl.kernels import ChipModel, DeviceMemory

from .test_conv import close, dev, run_checked


def _bn_params(K):
    return (torch.rand(K) + 0.5, torch.randn(K), torch.randn(K), torch.rand(K) + 0.1)


@pytest.mark.parametrize("name", ["conv2d_relu", "conv2d_bn", "conv2d_bn_relu", "conv2d_add_relu",
                                  "conv2d_bn_add_relu"])
def test_fused_conv_matches_torch_and_saves_bytes(name):
    chip = ChipModel()
    mem = DeviceMemory(chip)
    torch.manual_seed(4)
    x, w, b = torch.randn(2, 8, 12, 10), torch.randn(16, 8, 3, 3), torch.randn(16)
    gamma, beta, mean, var = _bn_params(16)
    ins = {"x": dev(x, mem, "NHWC"), "weight": dev(w, mem), "bias": dev(b, mem)}
    y0 = F.conv2d(x, w, b, padding=1)
    ref = y0
    if "bn" in name:
        ins.update(bn_weight=dev(gamma, mem), bn_bias=dev(beta, mem), running_mean=dev(mean, mem),
                   running_var=dev(var, mem))
        ref = F.batch_norm(ref, mean, var, gamma, beta, False, 0.0, 1e-5)
    if "add" in name:
        r = torch.randn_like(y0)
        ins["residual"] = dev(r, mem, "NHWC")
        ref = ref + r
    if "relu" in name:
        ref = F.relu(ref)
    (y,), fused = run_checked(name, chip, ins, {"padding": 1})
    close(y.to_numpy(), ref.numpy(), "float32", scale=9)
    # unfused: conv2d then the separate elementwise passes, each a full round trip
    _, conv = run_checked("conv2d", chip, {k: ins[k] for k in ("x", "weight", "bias")}, {"padding": 1})
    inter = 2 * 16 * 12 * 10 * 2 * 4   # bytes of the intermediate, read + written once more
    assert fused.traffic.bytes < conv.traffic.bytes + inter
    assert fused.traffic.bytes - conv.traffic.bytes < inter
    if name == "conv2d_bn_add_relu":
        # the same as conv2d_bn plus one read of the residual (unfused, add and relu would
        # each read and write the whole output once more)
        _, bn = run_checked("conv2d_bn", chip, {k: v for k, v in ins.items() if k != "residual"}, {"padding": 1})
        assert fused.traffic.bytes == bn.traffic.bytes + 2 * 12 * 10 * 16 * 4




@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_fused_conv_bn_relu_half_nhcw(dtype):
    chip = ChipModel()
    mem = DeviceMemory(chip)
    torch.manual_seed(6)
    tdt = getattr(torch, dtype)
    x, w = torch.randn(1, 8, 9, 7).to(tdt), torch.randn(16, 8, 3, 3).to(tdt)
    gamma, beta, mean, var = (t.to(tdt) for t in _bn_params(16))
    ins = {"x": dev(x, mem, "NHCW"), "weight": dev(w, mem), "bn_weight": dev(gamma, mem),
           "bn_bias": dev(beta, mem), "running_mean": dev(mean, mem), "running_var": dev(var, mem)}
    (y,), _ = run_checked("conv2d_bn_relu", chip, ins, {"padding": 1, "stride": 2})
    ref = F.relu(F.batch_norm(F.conv2d(x.float(), w.float(), padding=1, stride=2), mean.float(), var.float(),
                              gamma.float(), beta.float(), False, 0.0, 1e-5))
    close(y.to_numpy(), ref.numpy(), dtype, scale=8)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("name", ["conv2d_bn", "conv2d_add_relu", "conv2d_bn_add_relu"])
def test_tiny_tiles_computed_together_are_exact_and_counted(name, layout):
    """A strided 1x1 conv tiles its output pixel by pixel (the fewest bytes: skipped input
    rows are never read); the kernel computes such tiles six at a time in one micro-row
    and stores each where it belongs. 25 tiles: four full groups and a partial one; K not
    a multiple of 16."""
    chip = ChipModel()
    mem = DeviceMemory(chip)
    torch.manual_seed(9)
    x, w = torch.randn(1, 24, 9, 9).half(), torch.randn(40, 24, 1, 1).half()
    ins = {"x": dev(x, mem, layout), "weight": dev(w, mem)}
    ref = F.conv2d(x.float(), w.float(), stride=2)
    if "bn" in name:
        gamma, beta, mean, var = (t.half() for t in _bn_params(40))
        ins.update(bn_weight=dev(gamma, mem), bn_bias=dev(beta, mem), running_mean=dev(mean, mem),
                   running_var=dev(var, mem))
        ref = F.batch_norm(ref, mean.float(), var.float(), gamma.float(), beta.float(), False, 0.0, 1e-5)
    if "add" in name:
        r = torch.randn_like(ref).half()
        ins["residual"] = dev(r, mem, layout)
        ref = F.relu(ref + r.float())
    (y,), plan = run_checked(name, chip, ins, {"stride": 2})
    tiles = dict(plan.config.tiles)
    assert plan.config.strategy == "weight_stationary" and (tiles["oh"], tiles["ow"]) == (1, 1)
    close(y.to_numpy(), ref.numpy(), "float16", scale=5)


@pytest.mark.parametrize("dilation", [1, 2])
def test_one_large_tile_fp16_nchw_with_row_runs(dilation):
    """One output tile (a large cache): weights and slab rows loaded in one parallel phase,
    compute + epilogue + store per micro-row in the next; with dilation 1 a kernel row's taps
    and channels form one contiguous run of the reduction, with dilation 2 they do not."""
    chip = ChipModel()
    mem = DeviceMemory(chip)
    torch.manual_seed(10)
    x, w = torch.randn(1, 5, 23, 19).half(), torch.randn(20, 5, 3, 3).half()
    gamma, beta, mean, var = (t.half() for t in _bn_params(20))
    ins = {"x": dev(x, mem, "NCHW"), "weight": dev(w, mem), "bn_weight": dev(gamma, mem),
           "bn_bias": dev(beta, mem), "running_mean": dev(mean, mem), "running_var": dev(var, mem)}
    attrs = {"padding": 2, "dilation": dilation}
    (y,), plan = run_checked("conv2d_bn_relu", chip, ins, attrs)
    tiles = dict(plan.config.tiles)
    assert (tiles["oh"], tiles["ow"]) == (y.shape[2], y.shape[3])
    ref = F.relu(F.batch_norm(F.conv2d(x.float(), w.float(), padding=2, dilation=dilation), mean.float(),
                              var.float(), gamma.float(), beta.float(), False, 0.0, 1e-5))
    close(y.to_numpy(), ref.numpy(), "float16", scale=8)
    # the on-chip scratch is reused between calls: fill it with another conv's non-zero
    # input (no padding), then the halo must be zeroed again, not read as left over
    big = {"x": dev(torch.rand(1, 5, 40, 40).half() + 1, mem, "NCHW"), "weight": ins["weight"]}
    run_checked("conv2d", chip, big, {})
    (y2,), _ = run_checked("conv2d_bn_relu", chip, ins, attrs)
    assert (y2.to_numpy() == y.to_numpy()).all()


@pytest.mark.parametrize("layout", ["NCHW", "NCWH", "NHWC"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name,ks", [("conv2d_bn_relu", 1), ("conv2d_bn_add_relu", 1), ("conv2d_bn_add_relu", 3)])
def test_one_tile_epilogue_paths(name, ks, dtype, layout):
    """One large tile, K = 40 (a partial 16-channel panel), 13 x 11 output (micro-rows that
    wrap around an output row): float16 takes the vector epilogue (epi6x16_f16), bfloat16
    the scalar one; NCHW stores and reads the residual as six-pixel runs where a micro-row's
    pixels are consecutive (and per pixel where not), NCWH never has such runs, NHWC is
    channel-inner. float16 NCHW slab rows load 8 pixels x 16 channels at a time
    (tr16x8_f16; C = 21: one full channel block and a partial one; 3x3 with padding 1: a
    halo before and after), and float16 weight panels 8 taps (3x3: 9 = 8 + 1) or 8 input
    channels (1x1: 21 = 8 + 8 + 5) x 16 output channels at a time (K = 40: two full panels
    and a partial one). A residual with inf/NaN checks they reach the output like
    torch's."""
    chip = ChipModel()
    mem = DeviceMemory(chip)
    torch.manual_seed(11)
    tdt = getattr(torch, dtype)
    x, w = torch.randn(1, 21, 13, 11).to(tdt), (torch.randn(40, 21, ks, ks) * 0.3).to(tdt)
    gamma, beta, mean, var = (t.to(tdt) for t in _bn_params(40))
    ins = {"x": dev(x, mem, layout), "weight": dev(w, mem), "bn_weight": dev(gamma, mem),
           "bn_bias": dev(beta, mem), "running_mean": dev(mean, mem), "running_var": dev(var, mem)}
    ref = F.batch_norm(F.conv2d(x.float(), w.float(), padding=ks // 2), mean.float(), var.float(),
                       gamma.float(), beta.float(), False, 0.0, 1e-5)
    if "add" in name:
        r = torch.randn_like(ref).to(tdt)
        r[0, 3, 2, 5], r[0, 17, 12, 10], r[0, 39, 0, 0] = float("inf"), float("-inf"), float("nan")
        ins["residual"] = dev(r, mem, layout)
        ref = ref + r.float()
    ref = F.relu(ref)
    (y,), plan = run_checked(name, chip, ins, {"padding": ks // 2})
    tiles = dict(plan.config.tiles)
    assert (tiles["oh"], tiles["ow"]) == (13, 11)
    out = y.to_numpy()
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref.numpy()))
    close(np.nan_to_num(out), np.nan_to_num(ref.numpy()), dtype, scale=8)


@pytest.mark.parametrize("cache", [8 << 20, 32 << 10])      # one tile, many tiles
def test_frozen_weight_packed_once(cache):
    """A frozen weight's K blocks are packed into micro-kernel panels once and kept (both the
    one-tile and the many-tile path): later calls read the kept panels, results are
    bit-identical to the unfrozen run, the counted traffic is the plan's either way, and
    freeing the buffer drops the copies."""
    from torchfl.kernels import frozen
    from torchfl.kernels.conv.microkernel import NR

    chip = ChipModel(cache_bytes=cache)
    mem = DeviceMemory(chip)
    torch.manual_seed(11)
    x, w = torch.randn(1, 24, 15, 13).half(), torch.randn(40, 24, 3, 3).half()
    gamma, beta, mean, var = (t.half() for t in _bn_params(40))
    ins = {"x": dev(x, mem, "NCHW"), "weight": dev(w, mem), "bn_weight": dev(gamma, mem),
           "bn_bias": dev(beta, mem), "running_mean": dev(mean, mem), "running_var": dev(var, mem)}
    attrs = {"padding": 1}
    (ref,), plan = run_checked("conv2d_bn_relu", chip, ins, attrs)
    assert plan.config.strategy == "weight_stationary"
    wf = dev(w, mem)
    frozen.freeze(wf.buffer)
    before = frozen.cached_bytes()
    for _ in range(2):
        (y,), _ = run_checked("conv2d_bn_relu", chip, {**ins, "weight": wf}, attrs)
        np.testing.assert_array_equal(y.to_numpy(), ref.to_numpy())
    tk = plan.config.tile("k")
    assert frozen.cached_bytes() - before == -(-40 // tk) * -(-tk // NR) * NR * 24 * 9 * 4
    wf.buffer.free()
    assert frozen.derived(wf.buffer, "any", lambda: 1 / 0) is None
    assert frozen.cached_bytes() == before
    want = F.relu(F.batch_norm(F.conv2d(x.float(), w.float(), padding=1), mean.float(), var.float(),
                               gamma.float(), beta.float(), False, 0.0, 1e-5))
    close(y.to_numpy(), want.numpy(), "float16", scale=8)
