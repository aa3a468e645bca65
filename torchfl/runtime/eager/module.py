"""``torch.npu``: the device module, in the shape of ``torch.cuda``'s.

    torch.npu.device_count(); torch.npu.get_device_name(1)        # 'NPU-V3'
    torch.npu.memory_allocated(0); torch.npu.max_memory_allocated(0)
    torch.npu.reset_peak_memory_stats(0); torch.npu.empty_cache()
    torch.npu.manual_seed(0); s = torch.npu.get_rng_state(); torch.npu.set_rng_state(s)
    with torch.autocast("npu", dtype=torch.float16): ...; torch.amp.GradScaler("npu")

What device-generic torch code asks a device module for: the RNG functions
(``torch.manual_seed``, ``torch.random.fork_rng``, ``torch.utils.checkpoint``), AMP's
``get_amp_supported_dtype`` (``torch.autocast``), ``_is_in_bad_fork``.

Random numbers. The emulated chips draw on the host (a random op is a host write or a
plan's host step), but each device has its own generator, as a CUDA device has:
``rng_scope(index)`` runs a host draw with the CPU default generator swapped for the
device's, so ``torch.npu.manual_seed`` / ``get_rng_state`` / ``set_rng_state`` govern npu
draws and leave the CPU stream alone (and ``torch.manual_seed`` seeds both, as it does
CUDA). Generators are made on first use: seeding touches no registry.
"""
from __future__ import annotations

import contextlib

from . import device as _dev
from .rng import generator, manual_seed, manual_seed_all, rng_scope

__all__ = ["is_available", "is_initialized", "device_count", "current_device", "set_device", "device",
           "get_device_name", "memory_allocated", "max_memory_allocated", "memory_reserved",
           "reset_peak_memory_stats", "empty_cache", "synchronize", "manual_seed", "manual_seed_all",
           "seed", "seed_all", "initial_seed", "get_rng_state", "set_rng_state", "get_rng_state_all",
           "set_rng_state_all", "rng_scope", "get_amp_supported_dtype", "is_bf16_supported", "chip_device",
           "lazy"]


def _adapter():
    from . import adapter

    return adapter()


_UNAVAILABLE_LOGGED: list = []


def is_available() -> bool:
    """Whether this process has npu devices. A registry that cannot be opened means none
    (False, said once in the log), as ``torch.cuda.is_available()`` is False without a
    driver; a ``TORCHFL_DEVICES`` naming chips the registry lacks is the user's error and
    raises it (ValueError naming the chips and the registered ones), as any bug does."""
    try:
        return _dev.device_count() > 0
    except Exception as exc:   # noqa: BLE001 -- re-raised unless the registry itself is unusable
        # registry errors carry exit_code 2 exactly when the registry cannot be opened or
        # used (torchfl.registry.errors); named by that attribute, as the runtime layer does
        # not import the registry (tests/test_layers.py). Everything else propagates.
        if getattr(exc, "exit_code", None) != 2:
            raise
        if not _UNAVAILABLE_LOGGED:
            _UNAVAILABLE_LOGGED.append(str(exc))
            from . import LOG

            LOG.warning("torchfl: no npu devices: %s", exc)
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
    _adapter().set_device(_dev.index_of(index))


@contextlib.contextmanager
def device(index):
    """``with torch.npu.device(1):`` -- the current device inside the block."""
    a = _adapter()
    old = a.current_device()
    a.set_device(_dev.index_of(index))
    try:
        yield
    finally:
        a.set_device(old)


def get_device_name(index=None) -> str:
    """The chip's name (``chip.name`` of its HCD)."""
    return _dev.chip_names()[_dev.index_of(index)]


def chip_device(name: str):
    """The ``torch.device`` (``npu:i``) of the chip named ``name`` in this process's device
    list (``torch.npu.chip_device("TFL-X1")``), so code need not know the index order."""
    import torch

    names = _dev.chip_names()
    if name not in names:
        raise ValueError(f"no npu device is the chip {name!r}: this process has "
                         f"{', '.join(f'npu:{i}={c}' for i, c in enumerate(names)) or 'none'}; "
                         "set TORCHFL_DEVICES (comma-separated chip names) before the first use to choose them")
    return torch.device("npu", names.index(name))


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
    for h in list(_dev.DEVICES.handles.values()):
        if h.has_memory():
            mem = h.memory
            with mem.lock:          # not while another thread takes a block from the cache
                mem.empty_cache()


def synchronize(index=None) -> None:
    """The emulated chips run synchronously; in lazy mode this flushes recorded ops."""
    from . import lazy as _lazy

    _lazy.flush_all()


# ---------------------------------------------------------------- random numbers

_generator = generator


def seed() -> None:
    """A random seed for the current device's generator."""
    _generator(None).seed()


def seed_all() -> None:
    import random

    manual_seed_all(random.getrandbits(63))


def initial_seed() -> int:
    return _generator(None).initial_seed()


def get_rng_state(device="npu"):
    """The generator state of ``device`` (index, ``"npu:1"`` or a torch.device; the
    current device for ``"npu"``) as a CPU ByteTensor, as ``torch.cuda`` returns it."""
    return _generator(_rng_index(device)).get_state()


def set_rng_state(new_state, device="npu") -> None:
    _generator(_rng_index(device)).set_state(new_state.to("cpu", copy=True) if new_state.device.type != "cpu"
                                             else new_state.clone())


def get_rng_state_all() -> list:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(new_states) -> None:
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


def _rng_index(device):
    if isinstance(device, str) and device == "npu":
        return None
    return device


# ---------------------------------------------------------------- AMP

def get_amp_supported_dtype() -> list:
    """The dtypes ``torch.autocast("npu", dtype=...)`` accepts. Whether a chip computes in
    them is the planner's question (an op in a dtype the chip lacks is refused by name)."""
    import torch

    from . import amp

    amp.install()        # torch.autocast("npu") asks this first: the kernels go in now
    return [torch.float16, torch.bfloat16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """Whether the current device's chip stores bfloat16 (natively, or emulated when
    ``including_emulation``)."""
    hcd = _dev.hcd_of(None)
    if "bfloat16" in hcd.dtypes:
        return True
    return bool(including_emulation and hcd.constraints.bfloat16_emulation)


def lazy(enabled: bool = True):
    """``with torch.npu.lazy():`` records ops and runs them as whole planned graphs."""
    from . import lazy as _lazy

    return _lazy.lazy_mode(enabled)


def __getattr__(name):
    # ``torch.utils.checkpoint`` saves a device's RNG state only when its module says
    # ``_initialized`` (as torch.cuda does once it has a context): true once the adapter runs
    if name == "_initialized":
        return is_initialized()
    raise AttributeError(f"module 'torch.npu' has no attribute {name!r}")
