"""Rotary position embedding ``x * cos + rotate_half(x) * sin`` (LLaMA family), pure part.

``rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2])``: output element j of a row reads x[j]
and its partner x[j + D/2] (first half, negated) or x[j - D/2] (second half), so the rotated
copy, its two slices, the negation and the two products never leave the chip. In float16 /
bfloat16 eager torch rounds each product and the sum to the dtype (three ops in the model's
dtype): the kernel rounds at the same points (``round_products``), bit-exact with them.

x is ``(B, H, L, D)`` (q or k after the head split); cos and sin ``(Bc, Hc, L, D)`` with Bc in
{1, B}, Hc in {1, H} (Hugging Face's ``cos.unsqueeze(1)``): one table serves every head.
Tiling: a row of x (D elements) is the unit; the tables stay resident when they fit half the
cache, else each row streams its own cos/sin row beside it (``rows_plan``).
"""
from __future__ import annotations

from ..dtypes import FLOATS, ITEMSIZE
from ..errors import KernelError
from ..spec import KernelSpec, TensorMeta
from ..spec import numel as _numel

OPS_PER_ELEMENT = 3      # two products and the sum (the negation is a sign flip on load)


def geometry(p) -> tuple[int, int, int, int, int, int]:
    """(B, H, L, D, Bc, Hc); checks the tables against x."""
    x = tuple(p.shapes["x"])
    if len(x) != 4:
        raise KernelError(f"rope: x must be (batch, heads, sequence, head_dim), got shape {list(x)}")
    B, H, L, D = x
    if D % 2:
        raise KernelError(f"rope: head_dim must be even (rotate_half splits it in two), got {D}")
    for n in ("cos", "sin"):
        t = tuple(p.shapes[n])
        if len(t) != 4 or t[2:] != (L, D) or t[0] not in (1, B) or t[1] not in (1, H):
            raise KernelError(f"rope: {n} must be (1 or {B}, 1 or {H}, {L}, {D}) to pair with x {list(x)}, "
                              f"got {list(t)}")
    if tuple(p.shapes["cos"]) != tuple(p.shapes["sin"]):
        raise KernelError(f"rope: cos {list(p.shapes['cos'])} and sin {list(p.shapes['sin'])} differ")
    t = tuple(p.shapes["cos"])
    return B, H, L, D, t[0], t[1]


def _meta(p):
    return [TensorMeta(tuple(p.shapes["x"]), p.dtype, None)]


def rope_tiling(p, chip):
    """THE tiling of rope: rows of x; the cos/sin tables resident when both fit half the cache."""
    from . import rows_plan

    B, H, L, D, Bc, Hc = geometry(p)
    es = ITEMSIZE[p.dtype]
    if tables_resident(p, chip):
        return rows_plan(p, chip, B * H * L, D * es, D * es, D * OPS_PER_ELEMENT, 2 * _numel(p.shapes["cos"]) * es)
    return rows_plan(p, chip, B * H * L, 3 * D * es, D * es, D * OPS_PER_ELEMENT)


def tables_resident(p, chip) -> bool:
    """Did the plan keep cos/sin resident (read once) rather than one row per x row?"""
    return 2 * _numel(p.shapes["cos"]) * ITEMSIZE[p.dtype] <= chip.cache_bytes // 2


KERNELS = [
    KernelSpec("rope", "lm", ("x", "cos", "sin"), {"round_products": True}, FLOATS, "any",
               ("aten.mul.Tensor", "aten.slice.Tensor", "aten.neg.default", "aten.cat.default",
                "aten.add.Tensor"),
               "Rotary embedding x * cos + rotate_half(x) * sin over (B, H, L, D); round_products: each "
               "product and the sum round to the dtype, as eager's three ops.",
               geometry, _meta, rope_tiling, "run_rope"),
]
