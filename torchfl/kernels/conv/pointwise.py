"""A 1x1 unpadded float conv on channel-outer tensors (NCHW) as the GEMM it is:
``y[k, p] = sum_c w[k, c] * x[c, p]`` over the image's pixels p, with the fused epilogue.

Why a path of its own: the tiled conv (fused.py) puts 16 output channels in the vector
lanes, so on a channel-outer output every 6x16 block is transposed on its way out (~1 ns
an output, more than the FMAs of a 64-channel reduction). Here the lanes hold 16
consecutive pixels: the register block (microkernel.make_block_kernel, packed A)
broadcasts MB output channels' weights against 16-pixel input panels, and each
accumulator row is one output channel's 16 contiguous pixels, stored as one vector. The
sums are the tiled conv's, in the same order (one FMA chain over c from 0), so the two
paths agree bit for bit. The caller counts the tiles' traffic as the plan says.
"""
from __future__ import annotations

from llvmlite import ir
import numpy as np
from numba import njit, prange, types
from numba.extending import intrinsic

from .. import taskcall
from .microkernel import MR, NR, PB, RB, VW, make_block_kernel
from ..codecs import enc16
from ..optlevel import opt_level   # IR level 1: the hot loops are vector-IR micro-kernels (BENCHMARKS, cold5)
from .tiles import _dec


MB = MR * RB        # output channels per register block
mkp_p2, mkp_p1 = make_block_kernel(RB, 2, VW, True), make_block_kernel(RB, 1, VW, True)


def _vec_ptr(context, builder, aty, arr, off, vt):
    data = context.make_array(aty)(context, builder, arr).data
    return builder.bitcast(builder.gep(data, [off]), vt.as_pointer())


