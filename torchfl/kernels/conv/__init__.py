"""Convolution family: conv2d and its fused and backward kernels (pure Python part).

The one tiling function is :func:`conv_tiling` (forward, fused included); the backward
kernels tile with :func:`conv_bwd_input_tiling` / :func:`conv_bwd_weight_tiling` (``backward_tiling.py``), which
reuse the same window geometry. Execution is in ``impl.py``.

Forward tiling. An output tile is ``TK`` output channels (inside one group) x ``TOH`` rows
x ``TOW`` columns of one image; its input window (with halo) is loaded as one slab. Two
strategies:

- ``weight_stationary``: the tile's whole reduction (all C/groups channels) at once; the
  weight block of ``TK`` channels stays on chip while the spatial tiles stream past it
  (loaded once per block), input slabs are double-buffered.
- ``split_c``: when that does not fit, the reduction is cut into ``TC`` channel blocks;
  weight and input sub-blocks are both streamed (double-buffered) for every output tile.

Loop order: group, K block, image, row block, column block (, channel block). The tile
chosen is the one moving the fewest off-chip bytes among those that fit the cache
(ties: fewer tiles, then larger tiles), so a bigger cache never moves more bytes.
"""
from __future__ import annotations

from collections import Counter
from functools import lru_cache

from .. import dtypes as _dt
from ..dtypes import FLOATS
from ..errors import KernelError
from ..spec import KernelSpec, TensorMeta
from ..tiling import TileConfig, Traffic, make_plan, vector_utilisation
from .backward_tiling import (_check_bwd_in, _check_bwd_w, _meta_bwd_in, _meta_bwd_w, conv_bwd_input_tiling,
                              conv_bwd_weight_tiling)
from .geometry import clipped, conv_geometry, pow2_candidates, tile_starts, window_span

__all__ = ["KERNELS", "conv_geometry", "conv_tiling", "conv_bwd_input_tiling",
           "conv_bwd_weight_tiling"]

CONV_DTYPES = FLOATS + ("int8",)

_COMMON_ATTRS = {"stride": (1, 1), "padding": (0, 0), "dilation": (1, 1), "groups": 1}
_QUANT_ATTRS = {"x_scale": 1.0, "x_zero_point": 0, "w_scale": 1.0, "w_zero_point": 0,
                "out_scale": None, "out_zero_point": 0}
# qconv2d (quantised graphs: dequantize -> conv2d [-> relu] [-> quantize]): scales and zero
# points per tensor as attributes, per output channel as the w_scales / w_zero_points inputs;
# the output is requantised to int8 (out_scale set) or dequantised to out_dtype
_QCONV_ATTRS = {"x_scale": 1.0, "x_zero_point": 0, "w_scale": 1.0, "w_zero_point": 0, "out_scale": None,
                "out_zero_point": 0, "out_min": -128, "out_max": 127, "relu": False, "out_dtype": "float32"}
_QVECS = ("w_scales", "w_zero_points")
# epilogue ops per output element
_EPI_OPS = {"bias": 1, "bn": 2, "residual": 1, "relu": 1}


_BN_KERNELS = ("conv2d_bn", "conv2d_bn_relu", "conv2d_bn_add_relu")


def _epilogue(kernel: str, p) -> dict:
    e = {"bias": p.has("bias"), "bn": kernel in _BN_KERNELS,
         "residual": kernel in ("conv2d_add_relu", "conv2d_bn_add_relu"),
         "relu": kernel in ("conv2d_relu", "conv2d_bn_relu", "conv2d_add_relu", "conv2d_bn_add_relu")
         or (kernel == "qconv2d" and bool(p.attrs.get("relu")))}
    return e


def _out_dtype(p) -> str:
    if p.dtype == "int8":
        if p.attrs.get("out_scale") is not None:
            return "int8"
        return p.attrs.get("out_dtype", "float32") if p.kernel == "qconv2d" else "float32"
    return p.dtype


def _param_names(p):
    """Per-output-channel vectors of the epilogue (loaded once per K block, counted)."""
    names = ["bias"] if p.has("bias") else []
    names += [n for n in _QVECS if p.has(n)]
    if p.kernel in _BN_KERNELS:
        names += [n for n in ("bn_weight", "bn_bias") if p.has(n)] + ["running_mean", "running_var"]
    return names


