"""Rounding execution: element by element over the broadcast operands, tile by tile."""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from .. import dtypes as _dt
from ..codecs import decode, enc16
from ..dtypes import FLOATS, ITEMSIZE
from . import out_shape


@njit(cache=True, nogil=True, error_model="numpy")
def _div_float(a, b, floor):
    """torch's div_trunc / div_floor_floating in float32."""
    if not floor:
        return np.float32(np.trunc(a / b))
    if b == 0:
        return a / b
    mod = np.float32(np.fmod(a, b))
    div = (a - mod) / b
    if mod != 0 and (b < 0) != (mod < 0):
        div -= np.float32(1)
    if div != 0:
        fl = np.float32(np.floor(div))
        if div - fl > np.float32(0.5):
            fl += np.float32(1)
        return fl
    return np.float32(math.copysign(0.0, a / b))


@njit(cache=True, nogil=True, error_model="numpy")
def div_floats(a, b, dst, s0, s1, code, floor):
    for t in range(s0, s1):
        q = _div_float(decode(code, a[t]), decode(code, b[t]), floor)
        if code == 0:
            dst[t] = q
        else:
            dst[t] = enc16(code, q)


@njit(cache=True, nogil=True)
def div_ints(a, b, dst, s0, s1, floor):
    for t in range(s0, s1):
        x, y = np.int64(a[t]), np.int64(b[t])
        q = x // y                                    # Python's: rounds toward -inf
        if not floor and q < 0 and q * y != x:
            q += 1                                    # toward zero
        dst[t] = q


def _operand(ctx, name, shape, scalar, dtype):
    if name in ctx.inputs and ctx.inputs[name] is not None:
        arr = ctx.inputs[name].logical()
    else:
        arr = _dt.encode(np.array([scalar]), dtype).reshape(())      # stored as the tensor is
    return np.ascontiguousarray(np.broadcast_to(arr, shape)).reshape(-1)


def run_div_rounding(ctx):
    p = ctx.problem
    (out,) = ctx.outputs()
    shape = out_shape(p)
    n = out.numel
    if n == 0:
        return [out]
    floats = p.dtype in FLOATS
    a = _operand(ctx, "a", shape, None, p.dtype)
    b = _operand(ctx, "b", shape, p.attrs["scalar"], p.dtype)
    if not floats and not b.all():
        raise ZeroDivisionError("div_rounding: integer division by zero (torch raises ZeroDivisionError too)")
    dst = out.physical().reshape(-1)
    floor = np.int64(p.attrs["mode"] == "floor")
    ei = ITEMSIZE[p.dtype]
    cfg = ctx.plan.config
    T = cfg.tile("elements") or n
    streamed = ei * (2 if p.has("b") else 1)
    if _n_of(p, "a") < n:
        streamed -= ei
    if p.has("b") and _n_of(p, "b") < n:
        streamed -= ei
    ctx.read(sum(_n_of(p, k) * ei for k in ("a", "b") if p.has(k) and _n_of(p, k) < n))   # kept on chip
    for s0 in range(0, n, T):
        s1 = min(n, s0 + T)
        if floats:
            div_floats(a, b, dst, np.int64(s0), np.int64(s1), _dt.code(p.dtype, ctx.chip.bf16_emulation), floor)
        else:
            div_ints(a, b, dst, np.int64(s0), np.int64(s1), floor)
        ctx.read((s1 - s0) * streamed)
        ctx.write((s1 - s0) * ei)
        ctx.ops((s1 - s0) * 4)
    return [out]


def _n_of(p, name):
    return math.prod(p.shapes[name])