@intrinsic
def f16x16_to_f32(typingctx, X, xoff, S, soff):
    """S[soff:soff + 16] = float32 of the float16 bits X[xoff:xoff + 16] (one conversion)."""
    sig = types.void(X, xoff, S, soff)

    def codegen(context, builder, signature, args):
        x_arr, xoff_v, s_arr, soff_v = args
        sa = signature.args
        h = builder.load(_vec_ptr(context, builder, sa[0], x_arr, xoff_v, ir.VectorType(ir.IntType(16), NR)), align=2)
        v = builder.fpext(builder.bitcast(h, ir.VectorType(ir.HalfType(), NR)), ir.VectorType(ir.FloatType(), NR))
        builder.store(v, _vec_ptr(context, builder, sa[2], s_arr, soff_v, v.type), align=4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def epi_row16_f16(typingctx, C, coff, a, b, R, roff, has_res, lo, Y, yoff):
    """Y[yoff:yoff + 16] = f16(max(f32(C[coff:+16] * a + b) (+ f32(R[roff:+16])), lo)), all
    float16 storage (uint16): one output channel's 16 pixels, rounded as the scalar
    epilogue rounds (no fused multiply-add; Python's max, NaN stays NaN). R is read even
    without a residual (pass any 16 readable elements)."""
    sig = types.void(C, coff, a, b, R, roff, has_res, lo, Y, yoff)

    def codegen(context, builder, signature, args):
        c_arr, coff_v, a_v, b_v, r_arr, roff_v, hr_v, lo_v, y_arr, yoff_v = args
        sa = signature.args
        f32 = ir.FloatType()
        vf = ir.VectorType(f32, NR)
        vi = ir.VectorType(ir.IntType(16), NR)
        vh = ir.VectorType(ir.HalfType(), NR)

        def splat(val, ty):
            s = builder.insert_element(ir.Constant(vf, ir.Undefined), context.cast(builder, val, ty, types.float32),
                                       ir.Constant(ir.IntType(32), 0))
            return builder.shuffle_vector(s, ir.Constant(vf, ir.Undefined),
                                          ir.Constant(ir.VectorType(ir.IntType(32), NR), [0] * NR))
        v = builder.load(_vec_ptr(context, builder, sa[0], c_arr, coff_v, vf), align=4)
        v = builder.fadd(builder.fmul(v, splat(a_v, sa[2])), splat(b_v, sa[3]))
        r = builder.load(_vec_ptr(context, builder, sa[4], r_arr, roff_v, vi), align=2)
        v = builder.select(context.cast(builder, hr_v, sa[6], types.boolean),
                           builder.fadd(v, builder.fpext(builder.bitcast(r, vh), vf)), v)
        lov = splat(lo_v, sa[7])
        v = builder.select(builder.fcmp_ordered(">", lov, v), lov, v)
        builder.store(builder.bitcast(builder.fptrunc(v, vh), vi),
                      _vec_ptr(context, builder, sa[8], y_arr, yoff_v, vi), align=2)
        return context.get_dummy_value()

    return sig, codegen


@opt_level(1)
@njit(cache=True, nogil=True)
def _pack_pixels(x, xoff, xc, code, C, HW, OW, sh, sw, W, slab, pp0, pp1, lut):
    """Output pixels [16 pp0, 16 pp1) of every input channel -> slab[pp - pp0][c][16]
    (float32, zero past HW): the micro-kernel's B panels. Output pixel (i, j) reads input pixel
    (i sh, j sw) of a W wide image: with stride 1 a panel is 16 consecutive values. Channel
    by channel (each a sequential read): panel by panel, every channel's 32 bytes are a
    stream of their own, more than the prefetchers follow (a cold 256-channel input:
    +40 % of the conv)."""
    if sh == 1 and sw == 1:
        for c in range(C):
            for pp in range(pp0, pp1):
                p0 = pp * NR
                src = xoff + c * xc + p0
                dst = ((pp - pp0) * C + c) * NR
                if code == 1 and p0 + NR <= HW:
                    f16x16_to_f32(x, src, slab, dst)
                else:
                    for j in range(NR):
                        slab[dst + j] = _dec(code, x[src + j], lut) if p0 + j < HW else np.float32(0.0)
        return
    n = (pp1 - pp0) * NR
    src = np.zeros(n, np.int64)
    for q in range(n):
        p = min(pp0 * NR + q, HW - 1)
        src[q] = xoff + (p // OW) * sh * W + (p % OW) * sw
    for c in range(C):
        for q in range(n):
            slab[((q // NR) * C + c) * NR + q % NR] = (_dec(code, x[src[q] + c * xc], lut) if pp0 * NR + q < HW
                                                       else np.float32(0.0))


@njit(cache=True, nogil=True, forceinline=True)   # a call passes ~17 arrays' structs: ~100 cycles a block
def _store_rows(blk, mn, kb, p0, pn, y, yoff, yc, ycode, ea, eb, lo, has_res, res, roff, rc, lut):
    """Epilogue of a 6 x 16 block: channels kb..kb+mn, pixels p0..p0+pn, one row a channel."""
    for mi in range(mn):
        k = kb + mi
        a, b = ea[k], eb[k]
        yo = yoff + k * yc + p0
        ro = roff + k * rc + p0
        if ycode == 1 and pn == NR:
            if has_res:
                epi_row16_f16(blk, mi * NR, a, b, res, ro, True, lo, y, yo)
            else:
                epi_row16_f16(blk, mi * NR, a, b, y, yo, False, lo, y, yo)
            continue
        for j in range(pn):
            v = np.float32(blk[mi * NR + j] * a + b)
            if has_res:
                v = v + _dec(ycode, res[ro + j], lut)
            v = max(v, lo)
            if ycode == 1:
                y[yo + j] = enc16(ycode, v)
            else:
                y[yo + j] = v


@opt_level(1)
@njit(cache=True, nogil=True)
def _rows_chunk(q0, q1, x, xoff, xc, code, C, HW, OW, sh, sw, W, wblk, k0, tk, y, yoff, yc, ea, eb, lo, has_res,
                res, roff, rc, slab, lut):
    """Pixel panels [q0, q1) of one image (q0 a multiple of PB): packed into ``slab`` (panel
    q0 first), then every block of MB channels against them, with its epilogue."""
    taps = np.zeros(1, np.int64)
    pst = C * NR
    _pack_pixels(x, xoff, xc, code, C, HW, OW, sh, sw, W, slab, q0, q1, lut)
    acc = np.empty((RB * PB, MR * NR), np.float32)
    for m in range(0, tk, MB):
        for p in range(q0, q1, PB):
            npan = 2 if PB == 2 and p + 1 < q1 else 1
            if npan == 2:
                mkp_p2(wblk, taps, m * C, taps, np.int64(1), slab, (p - q0) * pst, pst, C, acc)
            else:
                mkp_p1(wblk, taps, m * C, taps, np.int64(1), slab, (p - q0) * pst, pst, C, acc)
            for i in range(RB):
                mi0 = m + i * MR
                for h in range(npan):
                    p0 = (p + h) * NR
                    _store_rows(acc[i * npan + h], min(MR, tk - mi0), k0 + mi0, p0, min(NR, HW - p0), y, yoff,
                                yc, code, ea, eb, lo, has_res, res, roff, rc, lut)


@njit(cache=True, nogil=True)
def _rows_part(t, parts, ppc, N, x, xoff, xn, xc, code, C, HW, OW, sh, sw, W, wblk, k0, tk, y, yoff, yn, yc, ea,
               eb, lo, has_res, res, roff, rn, rc, slab, lut):
    """Part ``t`` of ``parts`` of :func:`conv1x1_rows`: the units (image, pair of pixel panels)
    [t U / parts, (t + 1) U / parts) of all N images' U, in chunks of at most ``ppc`` panels
    inside one image, packed into this part's own ``ppc`` panels of ``slab``."""
    npp = (HW + NR - 1) // NR
    npair = (npp + PB - 1) // PB
    units = N * npair
    u, u1 = t * units // parts, (t + 1) * units // parts
    sl = slab[t * ppc * C * NR:(t + 1) * ppc * C * NR]
    while u < u1:
        n = u // npair
        a = u % npair
        b = min(npair, a + ppc // PB, a + u1 - u)
        _rows_chunk(a * PB, min(npp, b * PB), x, xoff + n * xn, xc, code, C, HW, OW, sh, sw, W, wblk, k0, tk, y,
                    yoff + n * yn, yc, ea, eb, lo, has_res, res, roff + n * rn, rc, sl, lut)
        u += b - a


def _chunk_pixels(C):
    """Pixel panels per chunk: chunks whose panels (~512 KB) are packed and stay in L2 while
    every channel block streams past them: output and residual are then read and written as
    MB sequential rows, not 16-pixel pieces of all K rows (scattered lines the prefetchers do
    not follow)."""
    ppc = max(PB, (512 * 1024) // (C * NR * 4))
    return np.int64(ppc - ppc % PB)


def rows_scratch(C, nthreads):
    """Floats of :func:`conv1x1_rows`' packed-panel scratch: ``_chunk_pixels(C)`` panels a thread."""
    return int(nthreads * _chunk_pixels(C) * C * NR)


def conv1x1_rows(x, xoff, xn, xc, code, C, HW, OW, sh, sw, W, wblk, k0, tk, y, yoff, yn, yc, ea, eb, relu,
                 has_res, res, roff, rn, rc, N, slab, lut):
    """Output channels [k0, k0 + tk) of N images: image n's x[c * xc + p] (from xoff + n xn) ->
    y[k * yc + p] (from yoff + n yn), residual res[k * rc + p] (from roff + n rn), HW output
    pixels OW wide, read at strides (sh, sw) of a W wide input; ``code`` is the storage of x,
    y and the residual alike (0 float32, 1 float16); ``wblk`` the channels' weights packed
    by pack_weight_rows; ``slab`` at least ``rows_scratch(C, threads)`` floats.
    One parallel region for all images: the N x (pairs of 16-pixel panels) units split into
    equal parts, one a host thread (:func:`_rows_part`, called through its address:
    :mod:`..taskcall`; linked in, the chunk's register blocks and epilogue were compiled
    again in the parallel function's gufunc and outer library). Chunks of one image each
    (1 or 2 a 56x56 image, of 196 and 128 panels) left a thread idle for 23-50 % of the
    call at two threads (a thread's busy CPU per region, ``bench_e2e --balance``)."""
    import numba

    ppc = _chunk_pixels(C)
    npp = -(-HW // NR)
    npair = -(-npp // PB)
    parts = np.int64(max(1, min(numba.get_num_threads(), N * npair, slab.size // max(1, ppc * C * NR))))
    lo = np.float32(0.0) if relu else np.float32(-np.inf)
    N, xn, yn, rn = np.int64(N), np.int64(xn), np.int64(yn), np.int64(rn)
    args = (ppc, N, x, xoff, xn, xc, code, C, HW, OW, sh, sw, W, wblk, k0, tk, y, yoff, yn, yc, ea, eb, lo, has_res,
            res, roff, rn, rc, slab, lut)
    task = taskcall.address(_rows_part, (np.int64(0), parts) + args)
    _conv1x1_rows(task, parts, *args)


@opt_level(1)
@njit(cache=True, nogil=True, parallel=True)
def _conv1x1_rows(task, parts, ppc, N, x, xoff, xn, xc, code, C, HW, OW, sh, sw, W, wblk, k0, tk, y, yoff, yn, yc,
                  ea, eb, lo, has_res, res, roff, rn, rc, slab, lut):
    """:func:`conv1x1_rows`' parts in parallel; ``task`` is ``_rows_part``'s address."""
    for t in prange(parts):
        taskcall.call(task, (np.int64(t), parts, ppc, N, x, xoff, xn, xc, code, C, HW, OW, sh, sw, W, wblk, k0, tk,
                             y, yoff, yn, yc, ea, eb, lo, has_res, res, roff, rn, rc, slab, lut))


def pack_weight_rows(w, K, C):
    """A (K, C) float32 weight -> blocks of MB output channels, [block][c][MB] (zero rows past
    K): the register block's A operand, its MB broadcasts per reduction step from one
    pointer at constant offsets (12 row pointers would not fit the 16 general registers)."""
    nb = -(-K // MB)
    out = np.zeros((nb * MB, C), np.float32)
    out[:K] = w
    return np.ascontiguousarray(out.reshape(nb, MB, C).transpose(0, 2, 1)).reshape(-1)
