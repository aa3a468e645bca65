"""One case on the ``npu`` device (eager mode): the case's call op by op on the chip's index,
strict, judged as :mod:`execute` judges a compiled case (same preparation, tolerances and
outcomes). Kept apart from the compiled path, which groups cases into joint graphs."""

from __future__ import annotations

from torchfl.conformance.execute import Outcome, first_lines, is_refusal, judge, Prepared, prepare, refusal_reason


def npu_index(chip: str) -> int:
    """The ``npu`` device index of ``chip`` in this process (``TORCHFL_DEVICES``), or a one-line error."""
    from torchfl.runtime.eager import device as _dev

    names = _dev.chip_names()
    if chip not in names:
        raise RuntimeError(f"chip {chip} is not an npu device in this process (devices: {', '.join(names)}); "
                           f"set TORCHFL_DEVICES={chip} before the first use of the device")
    return names.index(chip)


def _to_device(tree, device):
    """Every tensor of ``tree`` copied onto ``device`` with the same shape and strides."""
    import torch
    import torch.utils._pytree as pytree

    def move(x):
        if isinstance(x, torch.Tensor):
            out = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=device)
            out.copy_(x)
            return out
        return x

    return pytree.tree_map(move, tree)


def _to_host(tree):
    import torch
    import torch.utils._pytree as pytree

    return pytree.tree_map(lambda x: x.cpu() if isinstance(x, torch.Tensor) else x, tree)


def run_case_eager(case, *, chip, bf16_emulated: bool = False, targets=(), prepared: Prepared | None = None) -> Outcome:
    """``case`` on the ``npu`` device (the chip's index), op by op as a user's eager code runs,
    with ``TORCHFL_STRICT`` on: an op the chip cannot run raises instead of falling back.
    The case counts for the claimed ``targets`` eager torch dispatched for it."""
    import os

    import torch

    p = prepared or prepare(case)
    if p.skip:
        return p.outcome("skipped", reason=p.skip)
    ops = tuple(sorted(t for t in targets if t in p.eager_ops))
    if not ops and len(targets) == 1:
        ops = tuple(targets)   # a composite eager dispatch decomposes (linear -> addmm): its only target
    if not ops:
        return p.outcome("skipped", reason="none of the overloads under test reached the chip for this case")
    device = torch.device("npu", npu_index(chip))
    saved = os.environ.get("TORCHFL_STRICT")
    os.environ["TORCHFL_STRICT"] = "1"
    try:
        args, kwargs = _to_device((case.args, case.kwargs), device)
        with torch.no_grad():
            got = _to_host(case.func(*args, **kwargs))
    except Exception as exc:  # noqa: BLE001 - reported, not swallowed: a refusal, or a fail with the error
        if is_refusal(exc):
            return p.outcome("refused", ops=ops, reason=refusal_reason(exc))
        return p.outcome("fail", ops=ops, reason=f"error: {type(exc).__name__}: {first_lines(exc, 3)}")
    finally:
        if saved is None:
            os.environ.pop("TORCHFL_STRICT", None)
        else:
            os.environ["TORCHFL_STRICT"] = saved
    return judge(p, got, ops, bf16_emulated)
