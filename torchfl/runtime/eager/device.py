"""The ``npu`` device's chips, memory and state: one :class:`NpuDevice` per device index.

Which chip each index is comes from ``TORCHFL_DEVICES`` (comma-separated chip names, e.g.
``NPU-V3,NPU-V2``), else from the default registry's chips **sorted by name**. The list is
read once, at the first question about it (a device count, a tensor, a backward), and is
fixed for the process after that.

Every buffer of an ``npu`` tensor is a :class:`~torchfl.kernels.memory.DeviceBuffer` of
the chip's one device memory (``torchfl.runtime.device.device_memory``: the allocator the
compile path uses), so ``data_ptr()`` is the buffer's aligned address and the memory
statistics count exactly the tensors alive (plus what compiled plans keep there).

State (tinygrad's ``Device[...]``): :func:`get` hands out one cached :class:`NpuDevice` per
index, which holds everything the eager device keeps for that index (its Target and memory,
the one-op routes, lazy mode's graphs and the outputs' metadata, the random generator). What
is not per device lives in the one :data:`DEVICES` object: the chip list, the buffers torch
storages own (an address is unique in the process; the adapter frees by address alone) and
the seed new generators start from. Nothing here imports the registry or numba until a
device is used.
"""
from __future__ import annotations

import os
import threading

__all__ = ["NpuDevice", "DEVICES", "get", "of_torch_device", "chip_names", "chip_of", "memory_of", "malloc",
           "free", "buffer_at", "device_count", "owned_buffers", "target_of", "hcd_of", "adapter_current", "index_of",
           "handle"]

DEFAULT_SEED = 67280421310721          # torch's default seed of a device generator


class NpuDevice:
    """One device index and every cache of the eager device for it (built on first use)."""

    __slots__ = ("index", "name", "_target", "_memory", "routes", "fast_routes", "graphs", "metas",
                 "decompositions", "generator", "__weakref__")

    def __init__(self, index: int):
        self.index = index
        self.name = f"npu:{index}"
        self._target = self._memory = None
        self.routes: dict = {}         # the general route key (ops.route_for) -> route
        self.fast_routes: dict = {}    # ops.fast_key -> route: the same routes, found without flattening
        self.graphs: dict = {}         # lazy mode: a recorded sequence -> (plan, executor, writes, random)
        self.metas: dict = {}          # lazy mode: (op, structure, signature) -> outputs' metadata, or None
        self.decompositions = None     # the one-op decomposition table of the chip's packs (trace.py)
        self.generator = None          # torch.Generator of host random draws (rng.py)

    @property
    def chip_name(self) -> str:
        return DEVICES.names()[self.index]

    @property
    def target(self):
        """The resolved :class:`~torchfl.planner.target.Target` (HCD, rule packs, ChipModel,
        content hash), from the default registry."""
        return self._target or target_of(self.index)

    @property
    def memory(self):
        """The chip's device memory (shared with the compile path)."""
        m = self._memory
        if m is None:
            from torchfl.runtime.device import device_memory

            m = self._memory = device_memory(self.target)
        return m

    def has_memory(self) -> bool:
        """Whether this device's memory was opened (nothing to empty otherwise)."""
        return self._memory is not None

    def clear_routes(self) -> None:
        self.routes.clear()
        self.fast_routes.clear()
        from . import _STATE

        mod = _STATE["adapter"]
        if mod is not None and hasattr(mod, "fast_clear"):
            mod.fast_clear()        # the adapter's fast path holds runners of these routes

    def __repr__(self):
        return f"NpuDevice({self.name})"


class _Devices:
    """What the eager device keeps for the whole process (one instance, :data:`DEVICES`)."""

    def __init__(self):
        self.lock = threading.Lock()
        self._names: tuple | None = None
        self.handles: dict = {}        # index -> NpuDevice
        self.by_torch: dict = {}       # torch.device -> NpuDevice, or None for another device type
        self.live: dict = {}           # address -> DeviceBuffer owned by a torch npu storage
        self.seed = DEFAULT_SEED       # what a generator made from now on starts from
        self.last_plan = None          # the plan of lazy mode's most recent flush

    def names(self) -> tuple:
        """The chip of each device index (fixed at the first call in the process)."""
        names = self._names
        if names is None:
            with self.lock:
                if self._names is None:
                    self._names = _resolve_names()
                names = self._names
        return names


