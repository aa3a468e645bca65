"""Language-model block kernels (LLaMA family): fused RMSNorm, SiLU-gated product, rotary
position embedding. Pure-Python part: the specs of ``rms.py``, ``swiglu.py`` and ``rope.py``,
each with its one tiling function (``rows_plan`` below, shared); Numba code in ``impl.py``.

Each kernel replaces a chain of 5-9 ATen ops that a Hugging Face decoder's eager module runs
(rules/core.yaml, ``fusions:``), and rounds where that module rounds: in float16 / bfloat16
the chain rounds after some of its ops in the model's dtype while others run in float32
(RMSNorm upcasts), so each kernel takes the rounding points as attributes, not a guess.
"""
from __future__ import annotations

from ..errors import KernelError
from ..tiling import stream_plan

__all__ = ["KERNELS", "rows_plan"]


def rows_plan(p, chip, rows: int, in_bytes: int, out_bytes: int, ops: int, resident: int = 0):
    """THE tiling of the family: ``rows`` independent units (a row of a norm, an element of a
    gated product, a head's row of RoPE) streamed in double-buffered tiles of whole units, the
    shared operands (norm weight, cos/sin tables) resident (``stream_plan``)."""
    plan = stream_plan(p.kernel, p.key, rows, in_bytes, out_bytes, ops, chip, resident_bytes=resident,
                       unit_name="rows")
    if plan is None:
        raise KernelError(f"{p.kernel}: one row ({in_bytes + out_bytes} B in and out"
                          + (f", {resident} B resident" if resident else "")
                          + f") does not fit twice in the {chip.cache_bytes} B cache of {chip.name}; "
                          "the unfused ops run instead")
    return plan


from .rms import KERNELS as _RMS  # noqa: E402  (each kernel its own module)
from .rope import KERNELS as _ROPE  # noqa: E402
from .swiglu import KERNELS as _SWIGLU  # noqa: E402

KERNELS = _RMS + _SWIGLU + _ROPE
