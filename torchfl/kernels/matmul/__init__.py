"""Matmul family: matmul (mm/addmm), bmm, linear, fused linear_relu / linear_gelu /
layernorm_linear. Pure Python: specs, problem normalisation and THE tiling function.

Every kernel is reduced to one batched GEMM ``C[b] = epilogue(A[b] @ B[b])`` with
``A[b]: (M, K)``, ``B[b]: (K, N)`` (B shared by all b when ``b_shared``). Tiling is
output-stationary: C tiles of TM x TN with an fp32 accumulator on chip, K walked in
tiles of TK; A and B tiles are double-buffered. Off-chip traffic per batch:

    reads  = A * ceil(N/TN) + B * ceil(M/TM) + bias * ceil(M/TM)
    writes = C (once, after the last K tile)

unless B fits beside the stream (``B resident``: read once), or everything fits
(``resident``: A, B, C each once). The tiler enumerates candidate tile sizes, keeps those
whose footprint fits the cache, and picks the fewest bytes, then fewest tiles: a bigger
cache can only add candidates, so it never increases the bytes.
"""
from __future__ import annotations


from ..dtypes import FLOATS, ITEMSIZE
from ..errors import KernelError
from ..spec import KernelSpec, TensorMeta
from ..spec import numel as _prod
from ..tiling import TileConfig, Traffic, make_plan

DTYPES = FLOATS + ("int8",)
# trans_a / trans_b (core 1.22.0's transposed-operand fusions): the operand is the tensor before a
# transpose of its last two axes, read in place; the tiling prices the same bytes per tile
TRANS = {"trans_a": False, "trans_b": False}
QUANT = {"a_scale": 1.0, "a_zero": 0, "b_scale": 1.0, "b_zero": 0, "out_scale": 0.0, "out_zero": 0}
# qlinear (quantised graphs: dequantize -> linear [-> relu] [-> quantize]): per-tensor scales and
# zero points as attributes, per-output-channel weight ones as the w_scales / w_zero_points
# inputs; requantised to int8 (out_scale set) or dequantised to out_dtype
QLINEAR = {"x_scale": 1.0, "x_zero_point": 0, "w_scale": 1.0, "w_zero_point": 0, "out_scale": None,
           "out_zero_point": 0, "out_min": -128, "out_max": 127, "relu": False, "out_dtype": "float32"}
QVECS = ("bias", "w_scales", "w_zero_points")   # qlinear's per-output-channel epilogue vectors


def _flags(ta, tb):
    """The transposed operands of a call, as its shape error states them."""
    said = [f for f, on in (("trans_a: a given as [...,K,M]", ta), ("trans_b: b given as [...,N,K]", tb)) if on]
    return f" ({'; '.join(said)})" if said else ""


def _operand(shape, trans, rank):
    """(batch, rows, cols) of a batched GEMM operand as the GEMM reads it: ``rank``-D as stored,
    or, transposed (``trans_*``: the tensor before a transpose the kernel folds), its last two
    axes swapped and any leading axes (rank >= ``rank``; a view merged them) multiplied into the
    batch; (None, None, None) for a rank that does not fit."""
    if len(shape) != rank and not (trans and len(shape) >= rank):
        return None, None, None
    r, c = (shape[-1], shape[-2]) if trans else (shape[-2], shape[-1])
    return _prod(shape[:-2]), r, c


