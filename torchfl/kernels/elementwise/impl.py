"""Elementwise execution: stream tiles in the output's physical order, decode, apply,
encode (RNE), store; count every tile."""
from __future__ import annotations

import functools
import math

import numpy as np
from numba import njit

from .. import dtypes as dt
from .. import threads
from ..mathfn import erf32, exp32, gelu32, tanh32
from ..staging import load_row, store_row
from ..stream import Access, out_order
from . import COND, INTS, OPS, _names, out_dtype, split
from ..dtypes import ITEMSIZE


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


@njit(inline="always", cache=True)
def _compare(op, u, v):
    """Comparison ops 28-33 (eq, ne, lt, le, gt, ge), for the float and the integer paths."""
    return (u == v if op == 28 else u != v if op == 29 else u < v if op == 30 else u <= v if op == 31
            else u > v if op == 32 else u >= v)


# long: every op's loop sits in the closure's body so Numba's dead-branch pruning keeps only the constant op's (compile 3.5 -> 0.5 s for add)
@functools.lru_cache(maxsize=None)
def _make_apply(OP):
    """``apply`` for the one op code ``OP``: a closure whose ``op`` is a constant, so Numba's
    dead-branch pruning (before typing) drops every other op's loop and only this op's is
    typed, optimised and compiled (a cached closure is keyed by its cell values too). One
    function for all ops compiled ~3 s of CPU in a model's first call whatever ops it used
    (BERT layer: see BENCHMARKS.md, cold first call, cold4). IEEE division
    (``error_model="numpy"``): x/0 is inf or nan as in torch, never Python's
    ZeroDivisionError, and loops with a division vectorise (no per-element check)."""

    # long: the switch over op codes that dead-branch pruning cuts to one op (see _make_apply)
    def apply_op(x, y, z, c, out, s0, s1, has_y, tanh_form):
        op = OP
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
        elif op == 18:
            for i in range(n):
                out[i] = np.float32(math.sin(np.float64(x[i])))
        elif op == 19:
            for i in range(n):
                out[i] = np.float32(math.cos(np.float64(x[i])))
        elif op == 20:
            for i in range(n):
                out[i] = np.float32(math.exp(np.float64(x[i])))
        elif op == 21:
            for i in range(n):
                out[i] = np.float32(math.log(np.float64(x[i]))) if x[i] >= 0 else np.float32(np.nan)
        elif op == 22:
            for i in range(n):
                out[i] = np.float32(math.sqrt(np.float64(x[i]))) if x[i] >= 0 else np.float32(np.nan)
        elif op == 23:
            for i in range(n):
                out[i] = abs(x[i])
        elif op == 24:
            for i in range(n):
                out[i] = erf32(x[i])
        elif op == 25:      # comparisons are false for nan: nan passes through, as in torch
            for i in range(n):
                v = x[i]
                out[i] = s0 if v < s0 else (s1 if v > s1 else v)
        elif op == 26 or op == 27:
            for i in range(n):
                v = x[i] + np.float32(3.0)
                r6 = np.float32(0.0) if v < 0 else (np.float32(6.0) if v > np.float32(6.0) else v)
                out[i] = (x[i] * r6 if op == 26 else r6) / np.float32(6.0)
        elif op >= 28 and op <= 33:
            for i in range(n):
                u = x[i]
                v = y[i] if has_y else s0
                t = _compare(op, u, v)
                out[i] = np.float32(1.0) if t else np.float32(0.0)
        elif op == 34 or op == 35:
            for i in range(n):
                t = (x[i] != 0 and y[i] != 0) if op == 34 else (x[i] != 0 or y[i] != 0)
                out[i] = np.float32(1.0) if t else np.float32(0.0)
        elif op == 36:
            for i in range(n):
                out[i] = np.float32(1.0) if x[i] == 0 else np.float32(0.0)
        elif op == 38:
            for i in range(n):
                out[i] = s0 if c[i] == (s1 != 0) else x[i]
        elif op == 39:
            for i in range(n):
                out[i] = np.float32(1.0) / x[i]
        elif op == 40 or op == 41:      # torch.minimum / maximum: nan wins, a tie keeps a (0.0 vs -0.0)
            for i in range(n):
                u, v = x[i], y[i]
                out[i] = u if ((u <= v if op == 40 else u >= v) or u != u) else v

    apply_op.__qualname__ = "apply"     # its name in the cache and `torchfl kernels info`
    return njit(cache=True, error_model="numpy")(apply_op)


