"""Errors raised by the emulated chip. Each message says what, where and how to fix it."""
import sys


class KernelError(ValueError):
    """Bad kernel call: unknown input, wrong shape, unsupported dtype or layout."""


class AlignmentError(KernelError):
    """A tensor address is not a multiple of the chip's ``memory_alignment_bytes``."""


class DeviceOOMError(KernelError, MemoryError):
    """An allocation would exceed the emulated chip's off-chip memory. Raised (by
    :func:`out_of_memory`) as :class:`DeviceOutOfMemoryError` once torch is loaded."""


def out_of_memory(message: str) -> DeviceOOMError:
    """The out-of-memory error to raise: a :class:`DeviceOOMError` that is also a
    ``torch.OutOfMemoryError`` when torch is loaded (issue 52 case 14: an op out of device memory
    raised DeviceOOMError, a factory torch.OutOfMemoryError, and ``except
    torch.OutOfMemoryError`` missed the first). Without torch (the kernels alone, the CLI's
    torch-free commands) a plain DeviceOOMError: this package does not import torch."""
    torch = sys.modules.get("torch")
    if torch is None or getattr(torch, "OutOfMemoryError", None) is None:
        return DeviceOOMError(message)
    return _torch_class()(message)


def _torch_class() -> type:
    """``DeviceOutOfMemoryError(DeviceOOMError, torch.OutOfMemoryError)``, made once (importing
    torch); a module attribute, so that it pickles (worker processes) like any class here."""
    cls = globals().get("DeviceOutOfMemoryError")
    if cls is None:
        import torch

        cls = type("DeviceOutOfMemoryError", (DeviceOOMError, torch.OutOfMemoryError), {
            "__module__": __name__,
            "__doc__": "Out of the emulated chip's device memory: a DeviceOOMError (KernelError, MemoryError) "
                       "and a torch.OutOfMemoryError, so one ``except torch.OutOfMemoryError`` catches it "
                       "whether an op or a factory ran out."})
        globals()["DeviceOutOfMemoryError"] = cls
    return cls


def __getattr__(name):
    if name == "DeviceOutOfMemoryError":      # made on first use (it imports torch)
        return _torch_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