class Gemm:
    """The normalised GEMM of a problem (shapes only; layouts are the impl's business)."""

    __slots__ = ("batch", "M", "K", "N", "b_shared", "has_bias", "act", "ln", "out_shape",
                 "esa", "esc", "esbias", "acc")

    def __init__(self, p):
        name = p.kernel
        s = p.shapes
        ta, tb = bool(p.attrs.get("trans_a")), bool(p.attrs.get("trans_b"))
        if name == "bmm":
            a, b = s["a"], s["b"]
            ba, m, ka = _operand(a, ta, 3)
            bb, kb, n = _operand(b, tb, 3)
            if ba is None or bb is None or ba != bb or ka != kb:
                raise KernelError(f"bmm: expects a[B,M,K] and b[B,K,N], got a{list(a)} b{list(b)}{_flags(ta, tb)}")
            self.batch, self.M, self.K, self.N, self.b_shared = ba, m, ka, n, False
            self.out_shape = (ba, m, n)
        elif name in ("matmul", "matmul_gelu"):
            a, b = s["a"], s["b"]
            if len(a) < 1 or len(b) != 2 or (ta and len(a) != 2) or (a[0] if ta else a[-1]) != b[int(tb)]:
                raise KernelError(f"{name}: expects a[...,M,K] and b[K,N], got a{list(a)} b{list(b)}"
                                  f"{_flags(ta, tb)} (for batched b use bmm{'; a transposed a is 2-D' if ta else ''})")
            n = b[0] if tb else b[1]
            if ta:
                self.batch, self.M, self.K, self.N, self.b_shared = 1, a[1], a[0], n, True
                self.out_shape = (a[1], n)
            else:
                self.batch, self.M, self.K, self.N, self.b_shared = 1, _prod(a[:-1]), a[-1], n, True
                self.out_shape = tuple(a[:-1]) + (n,)
        else:
            x, w = s["x"], s["w"]
            if len(x) < 1 or len(w) != 2 or x[-1] != w[1]:
                raise KernelError(f"{name}: expects x[...,K] and w[N,K], got x{list(x)} w{list(w)}")
            self.batch, self.M, self.K, self.N, self.b_shared = 1, _prod(x[:-1]), x[-1], w[0], True
            self.out_shape = tuple(x[:-1]) + (w[0],)
        bias = s.get("bias")
        if bias is not None and tuple(bias) != (self.N,):
            raise KernelError(f"{name}: bias must have shape [{self.N}], got {list(bias)}")
        self.has_bias = bias is not None
        gelu = 2 if p.attrs.get("approximate", "none") == "none" else 3
        self.act = {"linear_relu": 1, "linear_gelu": gelu, "matmul_gelu": gelu,
                    "qlinear": int(bool(p.attrs.get("relu")))}.get(name, 0)
        self.ln = name == "layernorm_linear"
        if self.ln:
            for k in ("ln_weight", "ln_bias"):
                if k in s and tuple(s[k]) != (self.K,):
                    raise KernelError(f"layernorm_linear: {k} must have shape [{self.K}], got {list(s[k])}")
        dt = p.dtype
        self.esa = ITEMSIZE[dt]
        self.esc = ITEMSIZE[out_dtype(p)]
        self.esbias = 4 if dt == "int8" else ITEMSIZE[dt]
        if name == "qlinear":   # every per-column vector streams beside the B tiles like a bias
            vecs = [k for k in QVECS if k in s]
            for k in vecs:
                if tuple(s[k]) != (self.N,):
                    raise KernelError(f"qlinear: {k} must have shape [{self.N}], got {list(s[k])}")
            self.has_bias = bool(vecs)
            self.esbias = sum(ITEMSIZE[p.dtype_of(k)] for k in vecs)
        self.acc = 4   # fp32 / int32 accumulator on chip


def out_dtype(p):
    if p.kernel == "qlinear":
        return "int8" if p.attrs["out_scale"] is not None else p.attrs["out_dtype"]
    if p.dtype == "int8":
        return "int8" if p.attrs.get("out_scale", 0.0) else "float32"
    return p.dtype


