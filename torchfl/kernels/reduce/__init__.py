"""Reductions: sum, mean, amax and vector norms over dims (keepdim), and the boolean reductions
any / all (truth of each element: nonzero or NaN; a bool result), any input layout (pure Python part).

The one tiling function is :func:`reduce_tiling`: outputs are tiled ``TM`` at a time with
their float accumulators resident; each output's inputs stream through double-buffered
chunks of ``TR`` elements. Every input element is read exactly once whatever the tiling
(outputs own disjoint inputs), so the bytes are the input plus the output; the tiling
only bounds the footprint. Ops: one add/compare per input element, one divide per
output for ``mean``. ``any``/``all`` read every dtype the chip stores (masks are bool, the
index path's ints) and write one bool byte per output.
"""
from __future__ import annotations

import math

from .. import dtypes as _dt
from ..dtypes import DTYPES, FLOATS
from ..errors import KernelError
from ..spec import KernelSpec, TensorMeta
from ..tiling import TileConfig, Traffic, make_plan

__all__ = ["KERNELS", "op_count", "reduce_dims", "reduce_tiling"]

ACC = 8   # float64 accumulator per output
BOOL_REDUCE = ("any", "all")   # kernels with a bool result
EXACT = ("bool", "int8", "int32", "int64")   # sum of these is exact, in int64, as torch's


def out_dtype(p) -> str:
    """bool for any/all; int64 for a sum of bools or integers (torch promotes); else the input's."""
    if p.kernel in BOOL_REDUCE:
        return "bool"
    if p.kernel == "sum" and p.dtype in EXACT:
        return "int64"
    return p.dtype


def reduce_dims(p) -> tuple:
    """Normalised reduced dims (sorted, unique) of a reduce problem."""
    shape = p.shapes["x"]
    nd = len(shape)
    dim = p.attrs["dim"]
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return tuple(range(nd))
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    out = []
    for d in dims:
        if not isinstance(d, int) or not -max(nd, 1) <= d < max(nd, 1):
            raise KernelError(f"kernel {p.kernel}: dim {d!r} out of range for a rank-{nd} input "
                              f"(use -{nd}..{nd - 1})")
        if nd == 0:
            continue    # a 0-d input: dim 0 / -1 names the scalar itself, nothing is reduced
        d = d % nd
        if d in out:
            raise KernelError(f"kernel {p.kernel}: dim {d} appears twice in {dims}")
        out.append(d)
    return tuple(sorted(out))


def _sizes(p):
    shape = p.shapes["x"]
    dims = reduce_dims(p)
    R = 1
    for d in dims:
        R *= shape[d]
    M = 1
    for i, s in enumerate(shape):
        if i not in dims:
            M *= s
    return M, R, dims


def norm_order(p) -> float:
    """The order of a ``vector_norm`` problem as a float (any, inf and -inf included)."""
    return float(p.attrs["ord"])


def op_count(p, n: int, R: int) -> int:
    """Operations of ``n`` outputs reducing ``R`` elements each: what the tiling prices and the
    run counts (one definition for both). A norm maps each element (|x|, x*x, |x|**p) before
    adding or comparing, and roots each result for orders other than 1, inf, -inf and 0."""
    if p.kernel == "vector_norm":
        o = norm_order(p)
        if o in (1.0, 0.0) or math.isinf(o):
            return n * 2 * R
        return n * ((2 if o == 2.0 else 3) * R + 1)
    return n * (R + (1 if p.kernel == "mean" else 0))


def _check(p):
    M, R, dims = _sizes(p)
    if p.kernel == "amax" and R == 0 and M:
        raise KernelError(f"kernel amax: cannot reduce over an empty dim of {p.shapes['x']} "
                          "(torch raises too: the maximum of nothing is undefined)")
    if p.kernel == "vector_norm":
        o = p.attrs["ord"]
        if isinstance(o, bool) or not isinstance(o, (int, float)) or math.isnan(o):
            raise KernelError(f"kernel vector_norm: order {o!r} is not a number (give a float, inf or -inf)")
        if (o < 0 or math.isinf(o)) and R == 0 and M:
            raise KernelError(f"kernel vector_norm: the {o} norm over an empty dim of {p.shapes['x']} has no value "
                              "(torch raises too: the operation has no identity)")


def _meta(p):
    shape = p.shapes["x"]
    dims = reduce_dims(p)
    if p.attrs["keepdim"]:
        out = tuple(1 if i in dims else s for i, s in enumerate(shape))
    else:
        out = tuple(s for i, s in enumerate(shape) if i not in dims)
    return [TensorMeta(out, out_dtype(p), None)]


def reduce_tiling(p, chip):
    """The reduce family's one tiling function."""
    M, R, _ = _sizes(p)
    es = _dt.itemsize(p.dtype)
    oes = _dt.itemsize(out_dtype(p))
    if M == 0:
        return make_plan(p.kernel, p.key, TileConfig("streamed", (("outputs", 0), ("chunk", 0))), (), 0)
    cache = chip.cache_bytes
    tr = max(1, min(R, (cache // 2) // (2 * es)))      # half the cache for the input stream
    tm = max(1, min(M, (cache - 2 * tr * es) // ACC))
    need = tm * ACC + 2 * min(tr, max(R, 1)) * es
    full, rest = divmod(M, tm)
    groups = []
    for n, cnt in ((tm, full), (rest, 1 if rest else 0)):
        if cnt:
            groups.append((cnt, Traffic(n * R * es, n * oes, op_count(p, n, R))))
    strategy = "resident" if tm == M and tr >= R else "streamed"
    cfg = TileConfig(strategy, (("outputs", tm), ("chunk", tr)), strategy == "streamed",
                     f"{tm} accumulators resident, input streamed in chunks of {tr}; footprint {need} B")
    return make_plan(p.kernel, p.key, cfg, groups, need)


def _spec(name, fuses, doc, dtypes=FLOATS, **attrs):
    return KernelSpec(name, "reduce", ("x",), {"dim": None, "keepdim": False, **attrs}, dtypes, "any", fuses, doc,
                      _check, _meta, reduce_tiling, "run_reduce")


KERNELS = [
    _spec("sum", ("aten.sum.dim_IntList", "aten.sum.default"),
          "Sum over dims (float64 accumulation, stored in the input dtype; bools and integers summed "
          "exactly into int64, as torch), any input layout.", FLOATS + EXACT),
    _spec("mean", ("aten.mean.dim", "aten.mean.default"), "Mean over dims, any input layout."),
    _spec("amax", ("aten.amax.default",), "Maximum over dims (NaN propagates), any input layout."),
    _spec("vector_norm", ("aten.linalg_vector_norm.default",),
          "Vector norm of order ord over dims (float64 accumulation: (sum |x|**ord)**(1/ord); inf / -inf the "
          "largest / smallest |x|, 0 the count of nonzeros), any input layout.", ord=2.0),
    _spec("any", ("aten.any.dim", "aten.any.dims", "aten.any.default"),
          "True where some element over dims is nonzero (NaN counts), any input dtype and layout; bool result.",
          tuple(DTYPES)),
    _spec("all", ("aten.all.dim", "aten.all.dims", "aten.all.default"),
          "True where every element over dims is nonzero (NaN counts; empty: true), any input dtype and "
          "layout; bool result.", tuple(DTYPES)),
]
