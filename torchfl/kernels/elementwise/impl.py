"""Elementwise execution: stream tiles in the output's physical order, decode, apply,
encode (RNE), store; count every tile."""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from .. import dtypes as dt
from ..codecs import decode, encode16
from ..mathfn import exp32, gelu32, tanh32
from ..stream import Access, out_order
from . import ES, OPS, _names


@njit(cache=True)
def decode_tile(code, src, dst):
    for i in range(src.shape[0]):
        dst[i] = decode(code, src[i])


@njit(cache=True)
def encode_tile(code, src, dst):
    for i in range(src.shape[0]):
        dst[i] = encode16(code, src[i])


@njit(cache=True)
def _gelu_grad(v, tanh_form):
    if tanh_form:
        k = 0.7978845608028654
        u = k * (v + 0.044715 * v * v * v)
        t = math.tanh(u)
        return 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * k * (1.0 + 3 * 0.044715 * v * v)
    cdf = 0.5 * (1.0 + math.erf(v * 0.7071067811865476))
    pdf = math.exp(-0.5 * v * v) * 0.3989422804014327
    return cdf + v * pdf


@njit(cache=True, error_model="numpy")
def apply(op, x, y, z, c, out, s0, s1, has_y, tanh_form):
    """out = op(x, y, z) on float32 tiles (y/z unused by unary ops; c: bool condition).
    IEEE division (``error_model="numpy"``): x/0 is inf or nan as in torch, never Python's
    ZeroDivisionError, and loops with a division vectorise (no per-element check)."""
    n = out.shape[0]
    if op == 0 or op == 1:
        sg = np.float32(1.0 if op == 0 else -1.0) * s1
        if has_y:
            for i in range(n):
                out[i] = x[i] + sg * y[i]
        else:
            for i in range(n):
                out[i] = x[i] + sg * s0
    elif op == 2:
        if has_y:
            for i in range(n):
                out[i] = x[i] * y[i]
        else:
            for i in range(n):
                out[i] = x[i] * s0
    elif op == 3:
        if has_y:
            for i in range(n):
                out[i] = x[i] / y[i]
        else:
            for i in range(n):
                out[i] = x[i] / s0
    elif op == 4:
        for i in range(n):
            out[i] = x[i] if x[i] > 0 else (np.float32(0.0) if x[i] <= 0 else x[i])
    elif op == 5:
        for i in range(n):
            out[i] = gelu32(x[i], tanh_form)
    elif op == 6:
        for i in range(n):
            out[i] = x[i] / (np.float32(1.0) + exp32(-x[i]))
    elif op == 7:
        for i in range(n):
            out[i] = np.float32(1.0) / (np.float32(1.0) + exp32(-x[i]))
    elif op == 8:
        for i in range(n):
            out[i] = tanh32(x[i])
    elif op == 9:
        for i in range(n):
            out[i] = -x[i]
    elif op == 10:
        for i in range(n):
            out[i] = np.float32(1.0) / math.sqrt(x[i]) if x[i] >= 0 else np.float32(np.nan)
    elif op == 11:
        if has_y:
            for i in range(n):
                out[i] = np.float32(np.float64(x[i]) ** np.float64(y[i]))
        else:
            e = np.float64(s0)
            if e == 2.0:       # x*x, x*x*x: what pow computes, without a scalar libm pow per element
                for i in range(n):
                    v = np.float64(x[i])
                    out[i] = np.float32(v * v)
            elif e == 3.0:     # GPT-2's gelu_new
                for i in range(n):
                    v = np.float64(x[i])
                    out[i] = np.float32(v * v * v)
            else:
                for i in range(n):
                    out[i] = np.float32(np.float64(x[i]) ** e)
    elif op == 12:
        for i in range(n):
            out[i] = x[i] if c[i] else y[i]
    elif op == 13:
        for i in range(n):
            out[i] = x[i] if y[i] > s0 else np.float32(0.0)
    elif op == 14:
        for i in range(n):
            out[i] = x[i] * _gelu_grad(np.float64(y[i]), tanh_form)
    elif op == 15:
        for i in range(n):
            v = np.float64(y[i])
            sg = 1.0 / (1.0 + math.exp(-v))
            out[i] = x[i] * sg * (1.0 + v * (1.0 - sg))
    elif op == 16:
        for i in range(n):
            out[i] = x[i] * y[i] * (np.float32(1.0) - y[i])
    elif op == 17:
        for i in range(n):
            out[i] = x[i] * (np.float32(1.0) - y[i] * y[i])