def _check_qlinear(p):
    """qlinear: int8 x and w, a float bias, float32 weight scales, integer zero points."""
    at = p.attrs
    if p.dtype_of("w") != "int8":
        raise KernelError(f"qlinear: w must be int8 like x, got {p.dtype_of('w')}")
    if "bias" in p.shapes and p.dtype_of("bias") not in FLOATS:
        raise KernelError(f"qlinear: bias must be a float tensor, got {p.dtype_of('bias')}")
    if "w_scales" in p.shapes and p.dtype_of("w_scales") != "float32":
        raise KernelError(f"qlinear: w_scales must be float32, got {p.dtype_of('w_scales')}")
    if "w_zero_points" in p.shapes and p.dtype_of("w_zero_points") not in ("int8", "int32", "int64"):
        raise KernelError(f"qlinear: w_zero_points must be an integer tensor, got {p.dtype_of('w_zero_points')}")
    if not at["x_scale"] > 0 or (at["out_scale"] is not None and not at["out_scale"] > 0):
        raise KernelError(f"qlinear: scales must be positive (x_scale={at['x_scale']}, out_scale={at['out_scale']})")
    if not -128 <= at["out_min"] <= at["out_max"] <= 127:
        raise KernelError(f"qlinear: out_min/out_max must lie in [-128, 127], got [{at['out_min']}, {at['out_max']}]")
    if at["out_scale"] is None and at["out_dtype"] not in FLOATS:
        raise KernelError(f"qlinear: a dequantised output must be one of {', '.join(FLOATS)}, got {at['out_dtype']!r}")
    Gemm(p)


def _check(p):
    if p.kernel == "qlinear":
        return _check_qlinear(p)
    a = "a" if p.kernel in ("matmul", "matmul_gelu", "bmm") else "x"
    b = "b" if p.kernel in ("matmul", "matmul_gelu", "bmm") else "w"
    if p.dtype_of(a) != p.dtype or p.dtype_of(b) != p.dtype:
        raise KernelError(f"{p.kernel}: {a} and {b} must share one dtype, got "
                          f"{p.dtype_of(a)} and {p.dtype_of(b)}; insert a cast")
    want = "float32" if p.dtype == "int8" else p.dtype
    for k in ("bias", "ln_weight", "ln_bias"):
        if k in p.shapes and p.dtype_of(k) != want:
            raise KernelError(f"{p.kernel}: {k} must be {want} for {p.dtype} inputs, got {p.dtype_of(k)}")
    if p.kernel == "matmul_gelu" and p.dtype == "int8":
        raise KernelError("matmul_gelu: int8 is not supported (the int8 GEMM has no GELU epilogue)")
    if p.kernel == "layernorm_linear" and p.dtype == "int8":
        raise KernelError("layernorm_linear: int8 is not supported (normalise in float first)")
    if p.kernel in ("linear_gelu", "matmul_gelu") and p.attrs["approximate"] not in ("none", "tanh"):
        raise KernelError(f"{p.kernel}: approximate must be 'none' or 'tanh', got {p.attrs['approximate']!r}")
    Gemm(p)


def _meta(p):
    g = Gemm(p)
    return [TensorMeta(g.out_shape, out_dtype(p), None)]


def _cands(n):
    """Tile sizes tried along an axis of length n: n itself and powers of two below it."""
    c = {n}
    t = 8
    while t < n:
        c.add(t)
        t *= 2
    return sorted(c)


