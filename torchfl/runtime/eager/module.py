"""``torch.npu``: the device module, in the shape of ``torch.cuda``'s.

    torch.npu.device_count(); torch.npu.get_device_name(1)        # 'NPU-V3'
    torch.npu.memory_allocated(0); torch.npu.max_memory_allocated(0)
    torch.npu.reset_peak_memory_stats(0); torch.npu.empty_cache()
"""
from __future__ import annotations

import contextlib

from . import device as _dev

__all__ = ["is_available", "is_initialized", "device_count", "current_device", "set_device", "device",
           "get_device_name", "memory_allocated", "max_memory_allocated", "memory_reserved",
           "reset_peak_memory_stats", "empty_cache", "synchronize", "manual_seed", "manual_seed_all",
           "lazy"]


def _adapter():
    from . import adapter

    return adapter()


def is_available() -> bool:
    try:
        return _dev.device_count() > 0
    except Exception:
        return False


def is_initialized() -> bool:
    from . import _STATE

    return _STATE.get("adapter") is not None


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    """How many chips this process sees (``TORCHFL_DEVICES``, else the registry's)."""
    return _dev.device_count()


def current_device() -> int:
    return _adapter().current_device()


def set_device(index) -> None:
    _adapter().set_device(_dev._index(index))


@contextlib.contextmanager
def device(index):
    """``with torch.npu.device(1):`` -- the current device inside the block."""
    a = _adapter()
    old = a.current_device()
    a.set_device(_dev._index(index))
    try:
        yield
    finally:
        a.set_device(old)


def get_device_name(index=None) -> str:
    """The chip's name (``chip.name`` of its HCD)."""
    return _dev.chip_names()[_dev._index(index)]


def get_device_properties(index=None):
    """The chip's :class:`~torchfl.kernels.ChipModel` (cache, bandwidths, peaks, memory)."""
    return _dev.chip_of(index)


def memory_allocated(index=None) -> int:
    """Bytes allocated on the chip now, in alignment granules, as a device allocator counts."""
    return _dev.memory_of(index).memory_allocated()


def max_memory_allocated(index=None) -> int:
    return _dev.memory_of(index).max_memory_allocated()


def memory_reserved(index=None) -> int:
    """Allocated bytes plus the caching allocator's freed blocks kept for reuse."""
    return _dev.memory_of(index).memory_reserved()


def reset_peak_memory_stats(index=None) -> None:
    _dev.memory_of(index).reset_peak_memory_stats()


def empty_cache() -> None:
    """Return every chip's cached free blocks (like ``torch.cuda.empty_cache``)."""
    for i in range(_dev.device_count()):
        if i in _dev._MEMORY:
            _dev._MEMORY[i].empty_cache()


def synchronize(index=None) -> None:
    """The emulated chips run synchronously; in lazy mode this flushes recorded ops."""
    from . import lazy as _lazy

    _lazy.flush_all()


def manual_seed(seed: int) -> None:
    """Nothing to do: random ops on npu tensors draw from the CPU generator (they run on
    the host), so ``torch.manual_seed`` (which calls this) already makes them reproducible."""


def manual_seed_all(seed: int) -> None:
    """See :func:`manual_seed`."""


def lazy(enabled: bool = True):
    """``with torch.npu.lazy():`` records ops and runs them as whole planned graphs."""
    from . import lazy as _lazy

    return _lazy.lazy_mode(enabled)
