"""Register blocks of dot products for the few-row GEMM (:mod:`gemv`, 3..8 rows of A), as LLVM IR.

``blk(nv, a, a_off, lda, b, b_off, ldb, out)`` keeps ``rb x cb`` ``<16 x float>`` accumulators over
``nv`` vector steps: row r of A at ``a_off + r * lda``, column c of B at ``b_off + c * ldb`` (both
contiguous along K), and stores the sum of accumulator ``r * cb + c`` (its 16 lanes added) at
``out[r * cb + c]``. Each B vector is loaded once per step and used by all ``rb`` rows: the
weight streams from memory once for ``rb`` rows, which is the point (a decode GEMM is memory-bound).

The operand types pick the arithmetic when compiled:
- A and B int16 (bfloat16 bits): ``vdpbf16ps`` (AVX512-BF16), 32 k a step, two products per lane
  per instruction summed into float32, as oneDNN's bf16 GEMM does (torch's own path on such a CPU).
  Inputs and outputs that are denormal are flushed to zero by the instruction (oneDNN's likewise).
- A float32, B uint16 (float16 bits): ``vcvtph2ps`` widening, ``llvm.fma``, 16 k a step.
- A float32, B int16 (bfloat16 bits, a CPU without AVX512-BF16): widened by a shift, 16 k a step.
Plain ``@njit`` code with 24 scalar accumulators vectorises too, but LLVM keeps its 4 x 4 form
at ~one FMA a cycle and 8 x 4096 x 4096 bf16 took 3.3 ms against 2.3 ms here (one Zen 4 core,
torch 2.8-3.3 ms).
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

LANES = 16


class _BFloat(ir.Type):
    """LLVM's ``bfloat`` (llvmlite has no class for it): the operand type of the BF16 dot product."""

    def _to_string(self):
        return "bfloat"

    def __eq__(self, other):
        return isinstance(other, _BFloat)

    def __hash__(self):
        return hash("bfloat")


def _mode(a, b):
    """'dp' (bf16 dot products), 'f16' or 'bf16' (widening), or None for other types."""
    if not (isinstance(a, types.Array) and isinstance(b, types.Array) and a.ndim == 1 and b.ndim == 1):
        return None
    if a.dtype == types.int16 and b.dtype == types.int16:
        return "dp"
    if a.dtype == types.float32 and b.dtype == types.uint16:
        return "f16"
    if a.dtype == types.float32 and b.dtype == types.int16:
        return "bf16"
    return None


def make_block(rb: int, cb: int):
    """The ``rb x cb`` block (see the module docstring)."""

    @intrinsic
    def blk(typingctx, nv, a, a_off, lda, b, b_off, ldb, out):
        mode = _mode(a, b)
        if mode is None or not (isinstance(out, types.Array) and out.dtype == types.float32):
            return None
        sig = types.void(nv, a, a_off, lda, b, b_off, ldb, out)

        def codegen(context, builder, signature, args):
            _emit(context, builder, signature, args, rb, cb, mode)
            return context.get_dummy_value()

        return sig, codegen

    return blk


# long: one LLVM IR emitter: the loads, the k loop's phis and the stores share the builder's values
def _emit(context, builder, signature, args, rb, cb, mode):
    st = signature.args
    i16, i32, i64 = ir.IntType(16), ir.IntType(32), ir.IntType(64)
    vf = ir.VectorType(ir.FloatType(), LANES)
    step = 2 * LANES if mode == "dp" else LANES

    def as_i64(i):
        return context.cast(builder, args[i], st[i], types.int64)

    def base(i_arr, i_off):
        return builder.gep(context.make_array(st[i_arr])(context, builder, args[i_arr]).data, [as_i64(i_off)])

    nv_i, lda_i, ldb_i = as_i64(0), as_i64(3), as_i64(6)
    ap, bp = base(1, 2), base(4, 5)
    out_p = context.make_array(st[7])(context, builder, args[7]).data
    arows = [builder.gep(ap, [builder.mul(lda_i, ir.Constant(i64, r))]) for r in range(rb)]
    bcols = [builder.gep(bp, [builder.mul(ldb_i, ir.Constant(i64, c))]) for c in range(cb)]
    if mode == "dp":
        vb = ir.VectorType(_BFloat(), 2 * LANES)
        dot = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vf, [vf, vb, vb]),
                                             "llvm.x86.avx512bf16.dpbf16ps.512")
    else:
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vf, [vf, vf, vf]), "llvm.fma.v16f32")

    def load(p, off, n, elem, align):
        vt = ir.VectorType(elem, n)
        return builder.load(builder.bitcast(builder.gep(p, [off]), vt.as_pointer()), align=align)

    def b_vec(p, off):
        """A step of one B column, as the operand the arithmetic takes (unaligned loads)."""
        if mode == "dp":
            return builder.bitcast(load(p, off, 2 * LANES, i16, 2), vb)
        raw = load(p, off, LANES, i16, 2)
        if mode == "f16":
            return builder.fpext(builder.bitcast(raw, ir.VectorType(ir.HalfType(), LANES)), vf)
        wide = builder.shl(builder.zext(raw, ir.VectorType(i32, LANES)), ir.Constant(ir.VectorType(i32, LANES),
                                                                                     [16] * LANES))
        return builder.bitcast(wide, vf)

    def a_vec(p, off):
        if mode == "dp":
            return builder.bitcast(load(p, off, 2 * LANES, i16, 2), vb)
        return load(p, off, LANES, ir.FloatType(), 4)

    fn = builder.function
    entry = builder.block
    header, body, done = (fn.append_basic_block(f"gemv_blk_{s}") for s in ("header", "body", "done"))
    builder.branch(header)
    builder.position_at_end(header)
    v = builder.phi(i64)
    v.add_incoming(ir.Constant(i64, 0), entry)
    accs = []
    for _ in range(rb * cb):
        ph = builder.phi(vf)
        ph.add_incoming(ir.Constant(vf, None), entry)
        accs.append(ph)
    builder.cbranch(builder.icmp_signed("<", v, nv_i), body, done)
    builder.position_at_end(body)
    off = builder.mul(v, ir.Constant(i64, step))
    bs = [b_vec(p, off) for p in bcols]
    new = list(accs)
    for r in range(rb):
        av = a_vec(arows[r], off)
        for c in range(cb):
            i = r * cb + c
            new[i] = builder.call(dot, [accs[i], av, bs[c]]) if mode == "dp" else builder.call(fma, [av, bs[c], accs[i]])
    nxt = builder.add(v, ir.Constant(i64, 1))
    end = builder.block
    builder.branch(header)
    v.add_incoming(nxt, end)
    for ph, x in zip(accs, new):
        ph.add_incoming(x, end)
    builder.position_at_end(done)
    red = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.FloatType(), [ir.FloatType(), vf]),
                                         "llvm.vector.reduce.fadd.v16f32")
    zero = ir.Constant(ir.FloatType(), 0.0)
    for i, acc in enumerate(accs):     # reassociated: a tree of shuffles and vector adds, not 16 scalar adds
        builder.store(builder.call(red, [zero, acc], fastmath=("reassoc",)), builder.gep(out_p, [ir.Constant(i64, i)]))
