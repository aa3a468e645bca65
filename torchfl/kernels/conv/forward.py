"""Python drivers of the forward convolution (``spec.impl = "run_conv2d"``): call the tile
kernels in the order the TilePlan says and count what they move and compute.
"""
from __future__ import annotations

import itertools
import math

import numba
import numpy as np

from .. import frozen
from ..threads import conv_small, sized_by_plan
from ..staging import _code, _flat, _flat_view, _scratch
from .fused import conv_tile_fused, conv_tiles, fold_epilogue, store_task
from .microkernel import MR, NR, RB
from .pointwise import conv1x1_rows, pack_weight_rows, rows_scratch
from .tiles import F16_LUT, _slab_rows, compute, compute_int, exact_chunk, load_weights, pack_weights, store


def _load_vec(ctx, name, k0, k1, dst):
    """Load params[k0:k1] of a per-channel vector into on-chip dst (float32); counted."""
    from .. import dtypes as _dt

    t = ctx.inputs[name]
    raw = t.logical()[k0:k1]
    dst[k0:k1] = _dt.decode(np.ascontiguousarray(raw), t.dtype)
    ctx.read((k1 - k0) * _dt.itemsize(t.dtype))


class _Site:
    """What a forward conv call site needs that depends only on its problem and plan
    (computed once per bound call: ``ctx.cache``)."""

    def __init__(self, p, chip, cfg):
        from . import _epilogue, _param_names, conv_geometry
        from .. import dtypes as _dt
        from .geometry import tile_starts

        self.G = G = conv_geometry(p)
        self.e = e = _epilogue(p.kernel, p)
        self.is_int = p.dtype == "int8"
        self.stationary = cfg.strategy == "weight_stationary"
        self.fast = self.stationary and not self.is_int
        self.tk, self.toh, self.tow, self.tc = cfg.tile("k"), cfg.tile("oh"), cfg.tile("ow"), cfg.tile("c")
        self.params = _param_names(p)
        self.codes = {n: _code(p.dtype_of(n), chip) for n in p.shapes}
        self.nvec = sum(_dt.itemsize(p.dtype_of(n)) for n in self.params)
        self.n_epi = int(e["bias"]) + 2 * int(e["bn"]) + int(e["residual"]) + int(e["relu"])
        self.kblocks = tile_starts(G["Kg"], self.tk) if G["Kg"] else []
        oh_tiles, ow_tiles = tile_starts(G["OH"], self.toh), tile_starts(G["OW"], self.tow)
        tiles = [(n, a0, a1, b0, b1) for n in range(G["N"]) for a0, a1 in oh_tiles for b0, b1 in ow_tiles]
        self.tiles = np.array(tiles, dtype=np.int64).reshape(-1, 5)
        self.tile0 = tiles[0] if tiles else None
        self.single = len(tiles) == 1
        # tiles of one shape that underfill the 6-pixel micro-kernel are computed together
        bounds = [0]
        for t, (n, a0, a1, b0, b1) in enumerate(tiles):
            if t == 0:
                continue
            s0 = tiles[bounds[-1]]
            px = (a1 - a0) * (b1 - b0)
            same = (a1 - a0, b1 - b0) == (s0[2] - s0[1], s0[4] - s0[3])
            want = MR * RB // math.gcd(MR * RB, px) if px < 4 * MR else 1   # whole register blocks
            if not same or t - bounds[-1] >= want:
                bounds.append(t)
        bounds.append(len(tiles))
        self.groups = np.array(bounds, dtype=np.int64)
        rows_max = (self.toh - 1) * G["sh"] + (G["R"] - 1) * G["dh"] + 1
        cols_max = (self.tow - 1) * G["sw"] + (G["S"] - 1) * G["dw"] + 1
        self.slab_n = rows_max * cols_max * max(G["Cg"], 1)
        self.pointwise = self.fast and _pointwise_problem(p, G, self.codes, chip)
        if self.pointwise:
            self.window_reads = _window_reads(G, self.tiles)


