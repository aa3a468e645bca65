"""The native-bfloat16 check: does a chip whose HCD claims native bfloat16 compute it as one?

bfloat16 keeps float32's exponent (range to ~3.4e38, normals down to ~1.2e-38) with an 8-bit
significand; float16 ends at 65504 and flushes below ~6e-8. A chip that lists
``torch.bfloat16`` without ``constraints.bfloat16_emulation`` promises the former. If its
kernels really pass bf16 through an fp16 datapath (the article's "loss NaN after N steps":
activations or gradients beyond 65504 become inf, then NaN), per-op OpInfo samples, whose
values are O(1), never notice. This probe does: a few bf16 values far outside float16's
range (and below its smallest subnormal) go through elementwise ops, a matmul and a sum on
the chip (``torch.compile(backend="torchfl")``, strict), compared with eager torch in
bfloat16 at the bf16 tolerance of ``compare.py``. A chip that declares the emulation is
not probed: its HCD already says so.
"""

from __future__ import annotations

from dataclasses import dataclass

#: bf16 values beyond float16's range (> 65504) and below its smallest subnormal (~6e-8)
WIDE = (1.0e5, -3.0e6, 2.5e10, 1.0e30, -2.0e36, 1.0e-9, -3.0e-20, 1.5)


@dataclass(frozen=True)
class Finding:
    """The chip computes bfloat16 unlike a native bfloat16 unit."""

    chip: str
    op: str
    message: str

    def as_dict(self) -> dict:
        return {"check": "native_bfloat16", "chip": self.chip, "op": self.op, "message": self.message}


def claims_native_bf16(hcd) -> bool:
    """The HCD lists bfloat16 and does not declare that it emulates it."""
    return "bfloat16" in hcd.dtypes and not hcd.constraints.bfloat16_emulation


def _probe_fns():
    import torch

    def elementwise(a, b):
        return a * b + a              # 1e30 * 1.5 + 1e30: finite in bf16, inf through fp16

    def matmul(a, b):
        return a.view(2, 4) @ b.view(4, 2)

    def total(a, b):
        return (a * 0.5).sum().reshape(1) + b[:1]

    return {"aten.mul.Tensor": elementwise, "aten.mm.default": matmul, "aten.sum.default": total}, torch


def check_native_bf16(chip, registry=None) -> list[Finding]:
    """Probe ``chip`` (a name, an HCD or a Target) if its HCD claims native bfloat16; one
    :class:`Finding` per probe whose result is not what a bfloat16 unit computes."""
    from torchfl.conformance.compare import compare
    from torchfl.conformance.execute import is_refusal
    from torchfl.conformance.shared import GroupCompile
    from torchfl.planner.target import resolve_target

    target = resolve_target(chip, registry)
    if not claims_native_bf16(target.hcd):
        return []
    fns, torch = _probe_fns()
    a = torch.tensor(WIDE, dtype=torch.bfloat16)
    b = torch.tensor(tuple(reversed(WIDE)), dtype=torch.bfloat16) * 0 + 1.5
    out = []
    for op, fn in fns.items():
        with torch.no_grad():
            want = fn(a, b)
            exact = fn(a.double(), b.double())
        got, _plans, exc = GroupCompile(fn, [a, b]).run(target)
        if exc is not None:
            if is_refusal(exc):
                continue      # the op is not the chip's in bf16: conformance reports that claim itself
            raise exc
        result = compare(got, want, exact)
        if result.ok:
            continue
        gf, wf = got.float().flatten(), want.float().flatten()
        bad = next(i for i in range(wf.numel()) if not _near(gf[i], wf[i]))
        out.append(Finding(target.name, op, (
            f"{target.name} {target.version} claims native bfloat16 (tensor.supported_dtypes lists torch.bfloat16, "
            f"constraints.bfloat16_emulation is not set), but {op} on bfloat16 gave {gf[bad].item():.4g} where "
            f"eager bfloat16 gives {wf[bad].item():.4g}: its kernels compute bfloat16 through float16 (range "
            f"65504), so large activations or gradients overflow to inf and then NaN. Set "
            f"constraints.bfloat16_emulation: true in the HCD, or fix the kernels")))
    return out


def _near(g, w) -> bool:
    import torch

    return bool(torch.isclose(g.double(), w.double(), rtol=1.6e-2, atol=1e-2, equal_nan=True))