@functools.lru_cache(maxsize=None)
def apply_task(OP):
    """``_make_apply(OP)``'s function under a name of its own (``apply_op<OP>``), for a caller that
    calls it through its address (``taskcall``, the host split): every op's ``apply`` is named
    ``apply``, and two ops compiled in different processes can carry one mangled symbol (Numba's
    unique ids restart in each process), so an address looked up by symbol can be another op's
    (relu ran add's code: tests/kernels/test_host_split.py). Compiled only where a call splits."""
    import types

    f = _make_apply(OP).py_func
    g = types.FunctionType(f.__code__, f.__globals__, f.__name__, f.__defaults__, f.__closure__)
    g.__qualname__ = f"apply_op{OP}"
    return njit(cache=True, error_model="numpy")(g)


def apply(op, x, y, z, c, out, s0, s1, has_y, tanh_form):
    """out = op(x, y, z) on float32 tiles (y/z unused by unary ops; c: bool condition),
    through op's own compiled function (:func:`_make_apply`)."""
    _make_apply(int(op))(x, y, z, c, out, s0, s1, has_y, tanh_form)


@njit(cache=True)
def apply_int(op, x, y, c, out, s0, s1, has_y):
    """out = op(x, y) on int64 tiles: exact integer and boolean index math (masks,
    position ids); the op codes are ``apply``'s."""
    n = out.shape[0]
    if op == 0 or op == 1:
        sg = s1 if op == 0 else -s1
        for i in range(n):
            out[i] = x[i] + sg * (y[i] if has_y else s0)
    elif op == 2:
        for i in range(n):
            out[i] = x[i] * (y[i] if has_y else s0)
    elif op == 9:
        for i in range(n):
            out[i] = -x[i]
    elif op == 23:
        for i in range(n):
            out[i] = abs(x[i])
    elif op == 12:
        for i in range(n):
            out[i] = x[i] if c[i] else y[i]
    elif op == 25:
        for i in range(n):
            out[i] = min(max(x[i], s0), s1)
    elif op >= 28 and op <= 33:
        for i in range(n):
            u = x[i]
            v = y[i] if has_y else s0
            t = _compare(op, u, v)
            out[i] = 1 if t else 0
    elif op == 34:
        for i in range(n):
            out[i] = 1 if (x[i] != 0 and y[i] != 0) else 0
    elif op == 35:
        for i in range(n):
            out[i] = 1 if (x[i] != 0 or y[i] != 0) else 0
    elif op == 36:
        for i in range(n):
            out[i] = 1 if x[i] == 0 else 0
    elif op == 38:
        for i in range(n):
            out[i] = s0 if c[i] == (s1 != 0) else x[i]
    elif op == 40:
        for i in range(n):
            out[i] = min(x[i], y[i])
    elif op == 41:
        for i in range(n):
            out[i] = max(x[i], y[i])


_E32 = np.zeros(0, np.float32)
_EI = np.zeros(0, np.int64)
_EB = np.zeros(0, np.bool_)


def _scalars(p, is_int):
    """(s0, s1) of ``apply``/``apply_int`` for this op."""
    at = p.attrs
    if p.kernel == "hardtanh":
        lo, hi = at.get("min_val"), at.get("max_val")
        if is_int:
            return (np.int64(lo) if lo is not None else np.int64(-(1 << 62)),
                    np.int64(hi) if hi is not None else np.int64(1 << 62))
        return (np.float32(-np.inf if lo is None else lo), np.float32(np.inf if hi is None else hi))
    if p.kernel == "masked_fill":
        s0, s1 = at["scalar"], 1 if at["fill_if"] else 0
    else:
        s0 = at.get("scalar", at.get("exponent", at.get("threshold", 0.0)))
        s1 = at.get("alpha", 1.0)
    if is_int:
        return np.int64(s0), np.int64(s1)
    return np.float32(s0), np.float32(s1)


def _fill(ctx, out, T):
    """fill: write the constant tile by tile (nothing is read)."""
    p = ctx.problem
    flat = out.physical().reshape(-1)
    value = dt.encode(np.array([p.attrs["scalar"]], np.float32), out.dtype) if out.dtype in dt.FLOATS \
        else np.array([p.attrs["scalar"]]).astype(flat.dtype)
    for s in range(0, out.numel, T):
        e = min(out.numel, s + T)
        flat[s:e] = value[0]
        ctx.write((e - s) * ITEMSIZE[out.dtype])
    return [out]


