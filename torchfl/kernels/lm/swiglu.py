"""The SwiGLU gate's product ``silu(a) * b`` (LLaMA's MLP: ``silu(gate(x)) * up(x)``), pure part.

``silu(a) = a / (1 + exp(-a))`` in float32, as torch's own kernel computes it; in float16 /
bfloat16 eager torch rounds silu's result to the dtype (the captured graph's ``_to_copy`` back)
before the product, which rounds again: ``round_silu`` keeps that point. a and b have one
shape and dtype (the two projections of one input).

Tiling: elements stream (``rows_plan`` with one element a unit): two inputs in, one out, the
intermediate silu never leaves the chip.
"""
from __future__ import annotations

from ..dtypes import FLOATS, ITEMSIZE
from ..errors import KernelError
from ..spec import KernelSpec, TensorMeta
from ..spec import numel as _numel

OPS_PER_ELEMENT = 6      # silu as the elementwise family counts it (5), and the product


def _check(p):
    if tuple(p.shapes["a"]) != tuple(p.shapes["b"]):
        raise KernelError(f"silu_mul: a and b must have one shape, got {list(p.shapes['a'])} and "
                          f"{list(p.shapes['b'])}")


def _meta(p):
    return [TensorMeta(tuple(p.shapes["a"]), p.dtype, None)]


def silu_mul_tiling(p, chip):
    """THE tiling of silu_mul: elements stream, a and b in, y out."""
    from . import rows_plan

    es = ITEMSIZE[p.dtype]
    return rows_plan(p, chip, _numel(p.shapes["a"]), 2 * es, es, OPS_PER_ELEMENT)


KERNELS = [
    KernelSpec("silu_mul", "lm", ("a", "b"), {"round_silu": True}, FLOATS, "any",
               ("aten._to_copy.default", "aten.sigmoid.default", "aten.silu.default", "aten.mul.Tensor"),
               "silu(a) * b in one pass (SwiGLU); round_silu: silu rounds to the dtype first, as eager.",
               _check, _meta, silu_mul_tiling, "run_silu_mul"),
]