def _pointwise_problem(p, G, codes, chip):
    """Whether the conv is a plain GEMM over channel-outer tensors (pointwise.py): 1x1,
    no padding, one group, x / output / residual stored alike (float32 or
    float16) with each channel's pixels contiguous (N, C, H*W)."""
    from ..staging import _strides

    if (G["R"], G["S"], G["ph"], G["pw"], G["g"]) != (1, 1, 0, 0, 1) or not G["C"]:
        return False
    hw = G["OH"] * G["OW"]
    if hw % NR and hw < 128:     # 7x7: 16-pixel panels pad 49 to 64, the tiled conv's 6-pixel rows to 54
        return False
    names = ["x"] + (["residual"] if "residual" in p.shapes else [])
    if codes["x"] not in (0, 1) or any(codes[n] != codes["x"] for n in names):
        return False
    from . import _out_dtype, _out_layout

    if _code(_out_dtype(p), chip) != codes["x"]:
        return False
    out = (G["N"], G["K"], G["OH"], G["OW"])
    metas = [(p.shapes[n], p.layouts.get(n)) for n in names] + [(out, _out_layout(p))]
    for shape, layout in metas:
        st = _strides(shape, layout)
        if st[3] != 1 or st[2] != shape[3] or st[1] != shape[2] * shape[3]:
            return False
    return True


def _window_reads(G, tiles):
    """Input elements the tiles' windows read (inside the image), as _slab_rows counts them."""
    from .geometry import window_span

    total = 0
    for n, a0, a1, b0, b1 in tiles.tolist():
        lo_h, hi_h = window_span(a0, a1, G["sh"], G["ph"], G["dh"], G["R"])
        lo_w, hi_w = window_span(b0, b1, G["sw"], G["pw"], G["dw"], G["S"])
        total += max(0, min(hi_h, G["H"]) - max(lo_h, 0)) * max(0, min(hi_w, G["W"]) - max(lo_w, 0))
    return total * G["Cg"]


@sized_by_plan(conv_small)     # a small conv's loops on one thread (threads.py)
def run_conv2d(ctx):
    site = ctx.cache.get("conv")
    if site is None:
        site = ctx.cache["conv"] = _Site(ctx.problem, ctx.chip, ctx.plan.config)
    if site.fast:
        return _run_stationary_float(ctx, site)
    return _run_conv2d_general(ctx)


