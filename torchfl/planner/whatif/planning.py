"""What-if planning's common step: a chip resolved, a model captured once and planned on a
chip with the chip's errors kept (not raised), the precision ``auto`` picks."""

from __future__ import annotations

from dataclasses import dataclass
import time

from torchfl.planner.errors import PlanError


def chip_of(chip, registry=None, version: str | None = None):
    """The :class:`~torchfl.planner.target.Target` of ``chip`` (a name, an HCD or a Target):
    resolved as the planner does, or ``version`` of that name from the registry."""
    from torchfl.planner.target import resolve_target

    return resolve_target(chip, registry, version=version)


def auto_precision(hcd, requested: str | None) -> str | None:
    """``"auto"``: none on a chip with a float32 unit, else float16, else bfloat16 (the
    first the chip stores); anything else is passed through."""
    if requested != "auto":
        return requested
    if hcd.unit_for("float32") is not None:
        return None
    for p in ("float16", "bfloat16"):
        if p in hcd.stored_dtypes and hcd.unit_for(p) is not None:
            return p
    return None


@dataclass
class Planned:
    """One model on one chip: the plan (and for training, the backward's), or the error."""

    chip: str
    version: str
    precision: str | None
    plan: object = None
    backward: object = None
    error: PlanError | None = None
    planning_s: float = 0.0
    peak_bytes: int | None = None      # device high-water (training: both graphs, see training_peak)

    @property
    def ok(self) -> bool:
        return self.error is None


def plan_on(chip, captured, inputs, precision=None, backward=None) -> Planned:
    """Plan a capture (and a training capture's backward) on ``chip``; a planning error the
    chip's HCD causes is kept, not raised."""
    from torchfl.planner.api import plan_captured

    prec = auto_precision(chip.hcd, precision)
    out = Planned(chip.name, chip.version, prec)
    t0 = time.perf_counter()
    try:
        out.plan = plan_captured(captured, inputs, chip, precision=prec)
        out.peak_bytes = out.plan.memory.peak_bytes
        if backward is not None:
            out.backward = plan_captured(backward, (), chip, precision=prec)
            out.peak_bytes = training_peak(out.plan, out.backward, chip, captured.extra.get("weights", ()))
            _check_training(out, chip)
    except PlanError as exc:
        out.error = exc
    out.planning_s = time.perf_counter() - t0
    return out


def training_peak(forward, backward, chip, weights=()) -> int:
    """Device high-water of one training step as the runtime runs it: the forward (its
    parameter primals ``weights`` cached on the device, as the runtime does), then the
    backward while those weights stay resident. Saved activations cross between the two
    graphs as the backward's inputs, so its memory plan counts them."""
    from torchfl.planner.memory import plan_memory

    m = chip.model
    fw = plan_memory(forward, m.alignment, m.memory_bytes, weights)
    return max(fw.peak_bytes, fw.resident_bytes + backward.memory.peak_bytes)


def _check_training(out: Planned, chip) -> None:
    from torchfl.kernels.units import fmt_bytes
    from torchfl.planner.memory import MemoryLimitError

    cap = chip.model.memory_bytes
    if cap is not None and out.peak_bytes > cap:
        raise MemoryLimitError(
            f"Training step on {chip.name} needs {fmt_bytes(out.peak_bytes)} ({out.peak_bytes} B) of device memory "
            f"(the forward's cached weights plus the backward's peak), more than the chip's {fmt_bytes(cap)} "
            f"({cap} B, HCD field memory.off_chip_memory.size_gb); use a smaller batch", out.backward.memory,
            field="memory.off_chip_memory.size_gb", limit=cap, value=out.peak_bytes)


def example_error(module, inputs) -> str | None:
    """Why ``module(*inputs)`` fails, or None: the forward run once on fake tensors (shapes
    and dtypes only: no compute, no memory), so that a user's model given inputs of the wrong
    shape is one sentence before any capture (torch.export and Dynamo answered with 168-283
    lines of their own). The error is the user's code's, whatever its type."""
    import logging

    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    quiet = logging.getLogger("torch")   # fake-tensor dispatch logs the failure at ERROR first
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        with FakeTensorMode(allow_non_fake_inputs=True) as mode, torch.no_grad():
            fake = tuple(mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in inputs)
            module(*fake)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:  # noqa: BLE001 - user code: anything it raises is the user's to fix
        shapes = ", ".join(f"{tuple(x.shape)} {str(x.dtype).removeprefix('torch.')}" if isinstance(x, torch.Tensor)
                           else type(x).__name__ for x in inputs)
        first = (str(exc).strip().splitlines() or [""])[0]
        return f"the model's forward fails on its example inputs ({shapes}): {type(exc).__name__}: {first}"
    finally:
        quiet.setLevel(level)
    return None


def capture(module, inputs, training=False, packs=()):
    """(forward or inference capture, backward capture or None)."""
    from torchfl.planner.capture import capture_module
    from torchfl.planner.capture_training import capture_training

    if training:
        return capture_training(module, inputs, packs)
    return capture_module(module, inputs), None


def plan_everywhere(module, inputs, chips, precision="auto", training=False) -> list[Planned]:
    """``module(*inputs)`` captured once and planned on each of ``chips``."""
    fw, bw = capture(module, inputs, training, chips[0].packs if chips else ())
    return [plan_on(c, fw, inputs if not training else (), precision, bw) for c in chips]
