"""Tiling of the conv backward kernels (input and weight gradients): what the planner prices
and ``conv/backward.py`` executes; the forward's tiling is in the package ``__init__``."""
from __future__ import annotations

from collections import Counter
from functools import lru_cache

from .. import dtypes as _dt
from ..errors import KernelError
from ..spec import TensorMeta
from ..tiling import TileConfig, Traffic, make_plan
from .geometry import clipped, conv_geometry, pow2_candidates, tile_starts, window_span


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
