"""The fp32 GEMM micro-kernels, written as LLVM IR (numba.extending.intrinsic).

Plain @njit code cannot reach the CPU's FMA peak: LLVM cannot prove the accumulator
does not alias the packed panels, so it emits scalar FMAs (FINDINGS.md). Here an
``mr x nr`` block of C is held in ``mr * nr / w`` ``<w x float>`` registers and updated
with ``llvm.fma`` (one broadcast of A per ``nr / w`` FMAs), over ``kc`` steps of packed
panels:

    C[mr, nr] (row stride ldc, fp32) += A_panel[kc][mr] (x) B_panel[kc][nr]

``ukernel_6x16`` (12 ``<8 x float>`` accumulators: 16 registers, AVX2) serves attention.
The GEMM (gemm.py: matmul, linear, batched matmul) uses ``ukernel_gemm`` of shape
``MR x NR``, chosen for the host: on AVX-512 (32 vector registers) 8x48 with 24 ``<16 x
float>`` accumulators, which measured 109-114 GFLOP/s in a 128-row GEMM nest on one
Zen 4 core against 94-100 for 6x16 (the FMA peak is ~116 either way: fewer broadcasts and
C loads per FMA, and an A block of all 128 rows stays in L2); elsewhere 6x16. Its form
(:func:`make_ukernel_streaming`) reads A in rows, may start C from zero and prefetches
the next B panel; on one "Intel Xeon Processor" (Sapphire-Rapids-class, KVM) core it runs
at ~180 GFLOP/s on L1-resident panels against ~206 for bare FMAs.
Convolution has its own tap-aware micro-kernel (conv/microkernel.py).
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .hostcpu import has_feature


def make_ukernel(mr: int, nr: int, w: int):
    """The ``mr x nr`` micro-kernel with ``<w x float>`` vectors (``nr % w == 0``):
    ``uk(kc, pa, pa_off, pb, pb_off, c, c_off, ldc)`` does
    C[c_off + r*ldc + j] += sum_k pa[pa_off + mr*k + r] * pb[pb_off + nr*k + j]."""
    assert nr % w == 0
    nv = nr // w

    @intrinsic
    def uk(typingctx, kc, pa, pa_off, pb, pb_off, c, c_off, ldc):
        if not _f32_vectors(pa, pb, c):
            return None
        sig = types.void(kc, pa, pa_off, pb, pb_off, c, c_off, ldc)

        def codegen(context, builder, signature, args):
            return _emit(context, builder, signature, args, mr, nr, w, nv, False)

        return sig, codegen

    return uk


def make_ukernel_streaming(mr: int, nr: int, w: int):
    """The GEMM's micro-kernel: ``uk(kc, pa, pa_off, lda, pb, pb_off, c, c_off, ldc, load_c, pf,
    pf_off, pf_n)`` does C[c_off + r*ldc + j] (+)= sum_k pa[pa_off + r*lda + k] * pb[pb_off + nr*k + j].

    A is read in rows (``lda`` apart), not in a k-major panel: the caller decodes each A row
    contiguously (one vectorised pass) and never transposes it into panels (128 x 4096 fp16:
    the A pack 0.38 -> 0.1 ms), and the kernel runs as fast on it (8 broadcast streams).
    With ``load_c`` false the block starts from zero (C is only written: no zeroing pass
    over the accumulator, no read of a cold one). The k loop prefetches ``pf_n`` cache lines
    (16 floats each) of ``pf[pf_off:]`` into L2, one per k step while ``k < pf_n``: the caller
    names its share of the next B panel, which otherwise streams from L3 or memory when the
    first A panel reaches it (a frozen 1024x4096 B in a bare 128-row nest: 122 -> 145
    GFLOP/s on one Sapphire-Rapids-class core)."""
    assert nr % w == 0
    nv = nr // w

    @intrinsic
    def uk(typingctx, kc, pa, pa_off, lda, pb, pb_off, c, c_off, ldc, load_c, pf, pf_off, pf_n):
        if not _f32_vectors(pa, pb, c, pf):
            return None
        sig = types.void(kc, pa, pa_off, lda, pb, pb_off, c, c_off, ldc, load_c, pf, pf_off, pf_n)

        def codegen(context, builder, signature, args):
            return _emit(context, builder, signature, args, mr, nr, w, nv, True)

        return sig, codegen

    return uk


def _f32_vectors(*arrs) -> bool:
    return all(isinstance(a, types.Array) and a.dtype == types.float32 and a.ndim == 1 for a in arrs)


# long: one LLVM IR emitter: the register block, the k loop, prefetch and stores share the builder's values
def _emit(context, builder, signature, args, mr, nr, w, nv, streaming):
    """The kernel's IR. ``streaming``: the GEMM's signature (A rows ``lda`` apart, ``load_c``,
    prefetch), else the packed-panel one (A[k][r] at ``mr*k + r``)."""
    st = signature.args
    i32, i64 = ir.IntType(32), ir.IntType(64)
    vt = ir.VectorType(ir.FloatType(), w)
    vp = vt.as_pointer()

    def as_i64(i):
        return context.cast(builder, args[i], st[i], types.int64)

    def ptr(i_arr, i_off):
        return builder.gep(context.make_array(st[i_arr])(context, builder, args[i_arr]).data, [as_i64(i_off)])

    sh = 1 if streaming else 0      # the streaming form has lda after pa_off
    kc_i = as_i64(0)
    pa_ptr, pb_ptr, c_ptr = ptr(1, 2), ptr(3 + sh, 4 + sh), ptr(5 + sh, 6 + sh)
    ldc_i = as_i64(7 + sh)
    if streaming:
        lda_i = as_i64(3)
        arows = [builder.gep(pa_ptr, [builder.mul(lda_i, ir.Constant(i64, r))]) for r in range(mr)]
    fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vt, [vt, vt, vt]), f"llvm.fma.v{w}f32")
    cptrs = []
    for r in range(mr):
        row = builder.gep(c_ptr, [builder.mul(ldc_i, ir.Constant(i64, r))])
        cptrs += [builder.bitcast(builder.gep(row, [ir.Constant(i64, w * h)]), vp) for h in range(nv)]
    fn = builder.function
    if streaming:
        load_c = context.cast(builder, args[9], st[9], types.boolean)
        pf_ptr, pfn_i = ptr(10, 11), as_i64(12)
        i8p = ir.IntType(8).as_pointer()
        prefetch = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]), "llvm.prefetch.p0i8")
        with builder.if_else(load_c) as (then, otherwise):
            with then:
                loaded = [builder.load(p, align=4) for p in cptrs]
                from_load = builder.block
            with otherwise:
                from_zero = builder.block
        init = []
        for v in loaded:
            ph = builder.phi(vt)
            ph.add_incoming(v, from_load)
            ph.add_incoming(ir.Constant(vt, None), from_zero)
            init.append(ph)
    else:
        init = [builder.load(p, align=4) for p in cptrs]
    zeros = ir.Constant(ir.VectorType(i32, w), [0] * w)

    def step(k, accs):
        """One k: nv loads of B's row k, mr broadcasts of A's column k, mr * nv FMAs."""
        bk = builder.gep(pb_ptr, [builder.mul(k, ir.Constant(i64, nr))])
        bs = [builder.load(builder.bitcast(builder.gep(bk, [ir.Constant(i64, w * h)]), vp), align=4)
              for h in range(nv)]
        ak = builder.gep(pa_ptr, [builder.mul(k, ir.Constant(i64, mr))])
        new = []
        for r in range(mr):
            a = builder.load(builder.gep(arows[r], [k]) if streaming else builder.gep(ak, [ir.Constant(i64, r)]),
                             align=4)
            splat = builder.insert_element(ir.Constant(vt, ir.Undefined), a, ir.Constant(i32, 0))
            splat = builder.shuffle_vector(splat, ir.Constant(vt, ir.Undefined), zeros)
            for h in range(nv):
                new.append(builder.call(fma, [splat, bs[h], accs[nv * r + h]]))
        return new

    def loop(name, k0, kend, unroll, accs0, prefetching):
        """k from k0 while k < kend, ``unroll`` steps an iteration; returns (k at exit, accs)."""
        entry = builder.block
        header = fn.append_basic_block(name + "_header")
        body = fn.append_basic_block(name + "_body")
        done = fn.append_basic_block(name + "_done")
        builder.branch(header)
        builder.position_at_end(header)
        k = builder.phi(i64)
        k.add_incoming(k0, entry)
        accs = []
        for v in accs0:
            ph = builder.phi(vt)
            ph.add_incoming(v, entry)
            accs.append(ph)
        builder.cbranch(builder.icmp_signed("<", k, kend), body, done)
        builder.position_at_end(body)
        if prefetching:    # lines k .. k+unroll-1 of the next panel into L2 (prefetcht1) while k < pf_n
            with builder.if_then(builder.icmp_signed("<", k, pfn_i)):
                for u in range(unroll):
                    line = builder.gep(pf_ptr, [builder.mul(builder.add(k, ir.Constant(i64, u)), ir.Constant(i64, 16))])
                    builder.call(prefetch, [builder.bitcast(line, i8p), ir.Constant(i32, 0), ir.Constant(i32, 2),
                                            ir.Constant(i32, 1)])
        cur = accs
        for u in range(unroll):
            cur = step(builder.add(k, ir.Constant(i64, u)) if u else k, cur)
        k_next = builder.add(k, ir.Constant(i64, unroll))
        end = builder.block
        builder.branch(header)
        k.add_incoming(k_next, end)
        for ph, v in zip(accs, cur):
            ph.add_incoming(v, end)
        builder.position_at_end(done)
        return k, accs

    if streaming:   # two k steps an iteration: the loop's own uops off the FMA ports (hot panels 165 -> 174 GFLOP/s)
        kmain = builder.sub(kc_i, builder.srem(kc_i, ir.Constant(i64, 2)))
        kend, accs = loop("uk_pairs", ir.Constant(i64, 0), kmain, 2, init, True)
        _, accs = loop("uk_tail", kend, kc_i, 1, accs, False)
    else:
        _, accs = loop("uk", ir.Constant(i64, 0), kc_i, 1, init, False)
    for p, v in zip(cptrs, accs):
        builder.store(v, p, align=4)
    return context.get_dummy_value()


ukernel_6x16 = make_ukernel(6, 16, 8)

if has_feature("avx512f"):
    MR, NR = 8, 48
    ukernel_gemm = make_ukernel_streaming(MR, NR, 16)
    KC, MCP = 512, 32      # CPU sub-blocks: A block MCP*MR x KC fp32 = 512 KiB (L2)
else:
    MR, NR = 6, 16
    ukernel_gemm = make_ukernel_streaming(MR, NR, 8)
    KC, MCP = 256, 16      # A block 96 x 256 fp32 = 96 KiB
