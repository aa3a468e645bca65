"""The conv micro-kernel generator and the whole-block moves of the fused epilogue, against
plain numpy on small arrays (the conv tests cover them inside real convolutions)."""
import numba
import numpy as np
import pytest
from numba import njit

from torchfl.kernels.conv.microkernel import (MR, NR, gather_rows, gather_run, make_taps_kernel, scatter_rows,
                                              scatter_run)

_MOVES = {(False, False): scatter_rows, (True, False): scatter_run, (False, True): gather_rows,
          (True, True): gather_run}


def _caller(move):
    @njit
    def call(blk, arr, base, mr, kl, t1):
        move(blk, arr, base, mr, kl, t1)
    return call


@pytest.mark.parametrize("run", [False, True])
@pytest.mark.parametrize("to_block", [False, True])
@pytest.mark.parametrize("types", [("u2", "u2"), ("f4", "f4"), ("f4", "u2")])
def test_block_moves_place_every_element(run, to_block, types):
    """Element (m, j) of the block goes to / comes from base[mr + m] + kl + j (rows) or
    base[mr] + (kl + j) * t1 + m (run); nothing else of the tensor is touched; differing
    element types are cast per element (as a Numba assignment)."""
    bt, at = np.dtype(types[0]), np.dtype(types[1])
    mr, kl = 3, 5
    if run:
        t1 = 11
        base = np.arange(20, dtype=np.int64) + 7
        where = [[base[mr] + (kl + j) * t1 + m for j in range(NR)] for m in range(MR)]
    else:
        t1 = 1
        base = np.arange(20, dtype=np.int64) * 29 + 2
        where = [[base[mr + m] + kl + j for j in range(NR)] for m in range(MR)]
    where = np.array(where)
    size = int(where.max()) + 9
    rng = np.random.default_rng(0)
    blk = rng.integers(1, 1000, MR * NR).astype(bt)
    arr = rng.integers(1, 1000, size).astype(at)
    want_arr, want_blk = arr.copy(), blk.copy()
    if to_block:
        want_blk[:] = arr[where.ravel()].astype(bt)
    else:
        want_arr[where.ravel()] = blk.astype(at)
    _caller(_MOVES[(run, to_block)])(blk, arr, base, mr, kl, t1)
    np.testing.assert_array_equal(arr, want_arr)
    np.testing.assert_array_equal(blk, want_blk)


@pytest.mark.parametrize("mr,nr,w", [(6, 16, 8), (6, 16, 16), (4, 32, 16)])
def test_taps_kernel_shapes(mr, nr, w):
    """Any generated block shape accumulates the tap-aware implicit GEMM into C: the 6x16
    block with either accumulator width (conv picks one per host, TORCHFL_CONV_VECTOR
    overrides; both are tested here on any host: LLVM splits <16 x float> without AVX-512)."""
    uk = make_taps_kernel(mr, nr, w)

    @njit
    def call(a, pix, taps, b, kc, c, ldc):
        uk(a, pix, 0, taps, taps.size, b, 0, kc, c, 1, ldc)

    rng = np.random.default_rng(mr)
    kc, ntaps, ldc = 7, 3, nr + 3
    a = rng.standard_normal(200).astype(np.float32)
    pix = np.array([0, 9, 20, 31, 47, 50][:mr] + [60] * max(0, mr - 6), dtype=np.int64)
    taps = np.array([0, 13, 40], dtype=np.int64)
    b = rng.standard_normal(ntaps * kc * nr).astype(np.float32)
    c = rng.standard_normal(1 + mr * ldc).astype(np.float32)
    want = c.copy()
    for m in range(mr):
        for t in range(ntaps):
            for k in range(kc):
                row = b[(t * kc + k) * nr:(t * kc + k + 1) * nr]
                want[1 + m * ldc:1 + m * ldc + nr] += a[pix[m] + taps[t] + k] * row
    call(a, pix, taps, b, kc, c, ldc)
    np.testing.assert_allclose(c, want, rtol=1e-5, atol=1e-5)


def test_one_thread_schedule_gives_the_same_bits():
    """On one host thread the fused conv keeps Numba's default schedule (no per-piece
    dynamic hand-out); each block is computed the same way, so the result is bit-identical."""
    import torch

    from torchfl.kernels import ChipModel, DeviceMemory

    from .test_conv import dev, run_checked

    chip = ChipModel()
    mem = DeviceMemory(chip)
    torch.manual_seed(3)
    ins = {"x": dev(torch.randn(1, 32, 13, 14).half(), mem, "NCHW"),
           "weight": dev(torch.randn(48, 32, 3, 3).half(), mem),
           "residual": dev(torch.randn(1, 48, 13, 14).half(), mem, "NCHW")}
    for n in ("bn_weight", "bn_bias", "running_mean"):
        ins[n] = dev(torch.randn(48).half(), mem)
    ins["running_var"] = dev(torch.rand(48).half() + 0.5, mem)
    (many,), _ = run_checked("conv2d_bn_add_relu", chip, ins, {"padding": 1})
    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        (one,), _ = run_checked("conv2d_bn_add_relu", chip, ins, {"padding": 1})
    finally:
        numba.set_num_threads(before)
    np.testing.assert_array_equal(one.to_numpy(), many.to_numpy())
