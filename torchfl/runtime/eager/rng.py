"""Random numbers of the ``npu`` device: one host generator per device (``NpuDevice.generator``).

Random ops run on the host (a draw is host-made data written into the tensor, like a copy):
:func:`rng_scope` puts the device's generator in place of the CPU default generator around
them. Generators are made on first use from the seed :func:`manual_seed_all` set last, so
seeding (``torch.manual_seed`` seeds every device) opens no registry in programs that never
use the device.
"""
from __future__ import annotations

import contextlib
import threading

from . import device as _dev

__all__ = ["generator", "rng_scope", "manual_seed", "manual_seed_all"]


def generator(index=None):
    """The generator of device ``index`` (None: the current device)."""
    h = _dev.handle(index)
    gen = h.generator
    if gen is None:
        import torch

        gen = h.generator = torch.Generator()
        gen.manual_seed(_dev.DEVICES.seed)
    return gen


_SWAP = threading.RLock()     # the CPU default generator is one per process: one swap at a time


@contextlib.contextmanager
def rng_scope(index):
    """Run host random draws of device ``index`` from its generator: the CPU default
    generator holds the device's state inside the block, and its own again after. One thread
    at a time (two interleaved swaps left the CPU generator holding a device's state)."""
    import torch

    with _SWAP:
        gen = generator(index)
        cpu = torch.default_generator
        saved = cpu.get_state()
        cpu.set_state(gen.get_state())
        try:
            yield
        finally:
            gen.set_state(cpu.get_state())
            cpu.set_state(saved)


def manual_seed(seed: int) -> None:
    """Seed the current device's generator (like ``torch.cuda.manual_seed``)."""
    generator(None).manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    """Seed every device's generator (``torch.manual_seed`` calls this): lazily, so that
    seeding opens no registry in programs that never use the device."""
    _dev.DEVICES.seed = int(seed)
    for h in list(_dev.DEVICES.handles.values()):
        if h.generator is not None:
            h.generator.manual_seed(int(seed))
