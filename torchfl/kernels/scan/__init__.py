"""Scan family: ``cumsum`` along one dim (pure Python part).

Position ids from an attention mask (RoBERTa, OPT, BLOOM's ALiBi) and mask building run a
running sum over the sequence. Floats accumulate in float32 (as torch's CPU kernel does
for half types) and round once per element on store; integers and bools accumulate in
int64, and an integer or bool input gives an int64 result unless ``to`` says otherwise
(torch's promotion).

Tiling (``scan_tiling``): the tensor is seen as ``outer x L x inner`` (L the scanned dim);
each of the ``outer * inner`` lines of L elements is one unit, streamed in double-buffered
tiles of whole lines (``stream_plan``). A line too long for the cache is cut into chunks
that carry the running sum from one to the next (``line_split``): the bytes are the same,
each element is read and written once.
"""
from __future__ import annotations

from ..dtypes import FLOATS, ITEMSIZE
from ..errors import KernelError
from ..spec import KernelSpec, TensorMeta
from ..spec import numel as _n
from ..tiling import TileConfig, Traffic, make_plan, stream_plan

INTS = ("int32", "int64", "bool")   # int8 is the quantised type: no scan


def geometry(p):
    """(outer, L, inner) of the scan over dim."""
    xs = tuple(p.shapes["x"])
    r = len(xs)
    d = p.attrs["dim"]
    if not -max(r, 1) <= d < max(r, 1):
        raise KernelError(f"{p.kernel}: dim {d} out of range for x of rank {r}")
    d = d % r if r else 0
    if not r:
        return 1, 1, 1
    return _n(xs[:d]), xs[d], _n(xs[d + 1:])


def out_dtype(p):
    to = p.attrs["to"]
    if to is not None:
        return to
    return "int64" if p.dtype in INTS else p.dtype


def _check(p):
    geometry(p)
    to = p.attrs["to"]
    if to is not None and to not in ITEMSIZE:
        raise KernelError(f"cumsum: to={to!r} is not a dtype it writes; use one of {', '.join(ITEMSIZE)}")
    if to is not None and (to in FLOATS) != (p.dtype in FLOATS):
        raise KernelError(f"cumsum: a {p.dtype} input cannot sum into {to} here; cast the input first")


def _meta(p):
    return [TensorMeta(tuple(p.shapes["x"]), out_dtype(p), None)]


def scan_tiling(p, chip):
    """THE tiling function of the scan family (see the module docstring)."""
    outer, L, inner = geometry(p)
    ei, eo = ITEMSIZE[p.dtype], ITEMSIZE[out_dtype(p)]
    lines = outer * inner if L else 0
    plan = stream_plan(p.kernel, p.key, lines, L * ei, L * eo, L, chip, unit_name="lines",
                       notes="" if lines * L * (ei + eo) <= chip.cache_bytes else
                       "double-buffered tiles of whole lines along the scanned dim")
    if plan is not None:
        return plan
    c = chip.cache_bytes // (2 * (ei + eo))
    if c < 1:
        raise KernelError(f"{p.kernel}: not even one element fits the {chip.cache_bytes} B cache of {chip.name}")
    full, rest = divmod(L, c)
    groups = [(lines * full, Traffic(c * ei, c * eo, c))]
    if rest:
        groups.append((lines, Traffic(rest * ei, rest * eo, rest)))
    cfg = TileConfig("line_split", (("lines", 1), ("chunk", c)), True,
                     f"lines of {L} cut into chunks of {c} carrying the running sum")
    return make_plan(p.kernel, p.key, cfg, groups, 2 * c * (ei + eo))


KERNELS = [
    KernelSpec("cumsum", "scan", ("x",), {"dim": 0, "to": None}, FLOATS + INTS, "any",
               doc="running sum along dim (floats in float32, integers and bools in int64; `to`: the result "
                   "dtype, default torch's: int64 for integer inputs)",
               check=_check, meta=_meta, tiler=scan_tiling, impl="run_scan"),
]
