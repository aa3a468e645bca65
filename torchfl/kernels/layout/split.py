"""The host's split of a large layout copy over threads (the chip's tiling is not touched).

A copy, transform, expand, slice or non-row-major reshape of at least ``PAR_BYTES`` output bytes
gathers its output in ONE parallel region: the output's flat range cut into as many equal parts
as threads (Numba's OpenMP layer schedules a ``prange`` statically), each part gathered straight
into the output by the same strided walk (``stream.gather``) the tile loop uses: the same bytes.
The driver counts the plan's tiles as before. Smaller copies keep the tile loop (a region costs
a fixed wake-up a small eager op would pay on every call).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..stream import gather

PAR_BYTES = 64 << 10      # output bytes from which one parallel region beats the tile loop


@njit(cache=True, nogil=True, parallel=True)
def _gather_parts(P, src, shape, strides, contiguous, n, dst):
    """dst[:n] = the walk (shape, strides) over src, part t of P on thread t."""
    for t in prange(P):
        s = np.int64(t) * n // P
        e = (np.int64(t) + 1) * n // P
        if contiguous:
            d = dst[s:e]
            w = src[s:e]
            for i in range(e - s):
                d[i] = w[i]
        else:
            gather(src, shape, strides, s, e, dst[s:e])


def gather_parts(acc, dst, n) -> bool:
    """``dst[:n]`` = the walk ``acc`` (a ``stream.Access`` in dst's order) on every thread; False,
    with nothing done, where the call gets one thread (``threads``: a memory-bound call of fewer
    than SMALL_FLOPS / ELEMENT_WORK elements, or one thread set): the tile loop is as fast there,
    without a region's launch."""
    from .. import threads

    nt = threads.parts_for(n)
    if nt == 1:
        return False
    _gather_parts(np.int64(nt), acc.flat, acc.shape, acc.strides, bool(acc.contiguous), np.int64(n), dst)
    return True
