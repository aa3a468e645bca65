"""The emulated devices: one ChipModel and one DeviceMemory per chip, for the process.

Like ``torch.cuda``, memory statistics are per device and tell the truth: every tensor a
plan keeps on a chip (inputs in flight, intermediates, cached weight casts) is allocated
from that chip's :class:`~torchfl.kernels.memory.DeviceMemory`, aligned to its
``memory_alignment_bytes`` and accounted against its ``off_chip_memory.size_gb``.
"""
from __future__ import annotations

import threading

from torchfl.kernels import ChipModel

__all__ = ["chip_model", "device_memory", "memory_allocated", "max_memory_allocated",
           "reset_peak_memory_stats", "register_chip"]

_LOCK = threading.Lock()
_MODELS: dict[tuple, ChipModel] = {}
_MEMORY: dict[str, object] = {}


def _hcd_for(name: str, version: str | None, registry):
    """The chip's HCD from the registry (the planner's source of truth)."""
    from torchfl.registry import Registry

    reg = registry if isinstance(registry, Registry) else Registry(registry)
    return reg.chip(name, version)


def register_chip(model: ChipModel, version: str | None = None) -> ChipModel:
    """Make ``model`` the chip called ``model.name`` (tests, chips built by hand)."""
    with _LOCK:
        _MODELS[(model.name, version)] = model
        _MODELS.setdefault((model.name, None), model)
    return model


def chip_model(name, version: str | None = None, registry=None) -> ChipModel:
    """The :class:`ChipModel` of chip ``name`` (a ChipModel passes through), cached."""
    if isinstance(name, ChipModel):
        return name
    key = (name, version or None)
    with _LOCK:
        hit = _MODELS.get(key)
    if hit is not None:
        return hit
    model = ChipModel.from_hcd(_hcd_for(name, version, registry))
    with _LOCK:
        _MODELS[key] = model
    return model


def device_memory(chip):
    """The one :class:`DeviceMemory` of ``chip`` (a name or a ChipModel) in this process."""
    from torchfl.kernels.memory import DeviceMemory

    model = chip if isinstance(chip, ChipModel) else chip_model(chip)
    with _LOCK:
        mem = _MEMORY.get(model.name)
        if mem is None or mem.chip != model:
            mem = _MEMORY[model.name] = DeviceMemory(model)
        return mem


def _mem(chip):
    name = chip.name if isinstance(chip, ChipModel) else chip
    with _LOCK:
        mem = _MEMORY.get(name)
    return mem


def memory_allocated(chip) -> int:
    """Bytes allocated now on ``chip`` (alignment granules, as a device allocator counts)."""
    mem = _mem(chip)
    return 0 if mem is None else mem.memory_allocated()


def max_memory_allocated(chip) -> int:
    """Peak bytes allocated on ``chip`` since start or the last reset."""
    mem = _mem(chip)
    return 0 if mem is None else mem.max_memory_allocated()


def reset_peak_memory_stats(chip) -> None:
    mem = _mem(chip)
    if mem is not None:
        mem.reset_peak_memory_stats()
