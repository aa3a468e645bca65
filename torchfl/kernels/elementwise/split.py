"""The host's split of a large elementwise call over threads (the chip's tiling is not touched).

A call of at least ``PAR_BYTES`` output bytes runs as ONE parallel region: the flat range of the
output's walk is cut into as many equal parts as threads (Numba's OpenMP layer schedules a
``prange`` statically: equal parts are what keeps every thread busy), and each part is walked in
chunks of ``CHUNK`` elements (buffers that stay in the host's L2 and cost no page faults: a
chunk of the plan's whole tile, 393216 elements for BERT's residual add, made three fresh 1.5 MB
buffers a call, 1.5 ms instead of 0.14), each chunk gathered, decoded, applied, encoded and
stored exactly as the one-thread tile loop of ``impl.run_elementwise`` does it (the same
``apply``, ``load_row`` and ``store_row``: bit-identical results). The driver counts the plan's tiles as before; this split
is the host's, not the emulated chip's. Smaller calls keep the Python tile loop: a region costs a
fixed wake-up that a small eager op would pay on every call.

Float ops with float operands only (the paths BERT's and ResNet's adds, activations and their
backward take); integer, bool and promoted operands, conditions and bool outputs keep the loop.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .. import taskcall
from ..staging import load_row, store_row
from ..stream import gather

PAR_BYTES = 64 << 10      # output bytes from which one parallel region beats the Python tile loop
CHUNK = 8192              # elements a thread decodes, applies and stores at once (3 x 32 KB float32)


@njit(cache=True, nogil=True)
def _load(x, xsh, xst, xc, code, s, e, raw, f):
    """f[:e-s] = elements s..e-1 of the walk over x, decoded to float32."""
    if xc:
        load_row(x, s, np.int64(1), e - s, code, f)
    else:
        gather(x, xsh, xst, s, e, raw)
        load_row(raw, np.int64(0), np.int64(1), e - s, code, f)


@njit(cache=True, nogil=True)
def _part(t, P, n, C, ap, x, xsh, xst, xc, xcode, y, ysh, yst, yc, ycode, has_y, o, ocode, s0, s1, tanh_form):
    """Part ``t`` of ``P`` equal parts of the ``n`` elements, in chunks of ``C`` elements."""
    s = t * n // P
    e = (t + 1) * n // P
    m0 = min(C, e - s) if e > s else np.int64(0)
    fx = np.empty(m0, np.float32)
    fy = np.empty(m0 if has_y else 0, np.float32)
    r = np.empty(m0, np.float32)
    bx = np.empty(0 if xc else m0, x.dtype)
    by = np.empty(0 if (yc or not has_y) else m0, y.dtype)
    ez = np.empty(0, np.float32)
    ec = np.empty(0, np.bool_)
    ts = s
    while ts < e:
        te = min(e, ts + C)
        m = te - ts
        _load(x, xsh, xst, xc, xcode, ts, te, bx, fx)
        if has_y:
            _load(y, ysh, yst, yc, ycode, ts, te, by, fy)
            taskcall.call(ap, (fx[:m], fy[:m], ez, ec, r[:m], s0, s1, has_y, tanh_form))
        else:
            taskcall.call(ap, (fx[:m], ez, ez, ec, r[:m], s0, s1, has_y, tanh_form))
        store_row(o, ts, m, ocode, r)
        ts = te


@njit(cache=True, nogil=True, parallel=True)
def _parts(task, P, n, C, ap, x, xsh, xst, xc, xcode, y, ysh, yst, yc, ycode, has_y, o, ocode, s0, s1, tanh_form):
    """The one parallel region: part t on thread t (``task`` is ``_part``'s address)."""
    for t in prange(P):
        taskcall.call(task, (np.int64(t), P, n, C, ap, x, xsh, xst, xc, xcode, y, ysh, yst, yc, ycode, has_y, o,
                             ocode, s0, s1, tanh_form))


_F = np.zeros(1, np.float32)
_B = np.zeros(1, np.bool_)


def run_parts(apply_fn, parts, n, xa, xcode, ya, ycode, oflat, ocode, s0, s1, tanh_form):
    """Run the call as ``parts`` equal parts in one region. ``xa``/``ya``: the operands' walks
    (``stream.Access``; ``ya`` None for a unary op); ``oflat``: the output's contiguous storage."""
    has_y = ya is not None
    if ya is None:
        ya = xa
    ap = taskcall.address(apply_fn, (_F, _F, _F, _B, _F, np.float32(0), np.float32(0), True, False))
    args = (np.int64(parts), np.int64(n), np.int64(CHUNK), ap, xa.flat, xa.shape, xa.strides, bool(xa.contiguous),
            np.int64(xcode), ya.flat, ya.shape, ya.strides, bool(ya.contiguous), np.int64(ycode), has_y, oflat,
            np.int64(ocode), np.float32(s0), np.float32(s1), bool(tanh_form))
    if parts == 1:          # one thread: the part on the calling thread, no region to launch
        _part(np.int64(0), *args)
        return
    task = taskcall.address(_part, (np.int64(0),) + args)
    _parts(task, *args)
