"""A 6x16 fp32 register-blocked micro-kernel for implicit-GEMM convolution (Numba intrinsic).

Why LLVM IR: plain ``@njit`` accumulators compile to scalar FMAs (LLVM cannot prove the
accumulator does not alias the packed panels; FINDINGS.md). Here 12 ``<8 x float>``
accumulators live in registers through ``llvm.fma.v8f32``; A is broadcast from six
arbitrary row addresses (one per output pixel, so padding, stride and dilation cost
nothing: the on-chip slab already holds the zero halo), B is one packed 16-wide row per
reduction step.

    acc[m, 0:16] += sum_t sum_k A[pix[m0 + m] + taps[t] + k] * B[boff + 16 (t kc + k) : +16]

for m in 0..5, t over the kernel taps, k in 0..kc-1; ``acc`` rows are ``ldc`` apart
starting at ``coff``. ``make_taps_kernel(mr, nr, w)`` generates any block shape (the
split_c / int8 paths and the bench use it). The fused float conv runs
``make_block_kernel``'s blocks of up to two micro-rows x two panels: on one Zen 4 core
every shape ran at 106-117 GFLOP/s (one FMA per cycle), but on a Sapphire-Rapids-class
core (two 512-bit FMA ports, latency 4: 6x16's six chains fill 75 % of them) 12x32 ran
at 142-185 GFLOP/s against 81-130 for 6x16 (tools/bench_conv_ukernel.py; BENCHMARKS.md,
conv3). ``make_block_move`` moves a whole block of the epilogue to or from the tensor in
vectors.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


def make_taps_kernel(mr: int, nr: int, w: int):
    """The ``mr x nr`` tap-aware block with ``<w x float>`` accumulators (``nr % w == 0``,
    ``mr * nr / w`` of them in registers; see the module docstring for what it computes)."""
    assert nr % w == 0
    nv = nr // w

    @intrinsic
    def mk_taps(typingctx, A, pix, m0, taps, ntaps, B, boff, kc, C, coff, ldc):
        sig = types.void(A, pix, m0, taps, ntaps, B, boff, kc, C, coff, ldc)

        def codegen(context, builder, signature, args):
            return _emit_taps(context, builder, signature, args, mr, nr, w, nv)

        return sig, codegen

    return mk_taps


def _vector_kit(builder, w):
    """The IR pieces both register-block emitters use: int64, ``<w x float>`` and its
    pointer, ``llvm.fma`` on it, and the all-zero shuffle mask that broadcasts a scalar."""
    vt = ir.VectorType(ir.FloatType(), w)
    fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vt, [vt, vt, vt]), f"llvm.fma.v{w}f32")
    return ir.IntType(64), vt, vt.as_pointer(), fma, ir.Constant(ir.VectorType(ir.IntType(32), w), [0] * w)


def _emit_taps(context, builder, signature, args, mr, nr, w, nv):
    a_arr, pix_arr, m0_v, taps_arr, nt_v, b_arr, boff_v, kc_v, c_arr, coff_v, ldc_v = args
    A_, P_, T_, B_, C_ = (context.make_array(signature.args[i])(context, builder, args[i])
                          for i in (0, 1, 3, 5, 8))
    i64, vt, vp, fma, zeros = _vector_kit(builder, w)
    pixoff = [builder.load(builder.gep(P_.data, [builder.add(m0_v, ir.Constant(i64, m))])) for m in range(mr)]
    cptr, accs = [], []
    for m in range(mr):
        rowoff = builder.add(coff_v, builder.mul(ldc_v, ir.Constant(i64, m)))
        for h in range(nv):
            p = builder.bitcast(builder.gep(C_.data, [builder.add(rowoff, ir.Constant(i64, w * h))]), vp)
            cptr.append(p)
            slot = cgutils.alloca_once(builder, vt)
            builder.store(builder.load(p, align=4), slot)
            accs.append(slot)
    bbase = builder.gep(B_.data, [boff_v])
    with cgutils.for_range(builder, nt_v) as tloop:
        t = tloop.index
        toff = builder.load(builder.gep(T_.data, [t]))
        arow = [builder.gep(A_.data, [builder.add(po, toff)]) for po in pixoff]
        bt = builder.gep(bbase, [builder.mul(builder.mul(t, kc_v), ir.Constant(i64, nr))])
        with cgutils.for_range(builder, kc_v) as loop:
            k = loop.index
            bp = builder.gep(bt, [builder.mul(k, ir.Constant(i64, nr))])
            bs = [builder.load(builder.bitcast(builder.gep(bp, [ir.Constant(i64, w * h)]), vp), align=4)
                  for h in range(nv)]
            for m in range(mr):
                a = builder.load(builder.gep(arow[m], [k]))
                av = builder.insert_element(ir.Constant(vt, ir.Undefined), a, ir.Constant(ir.IntType(32), 0))
                av = builder.shuffle_vector(av, ir.Constant(vt, ir.Undefined), zeros)
                for h in range(nv):
                    slot = accs[nv * m + h]
                    builder.store(builder.call(fma, [av, bs[h], builder.load(slot)]), slot)
    for slot, p in zip(accs, cptr):
        builder.store(builder.load(slot), p, align=4)
    return context.get_dummy_value()


def make_block_kernel(rows: int, panels: int, w: int, packed_a: bool = False):
    """``rows`` micro-rows (6 pixels each) x ``panels`` packed 16-wide weight panels in one
    register block (``rows * 6 * panels * 16 / w`` accumulators, started at zero):

        C[i * panels + h, 16 m + j] = sum_t sum_k A[pix[m0 + 6 i + m] + taps[t] + k]
                                                  * B[boff + h * pstride + 16 (t kc + k) + j]

    C is a (>= rows * panels, 96) float32 array: each 6x16 block is a row of its own, so the
    epilogue takes it as it takes a 6x16 block. Why: with AVX-512, 6x16 keeps 6 FMA chains
    for two FMA ports of latency 4; 12x32 (24 chains, 2 panel loads + 12 broadcasts per 24
    FMAs) ran 30-75 % faster on a Sapphire-Rapids-class core (BENCHMARKS.md, conv3) and
    reads the same packed panels (panel h + 1 is ``pstride`` floats after panel h)."""
    assert NR % w == 0
    nv = NR // w

    @intrinsic
    def mk_block(typingctx, A, pix, m0, taps, ntaps, B, boff, pstride, kc, C):
        sig = types.void(A, pix, m0, taps, ntaps, B, boff, pstride, kc, C)

        def codegen(context, builder, signature, args):
            return _emit_block(context, builder, signature, args, rows, panels, w, nv, packed_a)

        return sig, codegen

    return mk_block


def _emit_block(context, builder, signature, args, rows, panels, w, nv, packed_a):
    a_arr, pix_arr, m0_v, taps_arr, nt_v, b_arr, boff_v, ps_v, kc_v, c_arr = args
    A_, P_, T_, B_, C_ = (context.make_array(signature.args[i])(context, builder, args[i])
                          for i in (0, 1, 3, 5, 9))
    i64, vt, vp, fma, zeros = _vector_kit(builder, w)
    npx = rows * MR
    if packed_a:      # A packed [k][npx] from m0: one pointer, the rows at constant offsets
        pixoff = [builder.add(m0_v, ir.Constant(i64, m)) for m in range(npx)]
    else:
        pixoff = [builder.load(builder.gep(P_.data, [builder.add(m0_v, ir.Constant(i64, m))])) for m in range(npx)]
    accs = {}
    for m in range(npx):
        for h in range(panels):
            for v in range(nv):
                slot = cgutils.alloca_once(builder, vt)
                builder.store(ir.Constant(vt, [0.0] * w), slot)
                accs[m, h, v] = slot
    bbase = [builder.gep(B_.data, [builder.add(boff_v, builder.mul(ps_v, ir.Constant(i64, h)))])
             for h in range(panels)]
    with cgutils.for_range(builder, nt_v) as tloop:
        t = tloop.index
        toff = builder.load(builder.gep(T_.data, [t]))
        arow = [builder.gep(A_.data, [builder.add(po, toff)]) for po in pixoff]
        tb = builder.mul(builder.mul(t, kc_v), ir.Constant(i64, NR))
        bt = [builder.gep(b, [tb]) for b in bbase]
        with cgutils.for_range(builder, kc_v) as loop:
            k = loop.index
            kb = builder.mul(k, ir.Constant(i64, NR))
            bs = [[builder.load(builder.bitcast(builder.gep(b, [builder.add(kb, ir.Constant(i64, w * v))]), vp),
                                align=4) for v in range(nv)] for b in bt]
            ka = builder.mul(k, ir.Constant(i64, npx)) if packed_a else k
            for m in range(npx):
                a = builder.load(builder.gep(arow[m], [ka]))
                av = builder.insert_element(ir.Constant(vt, ir.Undefined), a, ir.Constant(ir.IntType(32), 0))
                av = builder.shuffle_vector(av, ir.Constant(vt, ir.Undefined), zeros)
                for h in range(panels):
                    for v in range(nv):
                        slot = accs[m, h, v]
                        builder.store(builder.call(fma, [av, bs[h][v], builder.load(slot)]), slot)
    for (m, h, v), slot in accs.items():
        off = ((m // MR) * panels + h) * MR * NR + (m % MR) * NR + w * v
        p = builder.bitcast(builder.gep(C_.data, [ir.Constant(i64, off)]), vp)
        builder.store(builder.load(slot), p, align=4)
    return context.get_dummy_value()


def _vector_width() -> int:
    """Accumulator width of the 6x16 block: <16 x float> (one zmm per row) on AVX-512 hosts,
    2-4% faster in tools/bench_conv_ukernel.py and the same sums lane by lane; <8 x float>
    elsewhere. ``TORCHFL_CONV_VECTOR=8|16`` overrides (read at import)."""
    import os

    v = os.environ.get("TORCHFL_CONV_VECTOR", "")
    if v:
        if v not in ("8", "16"):
            raise ValueError(f"TORCHFL_CONV_VECTOR={v!r}: use 8 (AVX2 width) or 16 (AVX-512), or unset it")
        return int(v)
    from ..hostcpu import has_feature

    return 16 if has_feature("avx512f") else 8


MR, NR = 6, 16
VW = _vector_width()
mk6x16_taps = make_taps_kernel(MR, NR, VW)
# register blocks of the float conv (fused.py): with AVX-512 (32 vector registers) up to two
# micro-rows x two panels (24 accumulators); <8 x float> keeps 6x16 (12 of its 16 registers)
RB = PB = 2 if VW == 16 else 1
mk_r2p2, mk_r2p1, mk_r1p2, mk_r1p1 = (make_block_kernel(r, q, VW) for r, q in ((2, 2), (2, 1), (1, 2), (1, 1)))


@intrinsic
def epi6x16_f16(typingctx, C, A, B, koff, R, has_res, lo, H):
    """The float16 epilogue of a 6x16 block in 8-wide vectors (F16C conversions):

        H[q] = f16(max(f32(C[q] * A[koff + j] + B[koff + j]) (+ f32(R[q])), lo))

    for q = 16 m + j; C, A, B float32 arrays, R and H uint16 (float16 bits). The products
    and sums round as the scalar epilogue's do (no fused multiply-add); max(v, lo) is
    Python's (lo only where lo > v, so NaN stays NaN); the conversions are IEEE round to
    nearest even, the codec's own rounding."""
    sig = types.void(C, A, B, koff, R, has_res, lo, H)

    def codegen(context, builder, signature, args):
        c_arr, a_arr, b_arr, koff_v, r_arr, hr_v, lo_v, h_arr = args
        sa = signature.args
        C_ = context.make_array(sa[0])(context, builder, c_arr)
        A_ = context.make_array(sa[1])(context, builder, a_arr)
        B_ = context.make_array(sa[2])(context, builder, b_arr)
        R_ = context.make_array(sa[4])(context, builder, r_arr)
        H_ = context.make_array(sa[7])(context, builder, h_arr)
        i64 = ir.IntType(64)
        f32 = ir.FloatType()
        v8 = ir.VectorType(f32, 8)
        h8 = ir.VectorType(ir.HalfType(), 8)
        i8x16 = ir.VectorType(ir.IntType(16), 8)
        hres = context.cast(builder, hr_v, sa[5], types.boolean)
        lo32 = context.cast(builder, lo_v, sa[6], types.float32)
        lov = builder.insert_element(ir.Constant(v8, ir.Undefined), lo32, ir.Constant(ir.IntType(32), 0))
        lov = builder.shuffle_vector(lov, ir.Constant(v8, ir.Undefined),
                                     ir.Constant(ir.VectorType(ir.IntType(32), 8), [0] * 8))

        def vload(ptr, off, vt):
            return builder.load(builder.bitcast(builder.gep(ptr, [off]), vt.as_pointer()), align=2)

        av = [vload(A_.data, builder.add(koff_v, ir.Constant(i64, 8 * h)), v8) for h in range(2)]
        bv = [vload(B_.data, builder.add(koff_v, ir.Constant(i64, 8 * h)), v8) for h in range(2)]
        for q0 in range(0, MR * NR, 8):
            off = ir.Constant(i64, q0)
            v = vload(C_.data, off, v8)
            v = builder.fadd(builder.fmul(v, av[(q0 // 8) % 2]), bv[(q0 // 8) % 2])
            r = builder.fpext(builder.bitcast(vload(R_.data, off, i8x16), h8), v8)
            v = builder.select(hres, builder.fadd(v, r), v)
            v = builder.select(builder.fcmp_ordered(">", lov, v), lov, v)
            hv = builder.bitcast(builder.fptrunc(v, h8), i8x16)
            builder.store(hv, builder.bitcast(builder.gep(H_.data, [off]), i8x16.as_pointer()), align=2)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def tr16x8_f16(typingctx, X, xoff, s1, S, soff, tc):
    """Eight consecutive pixels of 16 channels of a float16 channel-outer tensor into the
    slab's [pixel][channel] float32 rows:

        S[soff + p * tc + c] = f32(X[xoff + c * s1 + p])    for p in 0..7, c in 0..15

    as 16 vector loads (F16C conversions) and 8 transposed 16-wide stores, instead of 128
    scalar strided loads."""
    sig = types.void(X, xoff, s1, S, soff, tc)

    def codegen(context, builder, signature, args):
        x_arr, xoff_v, s1_v, s_arr, soff_v, tc_v = args
        sa = signature.args
        X_ = context.make_array(sa[0])(context, builder, x_arr)
        S_ = context.make_array(sa[3])(context, builder, s_arr)
        i32 = ir.IntType(32)
        f32 = ir.FloatType()
        v8 = ir.VectorType(f32, 8)
        v16 = ir.VectorType(f32, 16)
        h8 = ir.VectorType(ir.HalfType(), 8)
        i16x8 = ir.VectorType(ir.IntType(16), 8)
        cols = []
        for c in range(NR):
            off = builder.add(xoff_v, builder.mul(s1_v, ir.Constant(ir.IntType(64), c)))
            p = builder.bitcast(builder.gep(X_.data, [off]), i16x8.as_pointer())
            cols.append(builder.fpext(builder.bitcast(builder.load(p, align=2), h8), v8))
        for px in range(8):
            row = ir.Constant(v16, ir.Undefined)
            for c in range(NR):
                row = builder.insert_element(row, builder.extract_element(cols[c], ir.Constant(i32, px)),
                                             ir.Constant(i32, c))
            off = builder.add(soff_v, builder.mul(tc_v, ir.Constant(ir.IntType(64), px)))
            builder.store(row, builder.bitcast(builder.gep(S_.data, [off]), v16.as_pointer()), align=4)
        return context.get_dummy_value()

    return sig, codegen


def make_block_move(run: bool, to_block: bool):
    """A whole MR x NR block ``blk[m * NR + j]`` moved to (``to_block`` False) or from (True)
    its place in a tensor's flat storage ``arr``, in vectors instead of 96 scalar accesses:

    - ``run`` False (channel-inner layouts, t1 == 1): element (m, j) at base[mr + m] + kl + j,
      one NR-wide vector per pixel;
    - ``run`` True (channel-outer, the MR pixels consecutive): element (m, j) at
      base[mr] + (kl + j) * t1 + m, one MR-wide vector per channel.

    Where the element types differ (a specialisation whose branch never runs with them: a
    float32 block against uint16 storage), each element is cast as a Numba assignment would."""

    @intrinsic
    def move(typingctx, blk, arr, base, mr, kl, t1):
        sig = types.void(blk, arr, base, mr, kl, t1)

        def codegen(context, builder, signature, args):
            b_v, a_v, base_v, mr_v, kl_v, t1_v = args
            sa = signature.args
            B_ = context.make_array(sa[0])(context, builder, b_v)
            A_ = context.make_array(sa[1])(context, builder, a_v)
            P_ = context.make_array(sa[2])(context, builder, base_v)
            i64, i32 = ir.IntType(64), ir.IntType(32)
            et = context.get_data_type(sa[0].dtype)
            mr_i = context.cast(builder, mr_v, sa[3], types.int64)
            kl_i = context.cast(builder, kl_v, sa[4], types.int64)
            t1_i = context.cast(builder, t1_v, sa[5], types.int64)

            def at(ptr, off):
                return builder.gep(ptr, [off])

            def c(v):
                return ir.Constant(i64, v)
            if sa[0].dtype != sa[1].dtype:
                src_t, dst_t = (sa[1].dtype, sa[0].dtype) if to_block else (sa[0].dtype, sa[1].dtype)
                for m in range(MR):
                    for j in range(NR):
                        if run:
                            off = builder.add(builder.load(at(P_.data, mr_i)),
                                              builder.add(builder.mul(builder.add(kl_i, c(j)), t1_i), c(m)))
                        else:
                            off = builder.add(builder.load(at(P_.data, builder.add(mr_i, c(m)))),
                                              builder.add(kl_i, c(j)))
                        bp, ap = at(B_.data, c(m * NR + j)), at(A_.data, off)
                        src, dst = (ap, bp) if to_block else (bp, ap)
                        builder.store(context.cast(builder, builder.load(src), src_t, dst_t), dst)
                return context.get_dummy_value()
            if not run:
                vt = ir.VectorType(et, NR)
                for m in range(MR):
                    off = builder.add(builder.load(at(P_.data, builder.add(mr_i, c(m)))), kl_i)
                    bp = builder.bitcast(at(B_.data, c(m * NR)), vt.as_pointer())
                    ap = builder.bitcast(at(A_.data, off), vt.as_pointer())
                    src, dst = (ap, bp) if to_block else (bp, ap)
                    builder.store(builder.load(src, align=2), dst, align=2)
                return context.get_dummy_value()
            vt = ir.VectorType(et, MR)
            base0 = builder.add(builder.load(at(P_.data, mr_i)), builder.mul(kl_i, t1_i))
            if not to_block:
                whole = builder.load(builder.bitcast(B_.data, ir.VectorType(et, MR * NR).as_pointer()), align=2)
            for j in range(NR):
                ap = builder.bitcast(at(A_.data, builder.add(base0, builder.mul(t1_i, c(j)))), vt.as_pointer())
                if to_block:
                    col = builder.load(ap, align=2)
                    for m in range(MR):
                        builder.store(builder.extract_element(col, ir.Constant(i32, m)), at(B_.data, c(m * NR + j)))
                else:
                    mask = ir.Constant(ir.VectorType(i32, MR), [m * NR + j for m in range(MR)])
                    builder.store(builder.shuffle_vector(whole, ir.Constant(whole.type, ir.Undefined), mask), ap,
                                  align=2)
            return context.get_dummy_value()

        return sig, codegen

    return move


scatter_rows, scatter_run = make_block_move(False, False), make_block_move(True, False)
gather_rows, gather_run = make_block_move(False, True), make_block_move(True, True)
