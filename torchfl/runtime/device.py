"""The emulated devices: one DeviceMemory per chip, for the process.

Like ``torch.cuda``, memory statistics are per device and tell the truth: every tensor a
plan keeps on a chip (inputs in flight, intermediates, cached weight casts) is allocated
from that chip's :class:`~torchfl.kernels.memory.DeviceMemory`, aligned to its
``memory_alignment_bytes`` and accounted against its ``off_chip_memory.size_gb``.

A chip is identified by its HCD's content hash (``Target.chip_hash`` =
``ChipModel.hcd_hash``): two chips with the same name but other numbers (a modified HCD)
have separate memories. The functions take a :class:`~torchfl.planner.target.Target`, a
:class:`~torchfl.kernels.chip.ChipModel` (one built by hand, without a hash, is keyed by its
name) or a chip name; a name means the chip of that name whose memory was created last
(``device_memory(name)`` resolves the name through the planner's default registry when no
memory of that name exists yet).
"""
from __future__ import annotations

import threading

from torchfl.kernels import ChipModel

__all__ = ["device_memory", "caching_memory", "memory_allocated", "max_memory_allocated",
           "memory_reserved", "empty_cache", "reset_peak_memory_stats"]

_LOCK = threading.Lock()
_MEMORY: dict[str, list] = {}     # chip key -> its CachingDeviceMemory, one per distinct model
_LATEST: dict[str, object] = {}   # chip name -> its memory created last


def _model(chip) -> ChipModel:
    if isinstance(chip, ChipModel):
        return chip
    model = getattr(chip, "model", None)   # a Target
    if isinstance(model, ChipModel):
        return model
    raise TypeError(f"expected a chip (Target, ChipModel or name), got {chip!r}")


def _key(model: ChipModel) -> str:
    return model.hcd_hash or f"name:{model.name}"


def device_memory(chip):
    """The one device memory of ``chip`` (a Target, a ChipModel or a name) in this process:
    a :class:`CachingDeviceMemory`, as a real device runtime keeps one caching allocator."""
    if isinstance(chip, str):
        with _LOCK:
            mem = _LATEST.get(chip)
        if mem is not None:
            return mem
        from torchfl.planner.target import resolve_target

        chip = resolve_target(chip)
    model = _model(chip)
    with _LOCK:
        mem = _find(model)
        if mem is None:
            # a model edited from its HCD (``dataclasses.replace``: the same hash, other numbers)
            # gets a memory beside the chip's, never in its place: live tensors and the eager
            # device keep the memory they were allocated on
            mem = caching_memory(model)
            _MEMORY.setdefault(_key(model), []).append(mem)
        _LATEST[model.name] = mem
        return mem


def _find(model: ChipModel):
    """The memory made for ``model`` (or an equal one), or None; under ``_LOCK``."""
    for mem in _MEMORY.get(_key(model), ()):
        if mem.chip is model or mem.chip == model:
            return mem
    return None


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
                pool = self._pool.get(acc)
                if pool is None:
                    pool = self._pool[acc] = []
                pool.append(block)
                self._reserved += acc

        def memory_reserved(self) -> int:
            return self._allocated + self._reserved

        def empty_cache(self):
            self._pool.clear()
            self._reserved = 0

    return CachingDeviceMemory(chip)


def _mem(chip):
    """The existing memory of ``chip`` (None when nothing was allocated on it yet)."""
    with _LOCK:
        return _LATEST.get(chip) if isinstance(chip, str) else _find(_model(chip))


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
