"""A 6x16 fp32 register-blocked micro-kernel for implicit-GEMM convolution (Numba intrinsic).

Why LLVM IR: plain ``@njit`` accumulators compile to scalar FMAs (LLVM cannot prove the
accumulator does not alias the packed panels; FINDINGS.md). Here 12 ``<8 x float>``
accumulators live in registers through ``llvm.fma.v8f32``; A is broadcast from six
arbitrary row addresses (one per output pixel, so padding, stride and dilation cost
nothing: the on-chip slab already holds the zero halo), B is one packed 16-wide row per
reduction step.

    acc[m, 0:16] += sum_t sum_k A[pix[m0 + m] + taps[t] + k] * B[boff + 16 (t kc + k) : +16]

for m in 0..5, t over the kernel taps, k in 0..kc-1; ``acc`` rows are ``ldc`` apart
starting at ``coff``.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

MR, NR = 6, 16


@intrinsic
def mk6x16_taps(typingctx, A, pix, m0, taps, ntaps, B, boff, kc, C, coff, ldc):
    """See module docstring: the 6x16 block accumulated over ``ntaps`` kernel taps in
    registers (C is loaded and stored once per block, not once per tap). A, B, C: float32
    1-D arrays; pix, taps: int64 1-D arrays."""
    sig = types.void(A, pix, m0, taps, ntaps, B, boff, kc, C, coff, ldc)

    def codegen(context, builder, signature, args):
        a_arr, pix_arr, m0_v, taps_arr, nt_v, b_arr, boff_v, kc_v, c_arr, coff_v, ldc_v = args
        sa = signature.args
        A_ = context.make_array(sa[0])(context, builder, a_arr)
        P_ = context.make_array(sa[1])(context, builder, pix_arr)
        T_ = context.make_array(sa[3])(context, builder, taps_arr)
        B_ = context.make_array(sa[5])(context, builder, b_arr)
        C_ = context.make_array(sa[8])(context, builder, c_arr)
        i64 = ir.IntType(64)
        f32 = ir.FloatType()
        v8 = ir.VectorType(f32, 8)
        v8p = v8.as_pointer()
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v8, [v8, v8, v8]),
                                             "llvm.fma.v8f32")
        zero8 = ir.Constant(ir.VectorType(ir.IntType(32), 8), [0] * 8)
        pixoff = []
        for m in range(MR):
            idx = builder.add(m0_v, ir.Constant(i64, m))
            pixoff.append(builder.load(builder.gep(P_.data, [idx])))
        cptr, accs = [], []
        for m in range(MR):
            rowoff = builder.add(coff_v, builder.mul(ldc_v, ir.Constant(i64, m)))
            for h in range(2):
                p = builder.bitcast(builder.gep(C_.data, [builder.add(rowoff, ir.Constant(i64, 8 * h))]), v8p)
                cptr.append(p)
                slot = cgutils.alloca_once(builder, v8)
                builder.store(builder.load(p, align=4), slot)
                accs.append(slot)
        bbase = builder.gep(B_.data, [boff_v])
        with cgutils.for_range(builder, nt_v) as tloop:
            t = tloop.index
            toff = builder.load(builder.gep(T_.data, [t]))
            arow = [builder.gep(A_.data, [builder.add(po, toff)]) for po in pixoff]
            bt = builder.gep(bbase, [builder.mul(builder.mul(t, kc_v), ir.Constant(i64, NR))])
            with cgutils.for_range(builder, kc_v) as loop:
                k = loop.index
                bp = builder.gep(bt, [builder.mul(k, ir.Constant(i64, NR))])
                b0 = builder.load(builder.bitcast(bp, v8p), align=4)
                b1 = builder.load(builder.bitcast(builder.gep(bp, [ir.Constant(i64, 8)]), v8p), align=4)
                for m in range(MR):
                    a = builder.load(builder.gep(arow[m], [k]))
                    av = builder.insert_element(ir.Constant(v8, ir.Undefined), a, ir.Constant(ir.IntType(32), 0))
                    av = builder.shuffle_vector(av, ir.Constant(v8, ir.Undefined), zero8)
                    for h, b in enumerate((b0, b1)):
                        slot = accs[2 * m + h]
                        builder.store(builder.call(fma, [av, b, builder.load(slot)]), slot)
        for slot, p in zip(accs, cptr):
            builder.store(builder.load(slot), p, align=4)
        return context.get_dummy_value()

    return sig, codegen


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
