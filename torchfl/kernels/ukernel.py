"""The fp32 GEMM micro-kernel, written as LLVM IR (numba.extending.intrinsic).

Plain @njit code cannot reach the CPU's FMA peak: LLVM cannot prove the accumulator
does not alias the packed panels, so it emits scalar FMAs (FINDINGS.md). Here the 6x16
block of C is held in 12 ``<8 x float>`` registers and updated with ``llvm.fma.v8f32``
(one broadcast of A per two FMAs), over ``kc`` steps of packed panels:

    C[6, 16] (row stride ldc, fp32) += A_panel[kc][6] (x) B_panel[kc][16]

Used by the GEMM (gemm.py: matmul, linear, batched matmul) and attention; convolution has
its own tap-aware micro-kernel (conv/microkernel.py).
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

MR, NR = 6, 16


@intrinsic
def ukernel_6x16(typingctx, kc, pa, pa_off, pb, pb_off, c, c_off, ldc):
    """C[c_off + r*ldc + j] += sum_k pa[pa_off + 6k + r] * pb[pb_off + 16k + j]."""
    for arr in (pa, pb, c):
        if not (isinstance(arr, types.Array) and arr.dtype == types.float32 and arr.ndim == 1):
            return None
    sig = types.void(kc, pa, pa_off, pb, pb_off, c, c_off, ldc)

    def codegen(context, builder, signature, args):
        kc_v, pa_v, pao_v, pb_v, pbo_v, c_v, co_v, ldc_v = args
        st = signature.args
        i64 = ir.IntType(64)
        f32 = ir.FloatType()
        v8 = ir.VectorType(f32, 8)
        v8p = v8.as_pointer()

        def as_i64(v, t):
            return context.cast(builder, v, t, types.int64)

        kc_i = as_i64(kc_v, st[0])
        pa_ptr = builder.gep(context.make_array(st[1])(context, builder, pa_v).data, [as_i64(pao_v, st[2])])
        pb_ptr = builder.gep(context.make_array(st[3])(context, builder, pb_v).data, [as_i64(pbo_v, st[4])])
        c_ptr = builder.gep(context.make_array(st[5])(context, builder, c_v).data, [as_i64(co_v, st[6])])
        ldc_i = as_i64(ldc_v, st[7])
        from numba.core import cgutils

        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v8, [v8, v8, v8]),
                                             "llvm.fma.v8f32")

        cptrs = []
        init = []
        for r in range(MR):
            row = builder.gep(c_ptr, [builder.mul(ldc_i, ir.Constant(i64, r))])
            for h in range(2):
                p = builder.bitcast(builder.gep(row, [ir.Constant(i64, 8 * h)]), v8p)
                cptrs.append(p)
                init.append(builder.load(p, align=4))
        entry = builder.block
        fn = builder.function
        header = fn.append_basic_block("uk_header")
        body = fn.append_basic_block("uk_body")
        done = fn.append_basic_block("uk_done")
        builder.branch(header)

        builder.position_at_end(header)
        k = builder.phi(i64)
        k.add_incoming(ir.Constant(i64, 0), entry)
        accs = []
        for v in init:
            ph = builder.phi(v8)
            ph.add_incoming(v, entry)
            accs.append(ph)
        builder.cbranch(builder.icmp_signed("<", k, kc_i), body, done)

        builder.position_at_end(body)
        bk = builder.gep(pb_ptr, [builder.mul(k, ir.Constant(i64, NR))])
        b0 = builder.load(builder.bitcast(bk, v8p), align=4)
        b1 = builder.load(builder.bitcast(builder.gep(bk, [ir.Constant(i64, 8)]), v8p), align=4)
        ak = builder.gep(pa_ptr, [builder.mul(k, ir.Constant(i64, MR))])
        zeros = ir.Constant(ir.VectorType(ir.IntType(32), 8), [0] * 8)
        new = []
        for r in range(MR):
            a = builder.load(builder.gep(ak, [ir.Constant(i64, r)]), align=4)
            splat = builder.insert_element(ir.Constant(v8, ir.Undefined), a, ir.Constant(ir.IntType(32), 0))
            splat = builder.shuffle_vector(splat, ir.Constant(v8, ir.Undefined), zeros)
            new.append(builder.call(fma, [splat, b0, accs[2 * r]]))
            new.append(builder.call(fma, [splat, b1, accs[2 * r + 1]]))
        k_next = builder.add(k, ir.Constant(i64, 1))
        end = builder.block
        builder.branch(header)
        k.add_incoming(k_next, end)
        for ph, v in zip(accs, new):
            ph.add_incoming(v, end)

        builder.position_at_end(done)
        for p, v in zip(cptrs, accs):
            builder.store(v, p, align=4)
        return context.get_dummy_value()

    return sig, codegen
