"""Order family: ``argmax`` / ``argmin``, ``sort`` and ``topk`` along one dim (pure Python part).

Routing a mixture-of-experts picks each token's top experts (``topk`` over the experts) and
groups tokens by expert (``sort`` of the expert ids); CLIP pools the text at the end-of-text
token (``argmax`` of the ids). Every one reads lines: the tensor is seen as ``outer x L x
inner`` (L the dim the op runs along), and each of the ``outer * inner`` lines is one unit.

Results follow torch's CPU kernels: NaN is the largest value (``argmax`` / ``argmin`` return
the first NaN of a line; ``sort`` puts NaNs last ascending, first descending); ties keep the
first index (``argmax``) or their order (``sort`` is stable, as ``torch.sort(stable=True)``;
``topk`` is the first ``k`` of that stable sort). Values are copied as stored, never
re-rounded; indices are int64. Floats compare in float32 (exact for float16 and bfloat16),
integers in int64.

Tiling (``order_tiling``): lines are streamed in double-buffered tiles of whole lines
(``stream_plan``), each line with its int64 index scratch on chip (the merge sort's working
indices, twice L). ``argmax`` and ``argmin`` need no scratch, and a line too long for the
cache is cut into chunks that carry the running best (``line_split``); a sort needs its
whole line on chip, so a longer line is refused (the op then runs on the host, said).
Operations counted: comparisons, ``L`` per line for arg-reductions and
``L * ceil(log2 L)`` for the merge sort (``topk`` sorts the whole line, so it counts the same).
"""
from __future__ import annotations

import math

from ..dtypes import FLOATS, ITEMSIZE
from ..errors import KernelError
from ..spec import KernelSpec, TensorMeta
from ..spec import numel as _n
from ..tiling import TileConfig, Traffic, make_plan, stream_plan

INTS = ("int32", "int64")
IDX = 8            # int64 indices


def geometry(p):
    """(outer, L, inner) of the op along ``dim`` (``dim`` None: the flattened tensor)."""
    xs = tuple(p.shapes["x"])
    r = len(xs)
    d = p.attrs["dim"]
    if d is None:
        return 1, _n(xs), 1
    if not -max(r, 1) <= d < max(r, 1):
        raise KernelError(f"{p.kernel}: dim {d} out of range for x of rank {r}")
    if not r:
        return 1, 1, 1
    d %= r
    return _n(xs[:d]), xs[d], _n(xs[d + 1:])


def kept(p) -> int:
    """Elements each line writes: 1 (arg-reductions), ``k`` (topk), ``L`` (sort)."""
    _o, L, _i = geometry(p)
    if p.kernel in ("argmax", "argmin"):
        return 1
    if p.kernel == "topk":
        return p.attrs["k"]
    return L


def _check(p):
    _o, L, _i = geometry(p)
    if p.kernel in ("argmax", "argmin") and L == 0:
        raise KernelError(f"{p.kernel}: an empty line has no {p.kernel[3:]}imum (torch refuses it too)")
    if p.kernel == "topk" and not 0 <= p.attrs["k"] <= L:
        raise KernelError(f"topk: k={p.attrs['k']} out of range for a dim of {L} elements")


def _meta(p):
    xs = tuple(p.shapes["x"])
    r = len(xs)
    if p.kernel in ("argmax", "argmin"):
        d = p.attrs["dim"]
        if d is None:
            shape = (1,) * r if p.attrs["keepdim"] else ()
        else:
            d = d % r if r else 0
            shape = xs[:d] + ((1,) if p.attrs["keepdim"] else ()) + xs[d + 1:] if r else ()
        return [TensorMeta(shape, "int64", None)]
    shape = xs
    if p.kernel == "topk" and r:
        d = p.attrs["dim"] % r
        shape = xs[:d] + (p.attrs["k"],) + xs[d + 1:]
    return [TensorMeta(shape, p.dtype, None), TensorMeta(shape, "int64", None)]


def comparisons(p, L: int) -> int:
    """Comparisons per line of ``L`` elements."""
    if p.kernel in ("argmax", "argmin"):
        return L
    return L * max(1, math.ceil(math.log2(L))) if L > 1 else 0


def order_tiling(p, chip):
    """THE tiling function of the order family (see the module docstring)."""
    outer, L, inner = geometry(p)
    ei = ITEMSIZE[p.dtype]
    k = kept(p)
    lines = outer * inner if k else 0          # topk(k=0), an empty line: nothing moves
    arg = p.kernel in ("argmax", "argmin")
    out_bytes = k * IDX if arg else k * (ei + IDX)
    scratch = 0 if arg else 2 * L * IDX
    plan = stream_plan(p.kernel, p.key, lines, L * ei, out_bytes, comparisons(p, L), chip, unit_name="lines",
                       scratch_per_unit=scratch)
    if plan is not None:
        return plan
    if not arg:
        raise KernelError(f"{p.kernel}: a line of {L} {p.dtype} values with its indices ({L * (ei + 3 * IDX)} B) "
                          f"does not fit the {chip.cache_bytes} B cache of {chip.name}; sort shorter lines")
    c = chip.cache_bytes // (2 * ei)
    if c < 1:
        raise KernelError(f"{p.kernel}: not even one element fits the {chip.cache_bytes} B cache of {chip.name}")
    full, rest = divmod(L, c)
    groups = [(lines * full, Traffic(c * ei, 0, c))]
    if rest:
        groups.append((lines, Traffic(rest * ei, 0, rest)))
    groups.append((lines, Traffic(0, IDX, 0)))
    cfg = TileConfig("line_split", (("lines", 1), ("chunk", c)), True,
                     f"lines of {L} cut into chunks of {c} carrying the running best")
    return make_plan(p.kernel, p.key, cfg, groups, 2 * c * ei)


_ARG = {"dim": None, "keepdim": False}
KERNELS = [
    KernelSpec("argmax", "order", ("x",), dict(_ARG), FLOATS + INTS,
               doc="index of the largest value along dim (None: the flattened tensor); NaN is the largest, "
                   "ties give the first index; int64",
               check=_check, meta=_meta, tiler=order_tiling, impl="run_arg"),
    KernelSpec("argmin", "order", ("x",), dict(_ARG), FLOATS + INTS,
               doc="index of the smallest value along dim; a NaN wins (as torch), ties give the first index",
               check=_check, meta=_meta, tiler=order_tiling, impl="run_arg"),
    KernelSpec("sort", "order", ("x",), {"dim": -1, "descending": False}, FLOATS + INTS,
               doc="stable sort along dim: (values as stored, int64 indices); NaN last ascending, first descending",
               check=_check, meta=_meta, tiler=order_tiling, impl="run_sort"),
    KernelSpec("topk", "order", ("x",), {"k": 1, "dim": -1, "largest": True}, FLOATS + INTS,
               doc="the k largest (smallest) values along dim, sorted, with int64 indices: the first k of the "
                   "stable sort",
               check=_check, meta=_meta, tiler=order_tiling, impl="run_sort"),
]