DEVICES = _Devices()
_LIVE = DEVICES.live


def get(index: int) -> NpuDevice:
    """The one :class:`NpuDevice` of ``index`` (an int already checked by :func:`_index`)."""
    h = DEVICES.handles.get(index)
    if h is None:
        with DEVICES.lock:
            h = DEVICES.handles.setdefault(index, NpuDevice(index))
    return h


def of_torch_device(dev):
    """The :class:`NpuDevice` of a ``torch.device``, None for another device type (cached per
    torch.device: ``device.type`` costs ~0.5 us, a dict lookup ~30 ns)."""
    try:
        return DEVICES.by_torch[dev]
    except KeyError:
        h = get(dev.index or 0) if dev.type == "npu" else None
        DEVICES.by_torch[dev] = h
        return h


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
    return DEVICES.names()


def device_count() -> int:
    return len(DEVICES.names())


def index_of(index) -> int:
    if index is None:
        return adapter_current()
    if hasattr(index, "type"):        # a torch.device
        if index.type != "npu":
            raise ValueError(f"expected an npu device, got {index}")
        index = index.index if index.index is not None else adapter_current()
    if isinstance(index, str):
        import torch

        return index_of(torch.device(index))
    index = int(index)
    n = device_count()
    if not 0 <= index < n:
        raise ValueError(f"npu:{index} does not exist: this process has {n} npu device(s) "
                         f"({', '.join(f'npu:{i}={c}' for i, c in enumerate(chip_names()))}); "
                         "set TORCHFL_DEVICES before the first use to choose them")
    return index


def handle(index=None) -> NpuDevice:
    """The :class:`NpuDevice` of ``index`` (an int, ``"npu:1"``, a torch.device, None for
    the current device), checked to exist."""
    return get(index_of(index))


def adapter_current() -> int:
    from . import adapter

    return adapter().current_device()


def target_of(index=None):
    """The resolved :class:`~torchfl.planner.target.Target` of device ``index`` (the eager
    device's one resolution of its chip, kept on its :class:`NpuDevice`)."""
    h = handle(index)
    t = h._target
    if t is None:
        from torchfl.planner.target import resolve_target

        t = h._target = resolve_target(h.chip_name)
    return t


def chip_of(index=None):
    """The :class:`~torchfl.kernels.ChipModel` of device ``index``."""
    return handle(index).target.model


def memory_of(index=None):
    """The chip's device memory (shared with the compile path)."""
    return handle(index).memory


def hcd_of(index=None):
    """The chip's HCD (from the registry, as the planner reads it)."""
    return handle(index).target.hcd


# ---------------------------------------------------------------- the adapter's callbacks

def default_layout(index: int) -> list:
    """Physical order of a 4-D tensor's logical axes in the chip's ``default_layout``
    (``NHCW`` -> [0, 2, 1, 3]); [] for row-major (``NCHW``)."""
    from torchfl.kernels.tensor import layout_perm

    perm = list(layout_perm(hcd_of(index).tensor.default_layout, 4))
    return [] if perm == [0, 1, 2, 3] else perm


#: called once, at the first allocation (the package sets it when the adapter loads: the
#: functional overloads registered before the first op, ``_route_functional``); None after
FIRST_ALLOC: list = [None]


def malloc(index: int, nbytes: int) -> int:
    """Allocate ``nbytes`` on chip ``index`` for a torch storage; returns the address."""
    first = FIRST_ALLOC[0]
    if first is not None:
        FIRST_ALLOC[0] = None
        first()
    buf = handle(index).memory.alloc(nbytes)
    _LIVE[buf.address] = buf
    return buf.address


def free(address: int) -> None:
    """The adapter's deleter of a torch npu storage (every tensor death: kept lean)."""
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
