"""Moving tensors between off-chip storage and on-chip buffers, for every kernel family.

Host side: a ``DeviceTensor``'s flat storage and its logical element strides (any layout),
per-thread on-chip scratch and the codec code of a storage dtype on a chip. Jitted side:
``load_rows`` (a dense window -> an on-chip ``[(h, w), c]`` block), ``store_plain`` (its
inverse, no epilogue) and ``load_row`` (one strided row decoded to float32). Imports numba: only ``impl`` modules import this.
"""
from __future__ import annotations

import functools
import threading

import numpy as np
from numba import njit

from .codecs import bf16_to_f32, decode, encode16, f2h_cvt, f32_to_bf16, h2f_cvt


def _flat(t):
    """Flat storage of a DeviceTensor and its logical element strides (layout-aware)."""
    return _flat_view(t), _strides(t.shape, t.layout)


def _flat_view(t):
    """The storage of a DeviceTensor as one flat array."""
    from . import dtypes as _dt

    n = 1
    for d in t.shape:
        n *= d
    return t.buffer.view(_dt.storage_dtype(t.dtype), (n,), t.offset)


@functools.lru_cache(maxsize=4096)
def _strides(shape, layout):
    """Logical element strides of a dense tensor of ``shape`` stored in ``layout``."""
    from .tensor import layout_perm

    perm = layout_perm(layout, len(shape))
    pshape = [shape[q] for q in perm]
    pstr = [0] * len(pshape)
    acc = 1
    for i in range(len(pshape) - 1, -1, -1):
        pstr[i] = acc
        acc *= pshape[i]
    strides = [0] * len(perm)
    for i, q in enumerate(perm):
        strides[q] = pstr[i]
    return tuple(strides)


_TLS = threading.local()


def _scratch(name, n, dtype=np.float32):
    """On-chip scratch of ``n`` elements, reused between calls (per host thread): fresh
    arrays cost page faults and evict the caches on every call."""
    bufs = _TLS.__dict__.setdefault("bufs", {})
    a = bufs.get(name)
    if a is None or a.size < n or a.dtype != dtype:
        a = bufs[name] = np.empty(max(int(n), 1), dtype)
    return a[:n]


def _code(name, chip):
    from . import dtypes as _dt

    return _dt.code(name, chip.bf16_emulation)


@njit(cache=True, nogil=True)
def load_rows(src, s0, s1, s2, s3, code, n, k0, tk, lo_h, hi_h, lo_w, hi_w, dst):
    """src[n, k0:k0+tk, lo_h:hi_h, lo_w:hi_w] (all inside the tensor) -> dst[(h, w), k]."""
    cols = hi_w - lo_w
    for i in range(hi_h - lo_h):
        for j in range(cols):
            b = n * s0 + k0 * s1 + (lo_h + i) * s2 + (lo_w + j) * s3
            o = (i * cols + j) * tk
            for k in range(tk):
                dst[o + k] = decode(code, src[b + k * s1])
    return (hi_h - lo_h) * cols * tk
@njit(cache=True, nogil=True)
def store_plain(acc, tc, th, tw, n, c0, h0, w0, y, t0, t1, t2, t3, ycode):
    for i in range(th):
        for j in range(tw):
            m = i * tw + j
            b = n * t0 + (h0 + i) * t2 + (w0 + j) * t3
            for c in range(tc):
                v = acc[m * tc + c]
                if ycode == 0:
                    y[b + (c0 + c) * t1] = v
                else:
                    y[b + (c0 + c) * t1] = encode16(ycode, v)
    return th * tw * tc


@njit(cache=True)
def store_row(Y, off, n, code, row):
    """Y[off:off + n] = row[:n] encoded from float32 (RNE), contiguous; like :func:`load_row`,
    one loop per code so that each vectorises."""
    dst = Y[off:off + n]
    if code == 0:
        for i in range(n):
            dst[i] = row[i]
    elif code == 1:
        for i in range(n):
            dst[i] = f2h_cvt(row[i])
    elif code == 2:
        for i in range(n):
            dst[i] = f32_to_bf16(row[i])
    else:
        for i in range(n):
            dst[i] = encode16(code, row[i])


@njit(cache=True)
def load_row(X, off, step, n, code, row):
    """row[:n] = X[off + i * step] decoded to float32; a contiguous float32, fp16 or bf16 row in
    one vectorised pass (one loop per code: a branch inside the loop keeps it scalar)."""
    if step != 1:
        for i in range(n):
            row[i] = decode(code, X[off + i * step])
        return
    src = X[off:off + n]
    if code == 0:
        for i in range(n):
            row[i] = np.float32(src[i])
    elif code == 1:
        for i in range(n):
            row[i] = h2f_cvt(src[i])
    elif code == 2:
        for i in range(n):
            row[i] = bf16_to_f32(src[i])
    else:
        for i in range(n):
            row[i] = decode(code, src[i])
