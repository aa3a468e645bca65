"""RMSNorm (LLaMA, Mistral, Qwen2, Gemma): ``y = w * (x * rsqrt(mean(x^2, -1) + eps))``, pure part.

Hugging Face's LlamaRMSNorm upcasts to float32 (``_to_copy``, ``pow``, ``mean``, ``add``,
``rsqrt``, ``mul``), rounds the normalised value back to the input's dtype, then multiplies by
the weight in that dtype: ``round_normed`` true reproduces both roundings. Gemma multiplies by
``1 + weight`` still in float32 and rounds once at the end: ``round_normed`` false, its weight
the float32 ``1 + w`` vector. In float32 the two are the same computation.

Tiling: a row (the last dim, ``D`` elements) is the unit: its sum of squares and its
normalisation both run on the on-chip copy, so x is read once and y written once; the weight
(``D`` elements) stays resident (``rows_plan``).
"""
from __future__ import annotations

from ..dtypes import FLOATS, ITEMSIZE
from ..errors import KernelError
from ..spec import KernelSpec, TensorMeta
from ..spec import numel as _numel

OPS_PER_ELEMENT = 4      # square, accumulate, x * r, * w
OPS_PER_ROW = 3          # mean, + eps, rsqrt


def geometry(p) -> tuple[int, int]:
    """(rows, D) of an rms_norm problem; checks the weight and dtypes."""
    x = tuple(p.shapes["x"])
    if len(x) < 1:
        raise KernelError("rms_norm: x must have at least one dim (the normalised last dim), got a scalar")
    D = x[-1]
    if "weight" in p.shapes:
        if tuple(p.shapes["weight"]) != (D,):
            raise KernelError(f"rms_norm: weight must have shape ({D},) (x's last dim), got {list(p.shapes['weight'])}")
        if p.dtype_of("weight") not in (p.dtype, "float32"):
            raise KernelError(f"rms_norm: weight must be {p.dtype} or float32, got {p.dtype_of('weight')}; "
                              "insert a cast")
    if not float(p.attrs["eps"]) >= 0:
        raise KernelError(f"rms_norm: eps must be >= 0, got {p.attrs['eps']}")
    return _numel(x[:-1]), D


def _meta(p):
    return [TensorMeta(tuple(p.shapes["x"]), p.dtype, None)]


def rms_tiling(p, chip):
    """THE tiling of rms_norm: rows of D elements, the weight resident (see the docstring)."""
    from . import rows_plan

    M, D = geometry(p)
    es = ITEMSIZE[p.dtype]
    w = D * ITEMSIZE[p.dtype_of("weight")] if "weight" in p.shapes else 0
    return rows_plan(p, chip, M if D else 0, D * es, D * es, D * OPS_PER_ELEMENT + OPS_PER_ROW, w)


KERNELS = [
    KernelSpec("rms_norm", "lm", ("x", "weight?"), {"eps": 1e-6, "round_normed": True}, FLOATS, "any",
               ("aten._to_copy.default", "aten.pow.Tensor_Scalar", "aten.mean.dim", "aten.add.Tensor",
                "aten.rsqrt.default", "aten.mul.Tensor"),
               "RMSNorm over the last dim, float32 statistics: w * round(x * rsqrt(mean(x^2) + eps)) "
               "(round_normed: the normalised value rounds to x's dtype first, as LlamaRMSNorm).",
               geometry, _meta, rms_tiling, "run_rms_norm", mixed_dtypes=True, dtype_input="x"),
]
