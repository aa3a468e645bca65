"""The emulated chip: kernels with real tiling, counted bytes, dtype emulation, device
memory. Cheap to import (no numba, no torch); the catalog loads on first access.

    from torchfl.kernels import CATALOG, ChipModel, DeviceMemory, DeviceTensor
"""
from . import jitcache
from .chip import ChipModel, reference_chip
from .errors import AlignmentError, DeviceOOMError, KernelError
from .tiling import TileConfig, TilePlan, Traffic, simulated_time

__all__ = ["ChipModel", "reference_chip", "AlignmentError", "DeviceOOMError", "KernelError",
           "TileConfig", "TilePlan", "Traffic", "simulated_time", "CATALOG", "DeviceMemory",
           "DeviceTensor", "KernelSpec", "Problem"]


def __getattr__(name):
    if name in ("CATALOG", "KernelSpec", "Problem"):
        from . import catalog

        return getattr(catalog, name)
    if name == "DeviceMemory":
        from .memory import DeviceMemory

        return DeviceMemory
    if name == "DeviceTensor":
        from .tensor import DeviceTensor

        return DeviceTensor
    raise AttributeError(f"module 'torchfl.kernels' has no attribute {name!r}")


jitcache.configure()  # before any kernel module binds its Numba cache (see jitcache)