def _split_parts(p, names, odt, oacc, n, is_int, cond) -> int:
    """Parts of the host's split (``split.py``), one a thread, or 1: the tile loop. A call splits
    when it is float math on float operands of the op's dtype, at most two of them, its output
    ``PAR_BYTES`` or more, and it gets more than one thread (``threads``: a memory-bound call of
    SMALL_FLOPS / ELEMENT_WORK elements or more). On one thread the loop stays: as fast, and the
    split's functions compile only where a call splits (2.5 s of cold CPU for ``_part`` and its
    op's ``apply_task``)."""
    if n * ITEMSIZE[odt] < split.PAR_BYTES:     # first: the one test an eager op's small call pays
        return 1
    if (is_int or cond is not None or odt != p.dtype or len(names) > 2 or not oacc.contiguous
            or any(p.dtype_of(nm) != p.dtype for nm in names)):
        return 1
    return threads.parts_for(n)


def _run_split(ctx, names, accs, oacc, mask, code, out, parts):
    """The counters of the plan's tiles (the same sums as the tile loop's), then the parts."""
    p = ctx.problem
    n, es = out.numel, ITEMSIZE[p.dtype]
    for i in range(len(names)):
        if not mask >> i & 1:
            ctx.read(n * es)
    ctx.write(n * es)
    ctx.ops(n * OPS[p.kernel][3])
    s0, s1 = _scalars(p, False)
    ya = accs[1] if len(accs) > 1 else None
    split.run_parts(apply_task(OPS[p.kernel][0]), parts, n, accs[0], code, ya, code, oacc.flat, code, s0, s1,
              p.attrs.get("approximate", "none") == "tanh")
    return [out]


def run_elementwise(ctx):
    p, plan = ctx.problem, ctx.plan
    (out,) = ctx.outputs()
    n = out.numel
    if n == 0:
        return [out]
    T = plan.config.tile("elements")
    if p.kernel == "fill":
        return _fill(ctx, out, T)
    order = out_order(out.shape, out.layout)
    names = [nm.rstrip("?") for nm in _names(p)]
    accs = [Access.kept(ctx.cache, ("ew_walk", nm), ctx.inputs[nm], order, out.shape) for nm in names]
    oacc = Access.kept(ctx.cache, ("ew_walk", None), out, order)
    mask = plan.config.tile("resident_mask", 0)
    is_int = p.dtype in INTS
    code = 0 if is_int else dt.code(p.dtype, ctx.chip.bf16_emulation)
    op, cost = OPS[p.kernel][0], OPS[p.kernel][3]
    cond = COND.get(p.kernel)
    odt = out_dtype(p)
    # resident (broadcast) operands: loaded once, counted once
    for i, nm in enumerate(names):
        if mask >> i & 1:
            ctx.read(ctx.inputs[nm].nbytes)
    parts = _split_parts(p, names, odt, oacc, n, is_int, cond)
    if parts > 1:
        return _run_split(ctx, names, accs, oacc, mask, code, out, parts)
    bufs = [None] * len(names)
    fbufs = [np.empty(min(T, n), np.int64 if is_int else np.float32) for _ in names]
    res = np.empty(min(T, n), np.int64 if is_int else np.float32)
    s0, s1 = _scalars(p, is_int)
    tanh_form = p.attrs.get("approximate", "none") == "tanh"
    for s in range(0, n, T):
        e = min(n, s + T)
        m = e - s
        c = _EB
        vals = []
        for i, (nm, a) in enumerate(zip(names, accs)):
            raw = a.load(s, e, bufs[i])
            if not a.contiguous:
                bufs[i] = raw if bufs[i] is None or bufs[i].shape[0] < m else bufs[i]
            if not mask >> i & 1:
                ctx.read(m * ITEMSIZE[p.dtype_of(nm)])
            if nm == cond:
                c = raw
            elif is_int or p.dtype_of(nm) in INTS:     # an integer operand of float math: promoted
                f = fbufs[i][:m]
                f[:] = raw
                vals.append(f)
            elif code == 0:
                vals.append(raw)
            else:
                f = fbufs[i][:m]
                load_row(raw, 0, 1, m, code, f)
                vals.append(f)
        empty = _EI if is_int else _E32
        x = vals[0]
        y = vals[1] if len(vals) > 1 else empty
        r = res[:m]
        if is_int:
            apply_int(op, x, y, c, r, s0, s1, len(vals) > 1)
        else:
            apply(op, x, y, _E32, c, r, s0, s1, len(vals) > 1, tanh_form)
        ob = oacc.flat[s:e]
        if odt == "bool":
            np.not_equal(r, 0, out=ob)
        elif is_int:
            ob[:] = r
        elif code == 0:
            oacc.store(s, e, r)
        else:
            store_row(ob, 0, m, code, r)
        ctx.write(m * ITEMSIZE[odt])
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
