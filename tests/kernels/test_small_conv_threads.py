"""A small convolution runs its parallel loops on one thread.

Why: waking Numba's OpenMP workers for a region costs ~0.1 ms on an idle host and tens of ms
when the host is loaded (the worker waits for a time slice; measured: a 2x144x2x2 -> 24 1x1
conv, 55 KFLOP, took 18-46 ms on 2 threads at load 4 and 0.24 ms on one, which made the
compiled MobileNetV2 of the zoo 12-70x slower than torch). A conv's parallel loops are
entered with one thread below ``threads.conv_small()`` FLOPs of their plan, with all of them
above it."""
import numba
import pytest

from torchfl.kernels import threads
from torchfl.kernels.conv import backward, forward

from .helpers import conv_backward_checked, conv_checked

#: the module attributes the conv drivers call their parallel loops through
PARALLEL = [(forward, "conv_tiles"), (forward, "conv_tile_fused"), (forward, "conv1x1_rows"),
            (backward, "compute_bwd_input"), (backward, "compute_bwd_weight")]


@pytest.fixture
def threads_seen(monkeypatch):
    """The thread count each parallel conv loop was entered with (the real loops run)."""
    seen = []
    for mod, name in PARALLEL:
        real = getattr(mod, name)

        def spy(*a, _real=real, _name=name):
            seen.append((_name, numba.get_num_threads()))
            return _real(*a)
        monkeypatch.setattr(mod, name, spy)
    return seen


@pytest.mark.parametrize("shape", [(2, 144, 2, 24, 1, 1), (2, 32, 8, 32, 3, 32), (1, 8, 12, 16, 3, 1)],
                         ids=["1x1", "depthwise", "3x3"])
def test_a_small_conv_enters_its_parallel_loops_with_one_thread(threads_seen, shape):
    conv_checked(shape)
    assert threads_seen and {n for _, n in threads_seen} == {1}, threads_seen


def test_a_small_conv_backward_enters_its_parallel_loops_with_one_thread(threads_seen):
    conv_backward_checked()
    assert {k for k, _ in threads_seen} == {"compute_bwd_input", "compute_bwd_weight"}, threads_seen
    assert {n for _, n in threads_seen} == {1}, threads_seen


def test_a_large_conv_keeps_every_thread(threads_seen):
    n = numba.get_num_threads()
    if n == 1:
        pytest.skip("this process runs Numba on one thread (NUMBA_NUM_THREADS=1)")
    conv_checked((1, 64, 56, 64, 3, 1))      # 2 * 56*56 * 64*64*9 = 231 MFLOP
    assert threads_seen and {k for _, k in threads_seen} == {n}, threads_seen
    assert threads.conv_small() < 231e6
