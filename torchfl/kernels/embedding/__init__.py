"""Embedding family: row gather and its backward (pure Python part).

The one tiling function is :func:`embedding_tiling`.

Forward: each index reads its id and one weight row and writes one output row. Tiles of
``TI`` indices stream through double-buffered buffers (``rows``); when a single row is too
big for the cache the rows are cut into ``TD`` columns and the ids are read once per
column block (``column_split``). No reuse of repeated ids is assumed: the bytes must not
depend on the data.

Backward (``embedding_dense_backward``): the gradient table ``V x TD`` (float32
accumulators) stays on chip while ids and grad rows stream past (``accumulate``; ids read
once per column block); when even one column of the table does not fit, every index does a
read-modify-write of its gradient row off-chip (``read_modify_write``, after zero-filling
the table). The cheapest that fits wins.
"""
from __future__ import annotations

from .. import dtypes as _dt
from ..conv.geometry import pow2_candidates
from ..dtypes import FLOATS
from ..errors import KernelError
from ..spec import KernelSpec, TensorMeta
from ..spec import numel as _prod
from ..tiling import TileConfig, Traffic, make_plan

__all__ = ["KERNELS", "embedding_tiling"]

ACC = 4


def _check(p):
    k = p.kernel
    ids = p.dtype_of("indices")
    if ids not in ("int64", "int32"):
        raise KernelError(f"kernel {k}: indices must be int64 or int32, got {ids}")
    if k == "embedding":
        if len(p.shapes["weight"]) != 2:
            raise KernelError(f"kernel {k}: weight must be 2-D (num_embeddings, dim), got {p.shapes['weight']}")
        if p.dtype_of("weight") not in FLOATS:
            raise KernelError(f"kernel {k}: weight must be a float dtype, got {p.dtype_of('weight')}")
    else:
        V = p.attrs["num_weights"]
        if not isinstance(V, int) or V < 0:
            raise KernelError(f"kernel {k}: attrs num_weights (the table's row count) is required")
        g, i = p.shapes["grad_out"], p.shapes["indices"]
        if tuple(g[:-1]) != tuple(i) or len(g) != len(i) + 1:
            raise KernelError(f"kernel {k}: grad_out {g} must be indices.shape {i} + (dim,)")
        if p.dtype_of("grad_out") not in FLOATS:
            raise KernelError(f"kernel {k}: grad_out must be a float dtype, got {p.dtype_of('grad_out')}")


def _dims(p):
    if p.kernel == "embedding":
        V, D = p.shapes["weight"]
    else:
        V, D = p.attrs["num_weights"], p.shapes["grad_out"][-1]
    return V, D, _prod(p.shapes["indices"])


def _dtype(p):
    return p.dtype_of("weight") if p.kernel == "embedding" else p.dtype_of("grad_out")


def _meta(p):
    V, D, n = _dims(p)
    if p.kernel == "embedding":
        return [TensorMeta(tuple(p.shapes["indices"]) + (D,), _dtype(p), None)]
    return [TensorMeta((V, D), _dtype(p), None)]


def embedding_tiling(p, chip):
    """The embedding family's one tiling function."""
    V, D, n = _dims(p)
    es = _dt.itemsize(_dtype(p))
    ei = _dt.itemsize(p.dtype_of("indices"))
    cache = chip.cache_bytes
    k = p.kernel
    if k == "embedding":
        if n * D == 0:
            return make_plan(k, p.key, TileConfig("rows", (("indices", 0), ("columns", D))), (), 0)
        per = ei + 2 * D * es
        if n * per <= cache:
            ti, td, strat, need = n, D, "rows", n * per
        elif 2 * per <= cache:
            ti, td, strat, need = min(n, cache // (2 * per)), D, "rows", 0
            need = 2 * ti * per
        else:
            td = max(1, (cache // 2 - ei) // (2 * es))
            td = min(td, D)
            ti, strat, need = 1, "column_split", 2 * (ei + 2 * td * es)
        groups = []
        full_c, rest_c = divmod(D, td)
        full_i, rest_i = divmod(n, ti)
        for cols, cc in ((td, full_c), (rest_c, 1 if rest_c else 0)):
            for rows, ci in ((ti, full_i), (rest_i, 1 if rest_i else 0)):
                if cc and ci:
                    groups.append((cc * ci, Traffic(rows * (ei + cols * es), rows * cols * es, 0)))
        cfg = TileConfig(strat, (("indices", ti), ("columns", td)), strat != "rows" or ti < n,
                         f"gather of {ti} rows x {td} columns per tile; footprint {need} B"
                         + ("" if need <= cache else f" EXCEEDS the {cache} B cache"))
        return make_plan(k, p.key, cfg, groups, need)
    # backward
    if V * D == 0:
        return make_plan(k, p.key, TileConfig("accumulate", (("indices", 0), ("columns", D))), (), 0)
    freq = bool(p.attrs["scale_grad_by_freq"])
    freq_bytes = n * ei if freq else 0          # the counting pass over the ids
    best = None
    for td in pow2_candidates(D):
        nb = -(-D // td)
        stream = 2 * (ei + td * es)              # one id + one grad row chunk, double-buffered
        need = V * td * ACC + stream + (V * 4 if freq else 0)
        total = nb * n * ei + n * D * es + V * D * es + freq_bytes
        if need <= cache:
            key = (total, nb)
            if best is None or key < best[0]:
                best = (key, "accumulate", td, need)
    rmw_total = V * D * es + n * (ei + D * es + 2 * D * es) + freq_bytes
    rmw_need = 2 * (ei + 3 * D * es) + (V * 4 if freq else 0)
    if best is None or rmw_total < best[0][0]:
        best = ((rmw_total, 1), "read_modify_write", D, rmw_need)
    _, strat, td, need = best
    groups = []
    if freq:
        groups.append((1, Traffic(n * ei, 0, n)))
    if strat == "accumulate":
        full, rest = divmod(D, td)
        for cols, cnt in ((td, full), (rest, 1 if rest else 0)):
            if cnt:
                groups.append((cnt, Traffic(n * (ei + cols * es), V * cols * es, n * cols)))
    else:
        groups.append((1, Traffic(0, V * D * es, 0)))                       # zero fill
        groups.append((n, Traffic(ei + 2 * D * es, D * es, D)))             # id, grad row, old row
    cfg = TileConfig(strat, (("indices", 1), ("columns", td)), True,
                     ("gradient table of " + (f"{V} x {td} resident" if strat == "accumulate" else
                                              "read-modify-write off chip")) + f"; footprint {need} B"
                     + ("" if need <= cache else f" EXCEEDS the {cache} B cache"))
    return make_plan(k, p.key, cfg, groups, need)


KERNELS = [
    KernelSpec("embedding", "embedding", ("weight", "indices"), {"padding_idx": None}, FLOATS, "any",
               ("aten.embedding.default",),
               "Row gather weight[indices]; indices of any shape (int64/int32); out-of-range ids are "
               "an error naming the id.", _check, _meta, embedding_tiling, "run_embedding",
               mixed_dtypes=True),
    KernelSpec("embedding_backward", "embedding", ("grad_out", "indices"),
               {"num_weights": None, "padding_idx": None, "scale_grad_by_freq": False}, FLOATS, "any",
               ("aten.embedding_dense_backward.default",),
               "Gradient of embedding: scatter-add of grad rows (padding_idx rows stay zero; "
               "scale_grad_by_freq divides by each id's count).", _check, _meta, embedding_tiling,
               "run_embedding_backward", mixed_dtypes=True),
]
