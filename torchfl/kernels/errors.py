"""Errors raised by the emulated chip. Each message says what, where and how to fix it."""


class KernelError(ValueError):
    """Bad kernel call: unknown input, wrong shape, unsupported dtype or layout."""


class AlignmentError(KernelError):
    """A tensor address is not a multiple of the chip's ``memory_alignment_bytes``."""


class DeviceOOMError(KernelError, MemoryError):
    """An allocation would exceed the emulated chip's off-chip memory."""