def _check_fwd(p):
    g = conv_geometry(p)
    k = p.kernel
    for name in _param_names(p):
        if p.shapes[name] != (g["K"],):
            raise KernelError(f"kernel {k}: {name} must have shape ({g['K']},), got {p.shapes[name]}")
    if k in ("conv2d_add_relu", "conv2d_bn_add_relu"):
        want = (g["N"], g["K"], g["OH"], g["OW"])
        if p.shapes["residual"] != want:
            raise KernelError(f"kernel {k}: residual must have the output's shape {want}, "
                              f"got {p.shapes['residual']}")
    xd, wd = p.dtype, p.dtype_of("weight")
    if xd == "int8":
        if wd != "int8":
            raise KernelError(f"kernel {k}: int8 input needs an int8 weight, got {wd}")
    else:
        odd = {n: p.dtype_of(n) for n in p.shapes if p.dtype_of(n) != xd}
        if odd:
            raise KernelError(f"kernel {k}: all inputs must be {xd}, got {odd}; insert a cast")
    if k == "qconv2d":
        _check_quantised(p)
    elif xd == "int8":
        for n in _param_names(p):
            if p.dtype_of(n) != "float32":
                raise KernelError(f"kernel {k}: with int8 input, {n} must be float32 "
                                  f"(got {p.dtype_of(n)})")


def _check_quantised(p):
    """qconv2d: int8 x and weight, float bias, float32 per-channel scales, integer zero points."""
    a, k = p.attrs, p.kernel
    if p.has("bias") and p.dtype_of("bias") not in FLOATS:
        raise KernelError(f"kernel {k}: bias must be a float tensor, got {p.dtype_of('bias')}")
    if p.has("w_scales") and p.dtype_of("w_scales") != "float32":
        raise KernelError(f"kernel {k}: w_scales must be float32, got {p.dtype_of('w_scales')}")
    if p.has("w_zero_points") and p.dtype_of("w_zero_points") not in ("int32", "int64", "int8"):
        raise KernelError(f"kernel {k}: w_zero_points must be an integer tensor, got "
                          f"{p.dtype_of('w_zero_points')}")
    if a["out_scale"] is not None and not a["out_scale"] > 0 or not a["x_scale"] > 0:
        raise KernelError(f"kernel {k}: scales must be positive (x_scale={a['x_scale']}, "
                          f"out_scale={a['out_scale']})")
    if not -128 <= a["out_min"] <= a["out_max"] <= 127:
        raise KernelError(f"kernel {k}: out_min/out_max must lie in [-128, 127], got "
                          f"[{a['out_min']}, {a['out_max']}]")
    if a["out_scale"] is None and a["out_dtype"] not in FLOATS:
        raise KernelError(f"kernel {k}: a dequantised output must be one of {', '.join(FLOATS)}, "
                          f"got {a['out_dtype']!r}")


def _out_layout(p):
    return p.attrs.get("out_layout") or p.layouts.get("x")


def _meta_fwd(p):
    g = conv_geometry(p)
    return [TensorMeta((g["N"], g["K"], g["OH"], g["OW"]), _out_dtype(p), _out_layout(p))]


def _axis_tiles(n_out, t, stride, pad, dil, k, n_in):
    """Counter of (tile length, valid input length, slab length) over the tiles of an axis."""
    c = Counter()
    first = None
    for a, b in tile_starts(n_out, t):
        lo, hi = window_span(a, b, stride, pad, dil, k)
        key = (b - a, clipped(lo, hi, n_in))
        c[key] += 1
        if first is None:
            first = key
    return c, first


