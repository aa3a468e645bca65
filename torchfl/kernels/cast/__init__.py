"""Cast family: ``cast`` between float32/float16/bfloat16/int8/int32/int64/bool.

Semantics follow ``torch.Tensor.to``: floats round to nearest even into float16/bfloat16,
float -> integer truncates toward zero (saturating at the integer range, where torch is
undefined), integer -> integer wraps, anything -> bool is ``!= 0``. With
``quantize=True`` and int8: float -> int8 is ``clamp(rint(x / scale) + zero_point)`` and
int8 -> float is ``(q - zero_point) * scale`` (per-tensor affine quantisation).
Tiling: a stream of elements (``stream_plan``), reads = in bytes, writes = out bytes.
"""
from __future__ import annotations

from ..dtypes import DTYPES, ITEMSIZE
from ..errors import KernelError
from ..spec import KernelSpec, TensorMeta
from ..spec import numel as _n
from ..tiling import stream_plan

ALL = tuple(DTYPES)


def _check(p):
    to = p.attrs["to"]
    if p.has("scales") or p.has("zero_points"):
        _check_per_channel(p)
    if to not in ALL:
        raise KernelError(f"cast: unknown target dtype {to!r}; use one of {', '.join(ALL)}")
    if p.attrs["quantize"] and "int8" not in (to, p.dtype):
        raise KernelError("cast: quantize=True needs int8 on one side")
    if p.attrs["quantize"] and not p.attrs["scale"] > 0:
        raise KernelError(f"cast: quantisation scale must be positive, got {p.attrs['scale']}")


def _check_per_channel(p):
    """Per-channel dequantisation (PT2E's dequantize_per_channel): int8 x, float32 scales and
    integer zero points along ``axis``."""
    shape, axis = p.shapes["x"], p.attrs["axis"]
    if not (p.attrs["quantize"] and p.dtype == "int8" and p.attrs["to"] in ("float32", "float16", "bfloat16")):
        raise KernelError("cast: per-channel scales dequantise int8 to a float dtype (quantize=True, to a float)")
    if not -len(shape) <= axis < len(shape):
        raise KernelError(f"cast: axis {axis} is out of range for a {len(shape)}-D input")
    n = shape[axis]
    for name, ok in (("scales", ("float32",)), ("zero_points", ("int8", "int32", "int64"))):
        if p.has(name) and (tuple(p.shapes[name]) != (n,) or p.dtype_of(name) not in ok):
            raise KernelError(f"cast: {name} must be {' or '.join(ok)} of shape [{n}] (x.shape[{axis}]), got "
                              f"{p.dtype_of(name)} {list(p.shapes[name])}")
    if not p.has("scales"):
        raise KernelError("cast: per-channel zero_points need per-channel scales")


def _meta(p):
    return [TensorMeta(p.shapes["x"], p.attrs["to"], p.attrs["out_layout"] or p.layouts.get("x"))]


def plan_cast(p, chip):
    """THE tiling function of the cast family."""
    vectors = sum(_n(p.shapes[k]) * ITEMSIZE[p.dtype_of(k)] for k in ("scales", "zero_points") if p.has(k))
    plan = stream_plan("cast", p.key, _n(p.shapes["x"]), ITEMSIZE[p.dtype], ITEMSIZE[p.attrs["to"]], 1, chip,
                       resident_bytes=vectors, unit_name="elements")
    if plan is None:
        raise KernelError(f"cast: no tile fits the {chip.cache_bytes} B cache of {chip.name}")
    return plan


KERNELS = [KernelSpec(
    name="cast", family="cast", inputs=("x", "scales?", "zero_points?"),
    attrs={"to": "float32", "quantize": False, "scale": 1.0, "zero_point": 0, "axis": 0, "out_layout": None},
    dtypes=ALL, layouts="any", fuses=("aten._to_copy", "aten.to"),
    doc="dtype conversion (RNE into 16-bit floats; int8 affine quantisation with quantize=True, per tensor "
        "or, dequantising, per channel along axis with the scales / zero_points inputs)",
    check=_check, meta=_meta, tiler=plan_cast, impl="run_cast", mixed_dtypes=True, dtype_input="x")]
