"""DeviceTensor: a logical shape stored in a physical layout in a device buffer.

A layout is a permutation of the logical dimension letters (``NHWC`` for a logical
``NCHW`` tensor) or None for row-major. Physical storage is the permuted array:
element ``x[n, c, h, w]`` of an ``NHWC`` tensor lives at ``phys[n, h, w, c]``.
Logical letters by rank: 3 ``NCL``, 4 ``NCHW``, 5 ``NCDHW``, otherwise ``ABCDEF...``.
"""
from __future__ import annotations

import math

import numpy as np

from torchfl.hcd.dtypes import short_dtype

from . import dtypes as _dt
from .memory import check_alignment

__all__ = ["DeviceTensor", "logical_letters", "layout_perm"]

_LETTERS = {3: "NCL", 4: "NCHW", 5: "NCDHW"}


def logical_letters(rank: int) -> str:
    return _LETTERS.get(rank, "ABCDEFGHIJKLMNOP"[:rank])


def layout_perm(layout, rank: int) -> tuple[int, ...]:
    """Physical axis i holds logical axis perm[i]. Accepts a letter string or a tuple."""
    if layout is None:
        return tuple(range(rank))
    if isinstance(layout, (tuple, list)):
        perm = tuple(int(p) for p in layout)
    else:
        letters = logical_letters(rank)
        if len(layout) != rank or sorted(layout) != sorted(letters):
            raise ValueError(f"layout {layout!r} is not a permutation of {letters!r} "
                             f"(the logical letters of a rank-{rank} tensor)")
        perm = tuple(letters.index(c) for c in layout)
    if sorted(perm) != list(range(rank)):
        raise ValueError(f"layout {layout!r} is not a permutation of {rank} axes")
    return perm


def _canon(layout, rank):
    """Normalise: identity permutations become None (row-major)."""
    if layout is None:
        return None
    perm = layout_perm(layout, rank)
    return None if perm == tuple(range(rank)) else layout


class DeviceTensor:
    """``buffer`` (DeviceBuffer), logical ``shape``, ``layout``, storage ``dtype`` short name,
    ``offset`` bytes into the buffer (a view; may be misaligned, which kernels refuse)."""

    __slots__ = ("buffer", "shape", "layout", "dtype", "offset")

    def __init__(self, buffer, shape, layout, dtype, offset: int = 0):
        self.buffer = buffer
        self.shape = tuple(int(s) for s in shape)
        self.layout = _canon(layout, len(self.shape))
        self.dtype = _dt.check_dtype(dtype)
        self.offset = int(offset)

    # -- geometry --
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def perm(self) -> tuple[int, ...]:
        return layout_perm(self.layout, self.ndim)

    @property
    def physical_shape(self) -> tuple[int, ...]:
        return tuple(self.shape[p] for p in self.perm)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)   # Python ints: exact, and ~20x cheaper than np.prod per call

    @property
    def nbytes(self) -> int:
        return self.numel * _dt.itemsize(self.dtype)

    @property
    def address(self) -> int:
        return self.buffer.address + self.offset

    def physical(self) -> np.ndarray:
        """The storage array, in physical order (a view of the buffer)."""
        return self.buffer.view(_dt.storage_dtype(self.dtype), self.physical_shape, self.offset)

    def logical(self) -> np.ndarray:
        """A strided view of the storage in logical axis order (no copy)."""
        inv = np.argsort(self.perm)
        return self.physical().transpose(inv)

    def check_alignment(self, alignment: int, where: str):
        check_alignment(self.address, alignment, where)

    # -- construction / conversion --
    @classmethod
    def empty(cls, memory, shape, dtype, layout=None) -> "DeviceTensor":
        shape = tuple(int(s) for s in shape)
        n = math.prod(shape) * _dt.itemsize(dtype)
        return cls(memory.alloc(n), shape, layout, dtype)

    @classmethod
    def from_numpy(cls, arr, memory, layout=None, dtype=None) -> "DeviceTensor":
        """Logical array -> device tensor. ``dtype`` defaults to the array's; floats are
        rounded to nearest even into float16/bfloat16 bits."""
        arr = np.asarray(arr)
        if dtype is None:
            dtype = {np.float64: "float32", np.float32: "float32", np.float16: "float16",
                     np.int8: "int8", np.int32: "int32", np.int64: "int64",
                     np.bool_: "bool"}.get(arr.dtype.type)
            if dtype is None:
                raise ValueError(f"no storage dtype for numpy {arr.dtype}; pass dtype=")
        t = cls.empty(memory, arr.shape, dtype, layout)
        if arr.dtype == np.float16 and dtype == "float16":
            data = arr.view(np.uint16)
        else:
            data = _dt.encode(arr, dtype)
        t.logical()[...] = data
        return t

    @classmethod
    def from_torch(cls, x, memory, layout=None, dtype=None) -> "DeviceTensor":
        import torch

        x = x.detach().cpu()
        name = short_dtype(x.dtype)
        if not _dt.stored(name) and dtype is not None and not x.is_complex():
            # a host dtype (float64, uint8, int16) converted on upload (the precision policy)
            return cls.from_numpy(x.contiguous().numpy(), memory, layout, dtype)
        src = _dt.from_torch_dtype(x.dtype)
        if src == "bfloat16":
            bits = x.contiguous().view(torch.int16).numpy().view(np.uint16)
            if dtype not in (None, "bfloat16"):   # one buffer, in the target dtype (no stray bf16 one)
                return cls.from_numpy(_dt.decode(bits, "bfloat16"), memory, layout, dtype)
            t = cls.empty(memory, tuple(x.shape), "bfloat16", layout)
            t.logical()[...] = bits
            return t
        arr = x.contiguous().numpy()
        return cls.from_numpy(arr, memory, layout, dtype or src)

    def _contiguous(self) -> np.ndarray:
        """The storage in logical order, contiguous, with the logical shape (a 0-d tensor
        stays 0-d: ``np.ascontiguousarray`` alone returns at least one dimension)."""
        return np.ascontiguousarray(self.logical()).reshape(self.shape)

    def to_numpy(self) -> np.ndarray:
        """Logical-order values: float32 for float dtypes, otherwise the storage type."""
        return _dt.decode(self._contiguous(), self.dtype)

    def to_torch(self):
        """A torch tensor of the same dtype (float16/bfloat16 bit-exact), logical order."""
        import torch

        bits = self._contiguous()
        if self.dtype == "float16":
            return torch.from_numpy(bits.view(np.float16).copy())
        if self.dtype == "bfloat16":
            return torch.from_numpy(bits.view(np.int16).copy()).view(torch.bfloat16)
        return torch.from_numpy(bits.copy())

    def free(self):
        self.buffer.free()

    def __repr__(self):
        return (f"DeviceTensor(shape={self.shape}, layout={self.layout}, dtype={self.dtype}, "
                f"address=0x{self.address:x})")
