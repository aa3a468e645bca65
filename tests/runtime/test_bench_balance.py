"""``tools/bench_e2e.py --balance`` takes every thread count's figures in one process, the
model's calls at each count alternating (``_balance(..., counts)``).

Why: CPU time per call is not steady on a shared host. ResNet-50 b8's CPU at two threads over
one read 1.165 from two processes a minute apart, 1.01-1.13 from calls alternating in one
process, and a 64 MB stream on both cores 0.98-1.55 in the same minutes: the work growth
``--threads 1,2 --balance`` reports is the threads' only when both counts share the host's
moments. The real kernels and clocks run here (a 3x3 conv of 231 MFLOP, above
``threads.conv_small()``: it splits at two threads)."""
import sys
from pathlib import Path

import numba
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))

import bench_e2e  # noqa: E402


def test_balance_alternates_thread_counts_in_one_process():
    n = numba.get_num_threads()
    if n == 1:
        pytest.skip("this process runs Numba on one thread (NUMBA_NUM_THREADS=1)")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(64, 64, 3, padding=1), torch.nn.BatchNorm2d(64),
                                torch.nn.ReLU()).eval()
    x = torch.randn(1, 64, 56, 56)
    compiled = torch.compile(model, backend="torchfl", options={"chip": "NPU-V3", "precision": "float16"})
    with torch.no_grad():
        compiled(x)
        executors = bench_e2e.recorded_executors(compiled, (x,))
        bal = bench_e2e._balance(compiled, (x,), executors, 2, [1, n])
    assert numba.get_num_threads() == n                 # the pool's count is back
    one, many = (bal["by_threads"][str(c)]["kernels"] for c in (1, n))
    assert bal["kernels"] is many and bal["threads"] == n
    assert one.keys() == many.keys() and "conv2d_bn_relu" in one, one.keys()
    for k in one:
        assert one[k]["calls"] == many[k]["calls"] >= 1, k
    c1, cn = one["conv2d_bn_relu"], many["conv2d_bn_relu"]
    assert c1["regions"] == c1["one_thread_regions"] >= 1, c1      # the 1-thread calls ran on one thread
    assert cn["regions"] >= 1 and cn["one_thread_regions"] == 0, cn
    rows = bench_e2e._kernel_balance(bal["by_threads"]["1"], bal["by_threads"][str(n)])
    assert rows["conv2d_bn_relu"]["work_growth"] == pytest.approx(cn["cpu_s"] / c1["cpu_s"])
