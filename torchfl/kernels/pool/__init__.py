"""Pooling family: max/avg/adaptive-avg 2-D pooling and their backward (pure Python part).

The one tiling function is :func:`pool_tiling`. Forward: an output tile is ``TC``
channels x ``TOH`` x ``TOW`` of one image; its input window (halo included) is one
double-buffered slab, read through the tensor's strides (any layout). Backward: a tile
of grad_input; the grad_out (and, for max, indices) rows whose windows touch it are
loaded. Every channel is in exactly one block, so the bytes depend only on the spatial
halo; the tile moving the fewest bytes that fits wins (ties: fewer tiles), so a bigger
cache never moves more bytes.
"""
from __future__ import annotations

from collections import Counter
from functools import lru_cache

from .. import dtypes as _dt
from ..conv.geometry import (adaptive_span, clipped, pair, pool_out_size, pow2_candidates, tile_starts,
                             window_span)
from ..dtypes import FLOATS
from ..errors import KernelError
from ..spec import KernelSpec, TensorMeta
from ..tiling import TileConfig, Traffic, make_plan

__all__ = ["KERNELS", "pool_geometry", "pool_tiling", "Axis"]

IDX_BYTES = 8   # int64 indices, as torch returns them


class Axis:
    """One spatial axis of a pooling: input length, output length and the window rule."""

    __slots__ = ("kind", "n_in", "n_out", "k", "s", "p", "d")

    def __init__(self, kind, n_in, n_out, k=1, s=1, p=0, d=1):
        self.kind, self.n_in, self.n_out, self.k, self.s, self.p, self.d = kind, n_in, n_out, k, s, p, d

    def key(self):
        return (self.kind, self.n_in, self.n_out, self.k, self.s, self.p, self.d)

    def span(self, o0, o1):
        """Input range [lo, hi) (padding included) read by outputs [o0, o1)."""
        if self.kind == "adaptive":
            return adaptive_span(o0, o1, self.n_in, self.n_out)
        return window_span(o0, o1, self.s, self.p, self.d, self.k)

    def valid(self, o0, o1):
        return clipped(*self.span(o0, o1), self.n_in)

    def out_range(self, i0, i1):
        """Outputs [lo, hi) whose windows touch inputs [i0, i1) (for the backward)."""
        if self.kind == "adaptive":
            lo = next((o for o in range(self.n_out) if self.span(o, o + 1)[1] > i0), self.n_out)
            hi = lo
            while hi < self.n_out and self.span(hi, hi + 1)[0] < i1:
                hi += 1
            return lo, max(lo, hi)
        lo = -(-(i0 + self.p - (self.k - 1) * self.d) // self.s)
        hi = (i1 - 1 + self.p) // self.s + 1
        lo, hi = max(lo, 0), min(hi, self.n_out)
        return lo, max(lo, hi)


def pool_geometry(p) -> dict:
    """Validated sizes of a pooling problem: N, C, H, W, OH, OW and the two axes."""
    k, a = p.kernel, p.attrs
    fwd = not k.endswith("_backward")
    if fwd:
        shape = p.shapes["x"]
    else:
        shape = tuple(a.get("input_shape") or ())
    if len(shape) != 4:
        raise KernelError(f"kernel {k}: input must be 4-D (N, C, H, W), got {shape}"
                          + ("" if fwd else "; pass attrs input_shape=(N, C, H, W)"))
    N, C, H, W = shape
    if k.startswith("adaptive"):
        osz = pair(a["output_size"], "output_size", k)
        if min(osz) < 0 or (min(osz) == 0 and H * W):
            raise KernelError(f"kernel {k}: output_size must be positive, got {osz}")
        ax = (Axis("adaptive", H, osz[0]), Axis("adaptive", W, osz[1]))
    else:
        ks = pair(a["kernel_size"], "kernel_size", k)
        st = pair(a["stride"], "stride", k, allow_none=True) or ks
        pad = pair(a["padding"], "padding", k)
        dil = pair(a.get("dilation", 1), "dilation", k)
        if min(ks) < 1 or min(st) < 1 or min(dil) < 1 or min(pad) < 0:
            raise KernelError(f"kernel {k}: kernel_size, stride, dilation must be >= 1 and padding "
                              f">= 0 (got {ks}, {st}, {dil}, {pad})")
        if pad[0] > ks[0] // 2 or pad[1] > ks[1] // 2:
            raise KernelError(f"kernel {k}: padding {pad} must be at most half the kernel size {ks} "
                              "(torch's rule)")
        ceil = bool(a["ceil_mode"])
        oh = pool_out_size(H, ks[0], st[0], pad[0], dil[0], ceil)
        ow = pool_out_size(W, ks[1], st[1], pad[1], dil[1], ceil)
        ax = (Axis("window", H, oh, ks[0], st[0], pad[0], dil[0]),
              Axis("window", W, ow, ks[1], st[1], pad[1], dil[1]))
    return dict(N=N, C=C, H=H, W=W, OH=ax[0].n_out, OW=ax[1].n_out, axes=ax)


def _check(p):
    G = pool_geometry(p)
    if p.kernel.endswith("_backward"):
        want = (G["N"], G["C"], G["OH"], G["OW"])
        for name in ("grad_out", "indices"):
            if name in p.shapes and p.shapes[name] != want:
                raise KernelError(f"kernel {p.kernel}: {name} must have the forward output's shape "
                                  f"{want}, got {p.shapes[name]}")
        if "indices" in p.shapes and p.dtype_of("indices") != "int64":
            raise KernelError(f"kernel {p.kernel}: indices must be int64, got {p.dtype_of('indices')}")
        if p.dtype not in FLOATS:
            raise KernelError(f"kernel {p.kernel}: grad_out must be a float dtype, got {p.dtype}")


def _meta(p):
    G = pool_geometry(p)
    lay = p.attrs.get("out_layout") or p.layouts.get("x" if "x" in p.shapes else "grad_out")
    if p.kernel.endswith("_backward"):
        return [TensorMeta((G["N"], G["C"], G["H"], G["W"]), p.dtype, lay)]
    out = [TensorMeta((G["N"], G["C"], G["OH"], G["OW"]), p.dtype, lay)]
    if p.kernel == "max_pool2d" and p.attrs["return_indices"]:
        out.append(TensorMeta(out[0].shape, "int64", lay))
    return out


@lru_cache(maxsize=4096)
def _fwd_choice(C, axh, axw, es, ei, cache):
    h, w = Axis(*axh), Axis(*axw)
    best = None
    for th in pow2_candidates(h.n_out):
        th_tiles = tile_starts(h.n_out, th)
        srh = sum(h.valid(a, b) for a, b in th_tiles)
        rows = max(b - a for a, b in (h.span(a, b) for a, b in th_tiles))
        for tw in pow2_candidates(w.n_out):
            tw_tiles = tile_starts(w.n_out, tw)
            srw = sum(w.valid(a, b) for a, b in tw_tiles)
            cols = max(b - a for a, b in (w.span(a, b) for a, b in tw_tiles))
            for tc in pow2_candidates(C):
                need = 2 * rows * cols * tc * es + th * tw * tc * (4 + 2 * ei)
                fits = need <= cache
                key = (not fits, srh * srw if fits else need, len(th_tiles) * len(tw_tiles) * -(-C // tc),
                       -tc, -th, -tw)
                if best is None or key < best[0]:
                    best = (key, tc, th, tw, need)
    return best[1:]


@lru_cache(maxsize=4096)
def _bwd_choice(C, axh, axw, es, ei, cache):
    h, w = Axis(*axh), Axis(*axw)
    best = None
    for th in pow2_candidates(h.n_in):
        rh = [h.out_range(a, b) for a, b in tile_starts(h.n_in, th)]
        srh = sum(b - a for a, b in rh)
        rows = max((b - a for a, b in rh), default=0)
        for tw in pow2_candidates(w.n_in):
            rw = [w.out_range(a, b) for a, b in tile_starts(w.n_in, tw)]
            srw = sum(b - a for a, b in rw)
            cols = max((b - a for a, b in rw), default=0)
            for tc in pow2_candidates(C):
                need = 2 * rows * cols * tc * (es + ei) + th * tw * tc * 4
                fits = need <= cache
                key = (not fits, srh * srw if fits else need, len(rh) * len(rw) * -(-C // tc), -tc, -th, -tw)
                if best is None or key < best[0]:
                    best = (key, tc, th, tw, need)
    return best[1:]


def _window_ops(p, ax, o0, o1):
    """Per-axis factor of the ops of outputs [o0, o1): the sum of their window lengths as
    the kernel visits them (max: valid taps; avg: valid taps; adaptive: window)."""
    n = 0
    for o in range(o0, o1):
        lo, hi = ax.span(o, o + 1)
        if ax.kind == "adaptive":
            n += hi - lo
        else:
            n += sum(1 for r in range(ax.k) if 0 <= lo + r * ax.d < ax.n_in)
    return n


def _bwd_pairs(ax, i0, i1):
    """Per-axis factor of the backward adds of input block [i0, i1): (output, tap) pairs with
    the tap inside the block and inside the tensor."""
    lo, hi = ax.out_range(i0, i1)
    n = 0
    for o in range(lo, hi):
        a, b = ax.span(o, o + 1)
        if ax.kind == "adaptive":
            n += clipped(max(a, i0), min(b, i1), ax.n_in)
        else:
            n += sum(1 for r in range(ax.k) if i0 <= a + r * ax.d < i1 and 0 <= a + r * ax.d < ax.n_in)
    return n


def pool_tiling(p, chip):
    """The pooling family's one tiling function (forward and backward)."""
    G = pool_geometry(p)
    N, C = G["N"], G["C"]
    h, w = G["axes"]
    es = _dt.itemsize(p.dtype)
    bwd = p.kernel.endswith("_backward")
    is_max = p.kernel.startswith("max")
    ei = IDX_BYTES if (is_max and (bwd or p.attrs.get("return_indices"))) else 0
    empty = N * C * (G["H"] * G["W"] if bwd else G["OH"] * G["OW"]) == 0
    if empty:
        return make_plan(p.kernel, p.key, TileConfig("streamed", (("c", 0), ("h", 0), ("w", 0))), (), 0)
    groups = Counter()
    if not bwd:
        tc, th, tw, need = _fwd_choice(C, h.key(), w.key(), es, ei, chip.cache_bytes)
        hc = Counter((b - a, h.valid(a, b), _window_ops(p, h, a, b)) for a, b in tile_starts(h.n_out, th))
        wc = Counter((b - a, w.valid(a, b), _window_ops(p, w, a, b)) for a, b in tile_starts(w.n_out, tw))
        extra = 1 if p.kernel.startswith(("avg", "adaptive")) else 0   # the divide
        for tca, nc in Counter(b - a for a, b in tile_starts(C, tc)).items():
            for (oh, rv, oph), nh in hc.items():
                for (ow, cv, opw), nw in wc.items():
                    out = oh * ow * tca
                    ops = tca * oph * opw + out * extra
                    groups[Traffic(rv * cv * tca * es, out * (es + ei), ops)] += N * nc * nh * nw
        tiles = (("c", tc), ("oh", th), ("ow", tw))
        notes = f"input windows double-buffered; footprint {need} B"
    else:
        tc, th, tw, need = _bwd_choice(C, h.key(), w.key(), es, ei, chip.cache_bytes)
        hc = Counter()
        for a, b in tile_starts(h.n_in, th):
            lo, hi = h.out_range(a, b)
            hc[(b - a, hi - lo, 0 if is_max else _bwd_pairs(h, a, b))] += 1
        wc = Counter()
        for a, b in tile_starts(w.n_in, tw):
            lo, hi = w.out_range(a, b)
            wc[(b - a, hi - lo, 0 if is_max else _bwd_pairs(w, a, b))] += 1
        for tca, nc in Counter(b - a for a, b in tile_starts(C, tc)).items():
            for (ih, rv, ph), nh in hc.items():
                for (iw, cv, pw), nw in wc.items():
                    # max: one test-and-add per loaded gradient; avg: one divide per loaded
                    # gradient and one add per (output, input) pair inside the block
                    ops = rv * cv * tca + (0 if is_max else tca * ph * pw)
                    groups[Traffic(rv * cv * tca * (es + ei), ih * iw * tca * es, ops)] += N * nc * nh * nw
        tiles = (("c", tc), ("h", th), ("w", tw))
        notes = f"grad_input tiles; touching grad_out rows double-buffered; footprint {need} B"
    fits = need <= chip.cache_bytes
    cfg = TileConfig("streamed", tiles, True,
                     notes + ("" if fits else f" EXCEEDS the {chip.cache_bytes} B cache (smallest tile)"))
    return make_plan(p.kernel, p.key, cfg, [(c, t) for t, c in groups.items()], need)


_WIN = {"kernel_size": 1, "stride": None, "padding": 0, "ceil_mode": False, "out_layout": None}

KERNELS = [
    KernelSpec("max_pool2d", "pool", ("x",), {**_WIN, "dilation": 1, "return_indices": False},
               FLOATS, "any", ("aten.max_pool2d_with_indices.default", "aten.max_pool2d.default"),
               "2-D max pooling in any layout (NaN propagates; first maximum wins ties); optional "
               "int64 indices (h*W + w) like torch.", _check, _meta, pool_tiling, "run_pool"),
    KernelSpec("avg_pool2d", "pool", ("x",), {**_WIN, "count_include_pad": True, "divisor_override": None},
               FLOATS, "any", ("aten.avg_pool2d.default",),
               "2-D average pooling in any layout (count_include_pad, divisor_override, ceil_mode).",
               _check, _meta, pool_tiling, "run_pool"),
    KernelSpec("adaptive_avg_pool2d", "pool", ("x",), {"output_size": 1, "out_layout": None}, FLOATS,
               "any", ("aten._adaptive_avg_pool2d.default", "aten.adaptive_avg_pool2d.default"),
               "2-D adaptive average pooling (torch's floor/ceil window rule), any layout.",
               _check, _meta, pool_tiling, "run_pool"),
    KernelSpec("max_pool2d_backward", "pool", ("grad_out", "indices"),
               {**_WIN, "dilation": 1, "input_shape": None}, FLOATS, "any",
               ("aten.max_pool2d_with_indices_backward.default",),
               "Gradient of max_pool2d: grad_out routed to the argmax (indices).",
               _check, _meta, pool_tiling, "run_pool_backward", mixed_dtypes=True),
    KernelSpec("avg_pool2d_backward", "pool", ("grad_out",),
               {**_WIN, "count_include_pad": True, "divisor_override": None, "input_shape": None},
               FLOATS, "any", ("aten.avg_pool2d_backward.default",), "Gradient of avg_pool2d.",
               _check, _meta, pool_tiling, "run_pool_backward"),
    KernelSpec("adaptive_avg_pool2d_backward", "pool", ("grad_out",),
               {"output_size": 1, "input_shape": None, "out_layout": None}, FLOATS, "any",
               ("aten._adaptive_avg_pool2d_backward.default",), "Gradient of adaptive_avg_pool2d.",
               _check, _meta, pool_tiling, "run_pool_backward"),
]
