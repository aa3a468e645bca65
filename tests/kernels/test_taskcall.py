"""A task called through its address (kernels/taskcall.py) computes what a direct call does,
from a parallel loop, and is compiled once for its signature (not linked into the caller)."""
import numpy as np
from numba import njit, prange

from torchfl.kernels import taskcall


@njit
def _task(t, x, scale, out):
    """out[t] = sum of row t of x, times scale (row t of a (n, m) array in a flat buffer)."""
    m = x.size // out.size
    s = np.float32(0.0)
    for j in range(m):
        s += x[t * m + j]
    out[t] = s * scale


@njit(parallel=True)
def _rows(task, x, scale, out):
    for t in prange(out.size):
        taskcall.call(task, (np.int64(t), x, scale, out))


def test_task_through_address_matches_direct_call():
    rng = np.random.default_rng(3)
    x = rng.standard_normal(64 * 33).astype(np.float32)
    scale = np.float32(0.5)
    got = np.zeros(64, np.float32)
    addr = taskcall.address(_task, (np.int64(0), x, scale, got))
    _rows(addr, x, scale, got)
    want = np.zeros(64, np.float32)
    for t in range(64):
        _task(np.int64(t), x, scale, want)
    np.testing.assert_array_equal(got, want)                      # same machine code: bit-identical
    np.testing.assert_allclose(got, x.reshape(64, 33).sum(axis=1) * 0.5, rtol=1e-5, atol=1e-5)
    f32 = [s for s in _task.signatures if str(s[1].dtype) == "float32"]
    assert len(f32) == 1                                           # the address is its one compile
    assert taskcall.address(_task, (np.int64(5), x, np.float32(2.0), want)) == addr   # memoised by types


def test_task_of_other_types_gets_its_own_address():
    x32 = np.ones(8, np.float32)
    x64 = np.ones(8, np.float64)
    a32 = taskcall.address(_task, (np.int64(0), x32, np.float32(1.0), np.zeros(2, np.float32)))
    a64 = taskcall.address(_task, (np.int64(0), x64, np.float32(1.0), np.zeros(2, np.float64)))
    assert a32 != a64
    out = np.zeros(2, np.float64)
    _rows(a64, x64, np.float32(1.0), out)
    np.testing.assert_array_equal(out, [4.0, 4.0])