@lru_cache(maxsize=4096)
def _conv_choice(G, nbytes_key, cache, res):
    """Pick (strategy, TK, TOH, TOW, TC) minimising off-chip bytes among those that fit."""
    (N, K, Cg, Kg, R, S, g, sh, sw, ph, pw, dh, dw, OH, OW, H, W) = G
    es, ew, ey, er, nvec_bytes = nbytes_key
    sums_h = {}
    for t in pow2_candidates(OH):
        tiles = tile_starts(OH, t)
        sums_h[t] = (len(tiles), sum(clipped(*window_span(a, b, sh, ph, dh, R), H) for a, b in tiles))
    sums_w = {}
    for t in pow2_candidates(OW):
        tiles = tile_starts(OW, t)
        sums_w[t] = (len(tiles), sum(clipped(*window_span(a, b, sw, pw, dw, S), W) for a, b in tiles))
    fixed = N * K * OH * OW * (ey + er) + K * nvec_bytes
    best = None
    for tk in pow2_candidates(Kg):
        nkb = -(-Kg // tk) if Kg else 0
        for toh, (nh, srh) in sums_h.items():
            rows = (toh - 1) * sh + (R - 1) * dh + 1
            for tow, (nw, srw) in sums_w.items():
                cols = (tow - 1) * sw + (S - 1) * dw + 1
                acc = toh * tow * tk * 4 + tk * nvec_bytes + (2 * toh * tow * tk * er if res else 0)
                xb = g * nkb * N * Cg * es * srh * srw
                ntile = g * nkb * N * nh * nw
                for tc in pow2_candidates(Cg):
                    if tc == max(Cg, 1):
                        strat = 0
                        need = tk * Cg * R * S * ew + 2 * rows * cols * Cg * es + acc
                        wb = K * Cg * R * S * ew
                        ncb = 1
                    else:
                        strat = 1
                        need = 2 * tk * tc * R * S * ew + 2 * rows * cols * tc * es + acc
                        wb = N * nh * nw * K * Cg * R * S * ew
                        ncb = -(-Cg // tc)
                    total = xb + wb + fixed
                    fits = need <= cache
                    key = (not fits, total if fits else need, ntile * ncb, strat, -tk, -toh, -tow, -tc)
                    if best is None or key < best[0]:
                        best = (key, strat, tk, toh, tow, min(tc, Cg) if Cg else 0, need)
    return best[1:]


def conv_tiling(p, chip):
    """The forward conv family's one tiling function: TilePlan with exact per-tile traffic."""
    G = conv_geometry(p)
    N, K, Cg, Kg, R, S, g = G["N"], G["K"], G["Cg"], G["Kg"], G["R"], G["S"], G["g"]
    OH, OW = G["OH"], G["OW"]
    epi = _epilogue(p.kernel, p)
    es = _dt.itemsize(p.dtype)
    ew = _dt.itemsize(p.dtype_of("weight"))
    ey = _dt.itemsize(_out_dtype(p))
    er = _dt.itemsize(p.dtype_of("residual")) if epi["residual"] else 0
    nvec_bytes = sum(_dt.itemsize(p.dtype_of(n)) for n in _param_names(p))
    if N * K * OH * OW == 0:
        cfg = TileConfig("weight_stationary", (("k", 0), ("oh", 0), ("ow", 0), ("c", Cg)), False,
                         "empty output: nothing moves")
        return make_plan(p.kernel, p.key, cfg, (), 0)
    Gk = (N, K, Cg, Kg, R, S, g, G["sh"], G["sw"], G["ph"], G["pw"], G["dh"], G["dw"], OH, OW,
          G["H"], G["W"])
    strat, tk, toh, tow, tc, need = _conv_choice(Gk, (es, ew, ey, er, nvec_bytes),
                                                 chip.cache_bytes, epi["residual"])
    epi_ops = sum(_EPI_OPS[e] for e, on in epi.items() if on)
    hc, hfirst = _axis_tiles(OH, toh, G["sh"], G["ph"], G["dh"], R, G["H"])
    wc, wfirst = _axis_tiles(OW, tow, G["sw"], G["pw"], G["dw"], S, G["W"])
    kc = Counter(b - a for a, b in tile_starts(Kg, tk))
    groups = Counter()
    for tka, nk in kc.items():
        for (th, rv), nh in hc.items():
            for (tw, cv), nw in wc.items():
                out = th * tw * tka
                base = Traffic(rv * cv * Cg * es + out * er + (0 if strat == 0 else tka * Cg * R * S * ew),
                               out * ey, out * (2 * Cg * R * S + epi_ops))
                cnt = g * nk * N * nh * nw
                if (th, rv) == hfirst and (tw, cv) == wfirst:
                    cnt -= g * nk
                    first = Traffic(base.bytes_read + tka * nvec_bytes
                                    + (tka * Cg * R * S * ew if strat == 0 else 0),
                                    base.bytes_written, base.flops)
                    groups[first] += g * nk
                groups[base] += cnt
    name = ("weight_stationary", "split_c")[strat]
    fits = need <= chip.cache_bytes
    notes = (f"{'weights resident per K block' if strat == 0 else 'reduction split into C blocks'}; "
             f"input slabs double-buffered; footprint {need} B"
             + ("" if fits else f" EXCEEDS the {chip.cache_bytes} B cache (smallest tile)"))
    util = conv_compute_util(G, tk, tc, es, chip)
    if util < 1.0:
        notes += f"; vector lanes {util:.0%} filled"
    # weight_stationary's output tiles are its pipeline's stages; split_c streams channel
    # blocks inside each tile (finer stages than its groups: no fill/drain term, as GEMM)
    cfg = TileConfig(name, (("k", tk), ("oh", toh), ("ow", tow), ("c", tc)), True, notes, util, strat == 0)
    return make_plan(p.kernel, p.key, cfg, [(c, t) for t, c in groups.items()], need)


def conv_compute_util(G, tk, tc, es, chip) -> float:
    """Fraction of the unit's vector lanes a forward conv tile keeps busy (see
    ``tiling.vector_utilisation``). The implicit GEMM vectorises one of two runs, whichever
    fills more lanes: the reduction's contiguous run in the channel-innermost slab (a
    kernel row's S taps x the block's TC channels when the taps are adjacent, dw == 1,
    else TC channels) or the output channels of the tile (TK; a tile covering whole groups,
    e.g. depthwise, lays the groups' channels side by side: TK x groups). The stem's 7x7
    conv of 3 channels: 21 fp16 (42 B of a 256 B vector) or its 64 output channels (128 B)."""
    run = G["S"] * tc if G["dw"] == 1 else tc
    lanes_k = tk * G["g"] if tk == G["Kg"] else tk
    return max(vector_utilisation(run, es, chip), vector_utilisation(lanes_k, es, chip))


# ---------------------------------------------------------------- specs

def _fwd(name, extra_inputs=(), fuses=(), doc=""):
    return KernelSpec(
        name=name, family="conv", inputs=("x", "weight", "bias?") + tuple(extra_inputs),
        attrs={**_COMMON_ATTRS, **_QUANT_ATTRS, "eps": 1e-5, "out_layout": None},
        dtypes=CONV_DTYPES, layouts="any", fuses=tuple(fuses), doc=doc, check=_check_fwd,
        meta=_meta_fwd, tiler=conv_tiling, impl="run_conv2d", mixed_dtypes=True)


_BN = ("bn_weight?", "bn_bias?", "running_mean", "running_var")

KERNELS = [
    _fwd("conv2d", (), ("aten.convolution.default",),
         "2-D convolution, any layout; stride, padding, dilation, groups (depthwise), bias; "
         "int8 with int32 accumulation and per-tensor scale/zero-point."),
    _fwd("conv2d_relu", (), ("aten.convolution.default", "aten.relu.default"),
         "conv2d with relu applied in the epilogue (no intermediate round trip)."),
    _fwd("conv2d_bn", _BN, ("aten.convolution.default",
                            "aten._native_batch_norm_legit_no_training.default"),
         "conv2d with inference batch-norm applied per channel in the epilogue."),
    _fwd("conv2d_bn_relu", _BN, ("aten.convolution.default",
                                 "aten._native_batch_norm_legit_no_training.default",
                                 "aten.relu.default"),
         "conv2d + inference batch-norm + relu in one pass."),
    _fwd("conv2d_add_relu", ("residual",), ("aten.convolution.default", "aten.add.Tensor",
                                            "aten.relu.default"),
         "conv2d + residual add (second input) + relu in one pass."),
    _fwd("conv2d_bn_add_relu", _BN + ("residual",), ("aten.convolution.default",
                                                    "aten._native_batch_norm_legit_no_training.default",
                                                    "aten.add.Tensor", "aten.relu.default"),
         "conv2d + inference batch-norm + residual add + relu in one pass (a ResNet block's "
         "last conv: the sum never makes a round trip)."),
    KernelSpec(
        name="qconv2d", family="conv", inputs=("x", "weight", "bias?") + tuple(n + "?" for n in _QVECS),
        attrs={**_COMMON_ATTRS, **_QCONV_ATTRS, "eps": 1e-5, "out_layout": None}, dtypes=("int8",),
        layouts="any", fuses=("quantized_decomposed.dequantize_per_tensor.default", "aten.conv2d.default",
                              "aten.relu.default", "quantized_decomposed.quantize_per_tensor.default"),
        doc="quantised conv2d: int8 x and weight, int32 accumulation of (x - x_zero_point)(w - w_zero_point), "
            "per-tensor or per-output-channel weight scales/zero points, bias and relu in the epilogue, "
            "output requantised to int8 (out_scale) or dequantised to out_dtype.",
        check=_check_fwd, meta=_meta_fwd, tiler=conv_tiling, impl="run_conv2d", mixed_dtypes=True),
    KernelSpec(
        name="conv2d_backward_input", family="conv", inputs=("grad_out", "weight"),
        attrs={**_COMMON_ATTRS, "input_shape": None, "out_layout": None}, dtypes=FLOATS,
        layouts="any", fuses=("aten.convolution_backward.default",),
        doc="Gradient of conv2d w.r.t. its input (transposed correlation), any layout.",
        check=_check_bwd_in, meta=_meta_bwd_in, tiler=conv_bwd_input_tiling,
        impl="run_conv2d_backward_input"),
    KernelSpec(
        name="conv2d_backward_weight", family="conv", inputs=("grad_out", "x"),
        attrs={**_COMMON_ATTRS, "weight_shape": None, "bias_grad": False}, dtypes=FLOATS,
        layouts="any", fuses=("aten.convolution_backward.default",),
        doc="Gradient of conv2d w.r.t. its weight (and bias when bias_grad), any layout.",
        check=_check_bwd_w, meta=_meta_bwd_w, tiler=conv_bwd_weight_tiling,
        impl="run_conv2d_backward_weight"),
]