def _run_stationary_float(ctx, site):
    """Float weight-stationary conv: per K block the weights are packed once (panels spread
    over host threads), then each tile is loaded, computed and stored (epilogue fused into
    the store of every 6-pixel micro-row)."""
    from .. import dtypes as _dt

    p, chip = ctx.problem, ctx.chip
    G, e = site.G, site.e
    N, K, Cg, R, S, OH, OW = G["N"], G["K"], G["Cg"], G["R"], G["S"], G["OH"], G["OW"]
    (yt,) = ctx.outputs()
    if N * K * OH * OW == 0:
        return [yt]
    codes = site.codes
    (x, xs), (w, wst), (y, ys) = _flat(ctx.inputs["x"]), _flat(ctx.inputs["weight"]), _flat(yt)
    xcode, wcode, ycode = codes["x"], codes["weight"], _code(yt.dtype, chip)
    es, ew, ey = _dt.itemsize(p.dtype), _dt.itemsize(p.dtype_of("weight")), _dt.itemsize(yt.dtype)
    if e["residual"]:
        res, rs = _flat(ctx.inputs["residual"])
        rcode, er = codes["residual"], _dt.itemsize(p.dtype_of("residual"))
    else:   # a stand-in of the output's storage type: conv2d_bn_relu and conv2d_bn_add_relu then
        # share one compiled conv_tile_fused / conv_tiles (a float32 stand-in compiled a second
        # 21 s specialisation for uint16 storage)
        res, rs, rcode, er = np.zeros(1, y.dtype), (0, 0, 0, 0), 0, 0
    # per-channel parameters, loaded once per K block (resident), folded into one FMA
    ea, eb = _folded_epilogue(ctx, site, K)
    ctx.read(K * site.nvec)
    if site.pointwise:
        _run_pointwise(ctx, site, G, x, xs, xcode, y, ys, res, rs, ea, eb, es, ew, ey, er)
        return [yt]
    npanel = -(-site.tk // NR)
    wpk = _scratch("wpk", npanel * R * S * max(Cg, 1) * NR)
    slab = _scratch("slab", site.slab_n) if site.single else None
    # the parallel loops' pieces one a chunk (meant to be handed out one at a time; under Numba's
    # omp layer, this host's, `omp for` still gives each thread a contiguous half of them: the
    # pieces must be even, as conv_tiles' are); on one thread it only costs (~2.5 us a piece)
    if numba.get_num_threads() == 1:
        _conv_blocks(ctx, site, G, x, xs, xcode, w, wst, wcode, y, ys, ycode, res, rs, rcode, ea, eb, wpk, slab,
                     es, ew, ey, er)
        return [yt]
    with numba.parallel_chunksize(1):
        _conv_blocks(ctx, site, G, x, xs, xcode, w, wst, wcode, y, ys, ycode, res, rs, rcode, ea, eb, wpk, slab,
                     es, ew, ey, er)
    return [yt]


def _conv_blocks(ctx, site, G, x, xs, xcode, w, wst, wcode, y, ys, ycode, res, rs, rcode, ea, eb, wpk, slab,
                 es, ew, ey, er):
    N, Cg, Kg, R, S, g = G["N"], G["Cg"], G["Kg"], G["R"], G["S"], G["g"]
    H, W, OH, OW = G["H"], G["W"], G["OH"], G["OW"]
    sh, sw, ph, pw, dh, dw = G["sh"], G["sw"], G["ph"], G["pw"], G["dh"], G["dw"]
    relu, has_res = site.e["relu"], site.e["residual"]
    per_out = 2 * Cg * R * S + site.n_epi
    for gi in range(g):
        for k0, k1 in site.kblocks:
            kg0 = gi * Kg + k0          # global output channel of the block
            tka = k1 - k0
            kept = _kept_panels(ctx, w, wst, wcode, kg0, tka, Cg, R, S)
            bw = wpk if kept is None else kept
            task = store_task(slab, bw, Cg, tka, R, S, y, ys[1], ycode, ea, eb, kg0, has_res, res, rs[1], rcode,
                              F16_LUT)
            if site.single:
                n, a0, a1, b0, b1 = site.tile0
                nr, nw = conv_tile_fused(task, x, *xs, xcode, Cg, H, W, w, *wst, wcode, bw, kept is None, tka, R, S,
                                         sh, sw, ph, pw, dh, dw, n, gi * Cg, a0, a1, b0, b1, slab, y, *ys, ycode,
                                         kg0, ea, eb, relu, has_res, res, *rs, rcode, F16_LUT)
                ctx.read(nw * ew)
            else:
                if kept is None:
                    pack_weights(w, *wst, wcode, kg0, tka, 0, Cg, R, S, wpk, F16_LUT)
                ctx.read(tka * Cg * R * S * ew)
                nr = conv_tiles(task, x, *xs, xcode, gi * Cg, Cg, H, W, bw, tka, R, S, sh, sw, ph, pw, dh, dw,
                                site.tiles, site.groups, y, *ys, ycode, kg0, ea, eb, relu, has_res, res,
                                *rs, rcode, F16_LUT, np.int64(numba.get_num_threads()))
            nout = N * OH * OW * tka
            ctx.read(nr * es + (nout * er if has_res else 0))
            ctx.write(nout * ey)
            ctx.ops(nout * per_out)


_NO_RES = np.zeros(1, np.float32)


_EPI_PARAMS = ("bias", "bn_weight", "bn_bias", "running_mean", "running_var")


def _folded_epilogue(ctx, site, K):
    """(ea, eb) of y = acc * ea[k] + eb[k] (fold_epilogue), padded to whole 16-wide rows.
    Where every parameter is frozen (the executor's static weights) the fold is kept with
    the first one's buffer, keyed by the others' addresses (frozen buffers are freed, and so
    may be reused, only together with their derived copies): ~30 us of a conv call's Python."""
    names = [n for n in _EPI_PARAMS if n in site.params]
    ts = [ctx.inputs[n] for n in names]

    def make():
        vec = {}
        for name in _EPI_PARAMS:
            t = ctx.inputs.get(name) if name in site.params else None
            vec[name] = (_flat_view(t), site.codes[name]) if t is not None else (_NO_RES, 0)
        eab = np.zeros((2, K + NR), np.float32)
        fold_epilogue(K, np.float32(1.0), float(ctx.problem.attrs["eps"]), site.e["bias"], *vec["bias"],
                      site.e["bn"], "bn_weight" in site.params, *vec["bn_weight"], "bn_bias" in site.params,
                      *vec["bn_bias"], *vec["running_mean"], *vec["running_var"], eab[0], eab[1])
        return eab
    eab = None
    if ts and all(frozen.is_frozen(t.buffer) for t in ts):
        key = ("conv_epilogue", K, float(ctx.problem.attrs["eps"]), site.e["bias"], site.e["bn"],
               tuple((n, t.buffer.address, t.offset, t.dtype) for n, t in zip(names, ts)))
        eab = frozen.derived(ts[0].buffer, key, make)
    if eab is None:
        eab = make()
    return eab[0], eab[1]


def _run_pointwise(ctx, site, G, x, xs, xcode, y, ys, res, rs, ea, eb, es, ew, ey, er):
    """A 1x1 conv on channel-outer tensors as a GEMM per image (pointwise.py), counted as
    the tiles count it: per K block its weights, the tiles' input windows, the residual and
    the output."""
    N, C, HW, K = G["N"], G["C"], G["OH"] * G["OW"], G["K"]
    wt = ctx.inputs["weight"]
    wst = _flat(wt)[1]
    blocks = {}
    for k0, k1 in site.kblocks:
        def make(k0=k0, k1=k1):
            return pack_weight_rows(_weight_rows(wt, K, C)[k0:k1], k1 - k0, C)
        blk = frozen.derived(wt.buffer, ("conv_rows", MR * RB, wt.offset, tuple(wst), K, C, k0, k1), make)
        blocks[k0] = blk if blk is not None else make()
    slab = _scratch("pw_slab", rows_scratch(C, numba.get_num_threads()))
    relu, has_res = site.e["relu"], site.e["residual"]
    per_out = 2 * C + site.n_epi
    for k0, k1 in site.kblocks:
        tka = k1 - k0
        ctx.read(tka * C * ew)
        conv1x1_rows(x, np.int64(0), xs[0], np.int64(xs[1]), xcode, C, HW, G["OW"], G["sh"], G["sw"], G["W"],
                     blocks[k0], k0, tka, y, np.int64(0), ys[0], np.int64(ys[1]), ea, eb, relu, has_res, res,
                     np.int64(0), rs[0], np.int64(rs[1]), N, slab, F16_LUT)
        ctx.read(site.window_reads * es)
        nout = N * HW * tka
        ctx.read(nout * er if has_res else 0)
        ctx.write(nout * ey)
        ctx.ops(nout * per_out)


def _weight_rows(wt, K, C):
    """The (K, C, 1, 1) weight as float32 rows of C (the pointwise GEMM's A operand)."""
    from .. import dtypes as _dt

    return np.asarray(_dt.decode(np.ascontiguousarray(wt.logical()), wt.dtype), dtype=np.float32).reshape(K, C)


def _kept_panels(ctx, w, wst, wcode, kg0, tka, Cg, R, S):
    """The K block's packed weight panels, packed once for all calls when the weight's
    buffer is frozen (a weight the executor keeps; kernels/frozen.py); None otherwise (the
    caller packs into scratch). The chip still loads the block: the caller counts it."""
    wt = ctx.inputs["weight"]

    def make():
        wpk = np.empty(-(-tka // NR) * R * S * max(Cg, 1) * NR, np.float32)
        pack_weights(w, *wst, wcode, kg0, tka, 0, Cg, R, S, wpk, F16_LUT)
        return wpk
    return frozen.derived(wt.buffer, ("conv_panels", NR, wt.offset, tuple(wst), wcode, kg0, tka, Cg, R, S), make)


def _sub_channel_zero_points(wpk, zps, run):
    """Packed int8 weight panels (load_weights: [panel][r][s][c][16], stored as q) minus each
    output channel's own zero point; the panel's padding channels stay zero."""
    tk = zps.shape[0]
    npanel = -(-tk // NR)
    zp = np.zeros(npanel * NR, np.float32)
    zp[:tk] = zps
    view = wpk[:npanel * run * NR].reshape(npanel, run, NR)
    view -= zp.reshape(npanel, 1, NR)


def _fold_block(ctx, p, e, vec, kg0, tka, deq, eps, ea, eb):
    """Load the per-channel parameters of output channels [kg0, kg0 + tka) (once per block,
    resident) and fold dequantisation, bias and batch-norm into one per-channel FMA:
    ``y = acc * ea + eb``."""
    from . import _param_names

    for name in _param_names(p):
        _load_vec(ctx, name, kg0, kg0 + tka, vec[name])
    sl = slice(kg0, kg0 + tka)
    scale, shift = vec["scale"], vec["shift"]
    if e["bn"]:
        wv = vec["bn_weight"][sl] if p.has("bn_weight") else np.ones(tka, np.float32)
        bv = vec["bn_bias"][sl] if p.has("bn_bias") else np.zeros(tka, np.float32)
        inv = (1.0 / np.sqrt(vec["running_var"][sl].astype(np.float64) + eps)).astype(np.float32)
        scale[sl] = wv * inv
        shift[sl] = bv - vec["running_mean"][sl] * scale[sl]
    if p.has("w_scales"):
        deq = np.float32(p.attrs["x_scale"])
    ea[sl] = deq * vec["w_scales"][sl] * scale[sl]
    eb[sl] = (vec["bias"][sl] * scale[sl] if e["bias"] else 0.0) + shift[sl]


def _quant_consts(a, is_int):
    """(x zero point, w zero point, dequantising scale, 1 / out scale, out zero point, qmin,
    qmax) as float32; the float conv's neutral values when not int8."""
    return (np.float32(a["x_zero_point"] if is_int else 0), np.float32(a["w_zero_point"] if is_int else 0),
            np.float32(a["x_scale"] * a["w_scale"]) if is_int else np.float32(1.0),
            np.float32(1.0 / (a["out_scale"] or 1.0)), np.float32(a["out_zero_point"] or 0),
            np.float32(a.get("out_min", -128)), np.float32(a.get("out_max", 127)))


def _epilogue_vectors(K):
    """Per-channel vectors (w_scales: else deq has w_scale), loaded per K block, and the folded
    epilogue's a * acc + b (scale/shift: folded batch norm)."""
    n = max(K, 1)
    vec = {name: np.zeros(n, np.float32) for name in ("bias", "bn_weight", "bn_bias", "running_mean",
                                                       "running_var", "w_zero_points", "shift")}
    vec["w_scales"], vec["scale"] = np.ones(n, np.float32), np.ones(n, np.float32)
    return vec, np.ones(n, np.float32), np.zeros(n, np.float32)


def _residual_operand(ctx, e, p, chip):
    """The residual's flat storage, strides, storage code and itemsize (placeholders without one)."""
    if not e["residual"]:
        return np.zeros(1, np.float32), (0, 0, 0, 0), 0, 0
    from .. import dtypes as _dt

    res, rs = _flat(ctx.inputs["residual"])
    return res, rs, _code(p.dtype_of("residual"), chip), _dt.itemsize(p.dtype_of("residual"))


def _tile_buffers(G, tk, toh, tow, cblock, is_int):
    """(input slab, accumulator, int8 chunk scratch, packed weights, accumulator row length) of
    one output tile. int8 runs exact float32 chunks through the micro-kernel (compute_int), the
    chunk set by the packed block's largest |w - zp|, known once the block is loaded."""
    R, S = G["R"], G["S"]
    rows_max = (toh - 1) * G["sh"] + (R - 1) * G["dh"] + 1
    cols_max = (tow - 1) * G["sw"] + (S - 1) * G["dw"] + 1
    slab = np.zeros(rows_max * cols_max * max(cblock, 1), np.float32)
    npanel = -(-tk // NR)
    ldc = npanel * NR
    mpad = -(-(toh * tow) // MR) * MR
    acc = np.zeros(mpad * ldc, np.float64 if is_int else np.float32)
    wpk = np.zeros(npanel * R * S * max(cblock, 1) * NR, np.float32)
    return slab, acc, (np.zeros(mpad * ldc, np.float32) if is_int else acc), wpk, ldc


def _run_conv2d_general(ctx):
    """split_c and int8 convs: channel blocks accumulate into a whole-tile accumulator."""
    from . import _epilogue, conv_geometry
    from .. import dtypes as _dt
    from .geometry import tile_starts, window_span

    p, chip, cfg = ctx.problem, ctx.chip, ctx.plan.config
    G = conv_geometry(p)
    N, K, Cg, Kg, R, S, g = G["N"], G["K"], G["Cg"], G["Kg"], G["R"], G["S"], G["g"]
    H, W, OH, OW, sh, sw, ph, pw, dh, dw = (G[k] for k in ("H", "W", "OH", "OW", "sh", "sw", "ph", "pw", "dh", "dw"))
    (yt,) = ctx.outputs()
    if N * K * OH * OW == 0:
        return [yt]
    tk, toh, tow, tc = cfg.tile("k"), cfg.tile("oh"), cfg.tile("ow"), cfg.tile("c")
    stationary = cfg.strategy == "weight_stationary"
    e = _epilogue(p.kernel, p)
    is_int = p.dtype == "int8"
    a = p.attrs
    (x, xs), (w, wst), (y, ys) = _flat(ctx.inputs["x"]), _flat(ctx.inputs["weight"]), _flat(yt)
    xcode, wcode, ycode = _code(p.dtype, chip), _code(p.dtype_of("weight"), chip), _code(yt.dtype, chip)
    es, ew, ey = _dt.itemsize(p.dtype), _dt.itemsize(p.dtype_of("weight")), _dt.itemsize(yt.dtype)
    xzp, wzp, deq, out_inv, out_zp, qmin, qmax = _quant_consts(a, is_int)
    per_channel_zp = p.has("w_zero_points")
    vec, ea, eb = _epilogue_vectors(K)
    wzv = vec["w_zero_points"]
    res, rs, rcode, er = _residual_operand(ctx, e, p, chip)
    eps = float(a["eps"])
    n_epi = int(e["bias"]) + 2 * int(e["bn"]) + int(e["residual"]) + int(e["relu"])
    slab, acc, tmp, wpk, ldc = _tile_buffers(G, tk, toh, tow, Cg if stationary else tc, is_int)
    x_bound = float(max(127 - a["x_zero_point"], a["x_zero_point"] + 128)) if is_int else 0.0
    block = {"chunk": 0}

    def chunk(tca):
        if not is_int:
            return 0
        if block.get("tca") != tca:
            block["tca"], block["chunk"] = tca, exact_chunk(x_bound, wpk, tca)
        return block["chunk"]
    oh_tiles, ow_tiles = tile_starts(OH, toh), tile_starts(OW, tow)
    for gi in range(g):
        for k0, k1 in tile_starts(Kg, tk):
            kg0 = gi * Kg + k0          # global output channel of the block
            tka = k1 - k0
            _fold_block(ctx, p, e, vec, kg0, tka, deq, eps, ea, eb)
            if stationary:
                nread = load_weights(w, *wst, wcode, wzp, kg0, tka, 0, Cg, R, S, wpk)
                if per_channel_zp:
                    _sub_channel_zero_points(wpk, wzv[kg0:kg0 + tka], R * S * Cg)
                block.clear()
                ctx.read(nread * ew)
            for n, (oh0, oh1), (ow0, ow1) in itertools.product(range(N), oh_tiles, ow_tiles):
                lo_h, hi_h = window_span(oh0, oh1, sh, ph, dh, R)
                lo_w, hi_w = window_span(ow0, ow1, sw, pw, dw, S)
                th, tw = oh1 - oh0, ow1 - ow0
                acc[:] = 0
                for c0, c1 in ([(0, Cg)] if stationary else tile_starts(Cg, tc)):
                    tca = c1 - c0
                    if not stationary:
                        nread = load_weights(w, *wst, wcode, wzp, kg0, tka, c0, tca, R, S, wpk)
                        if per_channel_zp:
                            _sub_channel_zero_points(wpk, wzv[kg0:kg0 + tka], R * S * tca)
                        block.clear()
                        ctx.read(nread * ew)
                    nread = _slab_rows(x, *xs, xcode, xzp, n, gi * Cg + c0, tca, lo_h, lo_w,
                                       hi_w - lo_w, H, W, slab, 0, hi_h - lo_h, F16_LUT)
                    ctx.read(nread * es)
                    if tca and chunk(tca) > 0:
                        compute_int(slab, hi_w - lo_w, tca, wpk, tka, R, S, sh, sw, dh, dw, th, tw,
                                    acc, tmp, ldc, chunk(tca))
                    elif tca:
                        compute(slab, hi_w - lo_w, tca, wpk, tka, R, S, sh, sw, dh, dw, th, tw, acc, ldc, is_int)
                    ctx.ops(2 * th * tw * tka * tca * R * S)
                nw, nr = store(acc, ldc, tka, th, tw, n, kg0, oh0, ow0, y, *ys, ycode, ea, eb,
                               e["relu"], e["residual"], res, *rs, rcode, out_inv, out_zp, qmin, qmax)
                ctx.write(nw * ey)
                ctx.read(nr * er)
                ctx.ops(nw * n_epi)
    return [yt]