def _cdiv(a, b):
    return -(-a // b)


def _streamed_groups(g, tm, tn, b_res, flops_tile, ln_ops):
    """[(count, Traffic)] of a streamed tiling: per (i, j) output tile, all of its K tiles
    (full tiles and the edge tiles of M and N apart)."""
    M, N, K, esa, esc, esb = g.M, g.N, g.K, g.esa, g.esc, g.esbias
    groups = {}
    for tmx, cm in ((tm, M // tm), (M % tm, 1 if M % tm else 0)):
        for tnx, cn in ((tn, N // tn), (N % tn, 1 if N % tn else 0)):
            if not (cm and cn):
                continue
            r = tmx * K * esa + (0 if b_res else K * tnx * esa + (tnx * esb if g.has_bias else 0))
            t = Traffic(r, tmx * tnx * esc, flops_tile(tmx, tnx) + ln_ops * tmx * K)
            groups[t] = groups.get(t, 0) + cm * cn * g.batch
    return [(c, t) for t, c in groups.items()]


def plan_gemm(p, chip):
    """THE tiling function of the matmul family (see the module docstring)."""
    g = Gemm(p)
    B_, M, K, N = g.batch, g.M, g.K, g.N
    esa, esc, esb, acc = g.esa, g.esc, g.esbias, g.acc
    a_bytes, b_bytes, c_bytes = M * K * esa, K * N * esa, M * N * esc
    bias_b = N * esb if g.has_bias else 0
    ln_b = sum(K * esb for k in ("ln_weight", "ln_bias") if k in p.shapes) if g.ln else 0
    cache = chip.cache_bytes
    key = p.key
    epi = int(g.has_bias) + int(g.act > 0)

    def flops_tile(tm, tn):
        return 2 * tm * tn * K + tm * tn * epi

    if min(M, N) == 0 or B_ == 0 or K == 0:
        # empty output, or K == 0 (C = epilogue(0)): only the output (and bias) move
        cfg = TileConfig("resident", (("m", M), ("n", N), ("k", K)), False, "degenerate GEMM")
        t = Traffic((bias_b if M * N else 0) + ln_b * 0, B_ * c_bytes, B_ * M * N * epi)
        return make_plan(p.kernel, key, cfg, ((1, t),) if t.bytes or t.flops else (), B_ * M * N * acc)

    ln_ops = 4 if g.ln else 0
    best = None
    # 1. resident: everything on chip at once, one tile
    foot = B_ * (a_bytes + (0 if g.b_shared else b_bytes) + M * N * acc) + (b_bytes if g.b_shared else 0) \
        + bias_b + ln_b
    if foot <= cache:
        t = Traffic(B_ * a_bytes + (b_bytes if g.b_shared else B_ * b_bytes) + bias_b + ln_b,
                    B_ * c_bytes, B_ * (flops_tile(M, N) + ln_ops * M * K))
        cfg = TileConfig("resident", (("m", M), ("n", N), ("k", K)), False,
                         "A, B and the fp32 accumulator fit the on-chip cache: each operand loaded once",
                         grid=(B_, M, N, K))
        best = ((t.bytes, 1, 0), cfg, ((1, t),), foot, (M, N, K, False))

    def consider(tm, tn, tk, b_res):
        nonlocal best
        if b_res:
            fp = b_bytes + bias_b + ln_b + 2 * tm * K * esa + tm * N * acc
            tn, tk = N, K
        else:
            fp = 2 * (tm * tk + tk * tn) * esa + tm * tn * acc + 2 * (tn * esb if g.has_bias else 0) + ln_b
        if fp > cache:
            return
        mi, ni = _cdiv(M, tm), _cdiv(N, tn)
        glist = _streamed_groups(g, tm, tn, b_res, flops_tile, ln_ops)
        first_extra = ln_b + ((b_bytes + bias_b) * (1 if g.b_shared else B_) if b_res else 0)
        if first_extra:
            glist.append((1, Traffic(first_extra, 0, 0)))  # resident operands, loaded once
        total = sum(c * t.bytes for c, t in glist)
        ntiles = B_ * mi * ni * (1 if b_res else _cdiv(K, tk))
        score = (total, ntiles, 1)
        if best is None or score < best[0]:
            note = (f"B ({b_bytes} B) resident, A row tiles of {tm} double-buffered" if b_res else
                    f"double-buffered {tm}x{tk} A and {tk}x{tn} B tiles, fp32 {tm}x{tn} accumulator")
            cfg = TileConfig("streamed", (("m", tm), ("n", tn), ("k", tk)), True, note, grid=(B_, M, N, K))
            best = (score, cfg, glist, fp, (tm, tn, tk, b_res))

    for tk in _cands(K):
        for tn in _cands(N):
            # largest TM that fits: TM*(2*tk*esa + tn*acc) <= cache - 2*tk*tn*esa - 2*tn*esb - ln
            room = cache - 2 * tk * tn * esa - 2 * (tn * esb if g.has_bias else 0) - ln_b
            per = 2 * tk * esa + tn * acc
            if room < per:
                continue
            tm = min(M, room // per)
            consider(tm, tn, tk, False)
    room = cache - b_bytes - bias_b - ln_b
    per = 2 * K * esa + N * acc
    if room >= per:
        consider(min(M, room // per), N, K, True)
    if best is None:
        raise KernelError(f"{p.kernel}: no tiling of M={M} N={N} K={K} ({p.dtype}) fits the "
                          f"{cache} B on-chip cache of {chip.name}: even an 8x8 tile needs more")
    _, cfg, groups, fp, _ = best
    if cfg.strategy == "streamed" and best[4][3]:
        cfg = TileConfig(cfg.strategy, cfg.tiles + (("b_resident", 1),), True, cfg.notes, grid=cfg.grid)
    return make_plan(p.kernel, key, cfg, groups, fp)


_DOC_Q = " int8: int32 accumulation of (a-a_zero)(b-b_zero), scaled by a_scale*b_scale (float32 out, or int8 when out_scale is set)."
_LIN_IN = ("x", "w", "bias?")
_DOC_T = (" trans_a / trans_b: that operand is given as stored before a transpose (a[K,M], b[N,K]; for bmm"
          " b[...,N,K] and a[...,K,M], the leading axes a view merges into B) and read in place through"
          " its strides, as a GEMM library's op(B) = T: the same bytes per tile, no copy.")


def _spec(name, inputs, attrs, doc, fuses=()):
    return KernelSpec(name=name, family="matmul", inputs=inputs, attrs=attrs, dtypes=DTYPES,
                      layouts="any", fuses=fuses, doc=doc, check=_check, meta=_meta, tiler=plan_gemm,
                      impl="run_gemm", mixed_dtypes=True)


KERNELS = [
    _spec("matmul", ("a", "b", "bias?"), {"alpha": 1.0, "beta": 1.0, **TRANS, **QUANT},
          "a[...,M,K] @ b[K,N] (mm), alpha*(a@b) + beta*bias[N] (addmm)." + _DOC_T + _DOC_Q,
          ("aten.mm", "aten.addmm", "aten.matmul")),
    _spec("matmul_gelu", ("a", "b", "bias?"), {"alpha": 1.0, "beta": 1.0, "approximate": "none"},
          "gelu(alpha*(a@b) + beta*bias[N]) (approximate none=erf or tanh), fused epilogue: addmm with "
          "an un-transposed weight (GPT-2's Conv1D) then GELU.", ("aten.addmm", "aten.gelu")),
    _spec("bmm", ("a", "b"), {"alpha": 1.0, **TRANS, **QUANT}, "a[B,M,K] @ b[B,K,N]." + _DOC_T + _DOC_Q,
          ("aten.bmm",)),
    _spec("linear", _LIN_IN, dict(QUANT), "x[...,K] @ w[N,K]^T + bias[N]." + _DOC_Q, ("aten.linear",)),
    _spec("linear_relu", _LIN_IN, dict(QUANT), "relu(linear(x, w, bias)), fused epilogue.",
          ("aten.linear", "aten.relu")),
    _spec("linear_gelu", _LIN_IN, {"approximate": "none", **QUANT},
          "gelu(linear(x, w, bias)) (approximate none=erf or tanh), fused epilogue.",
          ("aten.linear", "aten.gelu")),
    KernelSpec(name="qlinear", family="matmul", inputs=_LIN_IN + ("w_scales?", "w_zero_points?"),
               attrs=dict(QLINEAR), dtypes=("int8",), layouts="any",
               fuses=("quantized_decomposed.dequantize_per_tensor.default", "aten.linear.default",
                      "aten.relu.default", "quantized_decomposed.quantize_per_tensor.default"),
               doc="quantised linear: int8 x[...,K] and w[N,K], int32 accumulation of (x - x_zero_point)"
                   "(w - w_zero_point), per-tensor or per-output-channel weight scales/zero points, bias and "
                   "relu in the epilogue, output requantised to int8 (out_scale) or dequantised to out_dtype.",
               check=_check, meta=_meta, tiler=plan_gemm, impl="run_gemm", mixed_dtypes=True),
    _spec("layernorm_linear", ("x", "ln_weight?", "ln_bias?", "w", "bias?"), {"eps": 1e-5},
          "linear(layer_norm(x over K), w, bias): the normalisation is applied while A tiles are "
          "loaded, so the normalised x never goes off-chip.", ("aten.layer_norm", "aten.linear")),
]
