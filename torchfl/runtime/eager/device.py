"""The ``npu`` device's chips and memory: one device index per chip.

Which chip each index is comes from ``TORCHFL_DEVICES`` (comma-separated chip names, e.g.
``NPU-V3,NPU-V2``), else from the default registry's chips **sorted by name**. The list is
read once, at the first question about it (a device count, a tensor, a backward), and is
fixed for the process after that.

Every buffer of an ``npu`` tensor is a :class:`~torchfl.kernels.memory.DeviceBuffer` of
the chip's one device memory (``torchfl.runtime.device.device_memory``: the allocator the
compile path uses), so ``data_ptr()`` is the buffer's aligned address and the memory
statistics count exactly the tensors alive (plus what compiled plans keep there).
"""
from __future__ import annotations

import os
import threading

__all__ = ["chip_names", "chip_of", "memory_of", "malloc", "free", "buffer_at", "device_count",
           "owned_buffers"]

_LOCK = threading.Lock()
_NAMES: tuple | None = None
_MEMORY: dict = {}
_LIVE: dict = {}          # address -> DeviceBuffer owned by a torch npu storage


def _resolve_names() -> tuple:
    env = os.environ.get("TORCHFL_DEVICES", "").strip()
    from torchfl.planner.target import registered_chips

    registered = registered_chips()
    if not env:
        return tuple(registered)
    names = tuple(n.strip() for n in env.split(",") if n.strip())
    unknown = [n for n in names if n not in registered]
    if unknown:
        raise ValueError(f"TORCHFL_DEVICES names {', '.join(map(repr, unknown))}, which the registry does not "
                         f"have; registered chips: {', '.join(registered) or '(none)'}")
    return names


def chip_names() -> tuple:
    """The chip of each device index (fixed at the first call in the process)."""
    global _NAMES
    if _NAMES is None:
        with _LOCK:
            if _NAMES is None:
                _NAMES = _resolve_names()
    return _NAMES


def device_count() -> int:
    return len(chip_names())


def _index(index) -> int:
    if index is None:
        return adapter_current()
    if hasattr(index, "type"):        # a torch.device
        if index.type != "npu":
            raise ValueError(f"expected an npu device, got {index}")
        index = index.index if index.index is not None else adapter_current()
    if isinstance(index, str):
        import torch

        return _index(torch.device(index))
    index = int(index)
    n = device_count()
    if not 0 <= index < n:
        raise ValueError(f"npu:{index} does not exist: this process has {n} npu device(s) "
                         f"({', '.join(f'npu:{i}={c}' for i, c in enumerate(chip_names()))}); "
                         "set TORCHFL_DEVICES before the first use to choose them")
    return index


def adapter_current() -> int:
    from . import adapter

    return adapter().current_device()


def target_of(index=None):
    """The resolved :class:`~torchfl.planner.target.Target` of device ``index`` (HCD, rule
    packs, ChipModel, content hash), from the default registry."""
    from torchfl.planner.target import resolve_target

    return resolve_target(chip_names()[_index(index)])


def chip_of(index=None):
    """The :class:`~torchfl.kernels.ChipModel` of device ``index``."""
    return target_of(index).model


def memory_of(index=None):
    """The chip's device memory (shared with the compile path)."""
    i = _index(index)
    mem = _MEMORY.get(i)
    if mem is None:
        from torchfl.runtime.device import device_memory

        mem = _MEMORY[i] = device_memory(target_of(i))
    return mem


def hcd_of(index=None):
    """The chip's HCD (from the registry, as the planner reads it)."""
    return target_of(index).hcd


# ---------------------------------------------------------------- the adapter's callbacks

def default_layout(index: int) -> list:
    """Physical order of a 4-D tensor's logical axes in the chip's ``default_layout``
    (``NHCW`` -> [0, 2, 1, 3]); [] for row-major (``NCHW``)."""
    from torchfl.kernels.tensor import layout_perm

    perm = list(layout_perm(hcd_of(index).tensor.default_layout, 4))
    return [] if perm == [0, 1, 2, 3] else perm

def malloc(index: int, nbytes: int) -> int:
    """Allocate ``nbytes`` on chip ``index`` for a torch storage; returns the address."""
    buf = memory_of(index).alloc(nbytes)
    _LIVE[buf.address] = buf
    return buf.address


def free(address: int) -> None:
    buf = _LIVE.pop(address, None)
    if buf is not None and not buf.freed:
        buf.free()


def adopt(buf) -> None:
    """A buffer a kernel allocated becomes a torch storage's (freed through :func:`free`)."""
    _LIVE[buf.address] = buf


def buffer_at(address: int):
    """The live buffer that starts at ``address`` (a storage's data pointer), or None."""
    return _LIVE.get(address)


def owned_buffers(index=None) -> list:
    """Buffers held by torch npu storages now (of device ``index``, or all)."""
    if index is None:
        return list(_LIVE.values())
    mem = memory_of(index)
    return [b for b in _LIVE.values() if b.memory is mem]
