"""The emulated devices: one ChipModel and one DeviceMemory per chip, for the process.

Like ``torch.cuda``, memory statistics are per device and tell the truth: every tensor a
plan keeps on a chip (inputs in flight, intermediates, cached weight casts) is allocated
from that chip's :class:`~torchfl.kernels.memory.DeviceMemory`, aligned to its
``memory_alignment_bytes`` and accounted against its ``off_chip_memory.size_gb``.
"""
from __future__ import annotations

import threading

from torchfl.kernels import ChipModel

__all__ = ["chip_model", "device_memory", "caching_memory", "memory_allocated", "max_memory_allocated",
           "memory_reserved", "empty_cache", "reset_peak_memory_stats", "register_chip"]

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
    """The one device memory of ``chip`` (a name or a ChipModel) in this process: a
    :class:`CachingDeviceMemory`, as a real device runtime keeps one caching allocator."""
    model = chip if isinstance(chip, ChipModel) else chip_model(chip)
    with _LOCK:
        mem = _MEMORY.get(model.name)
        if mem is None or mem.chip != model:
            mem = _MEMORY[model.name] = caching_memory(model)
        return mem


def caching_memory(chip, max_reserved: int = 1 << 30):
    """A :class:`~torchfl.kernels.memory.DeviceMemory` that keeps freed blocks for reuse.

    Why: a plan frees and allocates the same sizes on every call; returning blocks to the
    OS and faulting fresh pages in again cost more than small kernels (measured: ResNet-50
    spent ~10 ms per call outside its kernels on that). Accounting stays truthful:
    ``memory_allocated()`` counts live blocks only, ``memory_reserved()`` adds the cache;
    the capacity (``off_chip_memory.size_gb``) bounds live + cached, and the cache is
    emptied before an allocation is refused. Blocks are reused only for the same aligned
    size, and a freed buffer's handle refuses use as before.
    """
    from torchfl.kernels.memory import DeviceMemory

    class CachingDeviceMemory(DeviceMemory):
        def __init__(self, chip):
            super().__init__(chip)
            self._pool: dict[int, list] = {}
            self._reserved = 0
            self.max_reserved = int(max_reserved)

        def _obtain(self, acc: int):
            blocks = self._pool.get(acc)
            if blocks:
                self._reserved -= acc
                return blocks.pop()
            if self.capacity is not None and self._allocated + self._reserved + acc > self.capacity:
                self.empty_cache()
            return super()._obtain(acc)   # a fresh block, or the located out-of-memory error

        def _recycle(self, block, acc: int) -> None:
            if self._reserved + acc <= self.max_reserved:
                self._pool.setdefault(acc, []).append(block)
                self._reserved += acc

        def memory_reserved(self) -> int:
            return self._allocated + self._reserved

        def empty_cache(self):
            self._pool.clear()
            self._reserved = 0

    return CachingDeviceMemory(chip)


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


def memory_reserved(chip) -> int:
    """Bytes held on ``chip``: live blocks plus the allocator's cache of freed ones."""
    mem = _mem(chip)
    return 0 if mem is None else mem.memory_reserved()


def empty_cache(chip) -> None:
    """Return the cached free blocks of ``chip`` (like ``torch.cuda.empty_cache``)."""
    mem = _mem(chip)
    if mem is not None:
        mem.empty_cache()
