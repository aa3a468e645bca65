"""Group norm (``aten.native_group_norm``: Wav2Vec2's feature encoder), pure Python part.

x is ``(N, C, *)``; each of the ``N x G`` groups (``C/G`` channels and all their spatial
elements, contiguous in row-major order) is normalised by its own mean and variance, then
scaled and shifted per channel. Outputs as torch: y, and mean / rstd of shape (N, G) in
float32 (saved statistics, never downcast). Statistics accumulate in float64 over the
on-chip copy of the group (two passes on chip), the result rounds once on store.

Tiling (``group_norm_tiling``): groups are the units, streamed in double-buffered tiles of
whole groups (``stream_plan``) with weight and bias resident. A group too big for the
cache is ``chunked``: streamed twice (statistics, then normalisation) in chunks of
``TE`` elements, so x is read twice.
"""
from __future__ import annotations

from ..dtypes import FLOATS, ITEMSIZE
from ..errors import KernelError
from ..spec import KernelSpec, TensorMeta
from ..spec import numel as _n
from ..tiling import TileConfig, Traffic, make_plan, stream_plan

STAT = 4
OPS_PER_ELEMENT = 6      # sum, centred square, normalise, scale, shift (as counted)


def geometry(p):
    """(N, C, HxW, G, elements per group)."""
    x = tuple(p.shapes["x"])
    if len(x) < 2:
        raise KernelError(f"group_norm: x must be (N, C, ...), got {list(x)}")
    G = int(p.attrs["groups"])
    N, C, HW = x[0], x[1], _n(x[2:])
    if G < 1 or C % G:
        raise KernelError(f"group_norm: {C} channels do not split into {G} groups")
    for nm in ("weight", "bias"):
        if nm in p.shapes and tuple(p.shapes[nm]) != (C,):
            raise KernelError(f"group_norm: {nm} must have shape ({C},), got {list(p.shapes[nm])}")
    return N, C, HW, G, C // G * HW


def _meta(p):
    N, C, HW, G, M = geometry(p)
    return [TensorMeta(tuple(p.shapes["x"]), p.dtype, None), TensorMeta((N, G), "float32", None),
            TensorMeta((N, G), "float32", None)]


def group_norm_tiling(p, chip):
    """THE tiling function of group norm (see the module docstring)."""
    N, C, HW, G, M = geometry(p)
    es = ITEMSIZE[p.dtype]
    params = sum(C * ITEMSIZE[p.dtype_of(nm)] for nm in ("weight", "bias") if nm in p.shapes)
    plan = stream_plan(p.kernel, p.key, N * G, M * es, M * es + 2 * STAT, M * OPS_PER_ELEMENT, chip,
                       resident_bytes=params, unit_name="groups")
    if plan is not None:
        return plan
    te = (chip.cache_bytes - params) // (4 * es)
    if te < 1:
        raise KernelError(f"group_norm: not even one element fits the {chip.cache_bytes} B cache of {chip.name}")
    te = min(te, M)
    full, rest = divmod(M, te)
    groups = [(1, Traffic(params, 0, 0))]
    for size, cnt in ((te, full), (rest, 1 if rest else 0)):
        groups.append((N * G * cnt, Traffic(size * es, 0, 2 * size)))                  # statistics pass
        groups.append((N * G * cnt, Traffic(size * es, size * es, (OPS_PER_ELEMENT - 2) * size)))
    groups.append((1, Traffic(0, N * G * 2 * STAT, 0)))
    cfg = TileConfig("chunked", (("groups", 1), ("elements", te)), True,
                     f"a group of {M} elements exceeds the cache: two passes in chunks of {te}")
    return make_plan(p.kernel, p.key, cfg, groups, params + 4 * te * es)


KERNELS = [
    KernelSpec("group_norm", "norm", ("x", "weight?", "bias?"), {"groups": 1, "eps": 1e-5}, FLOATS, "any",
               ("aten.native_group_norm.default",),
               "Group norm over (N, C, *): output, mean and rstd (N, groups) in float32, like native_group_norm.",
               geometry, _meta, group_norm_tiling, "run_group_norm", mixed_dtypes=True, dtype_input="x"),
]