_E32 = np.zeros(0, np.float32)
_EB = np.zeros(0, np.bool_)


def run_elementwise(ctx):
    p, plan = ctx.problem, ctx.plan
    (out,) = ctx.outputs()
    n = out.numel
    if n == 0:
        return [out]
    order = out_order(out.shape, out.layout)
    names = [nm.rstrip("?") for nm in _names(p)]
    accs = [Access(ctx.inputs[nm], order, out.shape) for nm in names]
    oacc = Access(out, order)
    T = plan.config.tile("elements")
    mask = plan.config.tile("resident_mask", 0)
    code = dt.code(p.dtype, ctx.chip.bf16_emulation)
    op, cost = OPS[p.kernel][0], OPS[p.kernel][3]
    is_where = p.kernel == "where"
    # resident (broadcast) operands: loaded once, counted once
    for i, nm in enumerate(names):
        if mask >> i & 1:
            ctx.read(ctx.inputs[nm].nbytes)
    bufs = [None] * len(names)
    fbufs = [np.empty(min(T, n), np.float32) for _ in names]
    res = np.empty(min(T, n), np.float32)
    at = p.attrs
    s0 = np.float32(at.get("scalar", at.get("exponent", at.get("threshold", 0.0))))
    s1 = np.float32(at.get("alpha", 1.0))
    tanh_form = at.get("approximate", "none") == "tanh"
    for s in range(0, n, T):
        e = min(n, s + T)
        m = e - s
        tiles = []
        for i, (nm, a) in enumerate(zip(names, accs)):
            raw = a.load(s, e, bufs[i])
            if not a.contiguous:
                bufs[i] = raw if bufs[i] is None or bufs[i].shape[0] < m else bufs[i]
            if not mask >> i & 1:
                ctx.read(m * ES[p.dtype_of(nm)])
            if is_where and nm == "cond":
                tiles.append(raw)
            elif code == 0:
                tiles.append(raw)
            else:
                f = fbufs[i][:m]
                decode_tile(code, raw, f)
                tiles.append(f)
        if is_where:
            c, x, y, z = tiles[0], tiles[1], tiles[2], _E32
        else:
            c = _EB
            x = tiles[0]
            y = tiles[1] if len(tiles) > 1 else _E32
            z = _E32
        r = res[:m]
        apply(op, x, y, z, c, r, s0, s1, len(tiles) > 1, tanh_form)
        if code == 0:
            oacc.store(s, e, r)
        else:
            ob = oacc.flat[s:e]
            encode_tile(code, r, ob)
        ctx.write(m * ES[p.dtype])
        ctx.ops(m * cost)
    return [out]


@njit(cache=True)
def qadd_tile(a, b, out, za, sa, zb, sb, inv, zo, lo, hi, relu):
    """PT2E's reference in float32: dq(a) + dq(b) (relu), then quantize_per_tensor's
    clamp(rne(v * float32(1 / out_scale)) + zo): bit-exact with it."""
    for i in range(out.shape[0]):
        v = np.float32((np.float32(a[i]) - za) * sa) + np.float32((np.float32(b[i]) - zb) * sb)
        if relu:
            v = max(v, np.float32(0.0))
        out[i] = min(hi, max(lo, np.rint(v * inv) + zo))


def run_qadd(ctx):
    """qadd over the family's element tiles (both operands streamed)."""
    p, plan = ctx.problem, ctx.plan
    (out,) = ctx.outputs()
    n = out.numel
    if n == 0:
        return [out]
    order = out_order(out.shape, out.layout)
    accs = [Access(ctx.inputs[nm], order, out.shape) for nm in ("a", "b")]
    oacc = Access(out, order)
    T = plan.config.tile("elements")
    at = p.attrs
    f = np.float32
    res = np.empty(min(T, n), np.int8)
    for s in range(0, n, T):
        e = min(n, s + T)
        m = e - s
        a, b = (acc.load(s, e) for acc in accs)
        qadd_tile(a, b, res[:m], f(at["a_zero_point"]), f(at["a_scale"]), f(at["b_zero_point"]), f(at["b_scale"]),
                  f(1.0 / at["out_scale"]), f(at["out_zero_point"]), f(at["out_min"]), f(at["out_max"]),
                  bool(at["relu"]))
        oacc.store(s, e, res[:m])
        ctx.read(2 * m)
        ctx.write(m)
        ctx.ops(m * OPS["qadd"][3])
    return [out]
