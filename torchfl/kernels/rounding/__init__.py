"""Rounding family: ``div_rounding``, division rounded toward zero or down (pure Python part).

``torch.div(a, b, rounding_mode="trunc" | "floor")`` and ``a // b`` (``floor_divide``): MoE
routing maps sorted slots back to tokens with ``perm // top_k``; position and bucket math use
them too. Results follow torch's CPU kernels: integers divide exactly (int64; ``floor`` rounds
toward -inf, ``trunc`` toward zero; a zero divisor raises ``ZeroDivisionError`` as torch
does); floats compute in float32 (half types widened, as torch's opmath) and round once on
store, ``floor`` by torch's ``div_floor_floating`` (``fmod`` first, so ``a // b`` is exact
where ``floor(a / b)`` is not), a zero divisor giving ``a / b`` (inf or NaN), NaN and inf as torch.

Tiling (``rounding_tiling``): the output is walked in tiles of whole elements
(``stream_plan``); an operand of the output's size streams beside it, a broadcast one (fewer
elements: a scalar tensor, a row) is loaded once and kept on chip. Operations: 4 per element
(divide, remainder, compare, round).
"""
from __future__ import annotations

from ..dtypes import FLOATS, ITEMSIZE
from ..errors import KernelError
from ..spec import KernelSpec, TensorMeta
from ..spec import numel as _n
from ..tiling import stream_plan

INTS = ("int32", "int64")
MODES = ("trunc", "floor")
COST = 4


def out_shape(p):
    a = tuple(p.shapes["a"])
    if not p.has("b"):
        return a
    b = tuple(p.shapes["b"])
    r = max(len(a), len(b))
    a, b = (1,) * (r - len(a)) + a, (1,) * (r - len(b)) + b
    out = []
    for x, y in zip(a, b):
        if x != y and 1 not in (x, y):
            raise KernelError(f"div_rounding: shapes {list(p.shapes['a'])} and {list(p.shapes['b'])} do not broadcast")
        out.append(y if x == 1 else x)
    return tuple(out)


def _check(p):
    if p.attrs["mode"] not in MODES:
        raise KernelError(f"div_rounding: rounding_mode {p.attrs['mode']!r} is not one of {', '.join(MODES)}")
    if p.dtype in INTS and not p.has("b") and not float(p.attrs["scalar"]).is_integer():
        raise KernelError("div_rounding: an integer tensor divided by a fractional number is a float result; "
                          "cast the tensor first")
    out_shape(p)


def _meta(p):
    return [TensorMeta(out_shape(p), p.dtype, None)]


def rounding_tiling(p, chip):
    """THE tiling function of the rounding family (see the module docstring)."""
    n = _n(out_shape(p))
    ei = ITEMSIZE[p.dtype]
    streamed, resident = ei, 0                 # a: the output's size unless it broadcasts
    if _n(p.shapes["a"]) < n:
        streamed, resident = 0, _n(p.shapes["a"]) * ei
    if p.has("b"):
        if _n(p.shapes["b"]) < n:
            resident += _n(p.shapes["b"]) * ei
        else:
            streamed += ei
    plan = stream_plan(p.kernel, p.key, n, streamed, ei, COST, chip, resident_bytes=resident, unit_name="elements")
    if plan is None:
        raise KernelError(f"div_rounding: the broadcast operands ({resident} B) and a tile do not fit the "
                          f"{chip.cache_bytes} B cache of {chip.name}")
    return plan


KERNELS = [
    KernelSpec("div_rounding", "rounding", ("a", "b?"), {"scalar": 1.0, "mode": "trunc"}, FLOATS + INTS,
               doc="a / b (b a tensor, broadcast, or the scalar) rounded toward zero (trunc) or down (floor), as "
                   "torch.div(rounding_mode=...); integers exact",
               check=_check, meta=_meta, tiler=rounding_tiling, impl="run_div_rounding"),
]
