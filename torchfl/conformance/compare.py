"""A chip's output against eager torch, at a tolerance per dtype stated here with its reason.

=================  ============  ====================================================================
dtype              rtol / atol   why
=================  ============  ====================================================================
float32            1e-4 / 1e-5   same inputs, fp32 accumulation both sides in another order (tiles,
                                 8-wide vectors); OpInfo values are O(1-10), sums of up to ~1e3 terms
float16            2e-3 / 2e-3   11-bit significand: one round-to-nearest-even on store is 2^-11
                                 ~ 4.9e-4 relative; torch's CPU half ops may round intermediates
bfloat16           1.6e-2 / 1e-2 8-bit significand: RNE on store is 2^-8 ~ 3.9e-3, plus torch's own
                                 bf16 intermediate rounding (~2 ulp each side)
bfloat16 emulated  3.2e-2 / 2e-2 ``bfloat16_emulation``: inputs pass through fp16 and the result is
                                 truncated to bf16, one more bf16 ulp (2^-7) one-sided
integers, bool     exact         integer arithmetic and data movement have one right answer
=================  ============  ====================================================================

These are the kernel tests' tolerances (``torchfl/kernels/dtypes.py``). Eager torch in a
16-bit dtype rounds some intermediates where the chip accumulates in fp32, so a low
precision result is accepted when it is within tolerance of eager torch in that dtype
*or* of eager torch in float64 on the same (already rounded) inputs. NaN must be NaN where
eager gives NaN, an infinity the same infinity; shapes and dtypes must match exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchfl.hcd.dtypes import short_dtype

TOLERANCES = {
    "float32": (1e-4, 1e-5),
    "float16": (2e-3, 2e-3),
    "bfloat16": (1.6e-2, 1e-2),
    "bfloat16_emulated": (3.2e-2, 2e-2),
}


def tolerance(dtype: str, bf16_emulated: bool = False) -> tuple[float, float]:
    """(rtol, atol) for a result of ``dtype`` (short name); integers and bool are exact."""
    if dtype == "bfloat16" and bf16_emulated:
        return TOLERANCES["bfloat16_emulated"]
    return TOLERANCES.get(dtype, (0.0, 0.0))


@dataclass(frozen=True)
class Comparison:
    ok: bool
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    detail: str = ""          # why not ok: the worst element, or a shape/dtype/NaN mismatch


def compare(got, eager, exact=None, *, bf16_emulated: bool = False) -> Comparison:
    """``got`` (chip) against ``eager`` (torch, same dtype) and ``exact`` (torch in float64, or None).

    All three are pytrees of the same structure; non-tensor leaves must be equal."""
    import torch.utils._pytree as pytree

    g, spec_g = pytree.tree_flatten(got)
    e, spec_e = pytree.tree_flatten(eager)
    if spec_g != spec_e or len(g) != len(e):
        return Comparison(False, detail=f"output structure {spec_g} differs from eager's {spec_e}")
    x = pytree.tree_leaves(exact) if exact is not None else [None] * len(e)
    if len(x) != len(e):
        x = [None] * len(e)
    worst_abs, worst_rel = 0.0, 0.0
    for i, (a, b, c) in enumerate(zip(g, e, x)):
        one = _leaf(a, b, c, bf16_emulated)
        if not one.ok:
            return Comparison(False, one.max_abs_error, one.max_rel_error,
                              f"output {i}: {one.detail}" if len(e) > 1 else one.detail)
        worst_abs = max(worst_abs, one.max_abs_error or 0.0)
        worst_rel = max(worst_rel, one.max_rel_error or 0.0)
    return Comparison(True, worst_abs, worst_rel)


def _leaf(a, b, c, bf16_emulated) -> Comparison:
    import torch

    if not isinstance(b, torch.Tensor):
        return Comparison(a == b, 0.0, 0.0, "" if a == b else f"got {a!r}, eager {b!r}")
    if not isinstance(a, torch.Tensor):
        return Comparison(False, detail=f"got {type(a).__name__}, eager a tensor")
    if a.shape != b.shape:
        return Comparison(False, detail=f"shape {tuple(a.shape)}, eager {tuple(b.shape)}")
    if a.dtype != b.dtype:
        return Comparison(False, detail=f"dtype {short_dtype(a.dtype)}, eager {short_dtype(b.dtype)}")
    if a.numel() == 0:
        return Comparison(True, 0.0, 0.0)
    rtol, atol = tolerance(short_dtype(b.dtype), bf16_emulated)
    if not (b.is_floating_point() or b.is_complex()):
        bad = a != b
        if bool(bad.any()):
            idx = tuple(int(i) for i in bad.nonzero()[0])
            return Comparison(False, float((a.double() - b.double()).abs().max()), None,
                              f"at {list(idx)}: got {a[idx].item()}, eager {b[idx].item()} (exact dtype)")
        return Comparison(True, 0.0, 0.0)
    a64, b64 = a.detach().double(), b.detach().double()
    close = torch.isclose(a64, b64, rtol=rtol, atol=atol, equal_nan=True)
    if c is not None and isinstance(c, torch.Tensor) and c.shape == a.shape:
        close |= torch.isclose(a64, c.detach().double(), rtol=rtol, atol=atol, equal_nan=True)
    finite = torch.isfinite(a64) & torch.isfinite(b64)
    diff = (a64 - b64).abs().where(finite, torch.zeros((), dtype=torch.float64))
    rel = diff / b64.abs().clamp_min(atol or 1e-30)
    max_abs = float(diff.max()) if diff.numel() else 0.0
    max_rel = float(rel.max()) if rel.numel() else 0.0
    if bool(close.all()):
        return Comparison(True, max_abs, max_rel)
    bad = (~close).nonzero()[0]
    idx = tuple(int(i) for i in bad)
    n_bad = int((~close).sum())
    return Comparison(False, max_abs, max_rel,
                      f"{n_bad} of {a.numel()} elements outside rtol {rtol:g} / atol {atol:g}; first at "
                      f"{list(idx)}: got {a[idx].item()!r}, eager {b[idx].item()!r}")
