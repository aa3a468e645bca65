"""Matmul family execution: maps each kernel onto the tiled GEMM engine (gemm.py)."""
from __future__ import annotations

import numpy as np

from .. import dtypes as dt
from .. import frozen
from ..gemm import pack_b, prepacked_ok, run_float, run_int8
from ..gemv import uses_gemv
from . import Gemm, out_dtype


def _flat(t):
    return t.physical().reshape(-1)


def _estrides(t):
    lv = t.logical()
    return [s // lv.itemsize for s in lv.strides], lv


def _row_offsets(t, lead_axes):
    """Element offsets of every row (all axes but the last) of tensor t, flattened."""
    st, lv = _estrides(t)
    shape = t.shape[:lead_axes]
    off = np.zeros(shape, np.int64)
    for ax in range(lead_axes):
        idx = np.arange(shape[ax], dtype=np.int64) * st[ax]
        off = off + idx.reshape((-1,) + (1,) * (lead_axes - ax - 1))
    return off.reshape(-1), st[-1]


class _Site:
    """What a GEMM call site needs that depends only on its problem and plan (a device
    tensor's strides follow from its shape and layout): the normalised GEMM, the tiles, the
    row offsets of A and C and B's strides. Kept in ``ctx.cache``, so a repeated call (the
    executor's) does not rebuild them: ~30 us of Python a call, more with the caches cold
    after the previous kernel."""

    __slots__ = ("g", "tiles", "b_res", "a_rows", "aks", "b_base", "b_ks", "b_ns", "c_rows", "code")

    def __init__(self, ctx, a, b):
        p, cfg = ctx.problem, ctx.plan.config
        self.g = g = Gemm(p)
        M, N, Bt = g.M, g.N, g.batch
        self.tiles = cfg.tile("m"), cfg.tile("n"), cfg.tile("k")
        self.b_res = bool(cfg.tile("b_resident", 0))
        self.code = dt.code(p.dtype, ctx.chip.bf16_emulation)
        bst, _ = _estrides(b)
        ta, tb = bool(p.attrs.get("trans_a")), bool(p.attrs.get("trans_b"))
        if p.kernel == "bmm":
            if ta:                     # a stored [..., K, M]: A[b, m, k] at base_b + m*s[-1] + k*s[-2]
                self.a_rows, self.aks = _transposed_rows(a, M)
            else:
                ar, self.aks = _row_offsets(a, 2)
                self.a_rows = ar.reshape(Bt, M)
            self.b_base = _row_offsets(b, b.ndim - 2)[0] if b.ndim > 2 else np.zeros(1, np.int64)
            self.b_ks, self.b_ns = (bst[-1], bst[-2]) if tb else (bst[-2], bst[-1])
            self.c_rows = (np.arange(Bt * M, dtype=np.int64) * N).reshape(Bt, M)
        else:
            if ta:                     # a stored [K, M]
                self.a_rows, self.aks = _transposed_rows(a, M)
            else:
                ar, self.aks = _row_offsets(a, a.ndim - 1)
                self.a_rows = ar.reshape(1, M)
            self.b_base = np.zeros(1, np.int64)
            if p.kernel in ("matmul", "matmul_gelu") and not tb:
                self.b_ks, self.b_ns = bst[0], bst[1]
            else:                      # w[N, K] (or a trans_b b): B[k, n] = w[n, k]
                self.b_ks, self.b_ns = bst[1], bst[0]
            self.c_rows = (np.arange(M, dtype=np.int64) * N).reshape(1, M)


def _transposed_rows(a, M):
    """([batch, M] row offsets, K stride) of A read from its transpose ``a`` (stored [..., K, M]):
    row m of a batch starts at the batch's base + m * (a's last stride) and walks K along a's
    second-to-last stride, so no transposed copy of ``a`` is ever made."""
    st, _ = _estrides(a)
    base = _row_offsets(a, a.ndim - 2)[0] if a.ndim > 2 else np.zeros(1, np.int64)
    rows = base[:, None] + np.arange(M, dtype=np.int64)[None, :] * st[-1]
    return rows, st[-2]


def run_gemm(ctx):
    p = ctx.problem
    ins = ctx.inputs
    (out,) = ctx.outputs()
    if p.kernel in ("matmul", "matmul_gelu", "bmm"):
        a, b = ins["a"], ins["b"]
    else:
        a, b = ins["x"], ins["w"]
    site = ctx.cache.get("gemm")
    if site is None:
        site = ctx.cache["gemm"] = _Site(ctx, a, b)
    g, code = site.g, site.code
    M, N, K, Bt = g.M, g.N, g.K, g.batch
    TM, TN, TK = site.tiles
    b_res = site.b_res
    bias = ins.get("bias")
    bias_arr = None if bias is None else _flat(bias)      # 1-D and dense: contiguous
    C = _flat(out)
    if Bt * M * N == 0:
        return [out]
    esa = g.esa
    if K == 0 or M == 0 or N == 0:
        # C = epilogue(0): the bias (if any) is read once, C written once
        vals = np.zeros(out.shape, np.float32)
        if bias is not None:
            vals = vals + p.attrs.get("beta", 1.0) * dt.decode(bias_arr, bias.dtype)
            ctx.read(bias.nbytes)
        if g.act == 1:
            vals = np.maximum(vals, 0)
        out.logical()[...] = dt.encode(vals, out.dtype)
        ctx.write(out.nbytes)
        ctx.ops(Bt * M * N * (int(bias is not None) + int(g.act > 0)))
        return [out]
    a_rows, aks, b_base, b_ks, b_ns, c_rows = site.a_rows, site.aks, site.b_base, site.b_ks, site.b_ns, site.c_rows
    A, B = _flat(a), _flat(b)
    if p.kernel == "qlinear":
        rd, wr, ops = _run_qlinear(ctx, g, A, a_rows, aks, B, b_base, b_ks, b_ns, C, c_rows, TM, TN, TK, b_res)
    elif p.dtype == "int8":
        at = p.attrs
        oq = bool(at["out_scale"])
        rd, wr, ops = run_int8(A, a_rows, aks, B, b_base, b_ks, b_ns, C, c_rows, 1, M=M, N=N, K=K, TM=TM,
                               TN=TN, TK=TK, b_res=b_res, esc=dt.itemsize(out_dtype(p)), za=at["a_zero"],
                               zb=np.full(N, at["b_zero"], np.int32),
                               scales=np.full(N, np.float32(at["a_scale"] * at["b_scale"]), np.float32),
                               bias=bias_arr, esvec=4 if bias_arr is not None else 0, act=g.act,
                               ocode=4 if oq else 0, oinv=1.0 / (at["out_scale"] or 1.0), ozero=at["out_zero"])
    else:
        ln = None
        if g.ln:
            xs = dt.decode(np.ascontiguousarray(a.logical()), a.dtype).reshape(M, K).astype(np.float32)
            if code == dt.CODE["bfloat16_emulated"]:
                xs = xs.astype(np.float16).astype(np.float32)
            with np.errstate(invalid="ignore", over="ignore"):   # NaN/inf rows: NaN, as torch
                mean = xs.mean(axis=1, dtype=np.float64)
                var = np.square(xs - mean[:, None]).mean(axis=1)
                rstd = (1.0 / np.sqrt(var + p.attrs["eps"])).astype(np.float32)
            gw = ins.get("ln_weight")
            gb = ins.get("ln_bias")
            dec = lambda t: None if t is None else np.ascontiguousarray(dt.decode(_flat(t), t.dtype), np.float32)
            ln = (mean.astype(np.float32), rstd, dec(gw), dec(gb))
            ctx.read(sum(t.nbytes for t in (gw, gb) if t is not None))
        packed = _packed_b(b, B, b_base, b_ks, b_ns, M, N, K, TN, code, g.ln)
        rd, wr, ops = run_float(A, a_rows, aks, B, b_base, b_ks, b_ns, C, c_rows, 1, M=M, N=N, K=K, TM=TM,
                                TN=TN, TK=TK, b_res=b_res, code=code, esa=esa, esc=g.esc, bias=bias_arr,
                                alpha=p.attrs.get("alpha", 1.0), beta=p.attrs.get("beta", 1.0), act=g.act, ln=ln,
                                packed_b=packed)
    ctx.read(rd)
    ctx.write(wr)
    ctx.ops(ops)
    return [out]


def _packed_b(b, B, b_base, b_ks, b_ns, M, N, K, TN, code, has_ln=False):
    """B decoded and packed once for all calls when its buffer is frozen (a weight the
    executor keeps): None when it is not, when the tiles cannot read a whole-B panel set, or when the
    GEMV path streams B as stored (``uses_gemv``: the rule the kernel choice reads)."""
    if b_base.shape[0] != 1 or not prepacked_ok(N, TN) or uses_gemv(M, K, code, b_ks, has_ln):
        return None
    base = int(b_base[0])
    return frozen.derived(b.buffer, ("gemm_b", b.offset, base, b_ks, b_ns, K, N, code, min(TN, N)),
                          lambda: pack_b(B, base, b_ks, b_ns, K, N, code, TN))


def _run_qlinear(ctx, g, A, a_rows, aks, B, b_base, b_ks, b_ns, C, c_rows, TM, TN, TK, b_res):
    """qlinear on the int8 GEMM engine: per-column scales x_scale * w_scale[n] and weight zero
    points (the per-tensor attributes when no vector is given), bias decoded to float32."""
    at, ins, N = ctx.problem.attrs, ctx.inputs, g.N

    def vec(name, default, np_type):
        t = ins.get(name)
        if t is None:
            return np.full(N, default, np_type)
        return np.ascontiguousarray(dt.decode(_flat(t), t.dtype)).astype(np_type)

    scales = (np.float32(at["x_scale"]) * vec("w_scales", at["w_scale"], np.float32)).astype(np.float32)
    zb = vec("w_zero_points", at["w_zero_point"], np.int32)
    bias = vec("bias", 0.0, np.float32) if "bias" in ins else None
    oq = at["out_scale"] is not None
    ocode = 4 if oq else dt.code(at["out_dtype"], ctx.chip.bf16_emulation)
    return run_int8(A, a_rows, aks, B, b_base, b_ks, b_ns, C, c_rows, 1, M=g.M, N=N, K=g.K, TM=TM, TN=TN, TK=TK,
                    b_res=b_res, esc=g.esc, za=at["x_zero_point"], zb=zb, scales=scales, bias=bias,
                    esvec=g.esbias if g.has_bias else 0, act=g.act, ocode=ocode,
                    oinv=1.0 / (at["out_scale"] or 1.0), ozero=at["out_zero_point"], qmin=at["out_min"],
                    qmax=at["out_max"])
