"""Emulated off-chip device memory: aligned buffers with truthful accounting.

Every buffer's numpy array really starts at a multiple of the chip's alignment (we
over-allocate by ``alignment`` bytes and offset into it, then verify the address).
Allocations are accounted in whole alignment granules, like a real device allocator.

Thread safety (issue 52: two Python threads running new ops on one npu device died): the
accounting and the block policy run under the memory's ``lock`` (re-entrant: a garbage
collection inside ``alloc`` may free a tensor, whose deleter frees here), and the scope of
:meth:`DeviceMemory.returned_on_error` is per thread, so a failing op in one thread frees
only what that thread allocated.
"""
from __future__ import annotations

import threading

import numpy as np

from .errors import AlignmentError, out_of_memory
from .units import fmt_bytes

__all__ = ["DeviceMemory", "DeviceBuffer", "accounted_bytes", "check_alignment", "address_of"]


def accounted_bytes(nbytes: int, alignment: int) -> int:
    """What an allocation of ``nbytes`` costs: whole alignment granules, at least one (the
    planner's memory plan counts with this same function)."""
    a = int(alignment)
    return max(a, (int(nbytes) + a - 1) // a * a)


def _fmt(n: int) -> str:
    return f"{fmt_bytes(n)} ({n} B)" if n >= 1024 else fmt_bytes(n)


def address_of(arr: np.ndarray) -> int:
    return int(arr.__array_interface__["data"][0])


class DeviceBuffer:
    """``nbytes`` of device memory; ``array`` is the aligned uint8 view; ``address`` its
    first byte (a buffer never moves: kept, not recomputed on every alignment check)."""

    __slots__ = ("memory", "array", "nbytes", "accounted", "freed", "address", "_raw", "__weakref__")

    def __init__(self, memory, raw, array, nbytes, accounted, address=None):
        self.memory, self._raw, self.array = memory, raw, array
        self.nbytes, self.accounted, self.freed = nbytes, accounted, False
        self.address = address_of(array) if address is None else address

    def view(self, dtype, shape, offset: int = 0) -> np.ndarray:
        """Numpy view of ``shape`` elements of ``dtype`` starting ``offset`` bytes in."""
        if self.freed:
            raise ValueError(f"use of freed device buffer at 0x{self.address:x}")
        dtype = np.dtype(dtype)
        n = dtype.itemsize
        for d in shape:
            n *= int(d)
        if offset + n > self.nbytes:
            raise ValueError(f"view of {n} B at offset {offset} exceeds the {self.nbytes} B buffer")
        return self.array[offset:offset + n].view(dtype).reshape(shape)

    def free(self):
        self.memory.free(self)


class DeviceMemory:
    """One emulated device's memory: ``alloc``/``free`` with current and peak usage."""

    def __init__(self, chip):
        self.chip = chip
        self.alignment = int(chip.alignment)
        self.capacity = chip.memory_bytes
        self._allocated = 0
        self._peak = 0
        self.lock = threading.RLock()    # the accounting and the block policy (_obtain, _recycle)
        self._local = _Scope()           # .scope: buffers allocated inside returned_on_error(), per thread

    def alloc(self, nbytes: int) -> DeviceBuffer:
        nbytes = int(nbytes)
        if nbytes < 0:
            raise ValueError(f"cannot allocate a negative size ({nbytes} B)")
        acc = accounted_bytes(nbytes, self.alignment)
        lock = self.lock
        lock.acquire()              # (acquire/release, not ``with``: every eager op allocates)
        try:
            block = self._obtain(acc)
            self._allocated += acc
            if self._allocated > self._peak:
                self._peak = self._allocated
        finally:
            lock.release()
        # an empty slice would not keep its address: an empty buffer still views one byte
        buf = DeviceBuffer(self, block, block[1][:max(nbytes, 1)], nbytes, acc, block[2])
        scope = self._local.scope
        if scope is not None:
            scope.append(buf)
        return buf

    @property
    def _scope(self) -> list | None:
        """This thread's innermost returned_on_error() scope (None outside one)."""
        return self._local.scope

    def returned_on_error(self) -> "_ReturnedOnError":
        """Every buffer allocated inside the block and still live is freed if the block
        raises (out-of-memory included), so a failed run gives back all it took. (A class, not
        a ``contextlib`` generator: every eager op enters one, and the generator cost ~2.5 us.)"""
        return _ReturnedOnError(self)

    def free(self, buf: DeviceBuffer):
        if buf.memory is not self:
            raise ValueError("buffer belongs to another device memory")
        lock = self.lock
        lock.acquire()
        try:
            if buf.freed:
                raise ValueError(f"double free of device buffer at 0x{buf.address:x}")
            buf.freed = True
            self._allocated -= buf.accounted
            block, buf._raw = buf._raw, None
            if block is not None:
                self._recycle(block, buf.accounted)
        finally:
            lock.release()

    # -- the block policy: a subclass (the runtime's caching allocator) overrides these two --

    def _obtain(self, acc: int) -> tuple:
        """A fresh block of ``acc`` bytes: (raw allocation, aligned view, its address), or
        DeviceOOMError."""
        if self.capacity is not None and self._allocated + acc > self.capacity:
            free = self.capacity - self._allocated
            raise out_of_memory(
                f"out of memory on {self.chip.name}: tried to allocate {_fmt(acc)}; "
                f"{_fmt(free)} free of {_fmt(self.capacity)} (peak {_fmt(self._peak)}). "
                "Free tensors you no longer need, use a smaller batch, or a chip with more "
                "off_chip_memory.size_gb")
        raw = np.empty(acc + self.alignment, dtype=np.uint8)
        full = self._aligned(raw, acc)
        addr = address_of(full)
        if addr % self.alignment:  # verify the address, not just the request
            raise RuntimeError(f"allocator bug: 0x{addr:x} not {self.alignment}-byte aligned")
        return raw, full, addr

    def _recycle(self, block: tuple, acc: int) -> None:
        """A freed block (as ``_obtain`` made it): returned to the host allocator (dropped)."""

    def _aligned(self, raw: np.ndarray, acc: int) -> np.ndarray:
        off = (-address_of(raw)) % self.alignment
        return raw[off:off + acc]

    def memory_allocated(self) -> int:
        return self._allocated

    def max_memory_allocated(self) -> int:
        return self._peak

    def reset_peak_memory_stats(self):
        with self.lock:
            self._peak = self._allocated


class _Scope(threading.local):
    """Per thread: the buffers allocated inside the innermost returned_on_error() block."""

    scope: list | None = None


def check_alignment(address: int, alignment: int, where: str):
    """Raise AlignmentError naming the pointer, its misalignment and the requirement."""
    mis = address % alignment
    if mis:
        raise AlignmentError(
            f"{where}: pointer 0x{address:x} is misaligned by {mis} bytes; this chip requires "
            f"{alignment}-byte alignment (memory_alignment_bytes). Allocate tensors through "
            "DeviceMemory (torchfl device tensors) or copy into an aligned buffer")


class _ReturnedOnError:
    """The context of :meth:`DeviceMemory.returned_on_error`: a scope of the buffers this
    thread allocated inside it, freed on an exception; nested scopes hand theirs to the
    enclosing one. (The scope lives in the memory's thread-local: one context object may be
    entered by one thread only, which every caller's ``with memory.returned_on_error()`` is.)"""

    __slots__ = ("memory", "outer")

    def __init__(self, memory: DeviceMemory):
        self.memory = memory

    def __enter__(self):
        local = self.memory._local
        self.outer = local.scope
        local.scope = []

    def __exit__(self, exc_type, exc, tb):
        memory, outer = self.memory, self.outer
        local = memory._local
        scope = local.scope
        try:
            if exc_type is not None:
                for buf in scope:
                    if not buf.freed:
                        memory.free(buf)
        finally:
            if outer is not None:
                outer.extend(scope)
            local.scope = outer
        return False
