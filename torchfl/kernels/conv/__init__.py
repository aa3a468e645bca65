"""Convolution family: conv2d and its fused and backward kernels (pure Python part).

The one tiling function is :func:`conv_tiling` (forward, fused included); the backward
kernels tile with :func:`conv_bwd_input_tiling` / :func:`conv_bwd_weight_tiling`, which
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
from .geometry import clipped, pair, conv_out_size, pow2_candidates, tile_starts, window_span

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


def conv_geometry(p) -> dict:
    """All sizes of a conv problem (forward or backward), validated."""
    k = p.kernel
    a = p.attrs
    stride = pair(a["stride"], "stride", k)
    pad = pair(a["padding"], "padding", k)
    dil = pair(a["dilation"], "dilation", k)
    g = a["groups"]
    if min(stride) < 1 or min(dil) < 1 or min(pad) < 0 or not isinstance(g, int) or g < 1:
        raise KernelError(f"kernel {k}: stride and dilation must be >= 1, padding >= 0, groups a "
                          f"positive int (got stride={stride}, padding={pad}, dilation={dil}, "
                          f"groups={g})")
    wshape = tuple(p.shapes["weight"] if "weight" in p.shapes else (a.get("weight_shape") or ()))
    if len(wshape) != 4:
        raise KernelError(f"kernel {k}: weight must be 4-D (K, C/groups, R, S), got {wshape}")
    K, Cg, R, S = wshape
    if "x" in p.shapes:
        xshape = p.shapes["x"]
    else:
        xshape = tuple(a["input_shape"] or ())
    if len(xshape) != 4:
        raise KernelError(f"kernel {k}: input must be 4-D (N, C, H, W), got {xshape}; "
                          "a 3-D input needs an explicit batch dimension")
    N, C, H, W = xshape
    if C != Cg * g or K % g:
        raise KernelError(f"kernel {k}: input has {C} channels and weight {wshape} with groups={g}: "
                          f"need C == weight.shape[1]*groups ({Cg}*{g}) and K % groups == 0")
    OH = conv_out_size(H, R, stride[0], pad[0], dil[0])
    OW = conv_out_size(W, S, stride[1], pad[1], dil[1])
    if (OH == 0 or OW == 0) and R * S:
        raise KernelError(f"kernel {k}: the dilated kernel ({dil[0] * (R - 1) + 1} x {dil[1] * (S - 1) + 1}) is "
                          f"larger than the padded input ({H + 2 * pad[0]} x {W + 2 * pad[1]}); torch refuses "
                          "this too: pad the input or use a smaller kernel")
    return dict(N=N, C=C, H=H, W=W, K=K, Cg=Cg, Kg=K // g, R=R, S=S, g=g, sh=stride[0],
                sw=stride[1], ph=pad[0], pw=pad[1], dh=dil[0], dw=dil[1], OH=OH, OW=OW)


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


# ---------------------------------------------------------------- backward: input gradient

def _bwd_in_rows(h0, h1, st, pad, dil, k, n_out):
    """Output rows [lo, hi) whose windows touch input rows [h0, h1)."""
    lo = -(-(h0 + pad - (k - 1) * dil) // st)
    hi = (h1 - 1 + pad) // st + 1
    return max(lo, 0), min(hi, n_out)


def _valid_taps(i, st, pad, dil, k, n_out):
    """How many kernel taps r reach input index i from a real output (stride holes skipped)."""
    n = 0
    for r in range(k):
        t = i + pad - r * dil
        if t >= 0 and t % st == 0 and t // st < n_out:
            n += 1
    return n


def _check_bwd_in(p):
    G = conv_geometry(p)
    want = (G["N"], G["K"], G["OH"], G["OW"])
    if p.shapes["grad_out"] != want:
        raise KernelError(f"kernel {p.kernel}: grad_out must have shape {want} (the forward "
                          f"output), got {p.shapes['grad_out']}")


def _meta_bwd_in(p):
    G = conv_geometry(p)
    return [TensorMeta((G["N"], G["C"], G["H"], G["W"]), p.dtype,
                       p.attrs.get("out_layout") or p.layouts.get("grad_out"))]


@lru_cache(maxsize=1024)
def _bwd_in_choice(G, es, ew, cache):
    (N, C, Cg, Kg, R, S, g, sh, sw, ph, pw, dh, dw, OH, OW, H, W) = G
    best = None
    for tc in pow2_candidates(Cg):
        for th in pow2_candidates(H):
            rh = [_bwd_in_rows(a, b, sh, ph, dh, R, OH) for a, b in tile_starts(H, th)]
            rmax = max((hi - lo for lo, hi in rh), default=0)
            srh = sum(max(0, hi - lo) for lo, hi in rh)
            for tw in pow2_candidates(W):
                rw = [_bwd_in_rows(a, b, sw, pw, dw, S, OW) for a, b in tile_starts(W, tw)]
                cmax = max((hi - lo for lo, hi in rw), default=0)
                srw = sum(max(0, hi - lo) for lo, hi in rw)
                ncb = -(-Cg // tc) if Cg else 0
                need = tc * Kg * R * S * ew + 2 * rmax * cmax * Kg * es + th * tw * tc * 4
                total = g * ncb * N * Kg * es * srh * srw + N * C * H * W * es + C * Kg * R * S * ew
                fits = need <= cache
                key = (not fits, total if fits else need, g * ncb * N * len(rh) * len(rw), -tc, -th, -tw)
                if best is None or key < best[0]:
                    best = (key, tc, th, tw, need)
    return best[1:]


def conv_bwd_input_tiling(p, chip):
    """Input-gradient tiling: tiles of grad_input (TC channels x TH x TW of one image); the
    weights of a channel block stay resident; the grad_out window is streamed."""
    G = conv_geometry(p)
    N, C, Cg, Kg, R, S, g, H, W = (G[k] for k in ("N", "C", "Cg", "Kg", "R", "S", "g", "H", "W"))
    es, ew = _dt.itemsize(p.dtype), _dt.itemsize(p.dtype_of("weight"))
    if N * C * H * W == 0:
        return make_plan(p.kernel, p.key, TileConfig("weight_stationary", (("c", 0), ("h", 0), ("w", 0))), (), 0)
    Gk = (N, C, Cg, Kg, R, S, g, G["sh"], G["sw"], G["ph"], G["pw"], G["dh"], G["dw"], G["OH"],
          G["OW"], H, W)
    tc, th, tw, need = _bwd_in_choice(Gk, es, ew, chip.cache_bytes)
    hc = Counter()
    for a, b in tile_starts(H, th):
        lo, hi = _bwd_in_rows(a, b, G["sh"], G["ph"], G["dh"], R, G["OH"])
        taps = sum(_valid_taps(i, G["sh"], G["ph"], G["dh"], R, G["OH"]) for i in range(a, b))
        hc[(b - a, max(0, hi - lo), taps)] += 1
    wc = Counter()
    for a, b in tile_starts(W, tw):
        lo, hi = _bwd_in_rows(a, b, G["sw"], G["pw"], G["dw"], S, G["OW"])
        taps = sum(_valid_taps(i, G["sw"], G["pw"], G["dw"], S, G["OW"]) for i in range(a, b))
        wc[(b - a, max(0, hi - lo), taps)] += 1
    hfirst = next(iter(hc)) if hc else None
    wfirst = next(iter(wc)) if wc else None
    groups = Counter()
    for tca, nc in Counter(b - a for a, b in tile_starts(Cg, tc)).items():
        for (h, rv, tr), nh in hc.items():
            for (w, cv, tcol), nw in wc.items():
                base = Traffic(rv * cv * Kg * es, h * w * tca * es, 2 * tr * tcol * Kg * tca)
                cnt = g * nc * N * nh * nw
                if (h, rv, tr) == hfirst and (w, cv, tcol) == wfirst:
                    cnt -= g * nc
                    groups[base + Traffic(tca * Kg * R * S * ew, 0, 0)] += g * nc
                groups[base] += cnt
    cfg = TileConfig("weight_stationary", (("c", tc), ("h", th), ("w", tw)), True,
                     f"weights of a channel block resident; grad_out windows double-buffered; "
                     f"footprint {need} B")
    return make_plan(p.kernel, p.key, cfg, [(c, t) for t, c in groups.items()], need)


# ---------------------------------------------------------------- backward: weight gradient

def _check_bwd_w(p):
    G = conv_geometry(p)
    want = (G["N"], G["K"], G["OH"], G["OW"])
    if p.shapes["grad_out"] != want:
        raise KernelError(f"kernel {p.kernel}: grad_out must have shape {want}, got {p.shapes['grad_out']}")


def _meta_bwd_w(p):
    G = conv_geometry(p)
    out = [TensorMeta((G["K"], G["Cg"], G["R"], G["S"]), p.dtype, None)]
    if p.attrs["bias_grad"]:
        out.append(TensorMeta((G["K"],), p.dtype, None))
    return out


@lru_cache(maxsize=1024)
def _bwd_w_choice(G, es, cache, bias):
    (N, K, Cg, Kg, R, S, g, sh, sw, ph, pw, dh, dw, OH, OW, H, W) = G
    cols = clipped(*window_span(0, OW, sw, pw, dw, S), W) if OW else 0
    best = None
    for tk in pow2_candidates(Kg):
        nkb = -(-Kg // tk) if Kg else 0
        for tc in pow2_candidates(Cg):
            ncb = -(-Cg // tc) if Cg else 0
            for toh in pow2_candidates(OH):
                tiles = tile_starts(OH, toh)
                srh = sum(clipped(*window_span(a, b, sh, ph, dh, R), H) for a, b in tiles)
                rows = (toh - 1) * sh + (R - 1) * dh + 1
                slab_cols = (OW - 1) * sw + (S - 1) * dw + 1 if OW else 0
                need = (tk * tc * R * S * 4 + 2 * toh * OW * tk * es + 2 * rows * slab_cols * tc * es
                        + (tk * 4 if bias else 0))
                total = (g * ncb * N * K // g * OH * OW * es + g * nkb * N * Cg * es * srh * cols
                         + K * Cg * R * S * es + (K * es if bias else 0))
                fits = need <= cache
                key = (not fits, total if fits else need, g * nkb * ncb * N * len(tiles), -tk, -tc, -toh)
                if best is None or key < best[0]:
                    best = (key, tk, tc, toh, need)
    return best[1:]


def conv_bwd_weight_tiling(p, chip):
    """Weight-gradient tiling: a (TK x TC x R x S) accumulator block stays on chip while the
    grad_out rows (TOH x full width) and matching input slabs of every image stream past."""
    G = conv_geometry(p)
    N, K, Cg, Kg, R, S, g, OH, OW = (G[k] for k in ("N", "K", "Cg", "Kg", "R", "S", "g", "OH", "OW"))
    es = _dt.itemsize(p.dtype)
    bias = bool(p.attrs["bias_grad"])
    if K * Cg * R * S == 0 and not (bias and K):
        return make_plan(p.kernel, p.key, TileConfig("output_stationary", (("k", 0), ("c", 0), ("oh", 0))), (), 0)
    Gk = (N, K, Cg, Kg, R, S, g, G["sh"], G["sw"], G["ph"], G["pw"], G["dh"], G["dw"], OH, OW,
          G["H"], G["W"])
    tk, tc, toh, need = _bwd_w_choice(Gk, es, chip.cache_bytes, bias)
    cols = clipped(*window_span(0, OW, G["sw"], G["pw"], G["dw"], S), G["W"]) if OW else 0
    hc = Counter()
    for a, b in tile_starts(OH, toh):
        hc[(b - a, clipped(*window_span(a, b, G["sh"], G["ph"], G["dh"], R), G["H"]))] += 1
    groups = Counter()
    kcnt = Counter(b - a for a, b in tile_starts(Kg, tk))
    ccnt = Counter(b - a for a, b in tile_starts(Cg, tc))
    for tka, nk in kcnt.items():
        # the block's store (and, once per K block, the bias gradient) is one "tile" per block
        for tca, nc in ccnt.items():
            groups[Traffic(0, tka * tca * R * S * es, 0)] += g * nk * nc
            for (th, rv), nh in hc.items():
                ops = th * OW * tka * tca * R * S * 2
                groups[Traffic(th * OW * tka * es + rv * cols * tca * es, 0, ops)] += g * nk * nc * N * nh
        if bias:
            groups[Traffic(0, tka * es, 0)] += g * nk
            for (th, rv), nh in hc.items():
                groups[Traffic(0, 0, th * OW * tka)] += g * nk * N * nh
    if Cg == 0 and bias:   # no input channels: the bias gradient still reads grad_out
        for tka, nk in kcnt.items():
            for (th, rv), nh in hc.items():
                groups[Traffic(th * OW * tka * es, 0, 0)] += g * nk * N * nh
    cfg = TileConfig("output_stationary", (("k", tk), ("c", tc), ("oh", toh)), True,
                     f"weight-gradient block resident; grad_out rows and input slabs "
                     f"double-buffered; footprint {need} B")
    return make_plan(p.kernel, p.key, cfg, [(c, t) for t, c in groups.items()], need)


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
